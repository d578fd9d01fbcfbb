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

import collections
import functools
import threading
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

from .._tracing import is_concrete
from .._policy import cast_floating
from .._pytree import replace
from ..precision import Ladder, canonical_dtype, is_adaptive, unit_roundoff, x64_enabled
from ._blocks import PointBlocks
from ._compile import cpu_jit
from ._errors import explain_trace_error
from ._buckets import PointMemo, bucket
from ._host import host_eligible, host_solve, masked
from . import _loop
from ._loop import LoopConfig, build_loop, default_schedule
from ._pointwise import point_axes
from . import _stream
from ._x64 import float64_entry
from .common import (STATUS_MESSAGES, check_loss, check_loss_output, robust_cost,
                     scale_for_robust_loss)
from .gn import gn_step
from .lm import lm_step, minpack_delta0, minpack_gnorm
from .result import NLSQResult, result_to_host
from .trf import active_constraints, cl_scaling, make_strictly_feasible, trf_delta0
from .trf import trf_lsmr_step, trf_step
from ._finite_diff import as_sparsity, fd_jacobian
from ._sparse_jac import as_user_format, host_jac, probe_host_jac
from ._lsmr import check_tr_options
from .dogbox import dogbox_delta0, dogbox_gnorm, dogbox_step, on_bound
from ._inputs import (FD_METHODS, OptionNotOffered, as_bounds, as_max_steps, as_scale_inv,
                      as_x0, check_array_leaves, check_jac_option, check_max_nfev,
                      check_tolerances, check_unsupported, check_jac_shape,
                      default_x_scale, lists_as_arrays, wrap_jac)

__all__ = ["solve_nlsq", "resolve_ladder", "clear_cache", "cache_info"]

METHODS = ("lm", "gn", "trf", "dogbox")
_CACHE_SIZE = 64
_cache: collections.OrderedDict = collections.OrderedDict()
_cache_lock = threading.Lock()
_stats = {"hits": 0, "misses": 0}
_m_cache: dict = {}
#: point axes per residual object (a new data length is neither traced nor analysed)
_points = PointMemo()
#: ``linear_solver="auto"`` uses the normal equations from this many residuals on: the
#: QR of a tall ``m x (n+1)`` matrix dominates the step there, while the normal
#: equations cost one ``O(m n^2)`` product (accumulated in float32 or wider).
_NORMAL_EQ_MIN_M = 4096
#: ``precision="adaptive"`` runs float64 alone on CPU when ``m n`` (residuals times
#: parameters) is below this: there a float32 rung saves nothing, since the step's cost
#: is dispatch and small dense algebra, not memory traffic. Measured
#: (curve_fit of a 3-parameter exponential, repeat fits, x64 off, 2 cores): float64
#: alone takes 0.84, 0.81 and 0.80 of the ladder's time at m = 120, 1000 and 4000,
#: 0.98 at 16000 and 1.04 at 64000. It also compiles one rung instead of two:
#: NIST StRD (54 solves) including compilation 5.5 s against 6.6 s. Such a solve keeps
#: the ladder's top-rung stopping rules (``LoopConfig.adaptive_stop``), which the
#: accuracy needs: with scipy's rules alone float64 ends at LRE 6.8 on NIST Lanczos3
#: start 2 (the ladder: 9.3). docs/architecture.md, "float64 alone for small problems".
SMALL_F64_MN = 32768


def clear_cache() -> None:
    """Drop every cached compiled solver.

    Example:
        >>> from adaptprec.nlsq.solve import clear_cache, cache_info
        >>> clear_cache(); cache_info()["size"]
        0
    """
    with _cache_lock:
        _cache.clear()
        _m_cache.clear()
        _points.clear()
        _stats.update(hits=0, misses=0)


def cache_info() -> dict:
    """``{"size", "hits", "misses"}`` of the compiled-solver cache.

    Example:
        >>> from adaptprec.nlsq.solve import cache_info
        >>> sorted(cache_info())
        ['hits', 'misses', 'size']
    """
    return {"size": len(_cache), **_stats}


def resolve_ladder(precision) -> Ladder:
    """The ladder for ``precision``: ``"adaptive"`` is ``f32 -> f64`` (bf16 is not faster
    than f32 on CPU and loses too much for a Jacobian; ``solve_nlsq`` keeps only float64
    for a small problem on CPU, :data:`SMALL_F64_MN`), a :class:`~adaptprec.Ladder` or
    ``"f32,f64"`` string is used as given, and a single dtype means fixed precision.
    ``"adaptive"`` with ``jax_enable_x64`` off raises ``ValueError`` (a float32-only answer
    only when asked for; the entry points run eager calls inside ``jax.enable_x64(True)``).

    Example:
        >>> from adaptprec.nlsq.solve import resolve_ladder
        >>> str(resolve_ladder("f32"))
        'f32'
    """
    if isinstance(precision, Ladder):
        return precision
    if is_adaptive(precision):
        if not x64_enabled():
            raise ValueError(
                "precision='adaptive' ends on float64, but jax_enable_x64 is off here: "
                "call resolve_ladder inside jax.enable_x64(True) (as the eager entry points "
                "do), or ask for float32 explicitly with precision='f32'.")
        return Ladder(["f32", "f64"])
    if isinstance(precision, str) and ("," in precision or ">" in precision):
        return Ladder.parse(precision)
    if isinstance(precision, (list, tuple)):
        return Ladder(list(precision))
    return Ladder([canonical_dtype(precision)])


def _check_finite_tree(tree, what: str, fix: str = "clean the data first (curve_fit can "
                       "drop NaN points with nan_policy='omit')") -> None:
    if not is_concrete(tree):
        return
    for leaf in jax.tree.leaves(tree):
        a = np.asarray(leaf)
        if np.issubdtype(a.dtype, np.inexact) and not np.all(np.isfinite(a)):
            raise ValueError(f"{what} contains NaN or Inf ({int(np.sum(~np.isfinite(a)))} "
                             f"non-finite value(s)); {fix}.")


def _broadcast_bounds(bounds, n, dtype):
    """``(lb, ub)`` as ``(n,)`` arrays, validated when concrete (numpy) or broadcast as
    traced values (``jnp``; bounds under ``jit``/``vmap`` cannot be checked here)."""
    if not isinstance(bounds, (tuple, list)) or len(bounds) != 2:
        raise ValueError(f"bounds must be a pair (lb, ub), got {bounds!r}")
    if not is_concrete(bounds):
        out = []
        for b in bounds:
            if isinstance(b, (dict, list, tuple)):
                b = ravel_pytree(b)[0]
            b = jnp.asarray(b, dtype)
            try:
                out.append(jnp.broadcast_to(b.ravel() if b.ndim else b, (n,)))
            except ValueError as exc:
                raise ValueError(f"a bound of shape {b.shape} does not broadcast to the "
                                 f"{n} parameters") from exc
        return tuple(out)
    out = []
    for b, name in zip(bounds, ("lower", "upper")):
        try:
            if isinstance(b, (dict, list, tuple)):
                # ravel_pytree's order, in NumPy: under a user's jit ravel_pytree would
                # make concrete lists tracers (newcomer audit 4)
                b = np.concatenate([np.ravel(np.asarray(v, np.float64))
                                    for v in jax.tree.leaves(b)] or [np.zeros(0)])
            arr = np.asarray(b, dtype=np.float64)
            arr = np.broadcast_to(arr.ravel() if arr.ndim else arr, (n,)).copy()
        except Exception as exc:  # noqa: BLE001 - re-raised with context
            raise ValueError(f"{name} bound of shape {np.shape(b)} does not broadcast to "
                             f"the {n} parameters") from exc
        out.append(arr)
    lb, ub = out
    if np.any(np.isnan(lb)) or np.any(np.isnan(ub)):
        raise ValueError("bounds contain NaN; use -inf/inf for no bound")
    if np.any(lb >= ub):
        i = int(np.argmax(lb >= ub))
        raise ValueError(f"each lower bound must be strictly less than its upper bound; "
                         f"parameter {i} has lb={lb[i]} >= ub={ub[i]}")
    return lb, ub


def _sig(tree):
    leaves, treedef = jax.tree.flatten(tree)
    return treedef, tuple((np.shape(a), str(jnp.result_type(a)) if hasattr(a, "dtype")
                           else type(a).__name__) for a in leaves)


class _Same:
    """Cache-key stand-in for an unhashable object: equal only to itself, and it keeps
    the object alive while the key is cached (a bare ``id()`` could be reused by a new
    object after the old one is collected, and hit the wrong compiled program)."""

    __slots__ = ("obj",)

    def __init__(self, obj):
        self.obj = obj

    def __eq__(self, other):
        return isinstance(other, _Same) and other.obj is self.obj

    def __hash__(self):
        return object.__hash__(self.obj)


def _hashable(obj):
    try:
        hash(obj)
        return obj
    except TypeError:
        return _Same(obj)


def _residual_size(residual, unravel, x0, x0_flat, args) -> int:
    """Check the residual's output (via ``jax.eval_shape``) and return its size ``m``.

    Memoised per (residual, shapes/dtypes of x0 and args): a repeated call does not trace
    the residual again.
    """
    key = (_hashable(residual), _sig(x0), _sig(args))
    m = _m_cache.get(key)
    if m is not None:
        return m
    try:
        out_shape = jax.eval_shape(lambda x, a: residual(unravel(x), *a), x0_flat, args)
    except Exception as exc:
        # JAX's complaints about NumPy / Python control flow on a parameter get the fix;
        # anything else (the user's own exceptions) propagates unchanged
        explained = explain_trace_error(exc)
        if explained is None:
            raise
        raise explained.with_traceback(None) from exc
    out_leaves = jax.tree.leaves(out_shape)
    if not out_leaves:
        raise ValueError("residual returned no arrays; it must return a 1-D array")
    if len(out_leaves) == 1 and jax.tree.structure(out_shape).num_leaves == 1 \
            and not isinstance(out_shape, (tuple, list, dict)) and out_leaves[0].ndim > 1:
        raise ValueError(f"residual must return at most a 1-D array (or a pytree of arrays); it "
                         f"returned shape {out_leaves[0].shape}. Return jnp.ravel(r) or "
                         "stack the residuals into a vector.")
    for leaf in out_leaves:
        if not jnp.issubdtype(leaf.dtype, jnp.floating):
            raise TypeError(f"residual must return floating arrays, got {leaf.dtype}")
    m = int(sum(int(np.prod(leaf.shape)) for leaf in out_leaves))
    _remember(key, m)
    return m


def _remember(key, value) -> None:
    """Store in ``_m_cache``, dropping the oldest entries beyond ``4 * _CACHE_SIZE`` (each
    key holds its residual alive: unbounded, 2,500 fits of fresh models kept 2,628
    entries and their closed-over data, newcomer audit 6)."""
    _m_cache[key] = value
    while len(_m_cache) > 4 * _CACHE_SIZE:
        _m_cache.pop(next(iter(_m_cache)))


@functools.lru_cache(maxsize=256)
def _with_kwargs(fn, n_args: int):
    """``fn(x, *args, **kwargs)`` as ``g(x, *args, kwargs)`` (scipy's ``kwargs=``), stable
    per ``(fn, n_args)`` so the compiled-solver cache hits."""
    def g(x, *a):
        return fn(x, *a[:n_args], **a[n_args])
    return g


def _check_jac_shape(jac, x0_flat, args, m: int, n: int) -> str | None:
    """A user ``jac``'s output shape, checked once (``jax.eval_shape``) at the boundary.

    A ``jac`` JAX cannot trace is called once on the host (eager calls only): if it
    returns a scipy.sparse matrix or a ``LinearOperator``, its kind (``"sparse"`` /
    ``"operator"``) is returned and it will be evaluated on the host
    (:mod:`._sparse_jac`); otherwise the tracing error is raised."""
    try:
        out = jax.eval_shape(lambda x, a: jnp.asarray(jac(x, *a)), x0_flat, args)
    except Exception as exc:
        kind, J0 = (probe_host_jac(jac, x0_flat, args) if is_concrete((x0_flat, args))
                    else (None, None))
        if kind is None:
            explained = explain_trace_error(exc, "jac")
            if explained is not None:
                raise explained.with_traceback(None) from exc
            raise TypeError(f"calling jac(x0, *args) failed while checking its shape: "
                            f"{exc}") from exc
        if tuple(J0.shape) != (m, n):
            raise ValueError(f"The return value of `jac` has wrong shape: expected "
                             f"{(m, n)}, actual {tuple(J0.shape)}.") from None
        return kind
    check_jac_shape(tuple(out.shape), m, n)
    return None


def _reshape_to(shape, flat):
    return jnp.reshape(flat, shape)


def _point_axes(residual, fun_flat, x0, x0_flat, args, m):
    """:func:`._pointwise.point_axes` of the flat residual, memoised like ``m``."""
    key = ("point_axes", _hashable(residual), _sig(x0), _sig(args))
    if key not in _m_cache:
        _remember(key, point_axes(fun_flat, x0_flat, args, m))
    return _m_cache[key]


@float64_entry("solve_nlsq", ("x0", "args", "bounds", "f_scale"), host=result_to_host)
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
    starts: int = 1,
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
      max_steps: iteration cap (trial steps); default ``100 * (n + 1)``. ``"lm"`` runs a
        portfolio (docs/nlsq.md, "Robustness"): when its default strategy fails (out of
        steps, no finite step, or runaway parameters) the top rung restarts from ``x0``
        with scipy's radius rule and the lower-cost end is returned. With the default,
        each strategy has ``100 * (n + 1)`` steps; an explicit ``max_steps`` (and
        ``max_nfev``) caps the whole solve.
      max_nfev: scipy's cap on residual evaluations (``None``: no cap beyond
        ``max_steps``); ``max_nfev=1`` evaluates at ``x0`` only. Status 0 when reached.
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
        the iterate stays float64; on CPU with ``m n <`` :data:`SMALL_F64_MN` and no
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
        ``njev`` and ``nit`` then count every start's work.
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
        from ._multistart import solve_multistart

        # the batched engine behind starts= carries none of these: never drop one silently
        given = [k for k, v in dict(max_nfev=max_nfev, diff_step=diff_step, kwargs=kwargs,
                                    tr_solver=tr_solver, tr_options=tr_options,
                                    jac_sparsity=jac_sparsity, callback=callback).items()
                 if v is not None] + (["verbose"] if verbose else [])
        if given:
            raise OptionNotOffered(
                f"solve_nlsq(starts={starts}) runs the starts on the batched engine, which "
                f"does not take {', '.join(given)}; drop them, or call solve_nlsq once per "
                "start (starts=1) with those options.")
        return solve_multistart(
            residual, x0, args, starts=starts, method=method, bounds=bounds, loss=loss,
            f_scale=f_scale, x_scale=x_scale, jac=jac,
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
    if jac is None:  # scipy's default is "2-point": diff_step / jac_sparsity ask for it
        jac = "2-point" if (diff_step is not None or jac_sparsity is not None) else "fwd"
    jac = check_jac_option(jac)
    check_unsupported(tr_solver=tr_solver, tr_options=tr_options, verbose=verbose,
                      workers=workers)
    if jac_sparsity is not None and callable(jac):
        # scipy: jac_sparsity describes finite differences; a callable jac gives the
        # Jacobian itself, so the pattern is unused (its shape is checked below)
        pass
    elif jac_sparsity is not None:
        if method == "lm":
            raise ValueError("method='lm' does not support `jac_sparsity`; use "
                             "method='trf' or 'dogbox'.")
        if tr_solver == "exact":
            raise ValueError("tr_solver='exact' is incompatible with `jac_sparsity` (as in "
                             "scipy); leave tr_solver unset.")
        if not (isinstance(jac, str) and jac in FD_METHODS):
            raise OptionNotOffered(
                "jac_sparsity applies to finite-difference Jacobians (it groups the "
                "perturbed evaluations); pass jac='2-point', '3-point' or 'cs' with it, or "
                "drop it: automatic differentiation (jac='fwd') needs no sparsity.")
    if callback is not None and not callable(callback):
        raise TypeError(f"callback must be callable, got {type(callback).__name__}")
    max_nfev = check_max_nfev(max_nfev)
    if diff_step is not None and not (isinstance(jac, str) and jac in FD_METHODS):
        raise ValueError("diff_step only applies to finite-difference Jacobians; pass "
                         "jac='2-point', '3-point' or 'cs' with it.")
    if kwargs:
        if not isinstance(kwargs, dict):
            raise TypeError(f"kwargs must be a dict, got {type(kwargs).__name__}")
        residual = _with_kwargs(residual, len(args))
        if callable(jac):
            jac = _with_kwargs(jac, len(args))
        args = (*args, dict(kwargs))
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

    if isinstance(x0, np.ndarray):
        # NumPy: ravel_pytree's eager jnp reshape would compile (per shape, per process)
        x0_flat, unravel = np.ravel(x0), functools.partial(_reshape_to, np.shape(x0))
    else:
        x0_flat, unravel = ravel_pytree(x0)
    if x0_flat.size == 0:
        raise ValueError("x0 has no elements; give at least one parameter")
    if not jnp.issubdtype(x0_flat.dtype, jnp.floating):
        x0_flat = x0_flat.astype(top_dt)
    _check_finite_tree(x0_flat, "x0", "give a finite starting point")
    check_array_leaves(args)
    _check_finite_tree(args, "the data in args")
    n = int(x0_flat.size)

    def fun_flat(x, *a):
        out = residual(unravel(x), *a)
        if isinstance(out, (jax.Array, np.ndarray)) or np.isscalar(out):
            return jnp.ravel(out)
        return ravel_pytree(out)[0]

    # a new data length of a residual seen before: size and point axes from the memo
    recalled = _points.recall(residual, x0_flat, args) if jac in ("fwd", "rev") else None
    if recalled is not None:
        m = recalled[0]
    else:
        m = _residual_size(residual, unravel, x0, x0_flat, args)
    check_loss_output(loss, m, top_dt)
    adaptive_stop = False
    if _starts_on_float64(precision, schedule, m, n):
        rungs, ladder, adaptive_stop = rungs[-1:], Ladder(list(rungs[-1:])), True
    if jac_sparsity is not None and callable(jac):
        as_sparsity(jac_sparsity, m, n)  # shape check only (scipy's check_jac_sparsity)
    # a jac returning scipy.sparse / LinearOperator: evaluated on the host (scipy's rules)
    host_kind = _check_jac_shape(jac, x0_flat, args, m, n) if callable(jac) else None
    if host_kind is not None:
        if method == "lm":
            raise ValueError("method='lm' works only with dense Jacobian matrices; "
                             "use method='trf' or 'dogbox' for a sparse or "
                             "LinearOperator `jac`.")
        if tr_solver == "exact":
            raise ValueError("tr_solver='exact' works only with dense Jacobian matrices; "
                             "leave tr_solver unset for a sparse or LinearOperator `jac`.")
        if host_kind == "operator" and isinstance(x_scale_given, str) \
                and x_scale_given == "jac":
            raise ValueError("x_scale='jac' can't be used when `jac` returns "
                             "LinearOperator; give x_scale as an array.")
        if method is None:  # scipy's least_squares default
            method = "trf"

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
    # max_steps caps the whole solve
    portfolio = (2 if max_steps is None else 1) if _loop.PORTFOLIO else 0
    max_steps = as_max_steps(max_steps, n)

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
    jac_key = jac
    if callable(jac):
        jac = wrap_jac(jac, m, n) if host_kind is None else host_jac(jac, m, n)
    elif jac in FD_METHODS:
        fd_bounds = (lb, ub) if bounds_known and has_bounds else (None, None)
        jac_key = (jac, None if diff_step is None else
                   tuple(np.ravel(np.asarray(diff_step, float)).tolist()),
                   *(None if b is None else tuple(np.asarray(b).tolist())
                     for b in fd_bounds))
        sp = None if jac_sparsity is None else as_sparsity(jac_sparsity, m, n)
        if sp is not None:
            jac_key = (*jac_key, sp.shape, np.packbits(sp).tobytes())
        jac = fd_jacobian(fun_flat, jac, diff_step, *fd_bounds, sparsity=sp)
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
    if driver not in ("auto", "host", "fused"):
        raise ValueError(f"driver must be 'auto', 'host' or 'fused', got {driver!r}")
    # ------------------------------------------------------------------ compiled solver
    cfg = LoopConfig(m=m, n=n, rungs=rungs, method=method, loss=loss, jac=jac,
                     jac_scale=isinstance(x_scale, str), has_bounds=has_bounds,
                     max_steps=int(max_steps), linear_solver=linear_solver,
                     max_rejections=int(max_rejections), cond_tol=float(cond_tol),
                     schedule=schedule, point_axes=axes, max_nfev=max_nfev,
                     callback=callback, tr=tr, portfolio=portfolio,
                     adaptive_stop=adaptive_stop)
    if driver != "fused":
        if tr is None and host_eligible(cfg, bool(throw), x0_flat, args, lb, ub, f_scale):
            x0_shape = np.shape(x0) if isinstance(x0, (jax.Array, np.ndarray)) else None
            res = host_solve(residual, fun_flat, unravel, x0_shape, cfg, pad,
                             x0_flat.astype(top_dt), args, lb, ub, scale_inv0, f_scale,
                             ftol, xtol, gtol)
            # the host driver runs autodiff Jacobians only: for lm, scipy's None
            return replace(res, njev=None) if _njev_is_none(cfg) else res
        if driver == "host":
            raise ValueError("driver='host' needs an eager call (no tracers in x0, args, "
                             "bounds), jac='fwd'/'rev', the QR model (linear_solver='qr' "
                             "or fewer than 4096 residuals), throw=False, no max_nfev, "
                             "callback or tr_solver='lsmr' and a hashable loss and "
                             "schedule; use "
                             "driver='auto'")
    key = (_hashable(residual), _hashable(jac_key), _hashable(loss), _hashable(schedule),
           cfg._replace(loss=None, jac=None, schedule=None, callback=None),
           _hashable(callback), bool(throw),
           _sig(x0), _sig(args), str(x0_flat.dtype), pad)
    with _cache_lock:
        solver = _cache.get(key)
        if solver is None:
            _stats["misses"] += 1
            solver = _build_solver(fun_flat, unravel, cfg, bool(throw), ladder, pad)
            _cache[key] = solver
            if len(_cache) > _CACHE_SIZE:
                _cache.popitem(last=False)
        else:
            _stats["hits"] += 1
            _cache.move_to_end(key)
    res = solver(x0_flat.astype(top_dt), args, jnp.asarray(lb, top_dt),
                 jnp.asarray(ub, top_dt), jnp.asarray(scale_inv0, top_dt),
                 jnp.asarray(f_scale, top_dt), jnp.asarray(ftol, top_dt),
                 jnp.asarray(xtol, top_dt), jnp.asarray(gtol, top_dt))
    if (host_kind or sparse_fd) and is_concrete(res.jac):  # scipy: res.jac in jac's format
        res = replace(res, jac=as_user_format(res.jac, host_kind or "sparse"))
    return res


def _starts_on_float64(precision, schedule, m: int, n: int) -> bool:
    """Whether an ``"adaptive"`` solve runs on float64 alone (:data:`SMALL_F64_MN`):
    the default ladder (no schedule) on CPU with ``m n`` below the crossover."""
    return (is_adaptive(precision) and schedule is None and m * n < SMALL_F64_MN
            and jax.default_backend() == "cpu")


def _njev_is_none(cfg: LoopConfig) -> bool:
    """scipy's rule for ``njev``: ``None`` for ``method="lm"`` unless ``jac`` is the
    user's callable (MINPACK counts only "analytic" Jacobian evaluations). Here an
    autodiff (``"fwd"``/``"rev"``) or finite-difference Jacobian under ``lm`` gives
    ``None`` likewise."""
    return cfg.method == "lm" and (isinstance(cfg.jac, str) or
                                   getattr(cfg.jac, "finite_diff", False))


def _tr_solver_options(tr_solver, tr_options, method: str, host_kind):
    """scipy's ``tr_solver``/``tr_options``: ``None`` (exact step) or the lsmr options.

    ``tr_solver=None`` is ``"exact"`` unless the Jacobian is sparse (``host_kind``: ``jac``
    returns a sparse matrix or a ``LinearOperator``, or finite differences with
    ``jac_sparsity``): then ``"lsmr"``, as scipy chooses; ``tr_options`` with the exact
    solver are ignored with a warning (scipy ignores them silently), and ``lm``/``gn``
    ignore ``tr_solver`` with a warning (scipy's ``lm`` ignores it silently)."""
    import warnings

    if tr_solver is None:
        tr_solver = "lsmr" if host_kind is not None else "exact"
    if method in ("lm", "gn"):
        if tr_solver == "lsmr" or tr_options:
            warnings.warn(f"tr_solver / tr_options have no effect with method={method!r} "
                          "(its step is MINPACK's exact one); use method='trf' or "
                          "'dogbox' for tr_solver='lsmr'.", UserWarning, stacklevel=4)
        return None
    if tr_solver == "exact":
        if tr_options:
            warnings.warn("tr_options are ignored with tr_solver='exact' (they are "
                          "LSMR's options); pass tr_solver='lsmr' to use them.",
                          UserWarning, stacklevel=4)
        return None
    return check_tr_options(tr_options, method)


def method_fns(method: str, m, tr=None):
    """``(step_fn, gnorm_fn, delta0_fn)`` of :func:`._loop.build_loop` for ``method``
    (``m`` may be traced: the host driver's step is compiled once for every ``m``);
    ``tr`` is ``tr_solver="lsmr"``'s options (:func:`._lsmr.check_tr_options`), ``None``
    for the exact step."""
    if method == "trf":
        def step_fn(x, R, qtf, g, scale_inv, Delta, alpha, lb, ub):
            if tr is not None:
                return trf_lsmr_step(x, R, qtf, g, scale_inv, Delta, alpha, lb, ub, m=m,
                                     opts=tr)
            return trf_step(x, R, qtf, g, scale_inv, Delta, alpha, lb, ub, m=m)

        def gnorm_fn(x, g, R, fsn, lb, ub):
            v, _ = cl_scaling(x, g, lb, ub)
            return jnp.max(jnp.abs(g * v))

        return step_fn, gnorm_fn, trf_delta0
    if method == "dogbox":
        if tr is not None:
            return (functools.partial(dogbox_step, lsmr_opts=tr), dogbox_gnorm,
                    dogbox_delta0)
        return dogbox_step, dogbox_gnorm, dogbox_delta0
    inner = lm_step if method == "lm" else gn_step

    def step_fn(x, R, qtf, g, scale_inv, Delta, alpha, lb, ub):  # noqa: F811
        return inner(x, R, qtf, scale_inv, Delta, alpha, m=m)

    return step_fn, minpack_gnorm, minpack_delta0


def final_eval(fun_flat, cfg: LoopConfig, x, args_top, f_scale):
    """The final evaluation on the top rung: ``(f, Js, g, cost)`` (residual, loss-scaled
    Jacobian, gradient, cost), shared by both drivers."""
    top_dt = cfg.rungs[-1]
    loss = cfg.loss
    if cfg.point_axes is not None:
        # block by block: f, loss-scaled J, g and the cost without an m x n transpose
        blocks = PointBlocks(cfg.m, cfg.point_axes)

        def body(carry, f, JT):
            g, cost = carry
            f, JT = f.astype(top_dt), JT.astype(top_dt)
            fs, Js = scale_for_robust_loss(loss, f, JT.T, f_scale)
            return (g + Js.T @ fs, cost + robust_cost(loss, f, f_scale)), (f, Js)

        init = (jnp.zeros((cfg.n,), top_dt), jnp.zeros((), top_dt))
        (g, cost), (f, Js) = blocks.scan_rows(fun_flat, x, blocks.block(args_top), body,
                                              init)
        return blocks.points(f), blocks.points(Js), g, cost
    if callable(cfg.jac):
        f = fun_flat(x, *args_top)
        J = jnp.asarray(cfg.jac(x, *args_top))
    else:
        jf = jax.jacfwd if cfg.jac == "fwd" else jax.jacrev
        J, f = jf(lambda z: (fun_flat(z, *args_top),) * 2, has_aux=True)(x)
    f = f.astype(top_dt)
    J = J.astype(top_dt)
    cost = robust_cost(loss, f, f_scale)
    fs, Js = scale_for_robust_loss(loss, f, J, f_scale)
    return f, Js, Js.T @ fs, cost


def _build_solver(fun_flat, unravel, cfg: LoopConfig, throw: bool, ladder, pad=None):
    rungs = cfg.rungs
    top_dt = rungs[-1]
    step_fn, gnorm_fn, delta0_fn = method_fns(cfg.method, cfg.m, cfg.tr)
    if pad is not None:  # data padded to the bucket inside, padded rows masked
        pad_axes, pad_m = pad
        pad_idx = np.minimum(np.arange(pad_m), cfg.m - 1)
        fun_flat = masked(fun_flat, np.arange(pad_m) < cfg.m)

    run = build_loop(fun_flat, cfg, step_fn, gnorm_fn, delta0_fn)
    loss = cfg.loss

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
        return NLSQResult(
            x=unravel(x), cost=cost, fun=f, jac=Js, grad=g, optimality=optimality,
            active_mask=active, nfev=st.nfev,
            njev=None if _njev_is_none(cfg) else st.njev, nit=st.nit,
            status=status, rung=st.rung, escalations=st.escalations,
            rung_entered=st.rung_entered, rung_nfev=st.rung_nfev,
            escalation_reason=st.esc_reason, ladder=tuple(np.dtype(d) for d in rungs))

    # run time is negligible next to compilation below _NORMAL_EQ_MIN_M residuals
    return cpu_jit(solve, optimise=cfg.m >= _NORMAL_EQ_MIN_M)

