"""The adaptive trust-region driver shared by ``lm``, ``gn`` and ``trf``.

One ``lax.while_loop``; each iteration proposes a step from the factored model, evaluates
the residual at the trial point on the current rung (``lax.switch`` over the ladder),
accepts or rejects it, decides whether to escalate, and (only after an accepted step or an
escalation) re-evaluates residual and Jacobian (``lax.cond`` + ``lax.switch``). Iterate and
model are kept in the top dtype; only residual/Jacobian evaluation runs on the rung.

Escalation (rung ``r`` below the top) when: the termination test fires on ``r``
(convergence is only declared on the top rung after at least one step there), a residual or
Jacobian is non-finite, ``max_rejections`` consecutive steps are rejected, the scaled
Jacobian's condition number times ``u_r`` exceeds ``cond_tol``, or the precision schedule
asks for it (stall / noise floor).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ..precision import unit_roundoff
from .common import Status, check_termination_codes, robust_cost, scale_for_robust_loss
from .common import update_tr_radius

__all__ = ["LoopConfig", "build_loop"]


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


class _State(NamedTuple):
    x: jax.Array
    f: jax.Array
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
    rung_entered: jax.Array
    rung_nfev: jax.Array
    esc_reason: jax.Array
    sched: Any


def _promote(dtype):
    return jnp.promote_types(dtype, jnp.float32)


def _factor(J, f, linear_solver):
    """``R`` (n x n) and ``qtf`` with ``R^T R = J^T J`` and ``R^T qtf = J^T f``."""
    m, n = J.shape
    if linear_solver == "normal":
        A = jnp.matmul(J.T, J, preferred_element_type=J.dtype)
        b = jnp.matmul(J.T, f, preferred_element_type=J.dtype)
        lam, V = jnp.linalg.eigh(A)
        lam = jnp.maximum(lam, 0.0)
        sq = jnp.sqrt(lam)
        keep = sq > jnp.finfo(J.dtype).eps * max(m, n) * jnp.max(sq)
        R = sq[:, None] * V.T
        qtf = jnp.where(keep, (V.T @ b) / jnp.where(keep, sq, 1.0), 0.0)
        return R, qtf
    A = jnp.concatenate([J, f[:, None]], axis=1)
    if m < n + 1:
        A = jnp.concatenate([A, jnp.zeros((n + 1 - m, n + 1), A.dtype)])
    Raug = jnp.linalg.qr(A, mode="r")
    return Raug[:n, :n], Raug[:n, n]


def build_loop(fun: Callable, cfg: LoopConfig, step_fn: Callable, gnorm_fn: Callable,
               delta0_fn: Callable):
    """Return ``run(x0, args_by_rung, lb, ub, scale_inv0, f_scale, ftol, xtol, gtol)``.

    ``fun(x, *args)`` maps a flat vector to a flat residual. ``step_fn(x, R, qtf, g,
    scale_inv, Delta, alpha, lb, ub) -> Step``; ``gnorm_fn(x, g, R, fsn, lb, ub)`` the
    first-order measure tested against ``gtol``; ``delta0_fn(x, scale_inv, g, lb, ub)``.
    """
    rungs = cfg.rungs
    top_dt = rungs[-1]
    nr = len(rungs)
    top = nr - 1
    loss = cfg.loss
    us = jnp.asarray([unit_roundoff(d) for d in rungs], top_dt)

    def f_branch(i):
        dt = rungs[i]

        def br(x, args_all, f_scale):
            args = args_all[i]
            return fun(x.astype(dt), *args).astype(top_dt)

        return br

    def fj_branch(i):
        dt = rungs[i]
        wt = _promote(dt)

        def br(x, args_all, f_scale):
            args = args_all[i]
            xr = x.astype(dt)
            if callable(cfg.jac):
                f = fun(xr, *args)
                J = cfg.jac(xr, *args)
            else:
                def both(z):
                    out = fun(z, *args)
                    return out, out

                jf = jax.jacfwd if cfg.jac == "fwd" else jax.jacrev
                J, f = jf(both, has_aux=True)(xr)
            f = f.astype(wt)
            J = jnp.asarray(J).astype(wt)
            fs, Js = scale_for_robust_loss(loss, f, J, jnp.asarray(f_scale, wt))
            R, qtf = _factor(Js, fs, cfg.linear_solver)
            jok = jnp.all(jnp.isfinite(R)) & jnp.all(jnp.isfinite(qtf))
            # ||f|| for MINPACK's gtol cosine; sqrt(2 cost) with a robust loss (the
            # rescaled residual can be huge where rho'' < 0).
            fnorm = jnp.sqrt(2.0 * robust_cost(loss, f, jnp.asarray(f_scale, wt)))
            return (f.astype(top_dt), R.astype(top_dt), qtf.astype(top_dt),
                    fnorm.astype(top_dt), jok)

        return br

    f_branches = [f_branch(i) for i in range(nr)]
    fj_branches = [fj_branch(i) for i in range(nr)]

    def eval_f(rung, x, args_all, f_scale):
        if nr == 1:
            return f_branches[0](x, args_all, f_scale)
        return lax.switch(rung, f_branches, x, args_all, f_scale)

    def eval_fj(rung, x, args_all, f_scale):
        if nr == 1:
            return fj_branches[0](x, args_all, f_scale)
        return lax.switch(rung, fj_branches, x, args_all, f_scale)

    def colnorms(R):
        return jnp.sqrt(jnp.sum(R * R, axis=0))

    def run(x0, args_all, lb, ub, scale_inv0, f_scale, ftol, xtol, gtol):
        f_scale = jnp.asarray(f_scale, top_dt)
        f0, R0, qtf0, fsn0, jok0 = fj_branches[0](x0, args_all, f_scale)
        cost0 = robust_cost(loss, f0, f_scale)
        if cfg.jac_scale:
            cn = colnorms(R0)
            scale_inv = jnp.where(jnp.isfinite(cn) & (cn > 0), cn, 1.0)
        else:
            scale_inv = scale_inv0
        g0 = R0.T @ qtf0
        Delta0 = delta0_fn(x0, scale_inv, g0, lb, ub)
        sched0 = cfg.schedule.init(_ladder(rungs)) if cfg.schedule is not None else None
        zi = jnp.zeros((), jnp.int32)
        st = _State(
            x=x0, f=f0, cost=cost0, R=R0, qtf=qtf0, fsn=fsn0,
            ok=jok0 & jnp.isfinite(cost0), scale_inv=scale_inv, Delta=Delta0,
            alpha=jnp.zeros((), top_dt), rung=zi, escalations=zi, nfev=zi + 1,
            njev=zi + 1, nit=zi, status=zi + Status.RUNNING, consec_rej=zi, top_steps=zi,
            rung_entered=jnp.full((nr,), -1, jnp.int32).at[0].set(0),
            rung_nfev=jnp.zeros((nr,), jnp.int32).at[0].set(1),
            esc_reason=jnp.zeros((nr,), jnp.int32), sched=sched0)

        def body(st: _State) -> _State:
            on_top = st.rung == top
            g = st.R.T @ st.qtf
            gnorm = gnorm_fn(st.x, g, st.R, st.fsn, lb, ub)
            gtol_hit = st.ok & (gnorm < gtol)
            step = step_fn(st.x, st.R, st.qtf, g, st.scale_inv, st.Delta, st.alpha, lb, ub)
            x_t = step.x_new
            f_t = eval_f(st.rung, x_t, args_all, f_scale)
            cost_t = robust_cost(loss, f_t, f_scale)
            finite_t = jnp.isfinite(cost_t) & jnp.all(jnp.isfinite(x_t))
            actual = st.cost - cost_t
            Delta_n, ratio = update_tr_radius(st.Delta, actual, step.predicted,
                                              step.step_norm, step.bound_hit)
            Delta_n = jnp.where(finite_t, Delta_n, 0.25 * step.step_norm)
            accepted = st.ok & finite_t & (actual > 0)
            xnorm = jnp.linalg.norm(st.x * st.scale_inv)
            dxn = jnp.linalg.norm((x_t - st.x) * st.scale_inv)
            code = check_termination_codes(actual, st.cost, dxn, xnorm, ratio, ftol, xtol)
            code = jnp.where(accepted, code, 0)
            # Rejected steps: MINPACK's test on the radius (no further progress possible).
            tiny = (~accepted) & st.ok & (Delta_n <= xtol * (xtol + xnorm))
            code = jnp.where(tiny & (code == 0) & finite_t, Status.XTOL, code)
            collapsed = tiny & ~finite_t
            conv = (code > 0) | gtol_hit
            # --- escalation decision
            consec = jnp.where(accepted, 0, st.consec_rej + 1)
            cond_est = step.s[0] / jnp.maximum(step.s[-1], jnp.finfo(top_dt).tiny)
            cond_bad = cond_est * us[st.rung] > cfg.cond_tol
            # A non-finite trial point first shrinks the radius; escalate when the current
            # point is bad or two trials in a row were non-finite.
            bad = (~st.ok) | collapsed | ((~finite_t) & (st.consec_rej >= 1))
            sched_n = st.sched
            sched_up = jnp.asarray(False)
            if cfg.schedule is not None:
                sched_n, sched_up = _consult_schedule(cfg.schedule, st, cost_t, actual,
                                                      accepted, bad, f_scale)
            reason = jnp.where(bad, 2, jnp.where(conv, 1, jnp.where(
                consec >= cfg.max_rejections, 3, jnp.where(cond_bad, 4, jnp.where(
                    sched_up, 5, 0)))))
            want_up = (~on_top) & (reason > 0)
            rung_n = jnp.where(want_up, st.rung + 1, st.rung)
            # --- (re-)evaluation after an accepted step or an escalation
            need = accepted | want_up
            x_e = jnp.where(accepted, x_t, st.x)

            def do_eval(_):
                return eval_fj(rung_n, x_e, args_all, f_scale)

            def keep(_):
                return st.f, st.R, st.qtf, st.fsn, st.ok

            f_e, R_e, qtf_e, fsn_e, jok_e = lax.cond(need, do_eval, keep, None)
            cost_e = jnp.where(need, robust_cost(loss, f_e, f_scale), st.cost)
            ok_e = jnp.where(need, jok_e & jnp.isfinite(cost_e), st.ok)
            if cfg.jac_scale:
                cn = colnorms(R_e)
                scale_inv_e = jnp.where(ok_e, jnp.maximum(
                    st.scale_inv, jnp.where(jnp.isfinite(cn), cn, 0.0)), st.scale_inv)
            else:
                scale_inv_e = st.scale_inv
            alpha_n = step.alpha * st.Delta / jnp.where(Delta_n > 0, Delta_n, 1.0)
            nit = st.nit + 1
            top_steps = st.top_steps + on_top.astype(jnp.int32)
            g_e = R_e.T @ qtf_e
            # A radius shrunk by rounding noise on the lower rung would make the first
            # steps on the new rung look converged: start the new rung afresh.
            Delta_n = jnp.where(want_up, delta0_fn(x_e, scale_inv_e, g_e, lb, ub), Delta_n)
            alpha_n = jnp.where(want_up, 0.0, alpha_n)
            # --- termination (only on the top rung, after a verifying step there)
            gtol_e = ok_e & (gnorm_fn(x_e, g_e, R_e, fsn_e, lb, ub) < gtol)
            status = jnp.asarray(Status.RUNNING, jnp.int32)
            status = jnp.where(on_top & (code > 0), code, status)
            status = jnp.where((rung_n == top) & (top_steps >= 1) & gtol_e & (code == 0),
                               Status.GTOL, status)
            status = jnp.where(on_top & collapsed, Status.NO_FINITE_STEP, status)
            status = jnp.where(on_top & ~st.ok, jnp.where(jnp.isfinite(st.cost),
                                                          Status.NONFINITE_JACOBIAN,
                                                          Status.NONFINITE_RESIDUAL), status)
            status = jnp.where((status == Status.RUNNING) & (nit >= cfg.max_steps),
                               Status.MAX_STEPS, status)
            nf = 1 + want_up.astype(jnp.int32)
            rung_nfev = st.rung_nfev.at[st.rung].add(1).at[rung_n].add(
                want_up.astype(jnp.int32))
            return _State(
                x=x_e, f=f_e, cost=cost_e, R=R_e, qtf=qtf_e, fsn=fsn_e, ok=ok_e,
                scale_inv=scale_inv_e, Delta=Delta_n, alpha=alpha_n, rung=rung_n,
                escalations=st.escalations + want_up.astype(jnp.int32),
                nfev=st.nfev + nf, njev=st.njev + need.astype(jnp.int32), nit=nit,
                status=status.astype(jnp.int32),
                consec_rej=jnp.where(want_up, 0, consec), top_steps=top_steps,
                rung_entered=jnp.where(want_up, st.rung_entered.at[rung_n].set(nit),
                                       st.rung_entered),
                rung_nfev=rung_nfev,
                esc_reason=jnp.where(want_up, st.esc_reason.at[rung_n].set(reason),
                                     st.esc_reason),
                sched=_sched_set_rung(sched_n, rung_n))

        return lax.while_loop(lambda s: s.status == Status.RUNNING, body, st)

    return run


def _ladder(rungs):
    from ..precision import Ladder

    return Ladder(list(rungs))


def _consult_schedule(schedule, st, cost_t, actual, accepted, bad, f_scale):
    from ..schedule import ScheduleStats  # consumed lazily: schedule sits above nlsq

    value = jnp.where(accepted, cost_t, st.cost)
    rel = jnp.where(accepted, actual, 0.0) / jnp.maximum(jnp.abs(st.cost),
                                                         jnp.finfo(st.cost.dtype).tiny)
    stats = ScheduleStats.make(value, step=st.nit, rel_decrease=rel, accepted=accepted,
                               guard_failures=bad.astype(jnp.int32),
                               scale=jnp.maximum(jnp.abs(st.cost),
                                                 jnp.finfo(st.cost.dtype).tiny))
    new = schedule.update(st.sched, stats)
    return new, new.rung > st.rung


def _sched_set_rung(sched, rung):
    if sched is None:
        return None
    import dataclasses

    return dataclasses.replace(sched, rung=jnp.asarray(rung, sched.rung.dtype))


def default_schedule():
    """``any_of(NoiseFloor(10), StallEscalation(1e-6, 3))``: climb when accepted steps
    decrease the cost by less than ``10 u cost`` or progress stalls for 3 steps."""
    from ..schedule import NoiseFloor, StallEscalation, any_of

    return any_of(NoiseFloor(factor=10.0), StallEscalation(rate=1e-6, patience=3))


_ = np
