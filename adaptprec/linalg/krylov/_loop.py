r"""The one loop every Krylov solver runs: cycles on the rungs of a ladder, each checked
by the true residual in the top dtype, a precision schedule deciding the rung.

State (top dtype ``w``): the iterate ``x``, the true residual ``r = b - A x`` and its norm,
the solver's carry, the schedule's state. One ``lax.while_loop`` over cycles:

1. ``s = ||r||``; on the schedule's rung (``lax.switch``), the solver iterates on
   ``A d = r / s`` in the rung's dtype until its recursive residual reaches
   ``max(delta, TARGET_MARGIN tol / s)``, it breaks down, or the cycle's length is used;
2. ``x += s d`` and ``r = b - A x`` in ``w`` (one product: the reliable update);
3. the schedule sees the true relative residual (``ScheduleStats``: value, previous
   value, ``guard_failures`` = 1 for NaN/Inf or a CG direction with ``p^T A p <= 0`` on a
   lower rung) and may move the rung; a cycle that produced NaN/Inf is discarded;
4. the solve ends when ``||r|| <= tol`` (CONVERGED: the only success, checked on this
   top-dtype residual), on the top rung when the residual did not fall below
   ``STALL_PROGRESS`` times the best so far in ``STALL_CYCLES`` consecutive cycles
   (STALLED: the top dtype's rounding floor), when CG meets ``p^T A p <= 0`` on the
   top rung (NOT_POSITIVE_DEFINITE), on NaN/Inf on the top rung (NONFINITE_RESIDUAL), or
   after ``maxiter`` iterations (MAX_EVALUATIONS).

The solve returns the iterate with the smallest true residual (the last one when it
converged). A lower rung never ends the solve: its answers only ever reach ``x`` through step 2, and
only step 4's residual, computed in ``w``, says CONVERGED.

Under ``vmap`` (several right-hand sides, batched systems) the rung is per element:
``lax.switch`` with a batched index runs every rung's branch, so each branch's inner
loop also stops for the elements that are not on its rung (``active``); an element whose
solve has ended runs no iterations.
"""

from __future__ import annotations

import numpy as np

import jax
import jax.numpy as jnp
from jax import lax

from ..._pytree import Module
from ..._status import Reason, Status
from ...schedule import ScheduleStats
from .common import (
    INDEFINITE,
    NONFINITE,
    STALL_CYCLES,
    STALL_PROGRESS,
    TARGET_MARGIN,
    CycleContext,
    KrylovSolver,
    compute_dtype,
)
from .info import KrylovInfo, empty_trace

__all__: list[str] = []

_RUNNING = int(Status.RUNNING)


class _LoopState(Module):
    x: jax.Array
    r: jax.Array
    rnorm: jax.Array
    x_best: jax.Array     # the iterate with the smallest true residual so far
    rn_best: jax.Array
    carry: object
    sched: object
    its: jax.Array
    its_rung: jax.Array
    cycles: jax.Array
    status: jax.Array
    reason: jax.Array
    stall: jax.Array
    rung_trace: jax.Array
    residual_trace: jax.Array


def _branches(solver: KrylovSolver, op, M, ladder, w):
    """One ``lax.switch`` branch per rung: a whole cycle on that rung. The matrices and
    the preconditioner are rounded to each rung here, once, outside the loop."""
    out = []
    for k, dtype in enumerate(ladder):
        matvec = op.at(dtype)
        precond = M.at(dtype) if M is not None else (lambda y: y)

        def run(ops, k=k, dtype=dtype, matvec=matvec, precond=precond):
            r, s, carry, target, budget, running, rung = ops
            ctx = CycleContext(matvec, precond, M is not None, np.dtype(dtype),
                               compute_dtype(dtype), np.dtype(w),
                               target.astype(compute_dtype(dtype)))
            active = running & (rung == k)
            st = solver.init(ctx, (r / s).astype(dtype), s, carry)

            def more(c):
                st, _ = c
                return active & (solver.iterations(st) < budget) & ~solver.terminate(ctx, st)

            def step(c):
                st = solver.step(ctx, c[0])
                return st, jnp.minimum(c[1], solver.residual(st))

            st, best = lax.while_loop(more, step, (st, solver.residual(st)))
            d, carry, code = solver.postprocess(ctx, st, s, carry)
            return (d.astype(w) * s, carry, solver.iterations(st), code,
                    solver.residual(st).astype(w), best.astype(w), solver.claim(st).astype(w))

        out.append(run)
    return out


def _after_cycle(solver, st: _LoopState, schedule, *, carry, k, code, rec_end, rec_best,
                 claim, target, r_new, x_new, tol_abs, bscale, maxiter, n_rungs,
                 carry0) -> _LoopState:
    """Steps 2-4 of the module docstring, given the cycle's outputs."""
    rung = st.sched.rung
    rn_new = jnp.linalg.norm(r_new)
    finite_cycle = jnp.isfinite(rn_new)
    useful, faithful = solver.judge(x_new - st.x, st.r, r_new, st.rnorm, claim)
    useful = useful & finite_cycle
    x = jnp.where(useful, x_new, st.x)
    r = jnp.where(useful, r_new, st.r)
    rn = jnp.where(useful, rn_new, st.rnorm)
    carry = jax.tree.map(lambda c, c0: jnp.where(useful, c, c0), carry, carry0)
    nonfinite = ~finite_cycle | (code == NONFINITE)
    indefinite = code == INDEFINITE
    guard = nonfinite | indefinite | ~useful
    # which cycles the schedule sees (common.RESIDUAL_GAP)
    top = rung == n_rungs - 1
    seen = ((rec_end <= target) | guard | ~faithful
            | ((k >= solver.cycle_length()) & solver.capped_cycle_counts(top, rec_best)))
    stats = ScheduleStats.make(rn / bscale, step=st.cycles, previous=st.rnorm / bscale,
                               accepted=faithful, guard_failures=guard.astype(jnp.int32))
    sched = jax.tree.map(lambda new, old: jnp.where(seen, new, old),
                         schedule.update(st.sched, stats), st.sched)
    climbed = sched.rung > rung
    # a new rung starts its recurrence afresh: the old rung's direction is what failed
    carry = jax.tree.map(lambda c, c0: jnp.where(sched.rung != rung, c0, c), carry, carry0)
    why = jnp.select([nonfinite, indefinite, ~useful],
                     [int(Reason.NONFINITE), int(Reason.MATRIX_ILL_CONDITIONED),
                      int(Reason.STAGNATION)], default=int(Reason.SCHEDULE))
    reason = jnp.where(climbed, why, st.reason).astype(jnp.int32)
    stuck = seen & top & ~climbed & ~(rn < STALL_PROGRESS * st.rn_best)
    stall = jnp.where(stuck, st.stall + 1, jnp.where(seen, 0, st.stall)).astype(jnp.int32)
    its = st.its + k
    cg_indefinite = indefinite & top if solver.name == "cg" else jnp.asarray(False)
    status = jnp.select(
        [rn <= tol_abs, cg_indefinite, top & nonfinite, stall >= STALL_CYCLES,
         its >= maxiter],
        [int(Status.CONVERGED), int(Status.NOT_POSITIVE_DEFINITE),
         int(Status.NONFINITE_RESIDUAL), int(Status.STALLED), int(Status.MAX_EVALUATIONS)],
        default=_RUNNING).astype(jnp.int32)
    i = st.cycles
    better = rn < st.rn_best
    return _LoopState(
        x=x, r=r, rnorm=rn, x_best=jnp.where(better, x, st.x_best),
        rn_best=jnp.where(better, rn, st.rn_best), carry=carry, sched=sched, its=its,
        its_rung=st.its_rung.at[rung].add(k), cycles=i + 1, status=status, reason=reason,
        stall=stall, rung_trace=st.rung_trace.at[i].set(rung, mode="drop"),
        residual_trace=st.residual_trace.at[i].set((rn / bscale).astype(
            st.residual_trace.dtype), mode="drop"))


def run(solver: KrylovSolver, op, M, b, *, tol_abs, bnorm, maxiter: int, ladder,
        schedule):
    """Solve ``A x = b`` from ``x = 0`` (``b`` is the caller's ``b - A x0``); ``tol_abs``
    and ``bnorm`` refer to the caller's ``b``. Returns ``(x, KrylovInfo)``."""
    ladder = tuple(np.dtype(d) for d in ladder)
    w = ladder[-1]
    n = b.shape[0]
    n_rungs = len(ladder)
    matvec_w = op.at(w)
    branches = _branches(solver, op, M, ladder, w)
    carry0 = solver.carry_init(n, w)
    bscale = jnp.where(bnorm > 0, bnorm, 1.0).astype(w)
    tol_abs = jnp.asarray(tol_abs, w)
    rn0 = jnp.linalg.norm(b)
    bad_input = ~jnp.isfinite(rn0)
    status0 = jnp.where(bad_input, int(Status.NONFINITE_INPUT),
                        jnp.where(rn0 <= tol_abs, int(Status.CONVERGED),
                                  jnp.where(maxiter <= 0, int(Status.MAX_EVALUATIONS),
                                            _RUNNING))).astype(jnp.int32)
    rung_trace, residual_trace = empty_trace(w)
    zero = jnp.asarray(0, jnp.int32)
    st0 = _LoopState(
        x=jnp.zeros((n,), w), r=b, rnorm=rn0, x_best=jnp.zeros((n,), w), rn_best=rn0,
        carry=carry0, sched=schedule.init(ladder),
        its=zero, its_rung=jnp.zeros((n_rungs,), jnp.int32), cycles=zero, status=status0,
        reason=jnp.asarray(int(Reason.NONE), jnp.int32), stall=zero,
        rung_trace=rung_trace, residual_trace=residual_trace)

    def body(st: _LoopState) -> _LoopState:
        s = st.rnorm
        target = jnp.maximum(solver.reliable_delta, TARGET_MARGIN * tol_abs / s)
        budget = jnp.minimum(solver.cycle_length(), maxiter - st.its)
        ops = (st.r, s, st.carry, target.astype(w), budget, st.status == _RUNNING,
               st.sched.rung)
        d, carry, k, code, rec_end, rec_best, claim = lax.switch(st.sched.rung, branches, ops)
        x_new = st.x + d
        r_new = b - matvec_w(x_new)
        return _after_cycle(solver, st, schedule, carry=carry, k=k, code=code,
                            rec_end=rec_end, rec_best=rec_best, claim=claim,
                            target=target,
                            r_new=r_new, x_new=x_new, tol_abs=tol_abs, bscale=bscale,
                            maxiter=maxiter, n_rungs=n_rungs, carry0=carry0)

    st = lax.while_loop(lambda st: st.status == _RUNNING, body, st0)
    x = jnp.where(bad_input, jnp.nan, st.x_best)
    info = KrylovInfo(
        status=st.status, residual_norm=(st.rn_best / bscale).astype(w), iterations=st.its,
        iterations_per_rung=st.its_rung, cycles=st.cycles, rung=st.sched.rung,
        escalations=st.sched.escalations, reason=st.reason, rung_trace=st.rung_trace,
        residual_trace=st.residual_trace, ladder=tuple(d.name for d in ladder),
        method=solver.name)
    return x, info

