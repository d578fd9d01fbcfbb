"""The adaptive trust-region driver shared by ``lm``, ``gn`` and ``trf``.

One ``lax.while_loop``; each iteration proposes a step from the factored model, evaluates
residual and Jacobian once, at the trial point, on the current rung (``lax.switch`` over
the ladder), accepts or rejects it, and decides whether to escalate. After an escalation
(and at the start) the iteration instead evaluates at the current point on the new rung
(``pending``). So the residual is traced once per rung (plus once for the final result):
compile time is a user-visible cost. Iterate and model are kept in the top dtype; only
residual/Jacobian evaluation runs on the rung (Jacobian-vector products and the QR /
normal equations in the rung's dtype promoted to at least float32).

Escalation (rung ``r`` below the top) when: the termination test fires on ``r``, or the
Gauss-Newton decrease left at the rung's point is below ``LOWER_RESOLVE_FACTOR`` times
the rung's evaluation error of the cost (both ``VERIFY``: the rung has converged as far
as it can resolve), a residual or Jacobian is non-finite, ``max_rejections`` consecutive
steps are rejected, the rung's Gauss-Newton step error (Wedin's bound
``u_r (2 kappa / cos(theta) + kappa^2 tan(theta))``, ``kappa`` the scaled Jacobian's
condition number, ``theta`` the angle between residual and range) exceeds ``cond_tol``
(the step it proposed is discarded and the rung above continues with the same radius),
the precision schedule asks for it (stall / noise floor), or the rung has used its share
of the budget (:func:`.common.lower_rung_budget`; the rung above continues the path,
radius included). A lower rung never ends a solve: ``max_steps`` ends it only on the top
rung, and after an escalation the top rung confirms its first convergence test with one
more step.

Large fits (issue 31; :func:`one_eval_gate`: a ladder, ``m >=`` :data:`ONE_EVAL_MIN_M`, no
bounds, the linear loss) verify the hand-off instead of iterating float64 to its own
tolerances: a lower rung that converged (``VERIFY``) hands over its point moved by its own
last Gauss-Newton step; at the top rung's evaluation there (and after each accepted
top-rung step) the Gauss-Newton step is taken and the solve ends when it is within
:data:`SE_FRACTION` of every standard error or meets ``ftol``/``xtol``, or is within
:data:`SE_TAKEN` and the lower rung measured Gauss-Newton contracting enough that the step
taken leaves a tenth of :data:`SE_FRACTION` (:func:`_one_eval_check`; no confirming step).
The lower rung's blocked model is moved from its rounded point back to ``x``. The
criterion, in docs/nlsq.md: the parameters agree with float64 alone's within a thousandth of their standard errors.
Smaller problems compile and run exactly as before (NIST StRD bit for bit).
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from .. import guards
from ..precision import Ladder, unit_roundoff
from .._status import Reason
from .common import Status, check_termination_codes, jac_scale, robust_cost
from .common import SE_FRACTION, lower_rung_budget, scale_for_robust_loss, update_tr_radius
from ._blocks import TARGET_BLOCK, PointBlocks, block_size
from .lm import minpack_radius, optx_radius, rounding_level_step, verify_minimum
from .lm import RUNAWAY_FACTOR, at_noise_level, flat_direction
from ._callback import call_callback
from ._factor import _factor, _factor_gram, _promote
from ._state import LoopConfig, Proposal, _Kept, _State
from ._step_schedule import _consult_schedule, _observes, _sched_set_rung, default_schedule

__all__ = ["LoopConfig", "Proposal", "build_loop", "default_schedule", "one_eval_gate"]

#: Rounding-level steps in a row on the top rung before the solve may end (ftol) ...
NOISE_STEPS = 3
#: ... which it does once they stop contracting (``||D dx|| >= NOISE_CONTRACTION`` times
#: the previous one: the steps are rounding noise) or after ``NOISE_STEPS_MAX`` of them.
#: On a large-residual problem Gauss–Newton converges only linearly, and below the cost's
#: rounding level the steps still shrink geometrically (NIST ENSO: by 0.64 per step, with
#: the last parameter at 6.6 digits after 3 of them; optimistix reaches 7.4 and 8.2).
NOISE_CONTRACTION = 0.9
NOISE_STEPS_MAX = 20
#: (issue 15) A rung below the top escalates once the Gauss-Newton decrease left at its
#: point is below this multiple of its evaluation error of the cost (see ``advance``).
LOWER_RESOLVE_FACTOR = 10.0
#: (issue 15) After an escalation, a top-rung step predicted to gain at most this many
#: times the cost's evaluation error, and whose cost rose by less, is taken as a
#: rounding-level step (see ``advance``).
POST_ESCALATION_NOISE = 10.0
#: Portfolio (issue 15): when ``lm``'s default strategy (MINPACK's radius update) fails --
#: its ``max_steps`` used up, a stop that :func:`.lm.verify_minimum` rejects, no finite
#: step, or a convergence test met with the parameters run off (``||x|| > RUNAWAY_FACTOR
#: ||x0||``: the model flattens, a "minimum" at infinity) -- the top rung restarts from
#: ``x0`` with optimistix's trust-region constants (:func:`.lm.optx_radius`; it replaced
#: scipy's ``trf`` rule: at sweep seed 0 it also solves MGH09 p3, at seed 1 MGH17 p3,
#: and loses no row), and the lower-cost of the two ends is returned. With the default ``max_steps`` each
#: strategy has that budget; an explicit ``max_steps`` caps the whole solve (the second
#: strategy gets what is left). ``solve_nlsq`` copies it into ``LoopConfig.portfolio``
#: (a cache key): set it to ``False`` to measure without the portfolio.
PORTFOLIO = True
#: The portfolio's restart from ``x0`` starts with this fraction of the first strategy's
#: initial radius (its failure says the full radius led astray): at sweep seed 1 it also
#: solves MGH09 p2, seeds 0 and 2 unchanged (docs/nlsq.md).
RESTART_RADIUS = 0.01
#: (issue 31) The hand-off verified in ONE top-rung evaluation (see ``advance``): from
#: this many residuals on (the normal-equation fits, ``common._NORMAL_EQ_MIN_M``), an
#: unbounded fit with the linear loss whose lower rung converged is accepted at a top-rung
#: evaluation (its first, or after an accepted step) when its Gauss-Newton step there is
#: at most ``SE_FRACTION`` of every parameter's standard error (:func:`one_eval_gate`,
#: :func:`_one_eval_check`). Smaller problems keep iterating on the top rung:
#: there the answer is judged to full float64 accuracy (NIST StRD's certified values
#: carry 10-11 digits, far below a thousandth of a standard error).
ONE_EVAL_MIN_M = 4096
#: ... or (issue 31, branch i31cf2) a Gauss-Newton step of at most this many standard
#: errors when the lower rung measured Gauss-Newton contracting fast enough that the
#: step, taken, leaves at most a tenth of ``SE_FRACTION`` (:func:`_one_eval_check`).
#: float32's own floor on the 1e6-point double exponential is ~1.1e-3 standard errors
#: (its ``exp``'s rounding errors correlate with the Jacobian), just above
#: ``SE_FRACTION``: without this rule float64 evaluated twice.
SE_TAKEN = 1e-2
#: (issue 31) Points per block on the rungs below the top (the top rung keeps
#: ``_blocks.TARGET_BLOCK``): a cheaper rung spends a larger share of its evaluation in
#: the scan's fixed cost per block, and 16384 float32 points (6 vectors: 384 KiB) still
#: sit in L2. 1e6-point double exponential, adaptive/f64 in one process, 21-31
#: interleaved rounds at load 4-6: 0.997 with 4000-point float32 blocks, 0.963 with
#: 8000; 8000 vs 15625 in two runs: 0.894 vs 0.822 and 1.003 vs 0.955. Measured again
#: with the final evaluation reused (branch i31cf2, 11 interleaved rounds, load 1.5,
#: whole curve_fit): float32 blocks of 8000 / 15625 / 31250 points 51.0 / 56.0 / 63.1
#: ms (float64 alone 63.4); the blocked evaluation alone, float32 8000 points 0.51-0.54
#: of float64's best (benchmarks/RESULTS.md). With a block's three reductions merged
#: into one Gram matrix of ``[J f]`` (branch i31cf4, ``fj_blocked_branch``), measured
#: again, whole curve_fit, medians of 41 interleaved rounds in one process, load 5.4-7.4,
#: adaptive/f64: float32 blocks of 8000 / 15625 / 31250 points 0.699 / 0.645 / 0.665,
#: 0.706 / 0.673 / -, 0.697 / 0.668 / 0.706 (min 39.8 / 37.0 / 39.1, 42.0 / 38.8 / -,
#: 33.6 / 34.9 / 36.9 ms): 15625 (64 blocks; 6 float32 vectors of a block: 375 KiB, in L2).
LOWER_RUNG_BLOCK = 4 * TARGET_BLOCK


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
    # NumPy, not jnp: build_loop may run under a user's trace and its closures are cached
    us = np.asarray([unit_roundoff(d) for d in rungs], top_dt)
    share = lower_rung_budget(cfg.max_steps, cfg.n, nr)
    portfolio = cfg.portfolio and cfg.method == "lm" and not cfg.has_bounds
    # (static: smaller problems compile the same step program as before, see ONE_EVAL_MIN_M)
    gate = one_eval_gate(cfg)

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
            jok = guards.finite_values((R, qtf)).ok
            # ||f|| for MINPACK's gtol cosine; sqrt(2 cost) with a robust loss (the
            # rescaled residual can be huge where rho'' < 0).
            fnorm = jnp.sqrt(2.0 * robust_cost(loss, f, jnp.asarray(f_scale, wt)))
            # Only O(n^2) leaves the branch: the m-vector residual stays inside.
            cost = robust_cost(loss, f.astype(top_dt), jnp.asarray(f_scale, top_dt))
            return (cost, R.astype(top_dt), qtf.astype(top_dt), fnorm.astype(top_dt), jok)

        return br

    def fj_blocked_branch(i):
        """As ``fj_branch`` for a pointwise residual: ``J^T J``, ``J^T f`` and the cost
        accumulated over blocks of points (:class:`._blocks.PointBlocks`), each block's
        residual and Jacobian (rows ``J^T``, no transposes) formed and consumed while in
        cache."""
        dt = rungs[i]
        wt = _promote(dt)
        # a lower rung with the linear loss: one Gram matrix per block, the model
        # moved back from the rounded point
        lower_linear = dt != top_dt and isinstance(loss, str) and loss == "linear"

        def br(x, args_all, f_scale):
            xr = x.astype(dt)
            fs_w = jnp.asarray(f_scale, wt)
            fs_top = jnp.asarray(f_scale, top_dt)

            def merged_block(carry, f, JT):
                # (issue 31, branch i31cf4) below the top rung, with the linear loss:
                # J^T J, J^T f and f^T f of the block from ONE Gram matrix of [J f]
                # ((n+1) x (n+1), in the rung's dtype), instead of three reductions (a
                # Gram matrix, a matrix-vector product, a float64 sum of squares): per
                # block one library call instead of three small kernels, the block's
                # sums then added in the top dtype as before. The block's f^T f in
                # float32 is off by ~1e-8 of the cost, far below float32's own error
                # in the cost (its residuals' rounding, ~u_32 (|cost| + ||f|| ||J x||)).
                # (One (n+1) x (n+1) sum carried: one addition per block, not three.)
                Z = jnp.concatenate([JT.astype(wt), f.astype(wt)[None, :]])
                return carry + (Z @ Z.T).astype(top_dt), None

            def block(carry, f, JT):
                A, b, cost = carry
                f, JT = f.astype(wt), JT.astype(wt)
                cost = cost + robust_cost(loss, f.astype(top_dt), fs_top)
                fs, Js = scale_for_robust_loss(loss, f, JT.T, fs_w)
                JTs = Js.T
                # (issue 31) each block's sums in the rung's dtype, their sum over the
                # blocks in the top dtype (5x5 per block: free): summed in float32, the
                # 250 block results of the 1e6-point double exponential left float32's
                # last Gauss-Newton step 4.8e-3 standard errors from float64's, 2.3e-3
                # summed in float64 (the rest: the data rounded to float32)
                return (A + (JTs @ JTs.T).astype(top_dt), b + (JTs @ fs).astype(top_dt),
                        cost), None

            init = (jnp.zeros((cfg.n, cfg.n), top_dt), jnp.zeros((cfg.n,), top_dt),
                    jnp.zeros((), top_dt))
            if lower_linear:
                n = cfg.n
                G, _ = rung_blocks[i].scan_rows(fun, xr, args_all[i], merged_block,
                                                jnp.zeros((n + 1, n + 1), top_dt))
                A, b, cost = G[:n, :n], G[:n, n], 0.5 * G[n, n]
            else:
                (A, b, cost), _ = rung_blocks[i].scan_rows(fun, xr, args_all[i], block, init)
            if lower_linear:
                # (issue 31) the model moved from the rounded point xr back to x
                # (f(x) ~ f(xr) + J (x - xr)): float32 holds a parameter only to 6e-8 of
                # its size, at 1e6 points ~1e-3 of its standard error, and without this
                # its last Gauss-Newton step aimed from xr (1e6-point double
                # exponential: handed over 1.3e-3 standard errors from float64's answer,
                # so float64 had to step once more)
                d = x - xr.astype(top_dt)
                Ad = A @ d
                cost = jnp.maximum(cost + b @ d + 0.5 * (d @ Ad), 0.0)
                b = b + Ad
            # (the n x n factorisation in the top dtype: free, and no rounding of the
            # summed A and b back to the rung)
            R, qtf = _factor_gram(A, b)
            jok = guards.finite_values((R, qtf)).ok
            fnorm = jnp.sqrt(2.0 * cost)
            return (cost, R.astype(top_dt), qtf.astype(top_dt), fnorm, jok)

        return br

    blocks = rung_blocks = None
    if cfg.point_axes is not None:
        blocks = PointBlocks(cfg.m, cfg.point_axes)
        # (issue 31) larger blocks below the top rung: LOWER_RUNG_BLOCK
        rung_blocks = [PointBlocks(cfg.m, cfg.point_axes, size=block_size(
            cfg.m, LOWER_RUNG_BLOCK)) for _ in rungs[:-1]] + [blocks]
        fj_branches = [fj_blocked_branch(i) for i in range(nr)]
    else:
        fj_branches = [fj_branch(i) for i in range(nr)]
    # R is upper triangular from a QR of [J f]; the Gram paths' R is not
    triangular = blocks is None and cfg.linear_solver != "normal"

    def eval_fj(rung, x, args_all, f_scale):
        if nr == 1:
            return fj_branches[0](x, args_all, f_scale)
        return lax.switch(rung, fj_branches, x, args_all, f_scale)

    def init(x0, ctx):
        """A state that evaluates residual and Jacobian at ``x0`` on the bottom rung in
        its first iteration (``pending``), so the loop holds the only copy of them."""
        args_all, lb, ub, scale_inv0, f_scale, ftol, xtol, gtol = ctx[:8]
        n = cfg.n
        zi = jnp.zeros((), jnp.int32)
        sched0 = cfg.schedule.init(Ladder(list(rungs))) if cfg.schedule is not None else None
        # the schedule's own starting rung (Fixed("f64") starts there, not on float32
        # and then escalating at its first consultation: newcomer audit 2)
        r0 = zi if sched0 is None else jnp.clip(jnp.asarray(sched0.rung, jnp.int32), 0,
                                                  nr - 1)
        return _State(
            x=x0, cost=jnp.asarray(jnp.inf, top_dt),
            R=jnp.zeros((n, n), top_dt), qtf=jnp.zeros((n,), top_dt),
            fsn=jnp.zeros((), top_dt), ok=jnp.asarray(False),
            scale_inv=jnp.zeros((n,), top_dt) if cfg.jac_scale else scale_inv0,
            Delta=jnp.ones((), top_dt), alpha=jnp.zeros((), top_dt), rung=r0,
            escalations=zi, nfev=zi, njev=zi, nit=zi, status=zi + Status.RUNNING,
            consec_rej=zi, top_steps=zi, pending=jnp.asarray(True),
            rung_entered=jnp.full((nr,), -1, jnp.int32).at[r0].set(0),
            rung_nfev=jnp.zeros((nr,), jnp.int32),
            esc_reason=jnp.zeros((nr,), jnp.int32),
            noise_dx=jnp.asarray(jnp.inf, top_dt), confirmed=jnp.asarray(False),
            sched=sched0,
            strat=zi, strat_nit=zi, x0_norm=jnp.linalg.norm(x0).astype(top_dt),
            kept=_Kept(x0, jnp.asarray(jnp.inf, top_dt), zi) if portfolio else None,
            gn_rate=jnp.full((3,), jnp.inf, top_dt) if gate else None)

    # One trust-region iteration = propose (model -> trial point z), one evaluation of
    # residual and Jacobian at z (eval_fj, the only part that depends on the residual),
    # advance (acceptance, radius, termination, escalation). The fused driver runs
    # ``body`` in a while_loop; the host driver (:mod:`._host`) compiles ``propose`` and
    # ``advance`` once, independently of the residual, and calls the evaluation between.
    def propose(st: _State, ctx) -> Proposal:
        args_all, lb, ub, scale_inv0, f_scale, ftol, xtol, gtol = ctx[:8]
        g = st.R.T @ st.qtf
        gnorm = gnorm_fn(st.x, g, st.R, st.fsn, lb, ub)
        gtol_hit = st.ok & (gnorm < gtol)
        step = step_fn(st.x, st.R, st.qtf, g, st.scale_inv, st.Delta, st.alpha, lb, ub)
        # One evaluation per iteration: at the trial point, or (pending: start or after an
        # escalation) at the current point on the current rung.
        z = jnp.where(st.pending, st.x, step.x_new)
        return Proposal(step, z, gtol_hit)

    def body(st: _State, ctx) -> _State:
        prop = propose(st, ctx)
        return advance(st, prop, eval_fj(st.rung, prop.z, ctx[0], ctx[4]), ctx)

    def advance(st: _State, prop: Proposal, ev, ctx) -> _State:
        args_all, lb, ub, scale_inv0, f_scale, ftol, xtol, gtol = ctx[:8]
        f_scale = jnp.asarray(f_scale, top_dt)
        pending = st.pending
        on_top = st.rung == top
        step, z, gtol_hit = prop
        cost_z, R_z, qtf_z, fsn_z, jok_z = ev
        finite_z = guards.finite_values((cost_z, z)).ok   # the trial point's evaluation
        ok_z = finite_z & jok_z
        # ---- trust-region bookkeeping for a real step
        actual = st.cost - cost_z
        # (issue 15) A rung entered because the lower one's steps became unreliable
        # (ILL_CONDITIONED: its path so far is sound) continues that path: it keeps the
        # radius and LM parameter instead of starting afresh from the point (a fresh
        # radius parts the path from float64 alone's: NIST Lanczos3 start 1 then crept
        # 52 evaluations where float64 alone needs 18 in all).
        carried = (st.rung > 0) & ((st.esc_reason[st.rung] == Reason.ILL_CONDITIONED) |
                                   (st.esc_reason[st.rung] == Reason.BUDGET))
        if portfolio:  # (the portfolio's restart from x0 starts afresh, not carried)
            carried = carried & (st.strat == 0)
        Delta_n, ratio = update_tr_radius(st.Delta, actual, step.predicted,
                                          step.step_norm, step.bound_hit)
        if cfg.method == "lm":  # MINPACK's radius update (see lm.minpack_radius)
            # MINPACK: on the first step (here: on each rung) the radius is first cut
            # to the step length, so a huge initial radius is not shrunk step by step.
            # (a carried radius is cut only if the rung below took no step but the
            # discarded one: then this is the solve's first step, as for float64 alone)
            first = (st.rung_entered[st.rung] == st.nit) & ~(
                carried & (st.rung_nfev[jnp.maximum(st.rung - 1, 0)] > 2))
            Delta_n = minpack_radius(jnp.where(first, jnp.minimum(st.Delta, step.step_norm),
                                               st.Delta),
                                     ratio, step.step_norm, step.alpha,
                                     cost_z > 100.0 * st.cost)
            if portfolio:  # the second strategy (PORTFOLIO): optimistix's constants
                Delta_n = jnp.where(st.strat == 1, optx_radius(st.Delta, ratio,
                                                               step.step_norm), Delta_n)
        Delta_n = jnp.where(finite_z, Delta_n, 0.25 * step.step_norm)
        accepted = (~pending) & st.ok & finite_z & (actual > 0)
        # On the top rung, steps whose predicted decrease is at the rounding level of the
        # cost cannot be judged by the cost: they are taken unless the cost rose beyond
        # its rounding error (Gauss-Newton corrections the cost can no longer see), and
        # after NOISE_STEPS of them in a row the solve ends (ftol), instead of shrinking
        # the radius until the xtol test fires short of the minimum. (The cost's evaluation
        # error scales with ``|cost| + ||f|| ||J x||``: the residual is a difference of
        # model and data of size ``||J x||``.)
        noise_scale = st.fsn * jnp.linalg.norm(st.R @ st.x)
        at_noise = rounding_level_step(step.predicted, actual, st.cost, us[top], noise_scale)
        # ---- (issue 15) after an escalation, the top rung judges "rounding level" by
        # the cost's evaluation error E = u (|cost| + ||f|| ||J x||), not by u |cost|:
        # it starts from a lower rung's converged point, where the cost is at its minimum
        # to ~1e-14 while x has ~7 digits, so the Gauss-Newton corrections left predict
        # decreases of ~E or below and their measured change is rounding noise of a few E
        # (Misra1b start 2: a step predicted to gain 6e-17 was rejected for a rise of
        # 4e-14 four times, until the radius collapsed and xtol stopped 2 digits short of
        # float64 alone). Such steps are taken (and stop by the NOISE_* rule below).
        cost_err = us[top] * (jnp.abs(st.cost) + noise_scale)
        at_noise = at_noise | (((st.escalations > 0) | cfg.adaptive_stop) & (
            step.predicted <= POST_ESCALATION_NOISE * cost_err) & (
            actual >= -POST_ESCALATION_NOISE * cost_err))
        at_noise = on_top & (~pending) & st.ok & finite_z & at_noise
        accepted = accepted | at_noise
        # Only rejections of steps whose predicted decrease is already at the rounding
        # noise of the rung count towards escalation; ordinary radius shrinking (a model
        # that is merely too optimistic far from the solution) does not.
        u_r = jnp.asarray(us)[st.rung]
        noisy = step.predicted <= 100.0 * u_r * jnp.abs(st.cost)
        # ... and, below the top, rejections whose cost rise is within the rung's
        # evaluation error: the rung is at its noise floor (without this a lower rung
        # there shrinks its radius ~20 times until its xtol fires: Lanczos1 start 2 spent
        # 33 float32 evaluations where float64 alone needs 9)
        noisy = noisy | ((~on_top) & (~accepted) & st.ok & finite_z & (
            actual >= -u_r * (jnp.abs(st.cost) + noise_scale)))
        consec = jnp.where(accepted & ~at_noise, 0, st.consec_rej + (
            noisy | ~finite_z).astype(jnp.int32))
        xnorm = jnp.linalg.norm(st.x * st.scale_inv)
        dxn = jnp.linalg.norm((z - st.x) * st.scale_inv)
        code = check_termination_codes(actual, st.cost, dxn, xnorm, ratio, ftol, xtol)
        code = jnp.where(accepted, code, 0)
        # (an ftol stop at the rounding level waits for the same NOISE_STEPS, and for the
        # steps to stop contracting: on a large-residual problem the cost stops moving
        # before the parameters do, and Gauss-Newton converges only linearly there)
        contracting = dxn < NOISE_CONTRACTION * st.noise_dx
        noise_stop = (consec >= NOISE_STEPS) & (~contracting | (consec >= NOISE_STEPS_MAX))
        code = jnp.where(at_noise & ((code == 0) | (code == Status.FTOL)),
                         jnp.where(noise_stop, Status.FTOL, 0), code)
        noise_dx_n = jnp.where(at_noise, dxn, jnp.where(accepted, jnp.inf, st.noise_dx))
        # Rejected steps: MINPACK's test on the radius (no further progress possible).
        tiny = (~pending) & (~accepted) & st.ok & (Delta_n <= xtol * (xtol + xnorm))
        radius_xtol = tiny & (code == 0) & finite_z
        code = jnp.where(radius_xtol, Status.XTOL, code)
        collapsed = tiny & ~finite_z
        conv = (code > 0) | ((~pending) & gtol_hit)
        tiny = jnp.finfo(top_dt).tiny
        kappa = step.s[0] / jnp.maximum(step.s[-1], tiny)
        # ---- (issue 15) the rung's Gauss-Newton step error: Wedin's bound for least
        # squares, u (2 kappa / cos(theta) + kappa^2 tan(theta)), theta the angle between
        # f and range(J) (||qtf|| = ||f|| cos(theta)). The second term is the residual's
        # amplification: NIST Bennett5 (kappa ~5e4, tan ~1e-4) gives float32 steps ~3%
        # off, enough for its path to part from float64's at the first marginal
        # acceptance (start 1: a valley float64 alone never enters, 363 evaluations vs 11).
        qn = jnp.linalg.norm(st.qtf)
        tan_t = jnp.sqrt(jnp.maximum(st.fsn * st.fsn - qn * qn, 0.0)) / jnp.maximum(qn, tiny)
        cond_est = 2.0 * kappa * st.fsn / jnp.maximum(qn, tiny) + kappa * kappa * tan_t
        cond_est = jnp.where(jnp.isfinite(cond_est), cond_est, jnp.inf)
        if cfg.linear_solver == "normal":  # the Gram matrix squares the condition
            cond_est = jnp.maximum(cond_est, kappa * kappa)
        cond_bad = (~pending) & ~guards.conditioned(cond_est, jnp.asarray(us)[st.rung],
                                                    cfg.cond_tol).ok
        # A non-finite trial point first shrinks the radius; escalate when the current
        # point is bad or two trials in a row were non-finite.
        bad = jnp.where(pending, ~ok_z, (~st.ok) | collapsed |
                        ((~finite_z) & (st.consec_rej >= 1)))
        sched_n = st.sched
        sched_up = jnp.asarray(False)
        if cfg.schedule is not None:
            # The schedule sees accepted steps and guard failures; a rejected trial in a
            # trust-region method is radius adaptation, not a stall.
            use = (~pending) & (accepted | bad)

            def consult():
                return _consult_schedule(cfg.schedule, st, cost_z, actual, accepted, bad,
                                         f_scale)
            if _observes(cfg.schedule):
                # a host observer (Callback, FitTrace) must not see the updates the mask
                # below discards (newcomer audit 2: a first "step" at cost inf, one per
                # rung entered, 9 calls for 6 iterations), nor the host driver's queued
                # iterations after the end; under vmap cond is a select
                sched_c, sched_up = lax.cond(
                    use & (st.status == Status.RUNNING), consult,
                    lambda: (st.sched, jnp.asarray(False)))
            else:
                sched_c, sched_up = consult()
            sched_n = jax.tree.map(lambda a, b: jnp.where(use, b, a), st.sched, sched_c)
            sched_up = use & sched_up
        reason = jnp.where(bad, Reason.NONFINITE, jnp.where(conv, Reason.VERIFY, jnp.where(
            consec >= cfg.max_rejections, Reason.REJECTED_STEPS, jnp.where(
                cond_bad, Reason.ILL_CONDITIONED, jnp.where(sched_up, Reason.SCHEDULE,
                                                            Reason.NONE))))).astype(jnp.int32)
        # ---- (issue 15) a lower rung at its resolution leaves at once
        # At a point just taken on a rung below the top (an accepted step, or the point
        # evaluated on arrival), the Gauss-Newton model there predicts the most the rung
        # can still gain: 0.5 ||qtf||^2. When that is below what the rung resolves of the
        # cost (its evaluation error, u_r (|cost| + ||f|| ||J x||), times
        # LOWER_RESOLVE_FACTOR), every further step on the rung is judged by rounding
        # noise (Misra1a start 2: 4 float32 rejections of the same step, then 4 more at
        # shrinking radii). Escalate from the new point, as for convergence (VERIFY).
        floor_hit = (~on_top) & (accepted | pending) & ok_z & (
            0.5 * jnp.sum(qtf_z * qtf_z) <= LOWER_RESOLVE_FACTOR * u_r * (
                jnp.abs(cost_z) + fsn_z * jnp.linalg.norm(R_z @ z)))
        reason = jnp.where((reason == Reason.NONE) & floor_hit, Reason.VERIFY,
                           reason).astype(jnp.int32)
        # A lower rung never ends a solve: its share of the budget used up, it escalates.
        rung_steps = st.nit + (~pending).astype(jnp.int32) - st.rung_entered[st.rung]
        reason = jnp.where((reason == Reason.NONE) & (~pending) & (rung_steps >= share),
                           Reason.BUDGET, reason).astype(jnp.int32)
        want_up = (~on_top) & (reason > 0)
        rung_n = jnp.where(want_up, st.rung + 1, st.rung)
        # ---- new model: after an accepted step or a (pending) evaluation
        # (issue 15) ... except a step proposed by a model the conditioning test has just
        # declared unreliable: the rung above proposes its own from the same point, with
        # the same radius (see ``carried``; NIST Bennett5 start 1: float32's first step,
        # 3% off, led into a valley float64 alone never enters).
        discard = want_up & (reason == Reason.ILL_CONDITIONED)
        take = (accepted & ~discard) | pending
        take, want_up, discard, accepted = _materialise(take, want_up, discard, accepted)

        def pick(new, old):
            return jnp.where(take, new, old)

        gn_rate_n = st.gn_rate
        if gate:
            # (issue 31) the lower rung's Gauss-Newton steps, in standard errors, at the
            # points it takes: their ratio measures how fast Gauss-Newton contracts here
            # (an upper bound: damped or radius-limited steps and the rung's rounding
            # only make it larger), for _one_eval_check's SE_TAKEN rule
            q_z = _se_steps(qtf_z, cost_z, cfg.m, cfg.n)
            prev = st.gn_rate[0]
            ratio_z = jnp.where(jnp.isfinite(prev) & (prev > 0), q_z / prev, jnp.inf)
            rec = (~on_top) & take & ok_z & jnp.isfinite(q_z)
            gn_rate_n = jnp.where(rec, jnp.stack([q_z, ratio_z, st.gn_rate[1]]),
                                  st.gn_rate)

        x_n = pick(z, st.x)
        R_n, qtf_n, fsn_n = pick(R_z, st.R), pick(qtf_z, st.qtf), pick(fsn_z, st.fsn)
        cost_n = pick(cost_z, st.cost)
        ok_n = jnp.where(take, ok_z, st.ok)
        if cfg.jac_scale:
            # column norms of R are those of J; only used when R_z is finite (ok_z)
            scale_inv_n = jnp.where(take & ok_z, jac_scale(R_z, st.scale_inv),
                                    st.scale_inv)
        else:
            scale_inv_n = st.scale_inv
        # (issue 15) A lower rung that used up its budget share hands its point, radius
        # and LM parameter to the rung above (``carried``), which continues the same path.
        # (It used to restart from x0, which made the share pure overhead: NIST Nelson,
        # where float32 tracks float64's path to 7 digits, took 80 evaluations where
        # float64 alone takes 49; the share's protection against a float32 path into a
        # valley float64 never enters, Bennett5, is now the conditioning test's.)
        g_n = R_n.T @ qtf_n
        alpha_n = jnp.where(pending, jnp.where(carried, st.alpha, 0.0),
                            step.alpha * st.Delta / jnp.where(Delta_n > 0, Delta_n, 1.0))
        # The first radius on a rung comes from the point (a radius shrunk by rounding
        # noise on the lower rung would make the next steps look converged), unless the
        # rung continues the lower one's path (``carried``).
        Delta0_n = delta0_fn(x_n, scale_inv_n, g_n, lb, ub)
        if portfolio:  # the restart's first evaluation (see RESTART_RADIUS)
            restart = (st.strat == 1) & (st.nit == st.strat_nit)
            Delta0_n = jnp.where(restart, RESTART_RADIUS * Delta0_n, Delta0_n)
        Delta_n = jnp.where(pending, jnp.where(carried, st.Delta, Delta0_n),
                            jnp.where(discard, st.Delta, Delta_n))
        alpha_n = jnp.where(discard, st.alpha, alpha_n)
        if gate:
            # (issue 31) A lower rung that converged hands the top rung its point moved by
            # its own last Gauss-Newton step (within its radius): the rung stopped
            # because it can no longer see that step's decrease in the cost, not because
            # its model lost the step (1e6-point double exponential: float32's point
            # 4.8e-3 standard errors from float64's answer, 1.6e-3 after the step; at
            # 1e5 points float64's first evaluation then passes the check).
            hand = want_up & (rung_n == top) & (reason == Reason.VERIFY) & ok_n
            dl, pl = _gauss_newton_step(R_n, qtf_n, scale_inv_n)
            hand = hand & (pl <= Delta_n) & jnp.all(jnp.isfinite(dl))
            hand, = _materialise(hand)
            x_n = jnp.where(hand, x_n + dl, x_n)
        nit = st.nit + (~pending).astype(jnp.int32)
        top_steps = st.top_steps + ((~pending) & on_top).astype(jnp.int32)
        # ---- termination (only on the top rung, after a verifying step there)
        gtol_n = ok_n & (gnorm_fn(x_n, g_n, R_n, fsn_n, lb, ub) < gtol)
        # ---- (issue 31) the hand-off verified in ONE top-rung evaluation (large fits,
        # ONE_EVAL_MIN_M): the lower rung converged (VERIFY) and the top rung has just
        # evaluated residual and Jacobian at its point. When the Gauss-Newton step there
        # passes _one_eval_check (within SE_FRACTION of every standard error, or the
        # top rung's own ftol/xtol), the step is taken without evaluating again and the
        # solve ends: iterating float64 to its own ftol cost two or three more float64
        # evaluations (a step, and the confirming step below) for digits far below the
        # fit's statistics. Otherwise the top rung iterates from the lower rung's point
        # as before (its first step is this Gauss-Newton step: the fresh radius holds it).
        one_eval = jnp.asarray(False)
        if gate:
            handoff = on_top & (pending | accepted) & (st.escalations > 0) & ok_z & (
                st.esc_reason[top] == Reason.VERIFY) & ~(pending & gtol_n)
            if portfolio:
                handoff = handoff & (st.strat == 0)
            dx, one_code = _one_eval_check(z, R_z, qtf_z, cost_z, scale_inv_n, ftol, xtol,
                                           cfg.m, cfg.n, jnp.max(st.gn_rate[1:]))
            one_eval = handoff & (one_code > 0)
            one_eval, = _materialise(one_eval)
            x_n = jnp.where(one_eval, z + dx, x_n)
            # ... and the model moved with it (Gauss-Newton's linear model at z + dx:
            # cost minus the decrease it predicts, qtf's part in J's range gone), so the
            # state's cost, R and qtf describe x (the fused driver's lean final reuses
            # them instead of evaluating again: the step is a thousandth of a standard
            # error, the model's error in the cost is second order in it)
            cost_n = jnp.where(one_eval, jnp.maximum(
                cost_z - 0.5 * jnp.sum(qtf_z * qtf_z) + 0.5 * jnp.sum(
                    (qtf_z + R_z @ dx) ** 2), 0.0), cost_n)
            qtf_n = jnp.where(one_eval, qtf_z + R_z @ dx, qtf_n)
            fsn_n = jnp.where(one_eval, jnp.sqrt(2.0 * cost_n), fsn_n)
            nit = nit + one_eval.astype(jnp.int32)
            top_steps = top_steps + one_eval.astype(jnp.int32)
        status = jnp.asarray(Status.RUNNING, jnp.int32)
        status = jnp.where(on_top & (code > 0), code, status)
        # scipy tests the gradient before the step: a point that already satisfies gtol
        # ends on gtol, not on the radius collapse of a rejected step from it
        status = jnp.where(on_top & (~want_up) & (top_steps >= 1) & gtol_n &
                           ((code == 0) | radius_xtol), Status.GTOL, status)
        # a point just evaluated on the top rung that already satisfies gtol ends the
        # solve there, as scipy's first test of each iteration does
        status = jnp.where(on_top & pending & gtol_n, Status.GTOL, status)
        if gate:
            status = jnp.where(one_eval, one_code, status)
        # ---- (issue 15) after an escalation the top rung confirms convergence with one
        # more step: its first steps start from a lower rung's converged point, and a
        # test met there (gtol after the first Gauss-Newton step, with the next one still
        # 1e3 times above the rounding level) stops a digit short of float64 alone, which
        # reaches the same test one step further along (NIST Misra1d, a perturbed start:
        # LRE 10.0 vs 11.0). The NOISE_* stop has confirmed itself already.
        converged = (status >= Status.GTOL) & (status <= Status.FTOL_XTOL)
        # (A point that satisfies gtol when first evaluated on the top rung ends there,
        # as scipy's first test of each iteration does: no step to confirm.)
        # (never into MAX_STEPS)
        defer = on_top & ((st.escalations > 0) | cfg.adaptive_stop) & ~st.confirmed & (
            converged) & ~(at_noise & noise_stop) & (nit < cfg.max_steps) & ~(
            pending & gtol_n) & ~one_eval
        if cfg.max_nfev:
            defer = defer & (st.nfev + 1 < cfg.max_nfev)
        status = jnp.where(defer, Status.RUNNING, status)
        status = jnp.where(on_top & collapsed, Status.NO_FINITE_STEP, status)
        cur_bad = jnp.where(pending, ~ok_z, ~st.ok)
        cur_cost = jnp.where(pending, cost_z, st.cost)
        status = jnp.where(on_top & cur_bad,
                           jnp.where(jnp.isfinite(cur_cost), Status.NONFINITE_JACOBIAN,
                                     Status.NONFINITE_RESIDUAL), status)
        # The budget ends the solve on the top rung only, after at least one step there.
        # (with portfolio=2 each strategy has max_steps of its own: nit - strat_nit)
        used = nit - st.strat_nit if cfg.portfolio == 2 else nit
        out_of_steps = ((status == Status.RUNNING) & on_top & (top_steps >= 1)
                        & (used >= cfg.max_steps))
        status = jnp.where(out_of_steps, Status.MAX_STEPS, status)
        if cfg.callback is not None:
            stop = call_callback(cfg.callback, x_n, nit, st.nfev + 1, cost_n,
                                 (accepted & ~want_up) | one_eval)
            status = jnp.where((status == Status.RUNNING) & stop, Status.CALLBACK_STOP,
                               status)
        if cfg.max_nfev:
            status = jnp.where((status == Status.RUNNING) & (st.nfev + 1 >= cfg.max_nfev),
                               Status.MAX_EVALUATIONS, status)
        # ---- portfolio (issue 15, see PORTFOLIO): the first strategy failed on the top
        # rung -> keep its end, restart from x0 with the second one (one loop, no second
        # compiled program); finish() returns the lower-cost end.
        switch = jnp.asarray(False)
        strat_n, strat_nit_n, kept_n = st.strat, st.strat_nit, st.kept
        if portfolio and len(ctx) > 8:
            # (a stop that verify_minimum rejects is not a trigger: testing it every
            # step tripled the step program's compile time, and no measured row needed it)
            x0 = ctx[8]
            # (a zero residual far out is a minimum: Box3D's line of them, (t, t, 0))
            runaway = _runaway(status, x_n, st.x0_norm, R_n, fsn_n, triangular) & ~at_noise_level(
                x_n, R_n, fsn_n)
            failed = (status == Status.NO_FINITE_STEP) | runaway
            if cfg.portfolio == 2:  # a budget of its own for the second strategy
                failed = failed | out_of_steps
            if cfg.max_nfev:  # scipy's max_nfev caps the whole solve
                failed = failed & (st.nfev + 1 < cfg.max_nfev)
            switch = (st.strat == 0) & on_top & (~want_up) & failed
            switch, runaway = _materialise(switch, runaway)
            kept_n = jax.tree.map(lambda a, b: jnp.where(switch, b, a), st.kept,
                                  _Kept(x_n, cost_n, jnp.where(runaway, Status.RUNAWAY,
                                                               status).astype(jnp.int32)))
            x_n = jnp.where(switch, x0, x_n)
            if cfg.jac_scale:
                scale_inv_n = jnp.where(switch, 0.0, scale_inv_n)
            status = jnp.where(switch, Status.RUNNING, status)
            # the second strategy ended: return the lower-cost end of the two (the kept
            # end is out of steps, without a finite step or run off: codes that
            # finish()'s verify_minimum leaves alone), and a convergence only by
            # running off is not a success (honest success)
            k = st.kept
            ended = (st.strat == 1) & (status != Status.RUNNING)
            back = ended & ~(cost_n < k.cost)
            ended, back = _materialise(ended, back)
            x_n = jnp.where(back, k.x, x_n)
            cost_n = jnp.where(back, k.cost, cost_n)
            status = jnp.where(back, k.status,
                               jnp.where(ended & runaway, Status.RUNAWAY, status))
            strat_n = jnp.where(switch, 1, st.strat).astype(jnp.int32)
            strat_nit_n = jnp.where(switch, nit, st.strat_nit).astype(jnp.int32)
        one = jnp.ones((), jnp.int32)
        return _State(
            x=x_n, cost=cost_n, R=R_n, qtf=qtf_n, fsn=fsn_n, ok=ok_n,
            scale_inv=scale_inv_n, Delta=Delta_n, alpha=alpha_n, rung=rung_n,
            escalations=st.escalations + want_up.astype(jnp.int32),
            nfev=st.nfev + one, njev=st.njev + one, nit=nit,
            status=status.astype(jnp.int32),
            consec_rej=jnp.where(want_up | pending | switch, 0, consec),
            top_steps=top_steps, pending=want_up | switch,
            rung_entered=jnp.where(want_up, st.rung_entered.at[rung_n].set(nit),
                                   st.rung_entered),
            rung_nfev=st.rung_nfev.at[st.rung].add(1),
            noise_dx=jnp.where(want_up | pending | switch, jnp.inf,
                               noise_dx_n).astype(top_dt),
            confirmed=st.confirmed | defer,
            esc_reason=jnp.where(want_up, st.esc_reason.at[rung_n].set(reason),
                                 st.esc_reason),
            sched=_sched_set_rung(sched_n, rung_n),
            strat=strat_n, strat_nit=strat_nit_n, kept=kept_n, x0_norm=st.x0_norm,
            gn_rate=gn_rate_n)

    def run(x0, args_all, lb, ub, scale_inv0, f_scale, ftol, xtol, gtol):
        if blocks is not None:  # once, outside the loop: data split into blocks
            args_all = tuple(b.block(a) for b, a in zip(rung_blocks, args_all))
        ctx = (args_all, lb, ub, scale_inv0, f_scale, ftol, xtol, gtol, x0)
        st = lax.while_loop(lambda s: s.status == Status.RUNNING,
                            lambda s: body(s, ctx), init(x0, ctx))
        return finish(st)

    def finish(st: _State) -> _State:
        """Honest success (unbounded solves): the top rung's model must say "minimum"."""
        if cfg.has_bounds:
            return st
        # (the portfolio's choice of end happens in ``advance``: finish runs inside the
        # host driver's step program, and two selections there cost compile time)
        return st._replace(status=verify_minimum(st.status, st.x, st.R, st.qtf, st.fsn))

    run.init = init
    run.body = body
    run.propose = propose
    run.advance = advance
    run.finish = finish
    run.fj_branches = fj_branches
    run.blocks = blocks
    return run


def one_eval_gate(cfg: LoopConfig) -> bool:
    """Whether a solve verifies the hand-off in one top-rung evaluation (static): a
    ladder, at least :data:`ONE_EVAL_MIN_M` residuals, no bounds, the linear loss."""
    return (len(cfg.rungs) > 1 and cfg.m >= ONE_EVAL_MIN_M and cfg.m > cfg.n
            and not cfg.has_bounds and isinstance(cfg.loss, str) and cfg.loss == "linear")


def _gauss_newton_step(R, qtf, scale_inv):
    """The Gauss-Newton step ``dx`` of the model ``(R, qtf)`` (minimum-norm on its
    numerical range) and its norm ``||p||`` in the scaled variables of
    :func:`.lm.lm_step` (``dx = p / scale_inv``)."""
    d = 1.0 / scale_inv
    U, s, VT = jnp.linalg.svd(R * d[None, :], full_matrices=False)
    keep = s > jnp.finfo(s.dtype).eps * s.shape[0] * s[0]
    p = -VT.T @ jnp.where(keep, (U.T @ qtf) / jnp.where(keep, s, 1.0), 0.0)
    return d * p, jnp.linalg.norm(p)


def _se_steps(qtf, cost, m: int, n: int):
    r"""The standard-error test's one quantity: the Gauss-Newton step's length in
    standard errors, :math:`q = \|qtf\| / s` with :math:`s^2 = 2\,\mathrm{cost}/(m-n)`.

    ``curve_fit``'s covariance is :math:`C = s^2 (J^\top J)^{-1} = s^2 (R^\top R)^{-1}`
    and the step :math:`dx` solves :math:`R\,dx = -qtf` on ``R``'s range, so
    :math:`\|R\,dx\| \le \|qtf\|`. For every parameter :math:`i`, by Cauchy-Schwarz
    (:math:`e_i^\top dx = (R^{-\top} e_i)^\top (R\,dx)`, :math:`\|R^{-\top} e_i\| =
    \sqrt{C_{ii}} / s`):

    .. math:: |dx_i| \le \sqrt{C_{ii}}\, \|R\,dx\| / s \le q \sqrt{C_{ii}},

    so ``q <= c`` says no parameter moves by more than ``c`` of its standard error
    (:data:`SE_FRACTION`, :data:`SE_TAKEN`), and the ratio of two successive ``q`` is
    Gauss-Newton's measured contraction (``advance``'s ``gn_rate``). ``cost = 0``
    (``s = 0``) gives ``q = inf`` for a nonzero step (``s^2`` floored at ``tiny``);
    callers test ``cost > 0`` besides."""
    s2 = 2.0 * cost / (m - n)
    return jnp.sqrt(jnp.sum(qtf * qtf) / jnp.maximum(s2, jnp.finfo(s2.dtype).tiny))


def _one_eval_check(x, R, qtf, cost, scale_inv, ftol, xtol, m: int, n: int, rate):
    r"""The top rung's verdict on a lower rung's converged point ``x`` from its model
    there (``R^T R = J^T J``, ``R^T qtf = J^T f``): ``(dx, code)``, the Gauss-Newton
    step and ``Status.FTOL``/``XTOL``/``FTOL_XTOL`` when it may be taken as the answer,
    0 when the top rung must iterate.

    Accepted when (the batched engine's tests, :mod:`adaptprec.batch.verify`):

    * the standard-error test: the step's length in standard errors (:func:`_se_steps`:
      :math:`q = \|qtf\| / s`, :math:`s^2 = 2\,\mathrm{cost}/(m-n)`, ``curve_fit``'s
      covariance :math:`s^2 (J^\top J)^{-1}`) is :math:`q \le c`, :math:`c` =
      :data:`SE_FRACTION`: no parameter then moves by more than :math:`c` of its
      standard error (``FTOL``); or
    * the top rung's own tolerances: the step's available decrease
      :math:`\tfrac12 \|qtf\|^2 \le` ``ftol cost`` (``FTOL``), ``||D dx|| <= xtol
      (xtol + ||D x||)`` (``XTOL``).

    * (``SE_TAKEN``) the step, taken, lands within a tenth of ``SE_FRACTION``: it is
      at most :data:`SE_TAKEN` standard errors and ``rate`` (the contraction the lower
      rung measured over its last two Gauss-Newton steps, an upper bound) times it is
      at most ``SE_FRACTION / 10`` (``FTOL``). The step is taken either way; what is
      left after it is Gauss-Newton's own error, ``rate`` times the step.

    A zero residual (``cost = 0``) passes only the tolerances.
    """
    dx, pn = _gauss_newton_step(R, qtf, scale_inv)
    q2 = jnp.sum(qtf * qtf)
    q = _se_steps(qtf, cost, m, n)
    se_ok = (cost > 0) & ((q <= SE_FRACTION) | (
        (q <= SE_TAKEN) & (rate * q <= 0.1 * SE_FRACTION)))
    f_ok = se_ok | (0.5 * q2 <= ftol * cost)
    x_ok = pn <= xtol * (xtol + jnp.linalg.norm(x * scale_inv))
    finite = jnp.isfinite(q2) & jnp.all(jnp.isfinite(dx))
    code = jnp.where(f_ok & x_ok, Status.FTOL_XTOL, jnp.where(
        f_ok, Status.FTOL, jnp.where(x_ok, Status.XTOL, 0)))
    return dx, jnp.where(finite, code, 0).astype(jnp.int32)


def _materialise(*masks):
    """``masks`` (boolean scalars) unchanged, computed once: passed through a sort of a
    small vector (the identity permutation), which XLA cannot fuse.

    XLA:CPU's loop fusion copies the whole chain of scalar decisions (acceptance,
    termination, escalation: a few hundred elementwise ops) into every fusion that
    consumes one of them, i.e. into each state field selected by them. With the issue-15
    rules that doubled the step program's size and compile time (one NIST step program
    0.4 -> 0.8 s; the adaptive sweep +40% CPU with the disk cache off). Materialised
    here, the chain is compiled once: 0.2 s, below the earlier 0.4 s.
    (``lax.optimization_barrier`` is expanded away before fusion on CPU; a while loop of
    one trip is inlined.)
    """
    v = jnp.stack([jnp.asarray(m_, jnp.int32) for m_ in masks])
    _, v = lax.sort((jnp.arange(len(masks), dtype=jnp.int32), v), num_keys=1)
    return tuple(v[i] > 0 for i in range(len(masks)))


def _runaway(status, x, x0_norm, R=None, fnorm=None, triangular=True):
    """A convergence ``status`` at ``||x|| > RUNAWAY_FACTOR ||x0||`` (``x0 != 0``) and,
    given the model ``R`` (``R^T R = J^T J``) and ``||f||`` there, with a flat direction
    (:func:`.lm.flat_direction`; issue 32: distance alone is not evidence)."""
    far = ((status > 0) & (status < Status.RUNNING) & (x0_norm > 0)
           & (jnp.linalg.norm(x) > RUNAWAY_FACTOR * x0_norm))
    if R is None:
        return far
    return far & flat_direction(x, R, fnorm, x0_norm, triangular)


