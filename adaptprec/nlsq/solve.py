"""`solve_nlsq`: nonlinear least squares with adaptive precision, and its dispatch."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from .._tracing import is_concrete
from .._x64_rule import float64_entry, to_device
from ._inputs import Problem, lists_as_arrays, prepare
from ._state import Outputs
from .result import NLSQResult, result_to_host

__all__ = ["solve_nlsq", "route", "solve_in_memory", "clear_cache", "cache_info"]


def clear_cache() -> None:
    """Drop every memo and compiled program of the fitting code (:mod:`._caches`).

    Example:
        >>> from adaptprec.nlsq.solve import clear_cache, cache_info
        >>> clear_cache(); cache_info()["PROGRAMS"]["size"]
        0
    """
    from . import _caches

    _caches.clear()


def cache_info() -> dict:
    """``{memo: {"size", "limit", "hits", "misses"}}`` (:mod:`._caches`).

    Example:
        >>> from adaptprec.nlsq.solve import cache_info
        >>> sorted(cache_info()["PROGRAMS"])
        ['hits', 'limit', 'misses', 'size']
    """
    from . import _caches

    return _caches.info()


@float64_entry("solve_nlsq", ("x0", "args", "bounds", "f_scale"), host=result_to_host,
               device=to_device)
def solve_nlsq(residual: Callable, x0: Any, args: tuple = (), *, method: str | None = None,
               bounds=(-np.inf, np.inf), loss="linear", f_scale: float = 1.0, x_scale=None,
               jac=None, ftol: float = 1e-15, xtol: float = 1e-10, gtol: float = 1e-10,
               max_steps: int | None = None, precision="adaptive", schedule=None,
               throw: bool = False, linear_solver: str = "auto", max_rejections: int = 4,
               cond_tol: float = 1e-2, starts: int | str = 1, max_nfev: int | None = None,
               diff_step=None, kwargs: dict | None = None, tr_solver: str | None = None,
               tr_options: dict | None = None, jac_sparsity=None, verbose: int = 0,
               callback=None, workers=None, chunk_size: int | None = None) -> NLSQResult:
    """Minimise ``0.5 * sum(rho(residual(x, *args) ** 2))`` with scipy ``least_squares``
    semantics, under ``jit``/``vmap``/``grad``, in adaptive precision.

    Args:
      residual: ``residual(x, *args)``: a 1-D array or a pytree of arrays (flattened);
        ``x`` has ``x0``'s structure.
      x0: initial guess (array or pytree); finite, inside ``bounds``.
      args: data; floating arrays are cast to each rung's dtype.
      method: ``"lm"`` (Moré's Levenberg-Marquardt; the default without bounds),
        ``"trf"`` (the default with bounds), ``"dogbox"`` or ``"gn"`` (damped
        Gauss-Newton).
      bounds: ``(lb, ub)`` (scalars, arrays, ``scipy.optimize.Bounds``; may be traced).
      loss, f_scale: scipy's robust losses (``"soft_l1"``, ``"huber"``, ``"cauchy"``,
        ``"arctan"``, or a callable ``rho(z)``) and soft margin.
      x_scale: ``"jac"`` or an array (scipy's default per method).
      jac: ``"fwd"`` (default) or ``"rev"`` (autodiff), scipy's ``"2-point"``,
        ``"3-point"``, ``"cs"``, or a callable ``jac(x, *args)`` (dense, scipy.sparse or a
        ``LinearOperator``); ``diff_step``, ``jac_sparsity``, ``tr_solver``,
        ``tr_options`` as scipy's.
      ftol, xtol, gtol, max_nfev, callback, kwargs: as scipy's (``None`` disables a
        tolerance). ``max_steps``: trial steps, default ``100 (n + 1)`` per strategy of
        ``lm``'s portfolio (docs/nlsq.md, "Robustness").
      precision: ``"adaptive"`` (``f32 -> f64``; float64 alone for ``m n < 32768`` on
        CPU), a :class:`~adaptprec.Ladder` or ``"f32,f64"``, or one dtype. With x64 off
        an eager call computes in ``jax.enable_x64(True)`` and returns NumPy; traced, it
        raises (docs/architecture.md, the x64 rule).
      schedule: a :class:`~adaptprec.PrecisionSchedule` consulted every step; the
        built-in escalation rules are always on (:mod:`.solver`).
      throw: raise inside the program (``equinox``) when the solve fails.
      linear_solver: ``"qr"``, ``"normal"`` or ``"auto"`` (QR below 4096 residuals).
      max_rejections, cond_tol: a rung is left after this many rejected steps at its
        rounding level, or when ``u_rung`` times its Gauss-Newton step error exceeds
        ``cond_tol``.
      starts: ``K > 1`` Latin-hypercube starts on the batched engine, the best polished;
        ``"auto"`` a search only when the local fit asks for one (eager only).
      chunk_size: stream the data in chunks of this many points (also a
        :class:`~adaptprec.Chunks` source; host data of 2^22 points and data sharded over
        a mesh stream by themselves; ``False`` never streams).
      verbose, workers: scipy's; anything but ``0``/``None`` raises naming the alternative.

    Returns:
      :class:`~adaptprec.NLSQResult`; ``x`` is differentiable in ``args`` (and in arrays
      the residual captures) by implicit differentiation of ``grad_x cost = 0``.

    The call is routed by :func:`route` (its docstring is the decision tree).

    Example:
        >>> import jax.numpy as jnp
        >>> import adaptprec as ap
        >>> def rosen(x):
        ...     return jnp.array([10.0 * (x[1] - x[0] ** 2), 1.0 - x[0]])
        >>> res = ap.solve_nlsq(rosen, jnp.array([-1.2, 1.0]))
        >>> [round(float(v), 8) for v in res.x], res.rung_name  # small: float64 alone
        ([1.0, 1.0], 'f64')
        >>> int(ap.solve_nlsq(rosen, jnp.array([-1.2, 1.0]), precision="f32,f64").escalations)
        1
    """
    kw = dict(method=method, bounds=bounds, loss=loss, f_scale=f_scale, x_scale=x_scale,
              jac=jac, ftol=ftol, xtol=xtol, gtol=gtol, max_steps=max_steps,
              precision=precision, schedule=schedule, linear_solver=linear_solver,
              max_rejections=max_rejections, cond_tol=cond_tol, max_nfev=max_nfev,
              diff_step=diff_step, kwargs=kwargs, tr_solver=tr_solver,
              tr_options=tr_options, jac_sparsity=jac_sparsity, verbose=verbose,
              workers=workers, callback=callback)
    return route(residual, x0, lists_as_arrays(args), kw, starts=starts, throw=throw,
                 chunk_size=chunk_size)


def route(residual, x0, args, kw: dict, *, starts=1, throw=False, chunk_size=None):
    """The one dispatch of a fit. In this order:

    1. **streamed** (:mod:`._stream`): a :class:`~adaptprec.Chunks` source,
       ``chunk_size=N``, host NumPy data of at least ``_stream.STREAM_MIN_POINTS``
       points, or ``jax.Array`` data **sharded** over a mesh along its points
       (:mod:`._sharded`: the per-device sums reduced with one ``psum``). A host loop
       over the solver's compiled step, each evaluation a pass over the chunks. Eager
       only.
    2. ``starts="auto"`` (:mod:`._auto_starts`): the in-memory fit, then a search from
       Latin-hypercube starts only when that fit failed or left a test unmet; budgeted
       in evaluations.
    3. ``starts=K > 1`` (:mod:`._multistart`): ``K`` starts on the batched engine, the
       best polished by the in-memory fit.
    4. **in memory** (:func:`solve_in_memory`): one compiled program per residual
       computation, data bucket and options (:mod:`._programs`), inlined under a user's
       ``jit``/``vmap``/``grad``.
    """
    from . import _stream

    if chunk_size is not False and (chunk_size is not None or _may_stream(args) and
                                    _stream.wants_stream(args)):
        res = _stream.solve_stream(residual, x0, args, chunk_size=chunk_size,
                                   auto=chunk_size is None and not isinstance(
                                       args, _stream.Chunks),
                                   throw=throw, starts=starts, **kw)
        if res is not None:
            return res
    if starts == "auto" or (starts != 1 and not isinstance(starts, (int, np.integer))):
        from ._auto_starts import as_auto, solve_auto

        return solve_auto(solve_in_memory, residual, x0, args, kw, auto=as_auto(starts),
                          throw=throw)
    if starts != 1:
        from ._multistart import solve_multistart

        return solve_multistart(solve_in_memory, residual, x0, args, kw, starts=starts,
                                throw=throw)
    return solve_in_memory(residual, x0, args, kw, outputs=Outputs(throw=bool(throw)))[0]


def _may_stream(args) -> bool:
    """Whether ``args`` may stream without being asked (the cheap test before
    :func:`._stream.wants_stream`, which decides)."""
    from ._stream import STREAM_MIN_POINTS, Chunks

    if isinstance(args, Chunks):
        return True
    return any(isinstance(a, jax.Array) or (isinstance(a, np.ndarray) and
                                             a.size >= STREAM_MIN_POINTS)
               for a in jax.tree.leaves(args))


def solve_in_memory(residual, x0, args, kw: dict, *, outputs: Outputs = Outputs(),
                    checked=(), raise_start: bool = True):
    """One in-memory solve: ``(NLSQResult, cov)`` (``cov``: ``(J^T J)^+`` when
    ``outputs.covariance``, else ``None``). ``checked``: data arrays the caller found
    finite already; ``raise_start``: a non-finite residual at ``x0`` raises scipy's
    error with its likely cause (:mod:`._start`), else the status reports it."""
    from ._programs import run

    prob = prepare(residual, x0, args, checked=checked, **kw)
    sol = run(prob, outputs)
    res = _result(prob, sol)
    if raise_start and is_concrete(res.status) and int(res.status) in (-3, -4):
        from ._start import raise_nonfinite_start

        raise_nonfinite_start(residual, x0, args, res)
    return res, sol.cov


def _result(prob: Problem, sol) -> NLSQResult:
    """The :class:`NLSQResult` of a program's :class:`._state.Solution`."""
    x = sol.x
    if prob.x0_shape is not None and is_concrete(x):
        x = np.asarray(x).reshape(prob.x0_shape)
    else:
        x = prob.unravel(x)
    fun, jac = sol.fun, sol.jac
    if prob.pad is not None and fun is not None:   # padded rows (eager: NumPy)
        fun, jac = fun[:prob.m], jac[:prob.m]
    if prob.jac_format is not None and jac is not None and is_concrete(jac):
        from ._residual import as_user_format

        jac = as_user_format(jac, prob.jac_format)
    return NLSQResult(x=x, cost=sol.cost, fun=fun, jac=jac, grad=sol.grad,
                      optimality=sol.optimality, active_mask=sol.active_mask,
                      nfev=sol.nfev, njev=None if prob.njev_none else sol.njev,
                      nit=sol.nit, status=sol.status, rung=sol.rung,
                      escalations=sol.escalations, rung_entered=sol.rung_entered,
                      rung_nfev=sol.rung_nfev, escalation_reason=sol.escalation_reason,
                      ladder=tuple(map(np.dtype, prob.opts.rungs)))
