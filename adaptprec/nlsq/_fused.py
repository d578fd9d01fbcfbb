"""The fused driver: a whole solve compiled as one program (one ``lax.while_loop`` over
:func:`._loop.build_loop`'s ``propose``/``evaluate``/``advance``), with the final
evaluation on the top rung and ``x`` made differentiable with respect to the data by
implicit differentiation. It runs everything the host driver does not: calls under
``jit``/``vmap``/``grad``, large problems, ``max_nfev``, ``callback``, ``tr_solver="lsmr"``.
Compiled solvers are cached per residual, Jacobian, options and shapes.

Example:
    >>> import jax.numpy as jnp
    >>> import adaptprec as ap
    >>> res = ap.solve_nlsq(lambda x: jnp.array([x[0] - 2.0, 3.0 * (x[1] + 1.0)]),
    ...                     jnp.zeros(2), driver="fused")
    >>> [round(float(v), 8) for v in res.x]
    [2.0, -1.0]
"""

from __future__ import annotations

import collections
import contextlib
import contextvars
import threading

import jax
import jax.numpy as jnp
import numpy as np

from .._policy import cast_floating
from .._pytree import replace
from .._tracing import is_concrete, is_eager
from ._buckets import masked
from ._compile import cpu_jit
from ._evaluation import final_eval
from ._loop import LoopConfig, build_loop
from ._methods import _njev_is_none, method_fns
from .common import _NORMAL_EQ_MIN_M, STATUS_MESSAGES, Status, robust_cost
from .common import _covariance, gram_covariance
from .dogbox import dogbox_gnorm, on_bound
from .result import NLSQResult
from .trf import active_constraints, cl_scaling, make_strictly_feasible

__all__ = ["fused_solver", "clear_cache", "lean_final", "lean_possible", "shares_lean"]

_CACHE_SIZE = 64
_cache: collections.OrderedDict = collections.OrderedDict()
_cache_lock = threading.Lock()
_stats = {"hits": 0, "misses": 0}


def clear_cache() -> None:
    """Drop every compiled fused solver."""
    with _cache_lock:
        _cache.clear()
        _stats.update(hits=0, misses=0)


#: (issue 31) The box of an active :func:`lean_final` (None: results as always).
_LEAN: contextvars.ContextVar = contextvars.ContextVar("adaptprec_lean_final", default=None)


@contextlib.contextmanager
def lean_final():
    """Inside, a fused solve that :func:`_lean_applies` to returns ``fun=None`` and
    ``jac=None`` and puts ``(J^T J)^+`` at the solution in the yielded dict
    (``box["cov"]``), for ``curve_fit`` without ``full_output``: when the loop ended on
    the top rung at a point it evaluated there, the final evaluation reuses its model
    (cost, ``R^T R = J^T J``, ``R^T qtf = J^T f``) instead of forming the residual and
    the ``m x n`` Jacobian again (1e6 points, n = 5: 26 ms, plus 8 ms of covariance from
    that Jacobian; the loop's whole float64 fit costs ~60 ms). Any other end, or a Gram
    matrix too ill-conditioned for :func:`.common.gram_covariance`, evaluates as before
    (the covariance then by the SVD route of that Jacobian), in a program of its own
    compiled when first needed (:func:`_final_programs`; under a trace, a ``lax.cond``
    around it)."""
    box: dict = {}
    token = _LEAN.set(box)
    try:
        yield box
    finally:
        _LEAN.reset(token)


def _lean_applies(cfg: LoopConfig) -> bool:
    """Blocked (pointwise) unbounded fits with the linear loss and no ``max_nfev``:
    their loop state at the end describes the returned point (:mod:`._loop`)."""
    return (cfg.point_axes is not None and not cfg.has_bounds and not cfg.max_nfev
            and isinstance(cfg.loss, str) and cfg.loss == "linear")


def lean_possible(cfg: LoopConfig, pad) -> bool:
    """Whether a fused solve is built lean inside :func:`lean_final` (the cache key's
    last entry, :func:`fused_solver`'s ``lean_ok``)."""
    return _lean_applies(cfg) and pad is None


def shares_lean(cfg: LoopConfig, pad) -> bool:
    """Whether an eager solve outside :func:`lean_final` runs the lean program and then
    the final evaluation as a program of its own (:func:`fused_solver`'s ``share``):
    large fits (``_NORMAL_EQ_MIN_M``), where compiling the whole solve a second time
    costs ~1 s and the second dispatch nothing (below, a solve's ~1 ms would carry it)."""
    return lean_possible(cfg, pad) and cfg.m >= _NORMAL_EQ_MIN_M


def fused_solver(key, build, lean_ok: bool = True, share: bool = False):
    """The compiled solver for ``key``, built by ``build(lean)`` on a miss (least
    recently used entries beyond :data:`_CACHE_SIZE` are dropped). Inside
    :func:`lean_final` the key says so when the solve can be lean (``lean_ok``:
    :func:`lean_possible`; a lean solver returns its covariance besides the result): a
    solve that cannot is built the same either way, so ``curve_fit`` with and without
    ``full_output`` share its program instead of compiling it twice.

    With ``share`` (:func:`shares_lean`) an eager call outside :func:`lean_final` also
    runs the lean program, then the final evaluation at its ``x`` (``solver.full``,
    a program of its own, as :func:`_final_programs`): the same ``fun``, ``jac``,
    ``cost``, ``grad`` (the same operations on the same ``x``; bit for bit on the
    issue-31 fits), and ``curve_fit(full_output=True)`` after ``curve_fit()`` (or the
    other way round) compiles only that evaluation. A traced call keeps the whole
    non-lean program (its ``cost``/``fun``/``jac`` differentiable in the data), as
    does an eager call under a user's trace."""
    box = _LEAN.get()
    if share and box is None:
        return _shared(key, build)
    key = (*key, box is not None and lean_ok)   # (appended: tests read the key by position)
    solver = _cached(key, lambda: build(box is not None))
    if not getattr(solver, "lean", False):   # (built outside lean_final, or not lean)
        return solver

    def lean(*a):
        res, cov, here, x = solver(*a)
        res, cov = _lean_end(solver, res, cov, here, x, a)
        box["cov"], box["m"] = cov, solver.m
        return res

    return lean


def _shared(key, build):
    """:func:`fused_solver`'s ``share``: eagerly the lean program plus ``solver.full``
    at its point; under any trace (a traced operand, or one the residual closes over:
    :func:`.._tracing.is_eager`), the non-lean program as before."""
    def full(*a):
        if not is_eager(a):
            return _cached((*key, False), lambda: build(False))(*a)
        solver = _cached((*key, True), lambda: build(True))
        res, _, _, x = solver(*a)
        f, Js, g, cost = solver.full(x, a[1], a[5])
        # (lean solves are unbounded: optimality as in the non-lean program's)
        return replace(res, fun=f, jac=Js, cost=cost, grad=g,
                       optimality=jnp.max(jnp.abs(g)))

    return full


def _lean_end(solver, res, cov, here, x, a):
    """A lean solve's result as it leaves: where the loop's model could not be used
    (``here`` false), cost, gradient, optimality and ``(J^T J)^+`` from the final
    evaluation at ``x`` (:func:`_final_programs`); eagerly only then, under a trace by
    ``lax.cond``. ``a``: the solver's operands ``(x0, args, lb, ub, scale_inv0,
    f_scale, ...)``."""
    args, f_scale = a[1], a[5]
    if is_concrete(here):
        if bool(here):
            return res, cov
        cost, g, cov = solver.final(x, args, f_scale)
    else:
        cost, g, cov = jax.lax.cond(here, lambda: (res.cost, res.grad, cov),
                                    lambda: solver.final(x, args, f_scale))
    return replace(res, cost=cost, grad=g, optimality=jnp.max(jnp.abs(g))), cov


def _cached(key, build):
    with _cache_lock:
        solver = _cache.get(key)
        if solver is None:
            _stats["misses"] += 1
            solver = build()
            _cache[key] = solver
            if len(_cache) > _CACHE_SIZE:
                _cache.popitem(last=False)
        else:
            _stats["hits"] += 1
            _cache.move_to_end(key)
    return solver


def _at_x0_only(run, cfg: LoopConfig, x0, ctx):
    """The loop's state of a solve that ends at ``x0`` after its one evaluation (the
    final one, on the top rung): ``max_nfev=1``."""
    top = len(cfg.rungs) - 1
    st = run.init(x0, ctx)
    one = jnp.ones((), jnp.int32)
    return st._replace(
        status=jnp.asarray(Status.MAX_EVALUATIONS, jnp.int32), nfev=one, njev=one,
        rung=jnp.asarray(top, jnp.int32), pending=jnp.asarray(False),
        rung_entered=jnp.full_like(st.rung_entered, -1).at[top].set(0),
        rung_nfev=jnp.zeros_like(st.rung_nfev).at[top].set(1))


def _build_solver(fun_flat, unravel, cfg: LoopConfig, throw: bool, ladder, pad=None,
                  lean_wanted: bool = False):
    rungs = cfg.rungs
    top_dt = rungs[-1]
    step_fn, gnorm_fn, delta0_fn = method_fns(cfg.method, cfg.m, cfg.tr)
    if pad is not None:  # data padded to the bucket inside, padded rows masked
        pad_axes, pad_m = pad
        pad_idx = np.minimum(np.arange(pad_m), cfg.m - 1)
        fun_flat = masked(fun_flat, np.arange(pad_m) < cfg.m)

    run = build_loop(fun_flat, cfg, step_fn, gnorm_fn, delta0_fn)
    loss = cfg.loss
    lean = lean_wanted and lean_possible(cfg, pad)
    top = len(rungs) - 1

    def cost_fn(x, args, f_scale):
        return robust_cost(loss, fun_flat(x, *args).astype(top_dt), f_scale)

    @jax.custom_jvp
    def implicit_x(x, args, f_scale, free):
        return x

    @implicit_x.defjvp
    def _implicit_jvp(primals, tangents):
        x, args, f_scale, free = primals
        _, dargs, dfs, _ = tangents
        grad_x = jax.grad(cost_fn)
        H = jax.jacfwd(grad_x)(x, args, f_scale)
        fz = free.astype(H.dtype)
        H = H * fz[:, None] * fz[None, :] + jnp.diag(1.0 - fz)
        _, rhs = jax.jvp(lambda a, s: grad_x(x, a, s), (args, f_scale), (dargs, dfs))
        dx = -jnp.linalg.solve(H, rhs * fz)
        return x, dx

    def solve(x0, args, lb, ub, scale_inv0, f_scale, ftol, xtol, gtol):
        if pad is not None:
            leaves, treedef = jax.tree.flatten(args)
            args = jax.tree.unflatten(treedef, [
                a if ax is None else jnp.take(jnp.asarray(a), pad_idx, axis=ax)
                for a, ax in zip(leaves, pad_axes)])
        args_top = cast_floating(args, top_dt)
        args_c = jax.lax.stop_gradient(args)
        args_all = tuple(cast_floating(args_c, d) for d in rungs)
        x0c = jax.lax.stop_gradient(x0)
        if cfg.has_bounds and cfg.method == "trf":
            x0c = make_strictly_feasible(x0c, lb, ub)
        if cfg.max_nfev == 1:
            # scipy's max_nfev=1 is one evaluation, at x0: the final evaluation below is
            # that one (the loop would evaluate x0 once more, uncounted)
            st = _at_x0_only(run, cfg, x0c, (args_all, lb, ub, scale_inv0, f_scale,
                                              ftol, xtol, gtol))
        else:
            st = run(x0c, args_all, lb, ub, scale_inv0, jax.lax.stop_gradient(f_scale),
                     ftol, xtol, gtol)
        x_star = jax.lax.stop_gradient(st.x)
        if cfg.has_bounds and cfg.method == "dogbox":
            active = on_bound(x_star, lb, ub)
        elif cfg.has_bounds:
            active = active_constraints(x_star, lb, ub, xtol)
        else:
            active = jnp.zeros(x_star.shape, jnp.int32)
        x = implicit_x(x_star, args_top, f_scale, active == 0)
        if lean:  # (lean_final) the loop's model at x (_lean_end: or the final evaluation)
            cost, g, cov, here = _lean_final(st)
            f = Js = None
        else:
            # Final evaluation on the top rung: fun, (loss-modified) jac, grad, optimality.
            f, Js, g, cost = final_eval(fun_flat, cfg, x, args_top, f_scale)
        if pad is not None:
            f, Js = f[:cfg.m], Js[:cfg.m]
        if cfg.has_bounds and cfg.method == "dogbox":
            optimality = dogbox_gnorm(x, g, None, None, lb, ub)
        elif cfg.has_bounds:
            v, _ = cl_scaling(x, g, lb, ub)
            optimality = jnp.max(jnp.abs(g * v))
        else:
            optimality = jnp.max(jnp.abs(g))
        status = st.status
        if throw:
            codes = sorted(k for k in STATUS_MESSAGES if k <= 0)
            idx = jnp.searchsorted(jnp.asarray(codes), jnp.minimum(status, 0))
            import equinox as eqx  # only on this path: its import is slow
            x = eqx.branched_error_if(
                x, status <= 0, idx,
                [f"solve_nlsq failed (status {c}): {STATUS_MESSAGES[c]}" for c in codes])
        res = NLSQResult(
            x=unravel(x), cost=cost, fun=f, jac=Js, grad=g, optimality=optimality,
            active_mask=active, nfev=st.nfev,
            njev=None if _njev_is_none(cfg) else st.njev, nit=st.nit,
            status=status, rung=st.rung, escalations=st.escalations,
            rung_entered=st.rung_entered, rung_nfev=st.rung_nfev,
            escalation_reason=st.esc_reason, ladder=tuple(np.dtype(d) for d in rungs))
        return (res, cov, here, x_star) if lean else res

    def _lean_final(st):
        """``(cost, g, (J^T J)^+, here)`` from the loop's model; ``here``: whether they
        hold at the returned point, i.e. the loop ended on the top rung at a point it
        evaluated there (its model finite, the first strategy of the portfolio: a
        restart's kept end is not where the model is) and the Gram route is accurate.
        Where not, :func:`_lean_end` evaluates (:func:`_final_programs`)."""
        R = jax.lax.stop_gradient(st.R)
        fast, inv = gram_covariance(R.T @ R, cfg.m)
        here = st.ok & (st.rung == top) & fast & jnp.isfinite(st.cost)
        if st.kept is not None:
            here = here & (st.strat == 0)
        return st.cost, R.T @ st.qtf, inv, here

    # run time is negligible next to compilation below _NORMAL_EQ_MIN_M residuals
    compiled = cpu_jit(solve, optimise=cfg.m >= _NORMAL_EQ_MIN_M)
    if not lean:
        return compiled

    def lean_solve(*a):
        return compiled(*a)

    lean_solve.lean, lean_solve.m = True, cfg.m
    lean_solve.final, lean_solve.full = _final_programs(fun_flat, cfg)
    return lean_solve


def _final_programs(fun_flat, cfg: LoopConfig):
    """``(final, full)``: ``final(x, args, f_scale) -> (cost, g, (J^T J)^+)`` at ``x``
    on the top rung: the final evaluation and the SVD route's covariance of its
    Jacobian, for a lean solve that could not reuse its loop's model; ``full(x, args,
    f_scale) -> (fun, jac, g, cost)``, the final evaluation of the non-lean program, for
    :func:`fused_solver`'s ``share`` (each compiled on its first call).

    Not inside the lean solve's program (issue 31, branch i31cf3): there, behind a
    ``lax.cond`` that a fit almost never takes, its ``m x n`` Jacobian and that
    Jacobian's QR copy (1e6 x 5 float64: 80 MB) were XLA temporaries of every call;
    a temporary block that large is mapped afresh at each execution, so the float32
    copies of the data that share it (8 MB) were page-faulted in at every call (~2000
    faults, ~1-2 ms of a 45 ms fit; benchmarks/RESULTS.md)."""
    top_dt = cfg.rungs[-1]
    null_tol = float(np.sqrt(np.finfo(np.dtype(top_dt)).eps))

    def final(x, args, f_scale):
        args_top = cast_floating(args, top_dt)
        _, Js, g, cost = final_eval(fun_flat, cfg, x, args_top, f_scale)
        return cost, g, _covariance(Js, null_tol)[0]

    def full(x, args, f_scale):
        return final_eval(fun_flat, cfg, x, cast_floating(args, top_dt), f_scale)

    optimise = cfg.m >= _NORMAL_EQ_MIN_M
    return cpu_jit(final, optimise=optimise), cpu_jit(full, optimise=optimise)
