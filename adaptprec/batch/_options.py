"""The options of :func:`~adaptprec.solve_nlsq_batch`, validated once at the boundary: the
ladder (nlsq's one parser), the per-rung LM options and the static configuration that keys
the compiled solver.

Example:
    >>> from adaptprec.batch._options import compaction_strategy, rung_plans
    >>> from adaptprec.nlsq._arguments import resolve_ladder
    >>> compaction_strategy("auto"), compaction_strategy(None), compaction_strategy("stream")
    (('staged', 4), ('staged', 0), ('stream', 0))
    >>> [(p.dtype.name, p.opts.max_steps) for p in rung_plans(resolve_ladder("f32,f64"),
    ...                                                       1e-15, 1e-10, 1e-10, 400, 3)]
    [('float32', 30), ('float64', 400)]
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .. import _backend
from ..nlsq._arguments import resolve_ladder
from ..nlsq.common import (SE_FRACTION, check_loss, check_loss_output, default_max_steps,
                           lower_rung_budget)
from ..precision import Ladder, dtype_name, unit_roundoff
from .escalation import RungPlan
from .lm_batched import LMOptions

__all__ = ["BatchConfig", "RUNG_TOL", "LOW_RUNG_SE_FRACTION", "ESCALATE_MIN",
           "COMPACTION_MIN", "batch_ladder", "rung_plans", "compaction_strategy", "configure"]

#: A rung stops once progress is below what it can resolve: each tolerance is raised to
#: ``RUNG_TOL * u_rung`` (for float64 and the default tolerances: the user's own).
RUNG_TOL = 16.0
#: On an adaptive ladder a lower rung stops at this fraction of the standard errors: 3/4
#: of what the top rung's one-evaluation check accepts (``SE_FRACTION``), a margin for the
#: lower rung's rounding, so the top rung's check accepts its answer.
LOW_RUNG_SE_FRACTION = 0.75 * SE_FRACTION
#: The fewest lanes of an upper rung's buffer (``escalate_fraction`` of a block, at least).
ESCALATE_MIN = 64
#: Staged compaction does not shrink a buffer below this many fits.
COMPACTION_MIN = 128


class BatchConfig(NamedTuple):
    """Everything static about one batched solve (hashable: with the residual, the key
    of its compiled program). ``serial``: cache-sized blocks run one after another
    (:func:`adaptprec._backend.serial_blocks`); otherwise one lockstep batch."""

    plans: tuple
    escalate_fraction: float
    escalate_min: int
    compaction_factor: int
    compaction_min: int
    cond_tol: float
    noise_floor: float
    return_pcov: bool
    absolute_sigma: bool
    block_size: int
    strategy: str
    serial: bool


def batch_ladder(precision) -> Ladder:
    """The ladder of ``precision=`` (:func:`adaptprec.nlsq._inputs.resolve_ladder`), which
    must end on float32 or float64, as ``solve_nlsq``'s: every fit is verified on the top
    rung (a lone half-precision rung too: its fits would be verified in half precision)."""
    ladder = resolve_ladder(precision)
    if unit_roundoff(ladder.rungs[-1]) > unit_roundoff(np.float32):
        raise ValueError(
            f"precision={precision!r} ends on {dtype_name(ladder.rungs[-1])}: a ladder must "
            "end on float32 or float64, where every fit is verified; e.g. 'bf16,f32'.")
    return ladder


def rung_plans(ladder: Ladder, ftol, xtol, gtol, max_steps: int, n: int, loss="linear",
               f_scale=1.0) -> tuple:
    """One :class:`~adaptprec.batch.escalation.RungPlan` per rung: tolerances raised to
    :data:`RUNG_TOL` ``u_rung``; a lower rung gets :func:`~adaptprec.nlsq.common.
    lower_rung_budget`'s share of ``max_steps`` (as ``solve_nlsq``: a lower rung never ends
    a solve, it escalates with ``Reason.BUDGET``) and stops below
    :data:`LOW_RUNG_SE_FRACTION` standard errors; the top rung of a ladder accepts a
    Gauss–Newton step below ``SE_FRACTION`` standard errors (batch/verify.py)."""
    rungs = tuple(ladder)
    multi = len(rungs) > 1
    share = lower_rung_budget(max_steps, n, len(rungs))
    plans = []
    for i, d in enumerate(rungs):
        top = i == len(rungs) - 1
        t = RUNG_TOL * unit_roundoff(d)
        opts = LMOptions(max(ftol, t), max(xtol, t), max(gtol, t),
                         max_steps if top else share, loss=loss, f_scale=f_scale,
                         se_below=LOW_RUNG_SE_FRACTION if multi and not top else 0.0,
                         se_accept=SE_FRACTION if multi and top else 0.0)
        plans.append(RungPlan(np.dtype(d), np.dtype(np.promote_types(d, np.float32)), opts))
    return tuple(plans)


def compaction_strategy(compaction) -> tuple[str, int]:
    """``(strategy, shrink factor)`` of ``compaction=`` (see ``solve_nlsq_batch``)."""
    if compaction == "stream":
        return "stream", 0
    if compaction in ("auto", "staged"):
        return "staged", 4
    if compaction in (None, 0, False):
        return "staged", 0
    if isinstance(compaction, int) and not isinstance(compaction, bool) and compaction >= 2:
        return "staged", compaction
    raise ValueError(f"compaction must be 'auto'/'stream', 'staged', None or an int >= 2, "
                     f"got {compaction!r}")


def configure(ladder: Ladder, m: int, n: int, *, loss, f_scale, ftol, xtol, gtol,
              max_steps, compaction, escalate_fraction, cond_tol, noise_floor, block_size,
              return_pcov, absolute_sigma) -> BatchConfig:
    """The validated :class:`BatchConfig` of one call (``ValueError`` naming a bad option).

    Example:
        >>> from adaptprec.batch._options import configure
        >>> from adaptprec.nlsq._arguments import resolve_ladder
        >>> cfg = configure(resolve_ladder("f32"), 8, 2, loss="linear", f_scale=1.0,
        ...                 ftol=1e-8, xtol=1e-8, gtol=1e-8, max_steps=None,
        ...                 compaction="auto", escalate_fraction=0.125, cond_tol=1e-2,
        ...                 noise_floor=10.0, block_size=2500, return_pcov=False,
        ...                 absolute_sigma=False)
        >>> cfg.plans[0].opts.max_steps, cfg.strategy, cfg.compaction_factor
        (300, 'staged', 4)
    """
    max_steps = default_max_steps(n) if max_steps is None else max_steps
    if int(max_steps) < 1:
        raise ValueError(f"max_steps must be a positive integer, got {max_steps!r}")
    for name, tol in (("ftol", ftol), ("xtol", xtol), ("gtol", gtol)):
        if not (tol >= 0):
            raise ValueError(f"{name} must be >= 0, got {tol!r}")
    strategy, factor = compaction_strategy(compaction)
    if int(block_size) < 1:
        raise ValueError(f"block_size must be a positive integer, got {block_size!r}")
    if not 0 < escalate_fraction <= 1:
        raise ValueError(f"escalate_fraction must be in (0, 1], got {escalate_fraction!r}")
    loss = check_loss(loss)
    check_loss_output(loss, m, ladder.rungs[-1])
    if not f_scale > 0:
        raise ValueError(f"f_scale must be > 0, got {f_scale!r}")
    plans = rung_plans(ladder, float(ftol), float(xtol), float(gtol), int(max_steps), n,
                       loss, float(f_scale))
    return BatchConfig(plans, float(escalate_fraction), ESCALATE_MIN, factor, COMPACTION_MIN,
                       float(cond_tol), float(noise_floor), bool(return_pcov),
                       bool(absolute_sigma), int(block_size), strategy,
                       _backend.serial_blocks())
