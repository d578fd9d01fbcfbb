"""The adaptive trust-region solver of ``lm``, ``gn``, ``trf`` and ``dogbox``: one object
with ``init / step / terminate / postprocess`` (optimistix's shape), run by one loop
(:func:`iterate`); docs/architecture.md, "One solve", describes it whole.

A step is **propose** (the method's trust-region step from the factored model),
**evaluate** (residual and Jacobian once, at the trial point, on the current rung) and
**advance** (accept or reject, update the radius, decide on escalation and termination by
the rules of :mod:`._rules`). After an escalation, and at the start, the evaluation is at
the current point on the new rung (``pending``). The iterate and the model live in the top
dtype; only the evaluation runs on the rung. A lower rung never ends a solve.

Example:
    >>> import jax.numpy as jnp, numpy as np
    >>> from adaptprec.nlsq.solver import TrustRegion, iterate
    >>> from adaptprec.nlsq._state import Context, Options
    >>> f64 = np.dtype("float64")
    >>> opts = Options(n=1, rungs=(f64,), method="lm", loss="linear", jac="fwd",
    ...                jac_scale=True, has_bounds=False, max_steps=100,
    ...                linear_solver="qr", max_rejections=4, cond_tol=1e-2, schedule=None)
    >>> solver = TrustRegion(lambda x, t: x[0] * t - 2.0 * t, opts)
    >>> one = jnp.ones(1)
    >>> ctx = Context(((jnp.arange(3.0),),), -jnp.inf * one, jnp.inf * one, one, 1.0,
    ...               1e-10, 1e-10, 1e-10, one, 3)
    >>> st = iterate(solver, one, ctx)
    >>> round(float(st.x[0]), 8), int(st.status) > 0
    (2.0, True)
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from .. import guards
from .._backend import materialise
from .._status import Reason
from ..precision import Ladder, unit_roundoff
from . import _rules as rules
from ._callback import call_callback
from ._evaluate import evaluation_branches, final_evaluation, rung_blocks
from ._methods import method_fns
from ._step_schedule import consult_schedule, schedule_observes, set_schedule_rung
from ._state import Context, Evaluation, Kept, Options, Outputs, Proposal, Solution, State
from .common import (PORTFOLIO, SE_FRACTION, STATUS_MESSAGES, Status,
                     check_termination_codes, covariance, gram_covariance, jac_scale,
                     lower_rung_budget, update_tr_radius)
from .dogbox import dogbox_gnorm, on_bound
from .lm import at_noise_level, minpack_radius, optx_radius, verify_minimum
from .trf import active_constraints, cl_scaling

__all__ = ["TrustRegion", "iterate", "one_eval_gate", "lean_capable", "RESTART_RADIUS",
           "ONE_EVAL_MIN_M"]

#: The restart starts with this fraction of the first strategy's initial radius (its
#: failure says the full radius led astray).
RESTART_RADIUS = 0.01
#: The one-evaluation hand-off applies from this many residuals on (the normal-equation
#: fits); smaller problems iterate the top rung to its own tolerances, where NIST StRD's
#: certified digits are judged.
ONE_EVAL_MIN_M = 4096


def lean_capable(opts: Options) -> bool:
    """Whether a solve's last model describes its iterate well enough to give cost,
    gradient and covariance without a final evaluation: blocked (pointwise, normal
    equations), unbounded, the linear loss, no ``max_nfev``. Forming the ``m x n``
    Jacobian again costs as much as a float64 evaluation there."""
    return (opts.point_axes is not None and not opts.has_bounds and not opts.max_nfev
            and isinstance(opts.loss, str) and opts.loss == "linear")


def one_eval_gate(opts: Options) -> bool:
    """Whether a solve verifies the hand-off in one top-rung evaluation (static): a
    ladder, at least :data:`ONE_EVAL_MIN_M` residuals, no bounds, the linear loss."""
    return (len(opts.rungs) > 1 and opts.m >= ONE_EVAL_MIN_M and opts.m > opts.n
            and not opts.has_bounds and isinstance(opts.loss, str)
            and opts.loss == "linear")


class TrustRegion:
    """The solver for one residual and one set of static :class:`._state.Options`.

    ``fun(x, *args)`` maps a flat vector to a flat residual (``None`` when the caller
    evaluates, as the streamed loop does). Methods take the per-solve
    :class:`._state.Context`.
    """

    def __init__(self, fun, opts: Options):
        self.fun, self.opts = fun, opts
        rungs = opts.rungs
        self.top_dt = rungs[-1]
        self.top = len(rungs) - 1
        # NumPy, not jnp: the solver may be built under a user's trace
        self.us = np.asarray([unit_roundoff(d) for d in rungs], self.top_dt)
        self.share = lower_rung_budget(opts.max_steps, opts.n, len(rungs))
        self.portfolio = bool(opts.portfolio) and opts.method == "lm" and \
            not opts.has_bounds
        self.gate = one_eval_gate(opts)
        self.blocks = rung_blocks(opts)
        # R is triangular from a QR of [J f]; the Gram paths' R is not
        self.triangular = self.blocks is None and opts.linear_solver != "normal"
        self.branches = evaluation_branches(fun, opts) if fun is not None else None

    # ------------------------------------------------------------------ the four methods
    def init(self, x0, ctx: Context) -> State:
        """A state whose first step evaluates at ``x0`` (``pending``) on the schedule's
        first rung (the bottom one by default)."""
        opts, top_dt, n, nr = self.opts, self.top_dt, self.opts.n, len(self.opts.rungs)
        zi = jnp.zeros((), jnp.int32)
        sched0 = (opts.schedule.init(Ladder(list(opts.rungs)))
                  if opts.schedule is not None else None)
        r0 = zi if sched0 is None else jnp.clip(jnp.asarray(sched0.rung, jnp.int32), 0,
                                                  nr - 1)
        return State(
            x=x0, cost=jnp.asarray(jnp.inf, top_dt),
            R=jnp.zeros((n, n), top_dt), qtf=jnp.zeros((n,), top_dt),
            fsn=jnp.zeros((), top_dt), ok=jnp.asarray(False),
            scale_inv=jnp.zeros((n,), top_dt) if opts.jac_scale else ctx.scale_inv0,
            Delta=jnp.ones((), top_dt), alpha=jnp.zeros((), top_dt), rung=r0,
            escalations=zi, nfev=zi, njev=zi, nit=zi, status=zi + Status.RUNNING,
            consec_rej=zi, top_steps=zi, pending=jnp.asarray(True),
            rung_entered=jnp.full((nr,), -1, jnp.int32).at[r0].set(0),
            rung_nfev=jnp.zeros((nr,), jnp.int32), esc_reason=jnp.zeros((nr,), jnp.int32),
            noise_dx=jnp.asarray(jnp.inf, top_dt), confirmed=jnp.asarray(False),
            sched=sched0, strat=zi, strat_nit=zi,
            x0_norm=jnp.linalg.norm(x0).astype(top_dt),
            kept=Kept(x0, jnp.asarray(jnp.inf, top_dt), zi) if self.portfolio else None,
            gn_rate=jnp.full((3,), jnp.inf, top_dt) if self.gate else None)

    def step(self, st: State, ctx: Context) -> State:
        """propose, evaluate, advance."""
        prop = self.propose(st, ctx)
        return self.finish(self.advance(st, prop, self.evaluate(st.rung, prop.z, ctx), ctx))

    def terminate(self, st: State):
        return st.status != Status.RUNNING

    def postprocess(self, st: State, ctx: Context, x, args_top, f_scale,
                    outputs: Outputs) -> Solution:
        """The solve's outputs at ``x`` (the final iterate, differentiable in the data):
        the final evaluation on the top rung (residual, loss-scaled Jacobian, gradient,
        cost) and, when asked, the covariance ``(J^T J)^+`` of its Jacobian (rank
        threshold on the ``ctx.m`` real rows). A blocked fit that needs no residual
        (:meth:`is_lean`) reads cost, gradient and covariance off the loop's last model
        instead; ``model_holds`` says whether that model describes ``x``."""
        opts = self.opts
        active = self.active_mask(jax.lax.stop_gradient(st.x), ctx)
        f = Js = cov = holds = None
        if self.is_lean(outputs):
            R = jax.lax.stop_gradient(st.R)
            fast, cov = gram_covariance(R.T @ R, opts.m)
            holds = st.ok & (st.rung == self.top) & fast & jnp.isfinite(st.cost)
            if self.portfolio:
                holds = holds & (st.strat == 0)
            cost, g = st.cost, R.T @ st.qtf
        else:
            f, Js, g, cost = final_evaluation(self.fun, opts, x, args_top, f_scale)
            if outputs.covariance:
                cov = covariance(Js, m=ctx.m)
            if not outputs.fun_jac:
                f = Js = None
        if opts.has_bounds and opts.method == "dogbox":
            optimality = dogbox_gnorm(x, g, None, None, ctx.lb, ctx.ub)
        elif opts.has_bounds:
            v, _ = cl_scaling(x, g, ctx.lb, ctx.ub)
            optimality = jnp.max(jnp.abs(g * v))
        else:
            optimality = jnp.max(jnp.abs(g))
        if outputs.throw:
            x = _raise_on_failure(x, st.status)
        return Solution(x=x, cost=cost, fun=f, jac=Js, grad=g, optimality=optimality,
                        active_mask=active, nfev=st.nfev, njev=st.njev, nit=st.nit,
                        status=st.status, rung=st.rung, escalations=st.escalations,
                        rung_entered=st.rung_entered, rung_nfev=st.rung_nfev,
                        escalation_reason=st.esc_reason, cov=cov, model_holds=holds)

    def active_mask(self, x, ctx: Context):
        """scipy's ``active_mask``: -1 at a lower bound, +1 at an upper one, 0 free."""
        opts = self.opts
        if opts.has_bounds and opts.method == "dogbox":
            return on_bound(x, ctx.lb, ctx.ub)
        if opts.has_bounds:
            return active_constraints(x, ctx.lb, ctx.ub, ctx.xtol)
        return jnp.zeros(x.shape, jnp.int32)

    def is_lean(self, outputs: Outputs) -> bool:
        """Whether the outputs come from the loop's last model (:func:`lean_capable`,
        and no residual asked for)."""
        return not outputs.fun_jac and lean_capable(self.opts)

    def at_x0_only(self, x0, ctx: Context) -> State:
        """The state of a solve that ends at ``x0`` after its one evaluation, the final
        one on the top rung (scipy's ``max_nfev=1``)."""
        top = self.top
        st = self.init(x0, ctx)
        one = jnp.ones((), jnp.int32)
        return st._replace(
            status=jnp.asarray(Status.MAX_EVALUATIONS, jnp.int32), nfev=one, njev=one,
            rung=jnp.asarray(top, jnp.int32), pending=jnp.asarray(False),
            rung_entered=jnp.full_like(st.rung_entered, -1).at[top].set(0),
            rung_nfev=jnp.zeros_like(st.rung_nfev).at[top].set(1))

    # ------------------------------------------------------------------ the step's parts
    def propose(self, st: State, ctx: Context) -> Proposal:
        step_fn, gnorm_fn, _ = method_fns(self.opts.method, ctx.m, self.opts.tr)
        g = st.R.T @ st.qtf
        gtol_hit = st.ok & (gnorm_fn(st.x, g, st.R, st.fsn, ctx.lb, ctx.ub) < ctx.gtol)
        step = step_fn(st.x, st.R, st.qtf, g, st.scale_inv, st.Delta, st.alpha, ctx.lb,
                       ctx.ub)
        return Proposal(step, jnp.where(st.pending, st.x, step.x_new), gtol_hit)

    def evaluate(self, rung, z, ctx: Context) -> Evaluation:
        if len(self.branches) == 1:
            return self.branches[0](z, ctx.args, ctx.f_scale)
        return lax.switch(rung, self.branches, z, ctx.args, ctx.f_scale)

    def finish(self, st: State) -> State:
        """Honest success for an unbounded solve: the top rung's model must say
        "minimum" (:func:`.lm.verify_minimum`)."""
        if self.opts.has_bounds:
            return st
        return st._replace(status=verify_minimum(st.status, st.x, st.R, st.qtf, st.fsn))

    def advance(self, st: State, prop: Proposal, ev: Evaluation, ctx: Context) -> State:
        t = self._judge_step(st, prop, ev, ctx)
        esc = self._escalation(st, prop, ev, ctx, t)
        new = self._new_model(st, prop, ev, ctx, t, esc)
        return self._terminate_or_continue(st, prop, ev, ctx, t, esc, new)

    def _judge_step(self, st, prop, ev, ctx) -> dict:
        """Acceptance, the radius update and the convergence codes of the trial step."""
        opts, top = self.opts, self.top
        pending, on_top = st.pending, st.rung == top
        step, z = prop.step, prop.z
        finite_z = guards.finite_values((ev.cost, z)).ok
        actual = st.cost - ev.cost
        # a rung entered because the one below became unreliable (ILL_CONDITIONED) or
        # spent its share (BUDGET) continues that path: radius and LM parameter kept
        carried = (st.rung > 0) & ((st.esc_reason[st.rung] == Reason.ILL_CONDITIONED) |
                                   (st.esc_reason[st.rung] == Reason.BUDGET))
        if self.portfolio:
            carried = carried & (st.strat == 0)
        Delta_n, ratio = update_tr_radius(st.Delta, actual, step.predicted,
                                          step.step_norm, step.bound_hit)
        if opts.method == "lm":
            # MINPACK: on a rung's first step the radius is first cut to the step length
            # (unless the path is carried from a rung that took steps)
            first = (st.rung_entered[st.rung] == st.nit) & ~(
                carried & (st.rung_nfev[jnp.maximum(st.rung - 1, 0)] > 2))
            Delta_n = minpack_radius(jnp.where(first, jnp.minimum(st.Delta, step.step_norm),
                                               st.Delta),
                                     ratio, step.step_norm, step.alpha,
                                     ev.cost > 100.0 * st.cost)
            if self.portfolio:
                Delta_n = jnp.where(st.strat == 1, optx_radius(st.Delta, ratio,
                                                               step.step_norm), Delta_n)
        Delta_n = jnp.where(finite_z, Delta_n, 0.25 * step.step_norm)
        accepted = (~pending) & st.ok & finite_z & (actual > 0)
        noise_scale = st.fsn * jnp.linalg.norm(st.R @ st.x)
        at_noise = rules.rounding_level(step.predicted, actual, st.cost, self.us[top],
                                        noise_scale, (st.escalations > 0) |
                                        opts.adaptive_stop)
        at_noise = on_top & (~pending) & st.ok & finite_z & at_noise
        accepted = accepted | at_noise
        # only rejections at the rung's rounding noise count towards escalation (radius
        # shrinking far from the solution does not) ...
        u_r = jnp.asarray(self.us)[st.rung]
        noisy = step.predicted <= 100.0 * u_r * jnp.abs(st.cost)
        # ... and, below the top, rejections whose rise is within the evaluation error
        noisy = noisy | ((~on_top) & (~accepted) & st.ok & finite_z & (
            actual >= -u_r * (jnp.abs(st.cost) + noise_scale)))
        consec = jnp.where(accepted & ~at_noise, 0, st.consec_rej + (
            noisy | ~finite_z).astype(jnp.int32))
        xnorm = jnp.linalg.norm(st.x * st.scale_inv)
        dxn = jnp.linalg.norm((z - st.x) * st.scale_inv)
        code = check_termination_codes(actual, st.cost, dxn, xnorm, ratio, ctx.ftol,
                                       ctx.xtol)
        code = jnp.where(accepted, code, 0)
        code, noise_stopped = rules.noise_stop(at_noise, code, consec, dxn, st.noise_dx)
        noise_dx_n = jnp.where(at_noise, dxn, jnp.where(accepted, jnp.inf, st.noise_dx))
        # rejected steps: MINPACK's test on the radius (no further progress possible)
        tiny = (~pending) & (~accepted) & st.ok & (Delta_n <= ctx.xtol * (ctx.xtol + xnorm))
        radius_xtol = tiny & (code == 0) & finite_z
        code = jnp.where(radius_xtol, Status.XTOL, code)
        return dict(finite_z=finite_z, ok_z=finite_z & ev.jac_ok, actual=actual,
                    carried=carried, Delta_n=Delta_n, accepted=accepted, at_noise=at_noise,
                    u_r=u_r, consec=consec, code=code, noise_stopped=noise_stopped,
                    noise_dx_n=noise_dx_n, radius_xtol=radius_xtol,
                    collapsed=tiny & ~finite_z, conv=(code > 0) | ((~pending) & prop.gtol_hit))

    def _escalation(self, st, prop, ev, ctx, t) -> dict:
        """Whether the rung is left, and why (one ``Reason``, ranked)."""
        opts, pending, on_top = self.opts, st.pending, st.rung == self.top
        cond = rules.conditioning_error(prop.step.s, st.fsn, jnp.linalg.norm(st.qtf),
                                        opts.linear_solver)
        cond_bad = (~pending) & ~guards.conditioned(cond, t["u_r"], opts.cond_tol).ok
        # a non-finite trial point first shrinks the radius; escalate when the current
        # point is bad or two trials in a row were non-finite
        bad = jnp.where(pending, ~t["ok_z"], (~st.ok) | t["collapsed"] |
                        ((~t["finite_z"]) & (st.consec_rej >= 1)))
        sched_n, sched_up = self._consult_schedule(st, ev, ctx, t, bad)
        reason = jnp.where(bad, Reason.NONFINITE, jnp.where(t["conv"], Reason.VERIFY, jnp.where(
            t["consec"] >= opts.max_rejections, Reason.REJECTED_STEPS, jnp.where(
                cond_bad, Reason.ILL_CONDITIONED, jnp.where(sched_up, Reason.SCHEDULE,
                                                            Reason.NONE))))).astype(jnp.int32)
        floor_hit = (~on_top) & (t["accepted"] | pending) & t["ok_z"] & rules.rounding_floor(
            ev.qtf, ev.cost, ev.fsn, ev.R, prop.z, t["u_r"])
        reason = jnp.where((reason == Reason.NONE) & floor_hit, Reason.VERIFY,
                           reason).astype(jnp.int32)
        # a lower rung never ends a solve: its share of the budget used, it escalates
        rung_steps = st.nit + (~pending).astype(jnp.int32) - st.rung_entered[st.rung]
        reason = jnp.where((reason == Reason.NONE) & (~pending) & (rung_steps >= self.share),
                           Reason.BUDGET, reason).astype(jnp.int32)
        want_up = (~on_top) & (reason > 0)
        # a step proposed by a model the conditioning test has just declared unreliable
        # is discarded: the rung above proposes its own, same point and radius
        discard = want_up & (reason == Reason.ILL_CONDITIONED)
        take = (t["accepted"] & ~discard) | pending
        take, want_up, discard, accepted = materialise(take, want_up, discard,
                                                       t["accepted"])
        return dict(reason=reason, want_up=want_up, discard=discard, take=take,
                    accepted=accepted, bad=bad, sched=sched_n,
                    rung_n=jnp.where(want_up, st.rung + 1, st.rung))

    def _consult_schedule(self, st, ev, ctx, t, bad):
        """The precision schedule sees accepted steps and guard failures (a rejected
        trial is radius adaptation, not a stall); ``(state, wants a higher rung)``."""
        schedule = self.opts.schedule
        if schedule is None:
            return st.sched, jnp.asarray(False)
        use = (~st.pending) & (t["accepted"] | bad)

        def consult():
            return consult_schedule(schedule, st, ev.cost, t["actual"], t["accepted"], bad)
        if schedule_observes(schedule):
            # a host observer must not see the updates the mask below discards
            sched_c, up = lax.cond(use & (st.status == Status.RUNNING), consult,
                                   lambda: (st.sched, jnp.asarray(False)))
        else:
            sched_c, up = consult()
        sched_n = jax.tree.map(lambda a, b: jnp.where(use, b, a), st.sched, sched_c)
        return sched_n, use & up

    def _new_model(self, st, prop, ev, ctx, t, esc) -> dict:
        """The state's point, model, scaling, radius and LM parameter after the step."""
        opts, top, pending = self.opts, self.top, st.pending
        take, z = esc["take"], prop.z
        _, _, delta0_fn = method_fns(opts.method, ctx.m, opts.tr)

        def pick(new, old):
            return jnp.where(take, new, old)

        gn_rate_n = st.gn_rate
        if self.gate:
            # the lower rung's Gauss-Newton steps in standard errors at the points it
            # takes: their ratio bounds how fast Gauss-Newton contracts here
            q_z = rules.se_steps(ev.qtf, ev.cost, opts.m, opts.n)
            prev = st.gn_rate[0]
            ratio_z = jnp.where(jnp.isfinite(prev) & (prev > 0), q_z / prev, jnp.inf)
            rec = (st.rung != top) & take & t["ok_z"] & jnp.isfinite(q_z)
            gn_rate_n = jnp.where(rec, jnp.stack([q_z, ratio_z, st.gn_rate[1]]), st.gn_rate)
        x_n = pick(z, st.x)
        R_n, qtf_n, fsn_n = pick(ev.R, st.R), pick(ev.qtf, st.qtf), pick(ev.fsn, st.fsn)
        cost_n = pick(ev.cost, st.cost)
        ok_n = jnp.where(take, t["ok_z"], st.ok)
        scale_inv_n = st.scale_inv
        if opts.jac_scale:   # column norms of R are those of J (used only where finite)
            scale_inv_n = jnp.where(take & t["ok_z"], jac_scale(ev.R, st.scale_inv),
                                    st.scale_inv)
        g_n = R_n.T @ qtf_n
        Delta_n, carried, step = t["Delta_n"], t["carried"], prop.step
        alpha_n = jnp.where(pending, jnp.where(carried, st.alpha, 0.0),
                            step.alpha * st.Delta / jnp.where(Delta_n > 0, Delta_n, 1.0))
        # a rung's first radius comes from its point, unless it continues the lower
        # rung's path (a radius shrunk by rounding noise would look converged)
        Delta0_n = delta0_fn(x_n, scale_inv_n, g_n, ctx.lb, ctx.ub)
        if self.portfolio:
            restart = (st.strat == 1) & (st.nit == st.strat_nit)
            Delta0_n = jnp.where(restart, RESTART_RADIUS * Delta0_n, Delta0_n)
        Delta_n = jnp.where(pending, jnp.where(carried, st.Delta, Delta0_n),
                            jnp.where(esc["discard"], st.Delta, Delta_n))
        alpha_n = jnp.where(esc["discard"], st.alpha, alpha_n)
        if self.gate:
            # a lower rung that converged hands over its point moved by its own last
            # Gauss-Newton step (within the radius): it stopped because the cost no
            # longer shows that step's decrease, not because its model lost it
            hand = esc["want_up"] & (esc["rung_n"] == top) & (
                esc["reason"] == Reason.VERIFY) & ok_n
            dl, pl = rules.gauss_newton_step(R_n, qtf_n, scale_inv_n)
            hand = hand & (pl <= Delta_n) & jnp.all(jnp.isfinite(dl))
            hand, = materialise(hand)
            x_n = jnp.where(hand, x_n + dl, x_n)
        return dict(x=x_n, R=R_n, qtf=qtf_n, fsn=fsn_n, cost=cost_n, ok=ok_n,
                    scale_inv=scale_inv_n, g=g_n, Delta=Delta_n, alpha=alpha_n,
                    gn_rate=gn_rate_n)

    def _one_evaluation_handoff(self, st, prop, ev, ctx, t, accepted, new, gtol_n):
        """The one-evaluation hand-off (:func:`._rules.one_eval_check`): the model
        updated to ``x + dx`` when the top rung accepts a lower rung's point."""
        opts, top = self.opts, self.top
        handoff = (st.rung == top) & (st.pending | accepted) & (st.escalations > 0) \
            & t["ok_z"] & (st.esc_reason[top] == Reason.VERIFY) & ~(st.pending & gtol_n)
        if self.portfolio:
            handoff = handoff & (st.strat == 0)
        z = prop.z
        dx, one_code = rules.one_eval_check(z, ev.R, ev.qtf, ev.cost, new["scale_inv"],
                                            ctx.ftol, ctx.xtol, opts.m, opts.n,
                                            jnp.max(st.gn_rate[1:]), SE_FRACTION)
        one_eval, = materialise(handoff & (one_code > 0))
        new = dict(new, x=jnp.where(one_eval, z + dx, new["x"]))
        # the model moved with it (Gauss-Newton's linear model at z + dx), so cost, R
        # and qtf describe the returned x
        cost_n = jnp.where(one_eval, jnp.maximum(
            ev.cost - 0.5 * jnp.sum(ev.qtf * ev.qtf) + 0.5 * jnp.sum(
                (ev.qtf + ev.R @ dx) ** 2), 0.0), new["cost"])
        qtf_n = jnp.where(one_eval, ev.qtf + ev.R @ dx, new["qtf"])
        return dict(new, cost=cost_n, qtf=qtf_n,
                    fsn=jnp.where(one_eval, jnp.sqrt(2.0 * cost_n), new["fsn"])), \
            one_eval, one_code

    def _terminate_or_continue(self, st, prop, ev, ctx, t, esc, new) -> State:
        """The status after the step (only the top rung ends a solve) and the next state."""
        opts, top, pending = self.opts, self.top, st.pending
        on_top = st.rung == top
        want_up, rung_n = esc["want_up"], esc["rung_n"]
        _, gnorm_fn, _ = method_fns(opts.method, ctx.m, opts.tr)
        nit = st.nit + (~pending).astype(jnp.int32)
        top_steps = st.top_steps + ((~pending) & on_top).astype(jnp.int32)
        gtol_n = new["ok"] & (gnorm_fn(new["x"], new["g"], new["R"], new["fsn"], ctx.lb,
                                       ctx.ub) < ctx.gtol)
        one_eval = jnp.asarray(False)
        if self.gate:
            new, one_eval, one_code = self._one_evaluation_handoff(
                st, prop, ev, ctx, t, esc["accepted"], new, gtol_n)
            nit = nit + one_eval.astype(jnp.int32)
            top_steps = top_steps + one_eval.astype(jnp.int32)
        code = t["code"]
        status = jnp.asarray(Status.RUNNING, jnp.int32)
        status = jnp.where(on_top & (code > 0), code, status)
        # scipy tests the gradient before the step: a point that already meets gtol ends
        # on gtol, not on the radius collapse of a rejected step from it
        status = jnp.where(on_top & (~want_up) & (top_steps >= 1) & gtol_n &
                           ((code == 0) | t["radius_xtol"]), Status.GTOL, status)
        status = jnp.where(on_top & pending & gtol_n, Status.GTOL, status)
        if self.gate:
            status = jnp.where(one_eval, one_code, status)
        converged = (status >= Status.GTOL) & (status <= Status.FTOL_XTOL)
        defer = rules.confirming_step(converged, on_top, (st.escalations > 0) |
                                      opts.adaptive_stop, st.confirmed,
                                      t["at_noise"] & t["noise_stopped"], nit,
                                      opts.max_steps, pending & gtol_n) & ~one_eval
        if opts.max_nfev:
            defer = defer & (st.nfev + 1 < opts.max_nfev)
        status = jnp.where(defer, Status.RUNNING, status)
        status = jnp.where(on_top & t["collapsed"], Status.NO_FINITE_STEP, status)
        cur_bad = jnp.where(pending, ~t["ok_z"], ~st.ok)
        cur_cost = jnp.where(pending, ev.cost, st.cost)
        status = jnp.where(on_top & cur_bad,
                           jnp.where(jnp.isfinite(cur_cost), Status.NONFINITE_JACOBIAN,
                                     Status.NONFINITE_RESIDUAL), status)
        used = nit - st.strat_nit if opts.portfolio == 2 else nit
        exhausted = rules.out_of_steps(status == Status.RUNNING, on_top, top_steps, used,
                                       opts.max_steps)
        status = jnp.where(exhausted, Status.MAX_STEPS, status)
        if opts.callback is not None:
            stop = call_callback(opts.callback, new["x"], nit, st.nfev + 1, new["cost"],
                                 (esc["accepted"] & ~want_up) | one_eval)
            status = jnp.where((status == Status.RUNNING) & stop, Status.CALLBACK_STOP,
                               status)
        if opts.max_nfev:
            status = jnp.where((status == Status.RUNNING) & (st.nfev + 1 >= opts.max_nfev),
                               Status.MAX_EVALUATIONS, status)
        status, new, switch, strat = self._portfolio(st, ctx, t, want_up, status, new,
                                                     exhausted, nit)
        one = jnp.ones((), jnp.int32)
        restart = want_up | pending | switch
        return State(
            x=new["x"], cost=new["cost"], R=new["R"], qtf=new["qtf"], fsn=new["fsn"],
            ok=new["ok"], scale_inv=new["scale_inv"], Delta=new["Delta"],
            alpha=new["alpha"], rung=rung_n,
            escalations=st.escalations + want_up.astype(jnp.int32),
            nfev=st.nfev + one, njev=st.njev + one, nit=nit,
            status=status.astype(jnp.int32),
            consec_rej=jnp.where(restart, 0, t["consec"]), top_steps=top_steps,
            pending=want_up | switch,
            rung_entered=jnp.where(want_up, st.rung_entered.at[rung_n].set(nit),
                                   st.rung_entered),
            rung_nfev=st.rung_nfev.at[st.rung].add(1),
            noise_dx=jnp.where(restart, jnp.inf, t["noise_dx_n"]).astype(self.top_dt),
            confirmed=st.confirmed | defer,
            esc_reason=jnp.where(want_up, st.esc_reason.at[rung_n].set(esc["reason"]),
                                 st.esc_reason),
            sched=set_schedule_rung(esc["sched"], rung_n),
            strat=strat[0], strat_nit=strat[1], kept=strat[2], x0_norm=st.x0_norm,
            gn_rate=new["gn_rate"])

    def _portfolio(self, st, ctx, t, want_up, status, new, exhausted, nit):
        """``lm``'s portfolio (:data:`PORTFOLIO`): the first strategy failed on the top
        rung -> keep its end and restart from ``x0`` with the second; when the second
        ends, return the lower-cost end of the two. A convergence reached only by
        running off is not a success."""
        strat = (st.strat, st.strat_nit, st.kept)
        if not self.portfolio:
            return status, new, jnp.asarray(False), strat
        opts, on_top = self.opts, st.rung == self.top
        x_n, R_n, fsn_n, cost_n = new["x"], new["R"], new["fsn"], new["cost"]
        run_off = rules.runaway(status, x_n, st.x0_norm, R_n, fsn_n, self.triangular) & \
            ~at_noise_level(x_n, R_n, fsn_n)
        failed = (status == Status.NO_FINITE_STEP) | run_off
        if opts.portfolio == 2:   # a budget of its own for the second strategy
            failed = failed | exhausted
        if opts.max_nfev:         # scipy's max_nfev caps the whole solve
            failed = failed & (st.nfev + 1 < opts.max_nfev)
        switch = (st.strat == 0) & on_top & (~want_up) & failed
        switch, run_off = materialise(switch, run_off)
        kept_n = jax.tree.map(lambda a, b: jnp.where(switch, b, a), st.kept,
                              Kept(x_n, cost_n, jnp.where(run_off, Status.RUNAWAY,
                                                          status).astype(jnp.int32)))
        x_n = jnp.where(switch, ctx.x0, x_n)
        scale_inv_n = new["scale_inv"]
        if opts.jac_scale:
            scale_inv_n = jnp.where(switch, 0.0, scale_inv_n)
        status = jnp.where(switch, Status.RUNNING, status)
        k = st.kept
        ended = (st.strat == 1) & (status != Status.RUNNING)
        back = ended & ~(cost_n < k.cost)
        ended, back = materialise(ended, back)
        x_n = jnp.where(back, k.x, x_n)
        cost_n = jnp.where(back, k.cost, cost_n)
        status = jnp.where(back, k.status, jnp.where(ended & run_off, Status.RUNAWAY, status))
        strat = (jnp.where(switch, 1, st.strat).astype(jnp.int32),
                 jnp.where(switch, nit, st.strat_nit).astype(jnp.int32), kept_n)
        return status, dict(new, x=x_n, cost=cost_n, scale_inv=scale_inv_n), switch, strat


def iterate(solver: TrustRegion, x0, ctx: Context) -> State:
    """The one loop: ``init``, then ``step`` until ``terminate`` (``postprocess`` is the
    caller's: it needs the iterate made differentiable, :mod:`._programs`)."""
    return lax.while_loop(lambda s: ~solver.terminate(s), lambda s: solver.step(s, ctx),
                          solver.init(x0, ctx))


def _raise_on_failure(x, status):
    """``x``, raising inside the program (``equinox.branched_error_if``) when ``status``
    is not a success: ``throw=True``."""
    import equinox as eqx  # only here: its import is slow

    codes = sorted(k for k in STATUS_MESSAGES if k <= 0)
    idx = jnp.searchsorted(jnp.asarray(codes), jnp.minimum(status, 0))
    return eqx.branched_error_if(
        x, status <= 0, idx,
        [f"solve_nlsq failed (status {c}): {STATUS_MESSAGES[c]}" for c in codes])
