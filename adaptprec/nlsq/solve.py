"""`solve_nlsq`: nonlinear least squares with adaptive precision.

Validation happens here, at the boundary (before tracing); the numerical work is one
compiled solver per ``(residual, jac, shapes/dtypes, static options)``, cached, so repeated
calls with new data of the same shapes neither retrace nor recompile.

Example:
    >>> import jax.numpy as jnp
    >>> import adaptprec as ap
    >>> t = jnp.linspace(0.0, 1.0, 20)
    >>> y = 3.0 * jnp.exp(-2.0 * t)
    >>> res = ap.solve_nlsq(lambda p, t, y: p[0] * jnp.exp(-p[1] * t) - y,
    ...                     jnp.array([1.0, 1.0]), args=(t, y))
    >>> [round(float(v), 6) for v in res.x], bool(res.success), res.rung_name
    ([3.0, 2.0], True, 'f64')
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .._tracing import is_concrete
from .._pytree import replace
from ..precision import Ladder, unit_roundoff
from . import _fused, _loop, _residual, _stream
from ._buckets import bucket
from ._dispatch import choose_driver
from ._finite_diff import as_sparsity
from ._fused import _build_solver, fused_solver, lean_possible, shares_lean
from ._host import host_solve
from ._inputs import (METHODS, _broadcast_bounds, _check_finite_tree, as_bounds,
                      as_max_steps, as_scale_inv, as_x0, check_array_leaves,
                      check_scipy_options, check_tolerances, default_x_scale,
                      lists_as_arrays)
from ._keys import _hashable, _sig
from ._ladder import _starts_on_float64, resolve_ladder
from ._loop import LoopConfig, default_schedule
from ._lsmr import _tr_solver_options
from ._methods import _njev_is_none
from ._residual import (_check_jac_shape, _point_axes, _points, _residual_size,
                        check_host_jac, flat_residual, flat_x0, jacobian, traced_once,
                        with_kwargs)
from ._sparse_jac import as_user_format
from ._start import check_start
from ._x64 import float64_entry
from .common import _NORMAL_EQ_MIN_M, check_loss, check_loss_output
from .result import result_to_host

__all__ = ["solve_nlsq", "resolve_ladder", "clear_cache", "cache_info"]

def _operand(v, dtype):
    """A small operand of the compiled solver: NumPy when concrete (the call's C++ path
    transfers it; ``jnp.asarray`` dispatched an eager conversion per operand, ~0.4 ms of
    the seven at every call, issue 31), else ``jnp.asarray`` (traced bounds, f_scale)."""
    if is_concrete(v):
        return np.asarray(v, dtype)
    return jnp.asarray(v, dtype)


def clear_cache() -> None:
    """Drop every cached compiled solver.

    Example:
        >>> from adaptprec.nlsq.solve import clear_cache, cache_info
        >>> clear_cache(); cache_info()["size"]
        0
    """
    _fused.clear_cache()
    _residual.clear_cache()


def cache_info() -> dict:
    """``{"size", "hits", "misses"}`` of the compiled-solver cache.

    Example:
        >>> from adaptprec.nlsq.solve import cache_info
        >>> sorted(cache_info())
        ['hits', 'misses', 'size']
    """
    return {"size": len(_fused._cache), **_fused._stats}


@float64_entry("solve_nlsq", ("x0", "args", "bounds", "f_scale"), host=result_to_host)
@check_start  # (issue 32) a non-finite residual at x0: scipy's early error, with the cause
def solve_nlsq(
    residual: Callable,
    x0: Any,
    args: tuple = (),
    *,
    method: str | None = None,
    bounds=(-np.inf, np.inf),
    loss="linear",
    f_scale: float = 1.0,
    x_scale=None,
    jac=None,
    ftol: float = 1e-15,
    xtol: float = 1e-10,
    gtol: float = 1e-10,
    max_steps: int | None = None,
    precision="adaptive",
    schedule=None,
    throw: bool = False,
    linear_solver: str = "auto",
    max_rejections: int = 4,
    cond_tol: float = 1e-2,
    driver: str = "auto",
    starts: int | str = 1,
    max_nfev: int | None = None,
    diff_step=None,
    kwargs: dict | None = None,
    tr_solver: str | None = None,
    tr_options: dict | None = None,
    jac_sparsity=None,
    verbose: int = 0,
    callback=None,
    workers=None,
    chunk_size: int | None = None,
) -> NLSQResult:
    """Minimise ``0.5 * sum(rho(residual(x, *args) ** 2))`` (scipy ``least_squares``
    semantics, jit/vmap/grad compatible, adaptive precision).

    Args:
      residual: ``residual(x, *args)`` returning a 1-D array or a pytree of arrays (it is
        flattened). ``x`` has the pytree structure of ``x0``.
      x0: initial guess (array or pytree of arrays); must be finite and inside ``bounds``.
      args: tuple of extra arguments (data); arrays in it are cast to each rung's dtype.
      method: ``"lm"`` (Levenberg–Marquardt trust region, Moré/MINPACK; default),
        ``"gn"`` (damped Gauss–Newton), ``"trf"`` (trust-region reflective, bounds) or
        ``"dogbox"`` (dogleg in a rectangular trust region, bounds; scipy's).
        ``"lm"``/``"gn"`` need ``m >= n`` and no bounds.
      bounds: ``(lb, ub)`` scalars or arrays of ``x0``'s size; iterates stay strictly
        feasible (``method="trf"`` is chosen automatically when bounds are given with the
        default method). Bounds may be traced (``jit``/``vmap`` over them): they are then
        not validated (``lb < ub`` is the caller's job; ``x0`` is moved inside) and
        ``"trf"`` runs even if they turn out infinite.
      loss, f_scale: robust loss (``"linear"``, ``"soft_l1"``, ``"huber"``, ``"cauchy"``,
        ``"arctan"`` or a callable ``rho(z)``) and its soft margin, as in scipy.
      x_scale: ``"jac"`` (column norms of the Jacobian, non-decreasing) or an array;
        the default, ``None``, is scipy's: ``"jac"`` for ``lm`` (the default method
        without bounds), ``1.0`` for ``trf`` and ``dogbox``.
      jac: ``"fwd"`` (``jax.jacfwd``; the default, or ``"2-point"`` when ``diff_step``
        is given), ``"rev"``, scipy's finite differences
        ``"2-point"``, ``"3-point"``, ``"cs"`` (one vectorised evaluation; for models JAX
        cannot differentiate) or a callable ``jac(x, *args)`` returning the ``(m, n)``
        Jacobian of the flat residual w.r.t. the flat ``x`` (``(m,)`` is accepted for one
        parameter).
      ftol, xtol, gtol: scipy's termination tolerances (``gtol`` is MINPACK's scaled
        cosine for ``lm``/``gn`` and ``||g * v||_inf`` for ``trf``); ``None`` disables a
        test, as in scipy.
      max_steps: iteration cap (trial steps); default ``100 * (n + 1)``, or
        ``max(100 * (n + 1), max_nfev)`` when ``max_nfev`` is given. ``"lm"`` runs a
        portfolio (docs/nlsq.md, "Robustness"): when its default strategy fails (out of
        steps, no finite step, or runaway parameters) the top rung restarts from ``x0``
        with scipy's radius rule and the lower-cost end is returned. With the default,
        each strategy has ``100 * (n + 1)`` steps; an explicit ``max_steps`` (and
        ``max_nfev``) caps the whole solve.
      max_nfev: scipy's cap on residual evaluations (``None``: no cap beyond
        ``max_steps``); when given it is the cap (the default ``max_steps`` is raised to
        it); ``max_nfev=1`` evaluates at ``x0`` only, once. Status 0 when reached.
        ``nfev`` counts the runs of the (traced) residual at ``x0`` and at each trial
        point; the final run at the returned ``x`` that fills ``fun``/``jac`` is not
        counted (none extra with ``max_nfev=1``). The residual and a callable ``jac`` are
        traced once per shape and dtype.
      diff_step: relative finite-difference step (with ``jac="2-point"/"3-point"/"cs"``).
      kwargs: keyword arguments for ``residual`` (and a callable ``jac``), as scipy's.
      callback: scipy's ``callback(intermediate_result)`` (or ``callback(x)``), called on
        the host after every accepted step (also under ``jit``); raising
        ``StopIteration`` ends the solve with status -2.
      jac_sparsity: scipy's ``(m, n)`` sparsity pattern (dense or scipy.sparse) for a
        finite-difference Jacobian: columns that share no row are perturbed together
        (one evaluation per group). Selects ``"2-point"`` when ``jac`` is unset.
      tr_solver, tr_options: scipy's: ``"exact"`` (the default; ``"lsmr"`` when ``jac``
        returns a sparse matrix or ``LinearOperator``) or ``"lsmr"`` for ``trf``/``dogbox``
        (scipy's LSMR + 2-D subspace step, :mod:`adaptprec.nlsq._lsmr`; ``tr_options``
        keys ``regularize``, ``damp``, ``atol``, ``btol``, ``conlim``, ``maxiter``).
      verbose, workers: ``verbose=0`` and ``workers=None`` are what adaptprec does;
        anything else raises an error naming the alternative (see ``docs/scipy.md``).
      precision: ``"adaptive"`` (``f32 -> f64``; residual and Jacobian on f32 first while
        the iterate stays float64; on CPU with ``m n <`` :data:`._ladder.SMALL_F64_MN` and no
        schedule, float64 alone with the ladder's top-rung stopping rules), a
        :class:`~adaptprec.Ladder`/``"f32,f64"``, or one dtype (fixed precision). With
        ``jax_enable_x64`` off, an eager call asking for float64 runs inside
        ``jax.enable_x64(True)`` (thread-local) and returns NumPy arrays; under
        ``jit``/``vmap``/``grad`` it raises (see :mod:`._x64`).
      schedule: a ``adaptprec.schedule.PrecisionSchedule`` consulted every step (stall /
        noise floor); the built-in triggers (non-finite values, convergence on a lower rung
        or its Gauss-Newton gain below its rounding of the cost, ``max_rejections``
        rejected steps in a row, the rung's Gauss-Newton step error
        ``u (2 kappa / cos(theta) + kappa^2 tan(theta)) > cond_tol`` with
        ``kappa = cond(J D^-1)``, its share of the budget) are always on (docs/nlsq.md,
        "Adaptive precision"). Escalation only goes up.
      throw: raise (via ``equinox.error_if``) when the solve does not succeed.
      linear_solver: ``"qr"`` (QR of ``[J f]``), ``"normal"`` (normal equations
        ``J^T J``, ``J^T f`` accumulated in float32 or wider; squares the condition number
        of the step computation, not of the answer: the fixed point ``J^T f = 0`` is the
        same), or ``"auto"`` (default): QR below 4096 residuals, normal equations above.
      driver: ``"auto"`` (default), ``"host"`` or ``"fused"``. The fused driver compiles
        the whole solve (one ``while_loop``) per residual and shape; it runs under
        ``jit``/``vmap``/``grad`` and for large problems. The host driver
        (:mod:`adaptprec.nlsq._host`) runs a Python loop over a trust-region step compiled
        once for every residual and data length, and compiles only the residual's
        evaluation per residual computation and data bucket: small eager solves then take
        milliseconds after the first. ``"auto"`` uses it for eager calls with the QR
        model (below 4096 residuals), an autodiff Jacobian and ``throw=False``. Both give
        the same iterates up to rounding.
      starts: multi-start (:mod:`adaptprec.nlsq._multistart`): ``K > 1`` runs ``x0`` and
        ``K - 1`` Latin-hypercube starts (in the box, or around ``x0`` by its scale) on the
        batched engine and polishes the best; never worse than ``starts=1``. ``nfev``,
        ``njev`` and ``nit`` then count every start's work. ``"auto"``
        (:mod:`adaptprec.nlsq._auto_starts`, eager only): the local fit first, then, only
        when it failed, was not finite at ``x0``, left a parameter unseen (a zero
        Jacobian column) or a cost far above the noise, local fits from Latin-hypercube
        starts across decades (or in the box) within a budget (default: 10x the local
        fit's time, clipped to 0.25-0.9 s); the result's
        ``starts_run`` and ``search`` (in ``message``) say what ran.
      chunk_size: stream the data through the normal equations in chunks of this many
        points (:mod:`adaptprec.nlsq._stream`): ``args`` may then hold host NumPy arrays
        or ``np.memmap`` (never copied whole), or be an :class:`~adaptprec.Chunks`
        source. Host NumPy data of at least 2^22 points, and jax.Arrays sharded over a
        mesh along their points (:mod:`adaptprec.nlsq._sharded`), are streamed without
        asking; ``chunk_size=False`` never streams. Eager only; ``fun``/``jac`` of the
        result are ``None``. See docs/nlsq.md.

    Returns:
      :class:`~adaptprec.NLSQResult`. ``x`` is differentiable with respect to the arrays in
      ``args`` by implicit differentiation of the optimality condition ``grad_x cost = 0``
      (parameters at an active bound are held fixed); ``x0`` gets a zero derivative.

    Example:
        >>> import jax.numpy as jnp
        >>> import adaptprec as ap
        >>> def rosen(x):
        ...     return jnp.array([10.0 * (x[1] - x[0] ** 2), 1.0 - x[0]])
        >>> res = ap.solve_nlsq(rosen, jnp.array([-1.2, 1.0]))
        >>> [round(float(v), 8) for v in res.x], res.rung_name  # small: float64 alone
        ([1.0, 1.0], 'f64')
        >>> ap.solve_nlsq(rosen, jnp.array([-1.2, 1.0]), precision="f32,f64").escalations
        Array(1, dtype=int32)
    """
    args = lists_as_arrays(args)
    if chunk_size is not False and (chunk_size is not None or
                                    _stream.wants_stream(args)):  # larger than memory
        res = _stream.solve_stream(
            residual, x0, args, chunk_size=chunk_size, auto=chunk_size is None and not
            isinstance(args, _stream.Chunks), method=method, bounds=bounds, loss=loss,
            f_scale=f_scale, x_scale=x_scale, jac=jac,
            ftol=ftol, xtol=xtol, gtol=gtol, max_steps=max_steps, precision=precision,
            schedule=schedule,
            linear_solver=linear_solver, max_rejections=max_rejections,
            cond_tol=cond_tol, **{k: v for k, v in locals().items()
                                  if k in _stream.UNSUPPORTED_DEFAULTS})
        if res is not None:
            return res
    if starts != 1:
        from ._auto_starts import as_auto, solve_auto

        auto = as_auto(starts)
        if auto is not None:  # a local fit first; a search only when it asks for one
            return solve_auto(
                solve_nlsq, residual, x0, args, auto=auto, method=method, bounds=bounds,
                loss=loss, f_scale=f_scale, x_scale=x_scale, jac=jac, ftol=ftol,
                xtol=xtol, gtol=gtol, max_steps=max_steps, precision=precision,
                schedule=schedule, throw=throw, linear_solver=linear_solver,
                max_rejections=max_rejections, cond_tol=cond_tol, driver=driver,
                max_nfev=max_nfev, diff_step=diff_step, kwargs=kwargs,
                tr_solver=tr_solver, tr_options=tr_options, jac_sparsity=jac_sparsity,
                verbose=verbose, callback=callback, workers=workers,
                chunk_size=chunk_size)
        from ._multistart import check_starts_options, solve_multistart

        check_starts_options(starts, max_nfev=max_nfev, diff_step=diff_step, kwargs=kwargs,
                             tr_solver=tr_solver, tr_options=tr_options, verbose=verbose,
                             jac_sparsity=jac_sparsity, callback=callback)
        return solve_multistart(
            solve_nlsq, residual, x0, args, starts=starts, method=method, bounds=bounds,
            loss=loss, f_scale=f_scale, x_scale=x_scale, jac=jac,
            ftol=ftol, xtol=xtol, gtol=gtol,
            max_steps=max_steps, precision=precision, schedule=schedule, throw=throw,
            linear_solver=linear_solver, max_rejections=max_rejections, cond_tol=cond_tol)
    # ------------------------------------------------------------------ validation
    if not callable(residual):
        raise TypeError(f"residual must be callable, got {type(residual).__name__}")
    if not isinstance(args, tuple):
        args = (args,)
    if method is not None and method not in METHODS:
        raise ValueError(f"method={method!r} is not supported; use one of {METHODS}")
    loss = check_loss(loss)
    x_scale_given = x_scale
    if method == "lm" and loss != "linear":
        raise ValueError("method='lm' supports only 'linear' loss function; use "
                         "method='trf' for a robust loss.")
    jac, max_nfev = check_scipy_options(
        jac, method, diff_step=diff_step, jac_sparsity=jac_sparsity, tr_solver=tr_solver,
        tr_options=tr_options, verbose=verbose, workers=workers, callback=callback,
        max_nfev=max_nfev)
    if kwargs:
        residual, jac, args = with_kwargs(residual, jac, args, kwargs)
    if callable(jac):  # a user's jac runs once per shape (gh-13670; the key keeps jac)
        jac = traced_once(jac)
    x0 = as_x0(x0)
    if linear_solver not in ("auto", "qr", "normal"):
        raise ValueError(f"linear_solver must be 'auto', 'qr' or 'normal', got "
                         f"{linear_solver!r}")
    if not (np.isscalar(f_scale) and np.isfinite(f_scale) and f_scale > 0):
        if is_concrete(f_scale):
            raise ValueError(f"f_scale must be a positive finite number, got {f_scale!r}")
    ladder = resolve_ladder(precision)
    rungs = ladder.rungs
    top_dt = np.dtype(rungs[-1])
    if unit_roundoff(top_dt) > unit_roundoff(np.float32):
        raise ValueError(
            f"precision={precision!r} ends on {top_dt.name}: the iterate, the trust region "
            "and the factored model live in the top rung's dtype, which must be float32 or "
            "float64 (LAPACK has no half precision). Start low and end on one of them, "
            "e.g. precision='bf16,f32'.")

    x0_flat, unravel = flat_x0(x0, top_dt)
    _check_finite_tree(x0_flat, "x0", "give a finite starting point")
    check_array_leaves(args)
    _check_finite_tree(args, "the data in args")
    n = int(x0_flat.size)

    fun_flat = flat_residual(residual, unravel)

    # a new data length of a residual seen before: size and point axes from the memo
    recalled = _points.recall(residual, x0_flat, args) if jac in ("fwd", "rev") else None
    if recalled is not None:
        m = recalled[0]
    else:
        m = _residual_size(residual, fun_flat, x0, x0_flat, args, top_dt)
    check_loss_output(loss, m, top_dt)
    adaptive_stop = False
    if _starts_on_float64(precision, schedule, m, n):
        rungs, ladder, adaptive_stop = rungs[-1:], Ladder(list(rungs[-1:])), True
    if jac_sparsity is not None and callable(jac):
        as_sparsity(jac_sparsity, m, n)  # shape check only (scipy's check_jac_sparsity)
    # a jac returning scipy.sparse / LinearOperator: evaluated on the host (scipy's rules)
    host_kind = _check_jac_shape(jac, x0_flat, args, m, n) if callable(jac) else None
    method = check_host_jac(host_kind, method, tr_solver, x_scale_given)

    lb, ub = _broadcast_bounds(as_bounds(bounds, n), n, top_dt)
    bounds_known = is_concrete((lb, ub))
    # traced bounds (jit/vmap over them): finiteness is unknown at trace time, so the
    # bounded method runs (with infinite bounds trf is an unconstrained trust region)
    has_bounds = (not bounds_known) or bool(np.any(np.isfinite(lb)) or
                                            np.any(np.isfinite(ub)))
    if method is None:
        method = "trf" if has_bounds else "lm"
    if x_scale is None:
        x_scale = default_x_scale(method)
    if has_bounds and method in ("lm", "gn"):
        raise ValueError(f"method={method!r} does not support bounds; use method='trf' "
                         "(or leave method unset)")
    ftol, xtol, gtol = check_tolerances(ftol, xtol, gtol, method)
    # scipy's finite differences with jac_sparsity give a sparse Jacobian: its defaults
    # (tr_solver "lsmr", res.jac a csr_array) follow
    sparse_fd = jac_sparsity is not None and not callable(jac)
    tr = _tr_solver_options(tr_solver, tr_options, method,
                            host_kind or ("sparse" if sparse_fd else None))
    if method in ("lm", "gn") and m < n:
        raise ValueError(f"method={method!r} needs at least as many residuals as "
                         f"parameters; got m={m} residuals for n={n} parameters. Use "
                         "method='trf' or add residuals.")
    if is_concrete(x0_flat) and bounds_known:
        xv = np.asarray(x0_flat, np.float64)
        if np.any(xv < lb) or np.any(xv > ub):
            i = int(np.argmax((xv < lb) | (xv > ub)))
            raise ValueError(f"x0 is outside the bounds: x0[{i}]={xv[i]} not in "
                             f"[{lb[i]}, {ub[i]}]")
    scale_inv0 = as_scale_inv(x_scale, n)
    # lm's portfolio (_loop.PORTFOLIO): the default budget is per strategy, an explicit
    # max_steps (or max_nfev) caps the whole solve
    # (max_nfev is 0 here when not given: check_max_nfev)
    portfolio = (2 if max_steps is None and not max_nfev else 1) \
        if _loop.PORTFOLIO else 0
    # the user's max_nfev is the cap (scipy): our own step cap must not end the solve
    # earlier (each step costs at least one evaluation, so max_nfev steps suffice)
    max_steps = as_max_steps(max_steps, n) if max_steps is not None or not max_nfev \
        else max(as_max_steps(None, n), max_nfev)

    if schedule is None and len(rungs) > 1:
        schedule = default_schedule()
    elif schedule is not None and not (hasattr(schedule, "init") and
                                       hasattr(schedule, "update")):
        raise TypeError(f"schedule must be an adaptprec.schedule.PrecisionSchedule, got "
                        f"{type(schedule).__name__}")
    if linear_solver == "auto":
        linear_solver = "normal" if m >= _NORMAL_EQ_MIN_M else "qr"
    axes = None
    if linear_solver == "normal" and jac == "fwd":
        axes = _point_axes(residual, fun_flat, x0, x0_flat, args, m)
    jac, jac_key = jacobian(jac, fun_flat, m, n, host_kind, diff_step, jac_sparsity,
                            (lb, ub) if bounds_known and has_bounds else (None, None))
    # Shape buckets: a pointwise residual's data are padded to a bucket length (masked
    # rows are zero), in both drivers, so a new length in the bucket compiles nothing.
    pad = None
    if linear_solver == "qr" and jac in ("fwd", "rev") and args and bucket(m) != m:
        q_axes = recalled[1] if recalled is not None else \
            _point_axes(residual, fun_flat, x0, x0_flat, args, m)
        if q_axes is not None:
            pad = (q_axes, bucket(m))
            if recalled is None:
                _points.remember(residual, x0_flat, args, q_axes)
    # ------------------------------------------------------------------ the driver
    cfg = LoopConfig(m=m, n=n, rungs=rungs, method=method, loss=loss, jac=jac,
                     jac_scale=isinstance(x_scale, str), has_bounds=has_bounds,
                     max_steps=int(max_steps), linear_solver=linear_solver,
                     max_rejections=int(max_rejections), cond_tol=float(cond_tol),
                     schedule=schedule, point_axes=axes, max_nfev=max_nfev,
                     callback=callback, tr=tr, portfolio=portfolio,
                     adaptive_stop=adaptive_stop)
    if choose_driver(driver, cfg, tr, throw, x0_flat, args, lb, ub, f_scale) == "host":
        x0_shape = np.shape(x0) if isinstance(x0, (jax.Array, np.ndarray)) else None
        res = host_solve(residual, fun_flat, unravel, x0_shape, cfg, pad,
                         x0_flat.astype(top_dt), args, lb, ub, scale_inv0, f_scale,
                         ftol, xtol, gtol)
        # the host driver runs autodiff Jacobians only: for lm, scipy's None
        return replace(res, njev=None) if _njev_is_none(cfg) else res
    key = (_hashable(residual), _hashable(jac_key), _hashable(loss), _hashable(schedule),
           cfg._replace(loss=None, jac=None, schedule=None, callback=None),
           _hashable(callback), bool(throw),
           _sig(x0), _sig(args), str(x0_flat.dtype), pad)
    solver = fused_solver(key, lambda lean: _build_solver(fun_flat, unravel, cfg, bool(throw),
                                                          ladder, pad, lean),
                          lean_possible(cfg, pad), shares_lean(cfg, pad))
    res = solver(x0_flat.astype(top_dt), args,
                 *(_operand(v, top_dt) for v in (lb, ub, scale_inv0, f_scale, ftol, xtol,
                                                 gtol)))
    if (host_kind or sparse_fd) and is_concrete(res.jac):  # scipy: res.jac in jac's format
        res = replace(res, jac=as_user_format(res.jac, host_kind or "sparse"))
    return res


