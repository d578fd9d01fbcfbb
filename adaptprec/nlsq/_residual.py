"""The residual as the solvers see it: a flat function of a flat parameter vector, its
size ``m`` and point axes (checked once with ``jax.eval_shape`` and memoised per
residual and shapes, so a repeated call traces nothing), scipy's ``kwargs=``, and a user
``jac``'s shape.

Example:
    >>> import jax.numpy as jnp, numpy as np
    >>> from adaptprec.nlsq._residual import flat_residual
    >>> f = flat_residual(lambda p, t: {"a": p["a"] * t}, lambda x: {"a": x[0]})
    >>> f(jnp.array([2.0]), jnp.arange(3.0)).tolist()
    [0.0, 2.0, 4.0]
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

from typing import Any, NamedTuple

from .._tracing import is_concrete
from .._user_fn import returns_arrays
from . import _caches
from .._user_fn import explain_trace_error
from .._finite_diff import as_sparsity, fd_jacobian
from .._identity import user_callables
from ._arguments import FD_METHODS, check_jac_shape, wrap_jac
from .._user_fn import hashable, sig
from .._pointwise import point_axes
from ._sparse_jac import host_jac, probe_host_jac

__all__ = ["flat_residual", "traced_once", "flat_x0", "with_kwargs", "jacobian",
           "check_host_jac", "analyse", "Analysis"]

#: jaxprs kept per traced function (one per shapes/dtypes of its inputs; a solve sees one
#: per rung)
_ONCE_SIZE = 8


def _aval_key(leaf):
    aval = jax.typeof(leaf)
    return aval.shape, aval.dtype, getattr(aval, "weak_type", False)


def traced_once(fn):
    """``fn(*inputs)`` traced once per shapes/dtypes of its inputs: every later call with
    the same ones (the size probe, the point-axes analysis, the loop, the final
    evaluation, each finite-difference or autodiff use) evaluates the recorded jaxpr
    instead of calling ``fn`` again (a user's Python model or ``jac`` runs once
    per shape, as scipy's gh-13670 expects of callables with side effects). A trace whose
    constants are tracers of an enclosing trace (a closure over a ``jit`` argument) is
    used for that call only; inputs that are not arrays call ``fn`` directly.

    ``call.user_callables`` lists the user's custom-derivative rules and callbacks found
    in ``fn``'s own traces (:func:`._identity.user_callables`): a replayed
    ``custom_jvp_call`` carries its rule nested too deep for a later trace's search, so
    :func:`._identity.trace_residual` keys on this list as well (two residuals with the
    same text and different rules must not share a compiled Jacobian).

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from adaptprec.nlsq._residual import traced_once
        >>> calls = []
        >>> f = traced_once(lambda x: calls.append(1) or jnp.sin(x) * 2.0)
        >>> _ = jax.eval_shape(f, jnp.ones(3)); _ = jax.jit(f)(jnp.ones(3))
        >>> _ = jax.jacfwd(f)(jnp.ones(3)); len(calls)
        1
    """
    jaxprs: dict = {}
    found: list = []

    def call(*inputs):
        leaves, tree = jax.tree.flatten(inputs)
        try:
            key = (tree, tuple(_aval_key(leaf) for leaf in leaves))
        except TypeError:
            return fn(*inputs)
        hit = jaxprs.get(key)
        if hit is None:
            avals = [jax.ShapeDtypeStruct(k[0], k[1], weak_type=k[2]) for k in key[1]]
            closed, out_shape = jax.make_jaxpr(
                lambda *ls: fn(*jax.tree.unflatten(tree, ls)), return_shape=True)(*avals)
            hit = closed, jax.tree.structure(out_shape)
            known = {id(f) for f in found}
            found.extend(f for f in user_callables(closed.jaxpr) if id(f) not in known)
            if not any(isinstance(c, jax.core.Tracer) for c in closed.consts):
                jaxprs[key] = hit
                while len(jaxprs) > _ONCE_SIZE:
                    jaxprs.pop(next(iter(jaxprs)))
        closed, out_tree = hit
        out = jax.core.eval_jaxpr(closed.jaxpr, closed.consts, *leaves)
        return jax.tree.unflatten(out_tree, out)

    call.__wrapped__ = fn
    call.user_callables = found
    return call


def flat_residual(residual, unravel):
    """``residual(unravel(x), *args)`` as one flat vector (a pytree output raveled), the
    user's function traced once per shape (:func:`traced_once`); ``fun_flat.tree`` is
    the same evaluation with the residual's own output (a pytree), for its checks."""
    def tree_out(x, *a):
        return returns_arrays(residual, residual(unravel(x), *a), "residual")

    tree_out = traced_once(tree_out)

    def fun_flat(x, *a):
        out = tree_out(x, *a)
        if isinstance(out, (jax.Array, np.ndarray)) or np.isscalar(out):
            return jnp.ravel(out)
        return ravel_pytree(out)[0]

    fun_flat.tree = tree_out
    fun_flat.user_callables = tree_out.user_callables
    return fun_flat


def residual_size(residual, fun_flat, x0, x0_flat, args, top_dt=None) -> int:
    """Check the residual's output (``jax.eval_shape`` of ``fun_flat.tree`` at ``x0`` in
    ``top_dt``: the trace the solver reuses) and return its size ``m``; memoised per
    residual and shapes (:data:`._caches.SIZES`)."""
    key = (hashable(residual), sig(x0), sig(args))
    m = _caches.SIZES.get(key)
    if m is not None:
        return m
    x_aval = jax.ShapeDtypeStruct(np.shape(x0_flat), top_dt or jnp.result_type(x0_flat))
    try:
        out_shape = jax.eval_shape(lambda x, a: fun_flat.tree(x, *a), x_aval, args)
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
        raise ValueError(f"residual must return at most a 1-D array (or a pytree of "
                         f"arrays); it returned shape {out_leaves[0].shape}. Return "
                         "jnp.ravel(r) or stack the residuals into a vector.")
    for leaf in out_leaves:
        if not jnp.issubdtype(leaf.dtype, jnp.floating):
            raise TypeError(f"residual must return floating arrays, got {leaf.dtype}")
    m = int(sum(int(np.prod(leaf.shape)) for leaf in out_leaves))
    _caches.SIZES.put(key, m)
    return m


@functools.lru_cache(maxsize=256)
def _with_kwargs(fn, n_args: int):
    """``fn(x, *args, **kwargs)`` as ``g(x, *args, kwargs)`` (scipy's ``kwargs=``), stable
    per ``(fn, n_args)`` so the compiled-solver cache hits."""
    def g(x, *a):
        return fn(x, *a[:n_args], **a[n_args])
    return g


def with_kwargs(residual, jac, args: tuple, kwargs):
    """scipy's ``kwargs=``: ``residual`` (and a callable ``jac``) taking them as one more
    argument, appended to ``args``."""
    if not isinstance(kwargs, dict):
        raise TypeError(f"kwargs must be a dict, got {type(kwargs).__name__}")
    residual = _with_kwargs(residual, len(args))
    if callable(jac):
        jac = _with_kwargs(jac, len(args))
    return residual, jac, (*args, dict(kwargs))


def flat_x0(x0, top_dt):
    """``(x0_flat, unravel)``: ``x0`` (after :func:`._inputs.as_x0`) as one vector, an
    integer one in ``top_dt``."""
    if isinstance(x0, np.ndarray):
        # NumPy: ravel_pytree's eager jnp reshape would compile (per shape, per process)
        x0_flat, unravel = np.ravel(x0), functools.partial(_reshape_to, np.shape(x0))
    else:
        x0_flat, unravel = ravel_pytree(x0)
    if x0_flat.size == 0:
        raise ValueError("x0 has no elements; give at least one parameter")
    if not jnp.issubdtype(x0_flat.dtype, jnp.floating):
        x0_flat = x0_flat.astype(top_dt)
    return x0_flat, unravel


def _host_kind(jac, x0_flat, args, m: int, n: int) -> str | None:
    """A user ``jac``'s output shape, checked once (``jax.eval_shape``) at the boundary.

    A ``jac`` JAX cannot trace is called once on the host (eager calls only): if it
    returns a scipy.sparse matrix or a ``LinearOperator``, its kind (``"sparse"`` /
    ``"operator"``) is returned and it will be evaluated on the host
    (:mod:`._sparse_jac`); otherwise the tracing error is raised."""
    try:
        out = jax.eval_shape(lambda x, a: jnp.asarray(jac(x, *a)), x0_flat, args)
    except Exception as exc:
        kind, J0 = (probe_host_jac(getattr(jac, "__wrapped__", jac), x0_flat, args)
                    if is_concrete((x0_flat, args))
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
    """:func:`._pointwise.point_axes` of the flat residual, memoised per residual and
    shapes (:data:`._caches.POINT_AXES`), and remembered per residual object so that a
    new data length needs no trace (:data:`._caches.POINTS`)."""
    key = (hashable(residual), sig(x0), sig(args))
    axes = _caches.POINT_AXES.get(key, False)
    if axes is False:
        axes = point_axes(fun_flat, x0_flat, args, m)
        _caches.POINT_AXES.put(key, axes)
        if axes is not None:
            _caches.POINTS.remember(residual, x0_flat, args, axes)
    return axes


def check_host_jac(host_kind, method, tr_solver, x_scale_given):
    """scipy's rules for a ``jac`` returning a sparse matrix or a ``LinearOperator``
    (``host_kind`` ``"sparse"``/``"operator"``, evaluated on the host; ``None``: a
    dense one): the options it excludes, and ``"trf"`` as the default method.

    Example:
        >>> from adaptprec.nlsq._residual import check_host_jac
        >>> check_host_jac("sparse", None, None, None), check_host_jac(None, "lm", None, None)
        ('trf', 'lm')
    """
    if host_kind is None:
        return method
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
    return method


def jacobian(jac, fun_flat, m: int, n: int, host_kind, diff_step, jac_sparsity, fd_bounds):
    """The Jacobian the solvers call, and its part of the compiled-solver cache key: a
    user callable (checked shape, or evaluated on the host for ``host_kind``), finite
    differences (``fd_bounds``: known finite bounds, or ``(None, None)``), or the
    autodiff mode ``"fwd"``/``"rev"`` as it is."""
    jac_key = getattr(jac, "__wrapped__", jac)  # the user's object (traced_once wraps it)
    if callable(jac):
        jac = wrap_jac(jac, m, n) if host_kind is None else host_jac(jac_key, m, n)
    elif jac in FD_METHODS:
        jac_key = (jac, None if diff_step is None else
                   tuple(np.ravel(np.asarray(diff_step, float)).tolist()),
                   *(None if b is None else tuple(np.asarray(b).tolist())
                     for b in fd_bounds))
        sp = None if jac_sparsity is None else as_sparsity(jac_sparsity, m, n)
        if sp is not None:
            jac_key = (*jac_key, sp.shape, np.packbits(sp).tobytes())
        jac = fd_jacobian(fun_flat, jac, diff_step, *fd_bounds, sparsity=sp)
    return jac, jac_key


class Analysis(NamedTuple):
    """The residual as the solver sees it (:func:`analyse`)."""

    residual: Any     # the user's (with scipy's kwargs bound)
    fun_flat: Any
    unravel: Any
    x0_flat: Any
    x0_shape: Any
    n: int
    m: int
    args: tuple
    jac: Any          # "fwd"/"rev", a finite-difference name, or a checked callable
    host_kind: Any    # "sparse"/"operator": a jac evaluated on the host (scipy.sparse)
    x0: Any
    top_dt: Any
    recalled_axes: Any = None

    def point_axes(self):
        """The data's point axes if the residual is proven pointwise, else ``None``."""
        if self.recalled_axes is not None:
            return self.recalled_axes
        return _point_axes(self.residual, self.fun_flat, self.x0, self.x0_flat, self.args,
                           self.m)


def analyse(residual, x0, args, jac, kwargs, top_dt) -> Analysis:
    """The residual, ``x0`` (after :func:`._inputs.as_x0`) and ``args`` as the solver sees
    them: scipy's ``kwargs`` bound, a user ``jac`` traced once per shape and its output
    shape checked, ``x0`` flat and finite, the residual's size ``m`` (a new data length of
    a pointwise residual seen before: no trace)."""
    if kwargs:
        residual, jac, args = with_kwargs(residual, jac, args, kwargs)
    if callable(jac):  # a user's jac runs once per shape (gh-13670)
        jac = traced_once(jac)
    x0_flat, unravel = flat_x0(x0, top_dt)
    if is_concrete(x0_flat) and not np.all(np.isfinite(np.asarray(x0_flat))):
        bad = int(np.sum(~np.isfinite(np.asarray(x0_flat))))
        raise ValueError(f"x0 contains NaN or Inf ({bad} non-finite value(s)); give a "
                         "finite starting point.")
    n = int(x0_flat.size)
    fun_flat = flat_residual(residual, unravel)
    recalled = _caches.POINTS.recall(residual, x0_flat, args) if jac in ("fwd", "rev") \
        else None
    m = recalled[0] if recalled is not None else residual_size(residual, fun_flat, x0,
                                                               x0_flat, args, top_dt)
    host_kind = _host_kind(jac, x0_flat, args, m, n) if callable(jac) else None
    x0_shape = np.shape(x0) if isinstance(x0, (jax.Array, np.ndarray)) else None
    return Analysis(residual, fun_flat, unravel, x0_flat, x0_shape, n, m, args, jac,
                    host_kind, x0, top_dt, recalled[1] if recalled is not None else None)
