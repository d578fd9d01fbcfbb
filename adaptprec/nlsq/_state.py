"""What the trust-region solver carries: its static :class:`Options` (part of every
compiled program's key), the per-solve :class:`Context`, the loop :class:`State`, the
:class:`Proposal` of a step and the :class:`Evaluation` of the model at a point.

Example:
    >>> from adaptprec.nlsq._state import Options
    >>> Options._fields[:4]
    ('n', 'rungs', 'method', 'loss')
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax

__all__ = ["Options", "Context", "State", "Kept", "Proposal", "Evaluation", "Outputs",
           "Solution"]


class Options(NamedTuple):
    """The static options of one solve."""

    n: int
    rungs: tuple  # dtypes, bottom to top
    method: str   # "lm" | "gn" | "trf" | "dogbox"
    loss: Any     # a loss name or a callable rho(z)
    jac: Any      # "fwd" | "rev" | a callable (user's, finite differences, host)
    jac_scale: bool  # x_scale="jac"
    has_bounds: bool
    max_steps: int
    linear_solver: str  # "qr" | "normal"
    max_rejections: int
    cond_tol: float
    schedule: Any
    #: per leaf of the data: the axis of its points (``None`` for leaves without); set
    #: only when the residual is proven pointwise (:mod:`._pointwise`) and the normal
    #: equations are accumulated block by block
    point_axes: tuple | None = None
    #: scipy's ``max_nfev`` (0: no cap beyond ``max_steps``)
    max_nfev: int = 0
    #: scipy's ``callback`` (:mod:`._callback`), or ``None``
    callback: Any = None
    #: ``tr_solver="lsmr"``'s options (:func:`._lsmr.check_tr_options`; ``None``: exact)
    tr: Any = None
    #: ``lm``'s second strategy (:data:`.common.PORTFOLIO`): 0 off, 1 ``max_steps`` caps
    #: the whole solve, 2 each strategy has ``max_steps``
    portfolio: int = 1
    #: the top-rung stopping rules of a solve that runs float64 alone for ``"adaptive"``
    #: (rounding-level steps judged by the cost's evaluation error, the first
    #: convergence confirmed by one more step); ``precision="f64"`` keeps scipy's rules
    adaptive_stop: bool = False
    #: the point count where the program's shapes depend on it (blocked evaluation, the
    #: one-evaluation hand-off); 0 when the data are padded to a bucket and the count is
    #: the runtime ``Context.m``
    m: int = 0


class Context(NamedTuple):
    """The per-solve operands of the loop (traced inside the program)."""

    args: tuple   # the data cast to each rung, bottom to top
    lb: Any
    ub: Any
    scale_inv0: Any
    f_scale: Any
    ftol: Any
    xtol: Any
    gtol: Any
    x0: Any
    m: Any        # the number of residuals (an int, or a traced int32 for padded data)


class Kept(NamedTuple):
    """Where the portfolio's first strategy ended (out of steps, no finite step, or a
    runaway convergence)."""

    x: jax.Array
    cost: jax.Array
    status: jax.Array


class State(NamedTuple):
    x: jax.Array
    cost: jax.Array
    R: jax.Array       # R^T R = J^T J (scaled for the loss)
    qtf: jax.Array     # R^T qtf = J^T f
    fsn: jax.Array     # ||f|| (sqrt(2 cost) with a robust loss)
    ok: jax.Array      # the model at x is finite
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
    pending: jax.Array  # the next evaluation is at x itself (start, or a new rung)
    rung_entered: jax.Array
    rung_nfev: jax.Array
    esc_reason: jax.Array
    #: ``||D dx||`` of the last rounding-level step on the top rung (inf: none)
    noise_dx: jax.Array
    #: the top rung has deferred its first convergence after an escalation
    confirmed: jax.Array
    sched: Any
    #: the portfolio's strategy (0 default, 1 the second), ``nit`` when it started,
    #: the first strategy's end (:class:`Kept`; ``None`` without a portfolio)
    strat: jax.Array = None
    strat_nit: jax.Array = None
    kept: Any = None
    x0_norm: jax.Array = None
    #: the one-evaluation hand-off: the lower rung's Gauss-Newton step in standard errors
    #: at its last point and the last two ratios to the one before (inf: none)
    gn_rate: jax.Array = None


class Proposal(NamedTuple):
    """A step from the model, the point to evaluate (the trial point, or the current one
    when ``pending``) and whether the current model already meets ``gtol``."""

    step: Any
    z: jax.Array
    gtol_hit: jax.Array


class Evaluation(NamedTuple):
    """The factored Gauss-Newton model at a point on a rung, the one contract between
    the data (in memory, blocked, streamed, sharded) and the step: cost, ``R`` and
    ``qtf`` (``R^T R = J^T J``, ``R^T qtf = J^T f``), ``||f||`` and whether the model is
    finite."""

    cost: jax.Array
    R: jax.Array
    qtf: jax.Array
    fsn: jax.Array
    jac_ok: jax.Array


class Outputs(NamedTuple):
    """What a solve's ``postprocess`` returns besides the iterate (static, part of the
    program's key): the final residual and Jacobian (``solve_nlsq``, ``curve_fit``'s
    ``full_output``), the covariance ``(J^T J)^+`` at the solution (``curve_fit``,
    ``ap.fit``), and whether a failed solve raises inside the program (``throw``)."""

    fun_jac: bool = True
    covariance: bool = False
    throw: bool = False


class Solution(NamedTuple):
    """A solve's explicit outputs (``fun``/``jac``/``cov`` are ``None`` when not asked
    for; ``model_holds``: the covariance came from the loop's last model and holds at
    ``x``, else the caller evaluates once more, :func:`._programs.final_program`)."""

    x: Any
    cost: Any
    fun: Any
    jac: Any
    grad: Any
    optimality: Any
    active_mask: Any
    nfev: Any
    njev: Any
    nit: Any
    status: Any
    rung: Any
    escalations: Any
    rung_entered: Any
    rung_nfev: Any
    escalation_reason: Any
    cov: Any = None
    model_holds: Any = None
