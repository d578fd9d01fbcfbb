r"""Per-fit precision escalation with compaction (the runtime's ``batch="element"`` idea).

The whole batch is solved on the ladder's bottom rung (float32 by default). Each fit is
then judged on its own; a fit is *flagged* for the next rung when

* its status is a failure: non-finite residual/Jacobian (-3/-4), no finite trial point
  (-5), damping limit reached without convergence (stalled, -6), or step budget
  exhausted (0);
* its scaled normal matrix is ill-conditioned for the rung:
  :math:`\hat\kappa(D^{-1}J^\top J D^{-1})\,u_{\text{rung}} > \text{cond\_tol}`, with
  :math:`D=\mathrm{diag}(J^\top J)^{1/2}` and :math:`\hat\kappa` the squared ratio of the
  extreme Cholesky diagonals (a cheap lower bound of the 2-norm condition number);
* it stopped above the rung's noise floor: the largest cosine between residual and a
  Jacobian column exceeds ``max(gtol, floor * sqrt(u_rung))``, i.e. ``ftol``/``xtol``
  stopped it because the rung could not resolve further progress, not because the
  gradient vanished.

Flagged fits are gathered into a fixed-capacity buffer, re-initialised **from their
current x** at the next rung (residual and Jacobian re-evaluated there, damping reset),
solved to completion (with compaction inside), and scattered back. If more fits are
flagged than the buffer holds, the buffer is refilled in rounds inside one
``lax.while_loop``, so cost tracks the number of flagged fits and nothing overflows.
On an intermediate rung, fits that are not flagged keep their answer and cost nothing
more there. The top rung takes every fit, flagged or not, from where it stopped: a lower
rung never ends a solve (DESIGN.md), so every answer has its final evaluation and
convergence test in the top precision. With ``strategy="staged"`` that test is ONE
evaluation per fit (:mod:`~adaptprec.batch.verify`: the gradient test and the
Gauss–Newton step, judged against the tolerances and the parameters' standard errors);
only the fits it does not accept iterate on the top rung, with their damping carried
over. ``strategy="stream"`` iterates every fit on the top rung (one to three iterations
from a bottom-rung solution).

Why not :func:`adaptprec.iterate` with a per-fit :class:`~adaptprec.schedule.PrecisionSchedule`?
With an explicit batch axis a ``lax.switch`` over rungs per fit degenerates into running
every rung for every fit (``select``), which is what this module avoids. Escalation here is
decided once per stage from per-fit guards, the decision the runtime calls
``batch="element"``.

Iteration counts (``nit``, ``nfev``, ``njev``) accumulate over rungs.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from .. import guards
from .._status import Reason
from . import _status as st
from .cholesky import UNROLL_MAX, _unrolled, cholesky_solve
from .compaction import (empty_state, gather, plan_capacities, run_compacted, run_streaming,
                         scatter, select)
from ._model import gradient_cosine, make_fj
from .lm_batched import LMOptions, LMState, lm_init
from .verify import finish_on_top

__all__ = ["RungPlan", "escalation_flags", "escalation_reasons", "scaled_condition",
           "solve_ladder"]


class RungPlan(NamedTuple):
    """What one rung runs: model dtype, accumulation dtype, rung-adjusted options.

    Example:
        >>> import numpy as np
        >>> from adaptprec.batch.escalation import RungPlan
        >>> from adaptprec.batch.lm_batched import LMOptions
        >>> p = RungPlan(np.dtype("float32"), np.dtype("float32"), LMOptions(1e-6, 1e-6, 1e-4, 50))
        >>> p.opts.max_steps
        50
    """

    dtype: np.dtype
    acc_dtype: np.dtype
    opts: LMOptions


def scaled_condition(jtj: jax.Array) -> jax.Array:
    """Lower-bound estimate of ``cond_2(D^-1 J^T J D^-1)`` per fit (inf if not SPD).

    Example:
        >>> import jax.numpy as jnp
        >>> from adaptprec.batch.escalation import scaled_condition
        >>> a = jnp.array([[[1.0, 0.0], [0.0, 1e6]], [[1.0, 0.999], [0.999, 1.0]]])
        >>> [round(float(c), 1) for c in scaled_condition(a)]  # exact: 1.0 and 1999.0
        [1.0, 500.3]
    """
    if jtj.shape[-1] <= UNROLL_MAX:
        return _scaled_condition_fits_last(jnp.moveaxis(jtj, 0, -1))
    d = jnp.sqrt(jnp.diagonal(jtj, axis1=-2, axis2=-1))
    d = jnp.where(d > 0, d, 1)
    a = jtj / (d[:, :, None] * d[:, None, :])
    _, diag = cholesky_solve(a, jnp.zeros(a.shape[:2], a.dtype))
    ratio = (jnp.max(diag, axis=-1) / jnp.min(diag, axis=-1)) ** 2
    return jnp.where(jnp.isfinite(ratio), ratio, jnp.inf)


def _scaled_condition_fits_last(jtj):
    """:func:`scaled_condition` of ``jtj`` ``(n, n, B)`` (fits last, ``n <= UNROLL_MAX``):
    the same arithmetic on contiguous vectors over the fits (fits first, the guards cost
    about 4% of the adaptive 1e5-fit solve)."""
    n = jtj.shape[0]
    d = jnp.sqrt(jnp.stack([jtj[i, i] for i in range(n)]))
    d = jnp.where(d > 0, d, 1)
    zero = jnp.zeros(jtj.shape[-1], jtj.dtype)
    _, diag = _unrolled(lambda i, j: jtj[i, j] / (d[i] * d[j]), lambda i: zero, n)
    diag = jnp.stack(diag)
    ratio = (jnp.max(diag, axis=0) / jnp.min(diag, axis=0)) ** 2
    return jnp.where(jnp.isfinite(ratio), ratio, jnp.inf)


def escalation_reasons(s: LMState, u: float, gtol: float, cond_tol: float,
                       floor: float) -> jax.Array:
    """Per-fit :class:`adaptprec.Reason` why a fit needs a higher rung after a rung with
    unit roundoff ``u`` (``Reason.NONE`` where it does not).

    Example:
        >>> import jax.numpy as jnp
        >>> import adaptprec as ap
        >>> from adaptprec.batch.lm_batched import LMOptions, lm_init, make_fj
        >>> from adaptprec.batch.escalation import escalation_reasons
        >>> fj = make_fj(lambda x, b, s: x - b[0], jnp.float32, jnp.float32)
        >>> y = (jnp.array([[1.0], [jnp.nan]]),)
        >>> s = lm_init(fj, jnp.ones((2, 1)), y, (), LMOptions(1e-6, 1e-6, 1e-6, 10))
        >>> [ap.Reason(int(r)).name for r in escalation_reasons(s, 2.0**-24, 1e-8, 1e-2, 10.0)]
        ['NONE', 'NONFINITE']
    """
    nonfinite = jnp.isin(s.status, jnp.array(
        (st.NONFINITE_RESIDUAL, st.NONFINITE_JACOBIAN, st.NO_FINITE_STEP), s.status.dtype))
    illcond = ~guards.conditioned(scaled_condition(s.jtj), u, cond_tol).ok   # per fit
    cos = gradient_cosine(s.cost, s.jtj, s.jtf)   # (both read J^T J fits last)
    above = ~(cos <= max(gtol, floor * float(np.sqrt(u))))
    # the first condition that holds gives the reason: nested selects (jnp.select's
    # argmax over the stacked conditions is a 64-bit index reduction per fit)
    cases = ((nonfinite, Reason.NONFINITE), (s.status == st.MAX_STEPS, Reason.BUDGET),
             (s.status == st.STALLED, Reason.REJECTED_STEPS),
             (illcond, Reason.ILL_CONDITIONED), (above & (s.status != st.GTOL), Reason.SCHEDULE))
    why = jnp.full(s.status.shape, int(Reason.NONE), jnp.int32)
    for cond, r in reversed(cases):
        why = jnp.where(cond, jnp.int32(int(r)), why)
    return why


def escalation_flags(s: LMState, u: float, gtol: float, cond_tol: float,
                     floor: float) -> jax.Array:
    """Per-fit "needs a higher rung" mask: :func:`escalation_reasons` is not ``NONE``."""
    return escalation_reasons(s, u, gtol, cond_tol, floor) != Reason.NONE


def _astype_state(s: LMState, dtype) -> LMState:
    return jax.tree.map(
        lambda a: a.astype(dtype) if jnp.issubdtype(a.dtype, jnp.floating) else a, s)


def solve_ladder(residual: Callable, x0, bargs, sargs, plans: tuple[RungPlan, ...], *,
                 escalate_capacity: int, cond_tol: float, noise_floor: float,
                 strategy: str = "stream", slots: int = 2048, refill_fraction: float = 0.25,
                 compaction_factor: int = 0, compaction_min: int = 256):
    """Solve every fit on ``plans[0]``, escalate flagged fits rung by rung.

    ``strategy="stream"`` runs each rung with :func:`~adaptprec.batch.compaction.run_streaming`
    (``slots`` lanes on the bottom rung, ``escalate_capacity`` lanes above; the queue of
    an upper rung is its flagged fits, and the rung is skipped by ``lax.cond`` when none
    is flagged). ``strategy="staged"`` runs the bottom rung on the whole (block of the)
    batch with staged compaction (``compaction_factor``; 0 = plain lockstep) and upper
    rungs in rounds of ``escalate_capacity`` fits (lockstep within a round: escalated
    fits are few, and every extra stage is another compiled copy of the LM loop).

    Returns ``(state, rung, reason)`` with the state in the top rung's accumulation dtype,
    ``rung`` the per-fit index of the rung that produced the answer and ``reason`` the
    per-fit :class:`adaptprec.Reason` it left the lower rungs for (``VERIFY`` when no guard
    fired and the fit was only finished and verified on the top rung).

    Example:
        >>> import jax.numpy as jnp, numpy as np
        >>> import adaptprec as ap
        >>> from adaptprec.batch.escalation import RungPlan, solve_ladder
        >>> from adaptprec.batch.lm_batched import LMOptions
        >>> f64 = np.dtype("float64")  # needs x64 (on under the tests)
        >>> plans = (RungPlan(np.dtype("float32"), np.dtype("float32"), LMOptions(1e-6, 1e-6, 1e-4, 50)),
        ...          RungPlan(f64, f64, LMOptions(1e-10, 1e-10, 1e-10, 50)))
        >>> y = (jnp.array([[2.0], [1e30]]),)  # exp(69) overflows float32
        >>> s, rung, why = solve_ladder(lambda x, b, s: jnp.exp(x) - b[0], jnp.array([[0.0], [69.0]]),
        ...                        y, (), plans, escalate_capacity=1, cond_tol=1e-2,
        ...                        noise_floor=10.0)
        >>> rung.tolist(), [round(float(v), 4) for v in s.x[:, 0]]   # all end on f64
        ([1, 1], [0.6931, 69.0776])
        >>> [ap.Reason(int(r)).name for r in why]   # exp(69) overflowed float32
        ['VERIFY', 'NONFINITE']
    """
    if strategy not in ("stream", "staged"):
        raise ValueError(f"strategy must be 'stream' or 'staged', got {strategy!r}")
    size, n = x0.shape
    top_acc = plans[-1].acc_dtype

    def caps(b):
        return plan_capacities(b, compaction_factor, compaction_min)

    def lanes(b):
        return int(min(size, b)), int(max(1, min(size, b) * refill_fraction))

    p0 = plans[0]
    fj0 = make_fj(residual, p0.dtype, p0.acc_dtype)
    if strategy == "stream":
        nslots, nrefill = lanes(slots)
        s = run_streaming(fj0, x0, bargs, sargs, p0.opts,
                          empty_state(size, n, p0.acc_dtype), jnp.arange(size, dtype=jnp.int32),
                          size, nslots, nrefill)
    else:
        s = lm_init(fj0, x0.astype(p0.acc_dtype), bargs, sargs, p0.opts)
        s = run_compacted(fj0, s, bargs, sargs, p0.opts, caps(size))
    rung = jnp.zeros((size,), jnp.int32)
    reason = jnp.zeros((size,), jnp.int32)

    for k in range(1, len(plans)):
        prev, plan = plans[k - 1], plans[k]
        u_prev = float(np.finfo(prev.dtype).eps) / 2
        # the guards judge the lower rung's state in its own dtype (for the bottom rung
        # float32: no float64 copy of its J^T J, which the top rung's check recomputes)
        why = jnp.where(rung == k - 1, escalation_reasons(
            s, u_prev, prev.opts.gtol, cond_tol, noise_floor), Reason.NONE)
        reason = jnp.where(why != Reason.NONE, why, reason)
        if not (k == len(plans) - 1 and strategy == "staged"):
            s = _astype_state(s, top_acc)
        if k == len(plans) - 1:
            # A lower rung never ends a solve: every fit finishes on the top rung, from
            # where it stopped, so an answer has its final evaluation and convergence test
            # in the top precision (staged: one evaluation, verify.py).
            reason = jnp.where(reason == Reason.NONE, Reason.VERIFY, reason)
            flags = jnp.ones((size,), bool)
            cap = int(min(size, slots))
        else:
            flags = why != Reason.NONE
            cap = int(min(size, escalate_capacity))
        fj = make_fj(residual, plan.dtype, plan.acc_dtype)
        if k == len(plans) - 1 and strategy == "staged":
            # one top-rung evaluation verifies every fit (verify.py); only the fits it
            # does not accept iterate there, with their damping carried over
            s = finish_on_top(fj, s, bargs, sargs, plan.opts, caps(size))
            rung = jnp.full((size,), k, jnp.int32)
            continue
        if strategy == "stream":
            nslots, nrefill = lanes(cap)

            def escalate(s, fj=fj, plan=plan, flags=flags, nslots=nslots, nrefill=nrefill):
                (queue,) = jnp.nonzero(flags, size=size, fill_value=size)
                res = run_streaming(fj, s.x, bargs, sargs, plan.opts,
                                    _astype_state(s, plan.acc_dtype), queue,
                                    jnp.sum(flags, dtype=jnp.int32), nslots, nrefill)
                res = _astype_state(res, top_acc)
                extra = lambda a: jnp.where(flags, a, 0)
                return res._replace(nit=res.nit + extra(s.nit), nfev=res.nfev + extra(s.nfev),
                                    njev=res.njev + extra(s.njev))

            s = jax.lax.cond(jnp.any(flags), escalate, lambda s: s, s)
            rung = jnp.where(flags, k, rung)
            continue

        def body(carry, fj=fj, plan=plan, cap=cap, k=k):
            s, rung, remaining = carry
            idx, valid = select(remaining, cap)
            old = gather(s, idx)
            sub = lm_init(fj, old.x.astype(plan.acc_dtype), gather(bargs, idx), sargs,
                          plan.opts, active=valid)
            sub = run_compacted(fj, sub, gather(bargs, idx), sargs, plan.opts, (cap,))
            sub = _astype_state(sub, top_acc)
            sub = sub._replace(nit=sub.nit + old.nit, nfev=sub.nfev + old.nfev,
                               njev=sub.njev + old.njev)
            s = scatter(s, idx, sub)
            rung = rung.at[idx].set(k, mode="drop")
            remaining = remaining.at[idx].set(False, mode="drop")
            return s, rung, remaining

        s, rung, _ = jax.lax.while_loop(lambda c: jnp.any(c[2]), body, (s, rung, flags))
    return s, rung, reason
