"""The boundary of ``solve_nlsq``: :func:`prepare` turns its arguments into a validated
:class:`Problem` before anything is traced (each argument by scipy's rules,
:mod:`._arguments`), and the checks of values (finite data, bounds) every call runs.

Example:
    >>> import numpy as np
    >>> from adaptprec.nlsq._inputs import broadcast_bounds
    >>> [b.tolist() for b in broadcast_bounds((0.0, [1.0, 2.0]), 2, np.float64)]
    [[0.0, 0.0], [1.0, 2.0]]
"""

from __future__ import annotations

import inspect
import operator
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

from .._tracing import is_concrete, is_eager, trace_active
from ..precision import x64_enabled
from . import _caches
from ._arguments import (AD_METHODS, as_bounds, as_x0, check_array_leaves,
                         check_method_loss, check_scipy_options, check_tolerances,
                         check_x0_inside, float64_alone, method_for_bounds,
                         step_budget, top_rungs)

__all__ = ["Problem", "prepare", "broadcast_bounds", "lists_as_arrays", "all_finite",
           "check_finite_tree", "check_f_scale"]


def broadcast_bounds(bounds, n: int, dtype):
    """``(lb, ub)`` as ``(n,)`` arrays: validated NumPy when concrete (no NaN, ``lb <
    ub``), ``jnp`` when traced (bounds under ``jit``/``vmap`` cannot be checked)."""
    if not isinstance(bounds, (tuple, list)) or len(bounds) != 2:
        raise ValueError(f"bounds must be a pair (lb, ub), got {bounds!r}")
    if not is_concrete(bounds):
        out = []
        for b in bounds:
            b = jnp.asarray(ravel_pytree(b)[0] if isinstance(b, (dict, list, tuple)) else b,
                            dtype)
            try:
                out.append(jnp.broadcast_to(b.ravel() if b.ndim else b, (n,)))
            except ValueError as exc:
                raise ValueError(f"a bound of shape {b.shape} does not broadcast to the "
                                 f"{n} parameters") from exc
        return tuple(out)
    return _numpy_bounds(bounds, n)


def _numpy_bounds(bounds, n: int):
    """:func:`broadcast_bounds` of concrete bounds."""
    out = []
    for b, name in zip(bounds, ("lower", "upper")):
        try:
            if isinstance(b, (dict, list, tuple)):   # ravel_pytree's order, in NumPy
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


def check_f_scale(f_scale) -> None:
    """``f_scale`` a positive finite number (concrete)."""
    if not (np.isscalar(f_scale) and np.isfinite(f_scale) and f_scale > 0):
        raise ValueError(f"f_scale must be a positive finite number, got {f_scale!r}")


def _scale_inv(x_scale, n: int):
    """``1 / x_scale`` as a float64 vector (ones for ``"jac"``, whose scaling the solver
    takes from the Jacobian); scipy's errors otherwise."""
    if isinstance(x_scale, str):
        if x_scale != "jac":
            raise ValueError(f"x_scale must be 'jac' or an array, got {x_scale!r}")
        return np.ones(n)
    if np.iscomplexobj(x_scale):
        raise ValueError("x_scale must be 'jac' or an array of positive finite (real) "
                         "numbers")
    try:
        xs = np.broadcast_to(np.asarray(x_scale, np.float64), (n,))
    except (TypeError, ValueError) as exc:
        raise ValueError(f"x_scale must be 'jac' or an array of positive finite "
                         f"numbers broadcastable to ({n},): {exc}") from None
    if not np.all(np.isfinite(xs)) or np.any(xs <= 0):
        raise ValueError("x_scale must be 'jac' or an array of positive finite numbers")
    return 1.0 / xs


def lists_as_arrays(args):
    """Top-level ``args`` that are lists of numbers as NumPy arrays (to JAX a list is a
    pytree: the residual would get a Python list of scalars)."""
    if not isinstance(args, tuple):
        return args
    return tuple(np.asarray(a) if isinstance(a, list) and a and all(
        isinstance(v, (bool, int, float)) for v in jax.tree.leaves(a)) else a for a in args)


def all_finite(a) -> bool:
    """Whether every entry of ``a`` is finite: a small array entry by entry, a large one
    in one pass (a finite sum means every term is; entry by entry when it is not).

    Example:
        >>> import numpy as np
        >>> from adaptprec.nlsq._inputs import all_finite
        >>> all_finite(np.ones(3)), all_finite(np.array([1.0, np.nan])), \
all_finite(np.array([1e308, 1e308]))
        (True, False, True)
    """
    a = a if type(a) is np.ndarray else np.asarray(a)
    if a.dtype.kind not in "fc":   # (NumPy's inexact kinds; integers are finite)
        return True
    if a.size >= 4096:   # one pass, no boolean temporary of a large array
        with np.errstate(over="ignore", invalid="ignore"):
            if np.isfinite(np.add.reduce(a, axis=None)):
                return True
    return bool(np.isfinite(a).all())


_FINITE_FIX = "clean the data first (curve_fit can drop NaN points with nan_policy='omit')"


def check_finite_tree(tree, what: str, fix: str = _FINITE_FIX, skip=()) -> None:
    """Raise ``ValueError`` when a concrete leaf of ``tree`` is not finite (``skip``:
    arrays the caller has checked already, by identity)."""
    if not is_concrete(tree):
        return
    for leaf in jax.tree.leaves(tree):
        if any(leaf is c for c in skip) or all_finite(leaf):
            continue
        a = np.asarray(leaf)
        raise ValueError(f"{what} contains NaN or Inf ({int(np.sum(~np.isfinite(a)))} "
                         f"non-finite value(s)); {fix}.")


class Problem(NamedTuple):
    """A validated in-memory solve (:func:`prepare`)."""

    residual: Any        # the user's function (keys, the start diagnosis)
    fun_flat: Any        # the flat residual of a flat parameter vector
    unravel: Any         # flat parameters -> the user's structure
    x0_shape: Any        # x0's shape when it is one array (None: a pytree)
    opts: Any            # ._state.Options
    jac_key: Any         # the Jacobian's part of a program key
    m: int
    pad: Any             # (point axes, bucket length) of a padded pointwise residual
    identity: bool       # keyed on the residual's computation (._programs.run_identity)
    jac_format: Any      # "sparse" / "operator": res.jac in the user's jac's format
    args: tuple
    context: tuple       # (x0, lb, ub, scale_inv0, f_scale, ftol, xtol, gtol), top dtype
    x0_sig: Any          # x0's structure, shapes and dtypes (keys of closing programs)
    njev_none: bool      # scipy's njev=None (lm with a Jacobian it did not evaluate)
    memo_key: Any = None  # the structure key of a memoised problem (:func:`prepare`)
    given: Any = None     # its call's (bounds, x_scale, f_scale) when immutable


class _Key(NamedTuple):
    """The structure of a common eager call (:func:`_structure_key`)."""

    residual: Any
    x0_shape: tuple
    data: tuple          # (shape, dtype) of each data array
    bounds: tuple        # per bound: finite (a number) or (shape, finite entries)
    x_scale: Any
    options: tuple       # the options but :data:`_VALUE_OPTIONS`
    x64: bool
    backend: str


def _structure_key(residual, x0, args, kw):
    """A key of everything but the values of ``x0``, the data, the bounds, ``x_scale``
    and ``f_scale``, for the common eager call (NumPy data and ``x0``, an autodiff
    Jacobian, scalar or array bounds); ``None`` for anything else (an unknown option too)."""
    if kw.keys() != _OPTION_NAMES:
        return None
    static = _static_options(kw)
    jac = kw["jac"]
    if not (jac is None or isinstance(jac, str) and jac in AD_METHODS) or kw["kwargs"] \
            or kw["jac_sparsity"] is not None:
        return None
    if not (isinstance(x0, np.ndarray) or (isinstance(
            x0, (list, tuple)) and all(isinstance(v, (int, float)) for v in x0))):
        return None
    if not isinstance(args, tuple) or not all(type(a) is np.ndarray for a in args):
        return None
    bounds = kw["bounds"]
    if not (isinstance(bounds, tuple) and len(bounds) == 2):
        return None
    bsig = []
    for b in bounds:
        if isinstance(b, (int, float)):
            bsig.append(-np.inf < b < np.inf)
        elif type(b) is np.ndarray:
            bsig.append((b.shape, np.isfinite(b).tobytes()))
        else:
            return None
    xs = kw["x_scale"]
    xs = xs if xs is None or isinstance(xs, (str, int, float)) else (
        "array" if type(xs) is np.ndarray else None)
    return _caches.hashable_key(_Key(residual, np.shape(x0), tuple(
        (a.shape, a.dtype.str) for a in args), tuple(bsig), xs, static, x64_enabled(),
        jax.default_backend()))


def _any_length(key: _Key) -> _Key:
    """``key`` with each data array's dimensions left out (its number of dimensions
    kept): the memo's entry for the last padded problem of this structure."""
    return key._replace(data=("any length", *((len(s), d) for s, d in key.data)))


def _bucket_key(key: _Key, prob: Problem):
    """The key of a padded problem's runner (:func:`._programs.run_identity`): ``key``
    with the data at the bucket length, and what the length decided (the ladder)."""
    axes, M = prob.pad
    data = tuple((s if ax is None else (*s[:ax], M, *s[ax + 1:]), d)
                 for (s, d), ax in zip(key.data, axes))
    return key._replace(data=data), prob.opts.rungs, prob.opts.linear_solver


def _new_length(key: _Key, args: tuple, kw: dict):
    """The memoised problem of a new data length in a bucket padded before, with this
    call's ``m``, or ``None``: the last padded problem of this structure
    (:func:`_any_length`) serves when this call's data have one length ``m`` along its
    point axes (the others as its own), ``m`` pads to the same bucket (``m`` the bucket
    length itself is not padded) and decides what its length decided (float64 alone,
    the linear solver). The checks of ``m`` run as in :func:`_prepare`."""
    from ._buckets import bucket
    from .common import check_loss_output

    known = _caches.PROBLEMS.get(_any_length(key))
    if known is None:
        return None
    (axes, M), opts = known.pad, known.opts
    lengths = {a.shape[ax] for a, ax in zip(args, axes) if ax is not None}
    if len(lengths) != 1:
        return None
    m = lengths.pop()
    if m == M or bucket(m) != M or any(
            a.shape != b.shape and (ax is None or a.shape[:ax] != b.shape[:ax] or
                                    a.shape[ax + 1:] != b.shape[ax + 1:])
            for a, b, ax in zip(args, known.args, axes)):
        return None
    if float64_alone(kw["precision"], kw["schedule"], m, opts.n) != opts.adaptive_stop or \
            _linear_solver_for(kw["linear_solver"], m) != opts.linear_solver:
        return None
    check_loss_output(opts.loss, m, opts.rungs[-1])
    _check_residual_count(opts.method, m, opts.n)
    return known._replace(m=m)


def _linear_solver_for(linear_solver: str, m: int) -> str:
    """``linear_solver`` with ``"auto"`` decided for ``m`` residuals: the normal
    equations from :data:`.common.NORMAL_EQ_MIN_M` on, else QR."""
    from .common import NORMAL_EQ_MIN_M

    if linear_solver == "auto":
        return "normal" if m >= NORMAL_EQ_MIN_M else "qr"
    return linear_solver


def _check_residual_count(method, m: int, n: int) -> None:
    """``lm`` and ``gn`` need at least as many residuals as parameters."""
    if method in ("lm", "gn") and m < n:
        raise ValueError(f"method={method!r} needs at least as many residuals as "
                         f"parameters; got m={m} residuals for n={n} parameters. Use "
                         "method='trf' or add residuals.")


def _with_values(known: Problem, x0, args, kw, checked) -> Problem:
    """A memoised problem with this call's values: ``x0``, the data, the bounds,
    ``x_scale`` and ``f_scale``, each checked as :func:`prepare` checks them (bounds,
    ``x_scale`` and ``f_scale`` that are the memoised call's were checked then)."""
    opts, ctx = known.opts, known.context
    n, top_dt = opts.n, np.dtype(opts.rungs[-1])
    x0_flat = np.asarray(x0, np.float64).reshape(-1)
    for what, leaves in (("x0", (x0_flat,)), ("the data in args", args)):
        for leaf in leaves:
            if not any(leaf is c for c in checked) and not all_finite(leaf):
                check_finite_tree(leaves, what, "give a finite starting point" if
                                  what == "x0" else _FINITE_FIX, skip=checked)
    bounds, x_scale, f_scale = kw["bounds"], kw["x_scale"], kw["f_scale"]
    g = known.given
    if g is not None and bounds is g[0] and x_scale is g[1] and f_scale is g[2]:
        lb, ub = ctx[1], ctx[2]
        if opts.has_bounds and ((x0_flat < lb).any() or (x0_flat > ub).any()):
            check_x0_inside(x0_flat, lb, ub)
        return known._replace(args=args, context=(x0_flat.astype(top_dt), *ctx[1:]))
    check_f_scale(f_scale)
    lb, ub = _numpy_bounds(bounds, n)
    if np.any(x0_flat < lb) or np.any(x0_flat > ub):
        check_x0_inside(x0_flat, lb, ub)
    if x_scale is None:
        x_scale = "jac" if opts.method in ("lm", "gn") else 1.0
    return known._replace(args=args, context=(
        x0_flat.astype(top_dt), lb, ub, _scale_inv(x_scale, n), f_scale, *ctx[5:]))


def prepare(residual, x0, args, *, checked=(), **kw) -> Problem:
    """``solve_nlsq``'s arguments (``kw``: its options) validated and resolved into a
    :class:`Problem`, before anything is traced (``checked``: data arrays the caller
    found finite already). The common eager call's structure is memoised
    (:func:`_structure_key`, :data:`._caches.PROBLEMS`); a repeat checks the values
    only."""
    key = None if trace_active() else _structure_key(residual, x0, args, kw)
    if key is not None:
        known = _caches.PROBLEMS.get(key)
        if known is None:
            known = _new_length(key, args, kw)
            if known is not None:
                _caches.PROBLEMS.put(key, known)
        if known is not None:
            return _with_values(known, x0, args, kw, checked)
    prob = _prepare(residual, x0, args, checked=checked, **kw)
    if key is not None and prob.identity:
        b, xs, fs = given = kw["bounds"], kw["x_scale"], kw["f_scale"]
        # immutable values (the same objects again are the same values) are kept
        immutable = type(b) is tuple and all(type(v) in (int, float) for v in b) and \
            isinstance(xs, (str, int, float, type(None))) and isinstance(fs, (int, float))
        prob = prob._replace(memo_key=key if prob.pad is None else _bucket_key(key, prob),
                             given=given if immutable else None)
        _caches.PROBLEMS.put(key, prob)
        if prob.pad is not None:
            _caches.PROBLEMS.put(_any_length(key), prob)
    return prob


def _prepare(residual, x0, args, *, method, bounds, loss, f_scale, x_scale, jac, ftol,
             xtol, gtol, max_steps, precision, schedule, linear_solver, max_rejections,
             cond_tol, max_nfev, diff_step, kwargs, tr_solver, tr_options, jac_sparsity,
             verbose, workers, callback, checked=()) -> Problem:
    from . import _residual
    from ._buckets import bucket
    from .._finite_diff import as_sparsity
    from .._user_fn import sig
    from ._lsmr import tr_solver_options
    from ._methods import njev_is_none
    from ._state import Options
    from ._step_schedule import schedule_for
    from .common import check_loss_output

    if not callable(residual):
        raise TypeError(f"residual must be callable, got {type(residual).__name__}")
    args = args if isinstance(args, tuple) else (args,)
    loss = check_method_loss(method, loss)
    jac, max_nfev = check_scipy_options(
        jac, method, diff_step=diff_step, jac_sparsity=jac_sparsity, tr_solver=tr_solver,
        tr_options=tr_options, verbose=verbose, workers=workers, callback=callback,
        max_nfev=max_nfev)
    if linear_solver not in ("auto", "qr", "normal"):
        raise ValueError(f"linear_solver must be 'auto', 'qr' or 'normal', got "
                         f"{linear_solver!r}")
    if is_concrete(f_scale):
        check_f_scale(f_scale)
    rungs = top_rungs(precision)
    top_dt = np.dtype(rungs[-1])
    check_array_leaves(args)
    check_finite_tree(args, "the data in args", skip=checked)
    a = _residual.analyse(residual, as_x0(x0), args, jac, kwargs, top_dt)
    n, m, args, jac = a.n, a.m, a.args, a.jac
    check_loss_output(loss, m, top_dt)
    adaptive_stop = float64_alone(precision, schedule, m, n)
    if adaptive_stop:
        rungs = rungs[-1:]
    if jac_sparsity is not None and callable(jac):
        as_sparsity(jac_sparsity, m, n)  # shape check only (scipy's check_jac_sparsity)
    method = _residual.check_host_jac(a.host_kind, method, tr_solver, x_scale)
    lb, ub = broadcast_bounds(as_bounds(bounds, n), n, top_dt)
    bounds_known = is_concrete((lb, ub))
    # traced bounds: their finiteness is unknown, so the bounded method runs (with
    # infinite bounds trf is an unconstrained trust region)
    has_bounds = (not bounds_known) or bool(np.any(np.isfinite(lb)) or
                                            np.any(np.isfinite(ub)))
    method, x_scale = method_for_bounds(method, has_bounds, x_scale)
    ftol, xtol, gtol = check_tolerances(ftol, xtol, gtol, method)
    sparse_fd = jac_sparsity is not None and not callable(jac)
    tr = tr_solver_options(tr_solver, tr_options, method,
                           a.host_kind or ("sparse" if sparse_fd else None))
    _check_residual_count(method, m, n)
    if is_concrete(a.x0_flat) and bounds_known:
        check_x0_inside(a.x0_flat, lb, ub)
    max_steps, portfolio = step_budget(max_steps, n, max_nfev)
    schedule = schedule_for(schedule, rungs)
    linear_solver = _linear_solver_for(linear_solver, m)
    autodiff = jac in AD_METHODS
    axes = a.point_axes() if linear_solver == "normal" and jac == "fwd" else None
    jac, jac_key = _residual.jacobian(jac, a.fun_flat, m, n, a.host_kind, diff_step,
                                      jac_sparsity, (lb, ub) if bounds_known and has_bounds
                                      else (None, None))
    eager = is_eager((a.x0_flat, args, lb, ub, f_scale))
    identity = eager and autodiff and axes is None
    pad = None
    if identity and linear_solver == "qr" and args and bucket(m) != m:
        q_axes = a.point_axes()
        if q_axes is not None:   # a new length in the bucket compiles nothing
            pad = (q_axes, bucket(m))
    opts = Options(n=n, rungs=tuple(rungs), method=method, loss=loss, jac=jac,
                   jac_scale=isinstance(x_scale, str), has_bounds=has_bounds,
                   max_steps=max_steps, linear_solver=linear_solver,
                   max_rejections=int(max_rejections), cond_tol=float(cond_tol),
                   schedule=schedule, point_axes=axes, max_nfev=max_nfev,
                   callback=callback, tr=tr, portfolio=portfolio,
                   adaptive_stop=adaptive_stop, m=0 if pad is not None else m)
    context = (a.x0_flat.astype(top_dt), lb, ub, _scale_inv(x_scale, n), f_scale, ftol,
               xtol, gtol)
    return Problem(a.residual, a.fun_flat, a.unravel, a.x0_shape, opts, jac_key, m, pad,
                   identity, a.host_kind or ("sparse" if sparse_fd else None), args,
                   context, sig(a.x0), njev_is_none(opts))


#: ``solve_nlsq``'s options (:func:`_prepare`'s keywords)
_OPTION_NAMES = frozenset(name for name, p in inspect.signature(_prepare).parameters.items()
                          if p.kind is p.KEYWORD_ONLY and name != "checked")
#: the options whose values a memoised problem takes per call (:func:`_with_values`);
#: every other option is part of the memo's key
_VALUE_OPTIONS = ("bounds", "x_scale", "f_scale", "jac_sparsity", "kwargs")
_static_options = operator.itemgetter(*sorted(_OPTION_NAMES.difference(_VALUE_OPTIONS)))
