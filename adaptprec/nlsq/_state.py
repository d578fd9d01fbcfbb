"""The step's configuration and state: :class:`LoopConfig` (the static options of one
solve, a cache key), the loop state ``_State``, the first strategy's end ``_Kept`` and
the ``Proposal`` that ``propose`` hands to the evaluation and to ``advance``
(:func:`._loop.build_loop`).

Example:
    >>> from adaptprec.nlsq._state import LoopConfig
    >>> LoopConfig._fields[:4]
    ('m', 'n', 'rungs', 'method')
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax

__all__ = ["LoopConfig", "Proposal"]


class LoopConfig(NamedTuple):
    m: int
    n: int
    rungs: tuple  # dtypes
    method: str
    loss: Any
    jac: Any  # "fwd" | "rev" | callable
    jac_scale: bool
    has_bounds: bool
    max_steps: int
    linear_solver: str
    max_rejections: int
    cond_tol: float
    schedule: Any
    #: per leaf of ``args``: the axis of its data points, ``None`` for leaves without;
    #: set (see :mod:`._pointwise`) only when the residual is proven pointwise and the
    #: normal equations are accumulated block by block.
    point_axes: tuple | None = None
    #: scipy's ``max_nfev``: stop (status 0) after this many residual evaluations; 0 = no
    #: cap beyond ``max_steps``.
    max_nfev: int = 0
    #: scipy's ``callback`` (see :mod:`._callback`), or ``None``
    callback: Any = None
    #: ``tr_solver="lsmr"``: :func:`._lsmr.check_tr_options`'s tuple (``None``: exact)
    tr: Any = None
    #: ``lm``'s second strategy on failure (:data:`PORTFOLIO`; part of every cache key):
    #: 0 off, 1 ``max_steps`` caps the whole solve, 2 each strategy has ``max_steps``
    portfolio: int = 1
    #: the stopping rules of a top rung entered by escalation from the first step on:
    #: rounding-level steps judged by the cost's evaluation error
    #: (:data:`POST_ESCALATION_NOISE`) and the first convergence confirmed by one more
    #: step. Set by ``solve_nlsq`` for an ``"adaptive"`` solve that runs float64 alone
    #: (``_ladder.SMALL_F64_MN``); an explicit ``precision="f64"`` keeps scipy's rules.
    adaptive_stop: bool = False


class _State(NamedTuple):
    x: jax.Array
    cost: jax.Array
    R: jax.Array
    qtf: jax.Array
    fsn: jax.Array
    ok: jax.Array
    scale_inv: jax.Array
    Delta: jax.Array
    alpha: jax.Array
    rung: jax.Array
    escalations: jax.Array
    nfev: jax.Array
    njev: jax.Array
    nit: jax.Array
    status: jax.Array
    consec_rej: jax.Array
    top_steps: jax.Array
    pending: jax.Array
    rung_entered: jax.Array
    rung_nfev: jax.Array
    esc_reason: jax.Array
    #: ``||D dx||`` of the last rounding-level step on the top rung (inf: none)
    noise_dx: jax.Array
    #: (issue 15) the top rung has deferred its first convergence stop after an
    #: escalation (see ``advance``)
    confirmed: jax.Array
    sched: Any
    #: portfolio (see :data:`PORTFOLIO`): the step strategy (0: default, 1: the second),
    #: ``nit`` when it started (its own ``max_steps``), and the first strategy's end
    #: (:class:`_Kept`, ``None`` without a portfolio)
    strat: jax.Array = None
    strat_nit: jax.Array = None
    kept: Any = None
    #: ``||x0||`` (the runaway test of the portfolio's end)
    x0_norm: jax.Array = None
    #: (issue 31, fits verified in one top-rung evaluation, ``_loop.one_eval_gate``):
    #: the Gauss-Newton step in standard errors at the lower rung's last point taken,
    #: and its last two ratios to the one before (the measured contraction; inf: none)
    gn_rate: jax.Array = None


class _Kept(NamedTuple):
    """Where the first strategy ended (only ends that ``verify_minimum`` leaves as they
    are: out of steps, no finite step, a runaway convergence)."""

    x: jax.Array
    cost: jax.Array
    status: jax.Array


class Proposal(NamedTuple):
    """What ``propose`` hands to the evaluation and to ``advance``: the step, the point
    to evaluate (the trial point, or the current point when ``pending``) and whether the
    current model already satisfies the ``gtol`` test."""

    step: Any
    z: jax.Array
    gtol_hit: jax.Array
