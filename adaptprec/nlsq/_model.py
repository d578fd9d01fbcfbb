"""curve_fit's problem: its data (scipy's rules for ``xdata``, ``ydata``, ``sigma``,
``p0``, ``nan_policy``) and its model ``f(xdata, *p)`` as ``solve_nlsq``'s
``residual(p, *args)``, one stable function per model and sigma kind (so compiled
programs are found again). Shared by the in-memory and the streamed curve_fit.

Example:
    >>> import numpy as np
    >>> from adaptprec.nlsq._model import _n_params, _residual_for
    >>> _n_params(lambda x, a, b: a * x + b)
    2
    >>> r = _residual_for(lambda x, a, b: a * x + b, "none")
    >>> r(np.array([2.0, 1.0]), np.array([0.0, 1.0]), np.array([1.0, 3.0])).tolist()
    [0.0, 0.0]
"""

from __future__ import annotations

import functools
import inspect
import numbers
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.linalg import solve_triangular

from .._tracing import is_concrete
from .._user_fn import returns_arrays
from ..precision import x64_enabled
from . import _caches
from ._inputs import all_finite, broadcast_bounds
from ._arguments import EPS, OptionNotOffered, as_bounds, as_x0

__all__ = ["_residual_for", "_jac_for", "_n_params", "_call", "CurveFitProblem",
           "prepare_curve_fit", "as_data", "initialize_feasible", "leastsq_kwargs"]


def _jac2d(J, n):
    """A 1-D Jacobian (one parameter, or one data point) as 2-D, as scipy accepts."""
    J = jnp.asarray(J)
    return J.reshape(-1, n) if J.ndim < 2 else J


def _call(f, xdata, p, role="model"):
    """``f(xdata, *p)``; a non-array result is a TypeError naming the user's ``f``."""
    return returns_arrays(f, f(xdata, *[p[i] for i in range(p.shape[0])]), role)


def _model_minus_data(f, xdata, p, ydata):
    """``f(xdata, *p) - ydata``. The model must return ``ydata``'s shape (one ``ydata``
    value may broadcast against it): a column ``(m, 1)``, a scalar or a stacked
    ``(2, m)`` would otherwise broadcast into a different number of residuals and a
    wrong fit. Checked when tracing: no run-time cost."""
    out = _call(f, xdata, p)
    # (complex parameters: a complex-step Jacobian, jac="cs", whose model output is
    # complex by construction)
    if jnp.iscomplexobj(out) and not jnp.iscomplexobj(ydata) and \
            not any(jnp.iscomplexobj(v) for v in jax.tree.leaves(p)):
        raise ValueError("curve_fit: the model returns complex values but ydata is real; "
                         "pass complex ydata (real and imaginary parts are fitted "
                         "together)")
    a, b = np.shape(out), np.shape(ydata)
    if a != b and int(np.prod(b)) != 1:
        raise ValueError(shape_message(a, b, np.shape(xdata) if hasattr(xdata, "shape")
                                       else None))
    return out - ydata


def shape_message(a: tuple, b: tuple, x_shape) -> str:
    """The error for a model output of shape ``a`` against ``ydata`` of shape ``b``,
    naming the likely cause (the data's lengths, a column, a scalar, stacked outputs)."""
    n_y = int(np.prod(b))
    if x_shape and len(a) == len(x_shape) >= 1 and a[-1] == x_shape[-1] != n_y:
        return (f"curve_fit: xdata has {x_shape[-1]} points (its last axis) but ydata has "
                f"{n_y}: give one ydata value per point of xdata (the model returned "
                f"shape {a}, following xdata)")
    head = f"curve_fit: the model returned shape {a} but ydata has shape {b}; "
    if not a or int(np.prod(a)) == 1:
        hint = (": it returned one value for all points. Compute it from x (a constant "
                "model is c + 0 * x)")
    elif int(np.prod(a)) == n_y:
        hint = " (not a column: ravel it, or index with [:, 0])"
    elif len(a) > 1 and a[-1] == n_y:
        hint = (f": {int(np.prod(a[:-1]))} values per point. Fit each output separately, "
                "or stack ydata the same way and return jnp.ravel(...) of both")
    else:
        hint = ""
    return head + f"f(xdata, *p) must return one value per data point, shape {b}" + hint


def _residual_for(f: Callable, kind: str) -> Callable:
    """A stable residual function per (model, sigma kind) (:data:`._caches.RESIDUALS`),
    so that the programs of a model are found again."""
    return _caches.RESIDUALS.get_or_build((f, kind), lambda: _make_residual(f, kind))


def _make_residual(f: Callable, kind: str) -> Callable:
    if kind == "none":
        def residual(p, xdata, ydata):
            return jnp.ravel(_model_minus_data(f, xdata, p, ydata))
    elif kind == "1d":
        def residual(p, xdata, ydata, w):
            return jnp.ravel(_model_minus_data(f, xdata, p, ydata) * w)
    else:
        def residual(p, xdata, ydata, L):
            r = jnp.ravel(_model_minus_data(f, xdata, p, ydata))
            return solve_triangular(L, r, lower=True)
    return residual


@functools.lru_cache(maxsize=256)
def _jac_for(jac: Callable, kind: str) -> Callable:
    if kind == "none":
        def J(p, xdata, ydata):
            return _jac2d(_call(jac, xdata, p, "jac"), p.shape[0])
    elif kind == "1d":
        def J(p, xdata, ydata, w):
            return _jac2d(_call(jac, xdata, p, "jac"), p.shape[0]) * w[:, None]
    else:
        def J(p, xdata, ydata, L):
            return solve_triangular(L, _jac2d(_call(jac, xdata, p, "jac"), p.shape[0]),
                                    lower=True)
    return J


def check_p0_arity(f, n: int) -> None:
    """A ``ValueError`` naming the model's parameters when ``f(x, *p0)`` with ``n`` values
    cannot bind to ``f``'s signature (not checked when it cannot be inspected)."""
    try:
        sig = inspect.signature(f)
    except (TypeError, ValueError):
        return
    try:
        sig.bind(None, *([0.0] * n))
    except TypeError:
        names = [p.name for p in sig.parameters.values()
                 if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        name = getattr(f, "__name__", "f")
        raise ValueError(
            f"p0 has {n} value{'s' if n != 1 else ''} but {name}({', '.join(names)}) takes "
            f"{len(names) - 1} fit parameter{'s' if len(names) != 2 else ''} after "
            f"{names[0] if names else 'x'}: give p0 one value per parameter "
            f"({', '.join(names[1:])})") from None


def _n_params(f) -> int:
    try:
        sig = inspect.signature(f)
    except (TypeError, ValueError) as exc:
        raise ValueError("p0 is required when the signature of f cannot be inspected"
                         ) from exc
    ps = [p for p in sig.parameters.values()
          if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if any(p.kind == p.VAR_POSITIONAL for p in sig.parameters.values()) or len(ps) < 2:
        raise ValueError("Unable to determine number of fit parameters; give p0.")
    return len(ps) - 1


def as_data(x, name: str, dtype=float):
    """Data (``xdata``/``ydata``/``sigma``) as arrays: JAX arrays, tracers and dicts pass
    through; any array-like (lists, pandas, xarray, memoryview) becomes a NumPy array.

    Example:
        >>> from adaptprec.nlsq._model import as_data
        >>> as_data(memoryview(bytearray(b"\\x01\\x02")), "xdata").tolist()
        [1.0, 2.0]
    """
    if x is None or isinstance(x, (jax.Array, dict)) or not is_concrete(x):
        return x
    if isinstance(x, (str, bytes)):
        raise ValueError(f"{name} must be numbers, got a string")
    if isinstance(x, (list, tuple, np.ndarray, memoryview, numbers.Number, np.generic)) \
            or hasattr(x, "__array__") or hasattr(x, "__array_interface__"):
        try:
            a = np.asarray(x)
        except Exception as exc:  # noqa: BLE001 - re-raised with context
            raise ValueError(f"{name} could not be read as an array: {exc}") from exc
        if a.dtype.kind in "USO":
            raise ValueError(f"{name} must be numbers, got dtype {a.dtype}")
        if a.dtype.kind == "c":
            return a
        if dtype is not None and a.dtype.kind in "biuf":
            a = a.astype(dtype) if a.dtype.kind != "f" else a
        return a
    return x


def initialize_feasible(lb, ub):
    """scipy's feasible start for ``curve_fit`` without ``p0``: the midpoint of finite
    bounds, ``lb + 1`` / ``ub - 1`` for one-sided bounds, 1 otherwise."""
    lb = np.asarray(lb, float)
    ub = np.asarray(ub, float)
    p0 = np.ones_like(lb)
    lf, uf = np.isfinite(lb), np.isfinite(ub)
    both = lf & uf
    p0[both] = 0.5 * (lb[both] + ub[both])
    p0[lf & ~uf] = lb[lf & ~uf] + 1
    p0[~lf & uf] = ub[~lf & uf] - 1
    return p0


def leastsq_kwargs(kwargs: dict) -> dict:
    """scipy ``leastsq``'s keyword arguments (scipy's ``curve_fit`` passes them on for
    ``method="lm"``) as :func:`~adaptprec.solve_nlsq` options: ``maxfev`` -> ``max_nfev``,
    ``epsfcn`` -> ``diff_step = sqrt(epsfcn)``, ``diag`` -> ``x_scale = 1 / diag``;
    ``factor`` and ``col_deriv`` raise naming the alternative.

    Example:
        >>> from adaptprec.nlsq._model import leastsq_kwargs
        >>> leastsq_kwargs({"maxfev": 10})
        {'max_nfev': 10}
    """
    kw = dict(kwargs)
    if "maxfev" in kw:
        v = kw.pop("maxfev")
        if "max_nfev" in kw and kw["max_nfev"] is not None and v is not None:
            raise TypeError("give max_nfev or maxfev, not both")
        if kw.get("max_nfev") is None:
            kw["max_nfev"] = None if v in (None, 0) else v
    if "epsfcn" in kw:
        v = kw.pop("epsfcn")
        if v is not None and kw.get("diff_step") is None:
            kw["diff_step"] = float(np.sqrt(max(float(v), EPS)))
    if "diag" in kw:
        v = kw.pop("diag")
        if v is not None:
            kw["x_scale"] = 1.0 / np.asarray(v, float)
    if kw.pop("col_deriv", 0):
        raise OptionNotOffered("col_deriv is not offered: return the Jacobian with one "
                                  "row per data point (transpose it in your jac).")
    if "factor" in kw:
        v = kw.pop("factor")
        if v not in (None, 100):
            raise OptionNotOffered("factor (MINPACK's initial step bound) is not "
                                      "offered; use x_scale to change the initial radius.")
    if "Dfun" in kw:
        raise TypeError("Dfun is leastsq's name; pass the Jacobian as jac=...")
    return kw


class CurveFitProblem(NamedTuple):
    """curve_fit's data and model as ``solve_nlsq`` sees them (:func:`prepare_curve_fit`)."""

    residual: Any     # residual(p, xdata, ydata[, w or L])
    p0: Any
    args: tuple       # (xdata, ydata[, 1/sigma or the covariance's Cholesky factor])
    kind: str         # "none", "1d" (standard deviations) or "2d" (a covariance)
    bounds: tuple
    n: int
    m: int
    lm_rule: bool     # scipy's all-inf pcov when a parameter is not identifiable
    checked: tuple    # data found finite here (solve_nlsq skips them)
    concrete: bool


def prepare_curve_fit(f, xdata, ydata, p0, sigma, check_finite, bounds, method,
                      nan_policy) -> CurveFitProblem:
    """scipy's ``curve_fit`` rules on its data: array-likes read as arrays, non-finite
    data refused (or dropped, ``nan_policy="omit"``), ``ydata`` raveled, ``p0`` from the
    signature (or the middle of finite bounds), ``sigma`` as standard deviations or a
    covariance (whitened by its Cholesky factor). The common call's structure is memoised
    (:data:`._caches.PROBLEMS`); a repeat checks the values only."""
    key = _curve_fit_key(f, xdata, ydata, p0, sigma, check_finite, bounds, method,
                         nan_policy)
    if key is not None:
        known = _caches.PROBLEMS.get(key)
        if known is not None:
            return _with_data(known, xdata, ydata, p0, sigma)
    cf = _prepare_curve_fit(f, xdata, ydata, p0, sigma, check_finite, bounds, method,
                            nan_policy)
    if key is not None and cf.kind != "2d":
        _caches.PROBLEMS.put(key, cf)
    return cf


def _curve_fit_key(f, xdata, ydata, p0, sigma, check_finite, bounds, method, nan_policy):
    """The structure of the common call, or ``None``."""
    if nan_policy is not None or type(xdata) is not np.ndarray or \
            type(ydata) is not np.ndarray or ydata.ndim != 1 or not ydata.size or \
            xdata.dtype.kind not in "fiu" or ydata.dtype.kind not in "fiu":
        return None
    if sigma is None or isinstance(sigma, (int, float)):
        sk = None if sigma is None else "scalar"
    elif type(sigma) is np.ndarray and sigma.shape == ydata.shape:
        sk = ("1d", sigma.dtype.str)
    else:
        return None
    if p0 is None:
        pk = None
    elif isinstance(p0, (list, tuple)) and all(type(v) in (float, int) for v in p0):
        pk = len(p0)
    elif type(p0) is np.ndarray and p0.ndim == 1 and p0.dtype.kind in "fiu":
        pk = p0.shape
    else:
        return None
    if not (isinstance(bounds, tuple) and len(bounds) == 2 and
            all(type(b) in (float, int) for b in bounds)):
        return None
    # (any number of points: xdata's dimensions of ydata's length left out)
    m = ydata.shape[0]
    return _caches.hashable_key(("curve_fit", f, tuple(-1 if d == m else d for d in
                                                       xdata.shape), xdata.dtype.str,
                                 ydata.dtype.str, sk, pk, bounds, method, check_finite,
                                 x64_enabled()))


def _with_data(known: CurveFitProblem, xdata, ydata, p0, sigma) -> CurveFitProblem:
    """A memoised curve_fit problem with this call's data (any number of points), ``p0``
    and ``sigma``."""
    x = xdata if xdata.dtype.kind == "f" else xdata.astype(float)
    y = ydata if ydata.dtype == np.float64 else ydata.astype(np.float64)
    checked = _check_finite_data(x, y) if known.checked else ()
    m = y.shape[0]
    _check_point_count(m, known.n, known.lm_rule)
    extra = ()
    if known.kind == "1d":
        s = np.asarray(sigma, np.float64)
        if np.any(s <= 0):
            raise ValueError("1-D `sigma` must be positive (standard deviations).")
        with np.errstate(over="ignore", divide="ignore"):
            extra = (np.broadcast_to(1.0 / s.reshape(-1), (m,)),)
    p0 = known.p0 if p0 is None else np.asarray(p0, np.float64)   # 1-D by the key
    return known._replace(p0=p0, args=(x, y, *extra), m=m, checked=checked)


def _check_point_count(m: int, n: int, lm_rule: bool) -> None:
    """scipy's rule: ``lm`` needs at least as many data points as parameters."""
    if lm_rule and m != 1 and n > m:
        raise TypeError(f"The number of func parameters={n} must not exceed the number "
                        f"of data points={m}")


def _prepare_curve_fit(f, xdata, ydata, p0, sigma, check_finite, bounds, method,
                       nan_policy) -> CurveFitProblem:
    xdata, ydata, sigma = as_data(xdata, "xdata"), as_data(ydata, "ydata"), \
        as_data(sigma, "sigma")
    concrete = is_concrete((xdata, ydata, sigma))
    if check_finite is None:
        check_finite = nan_policy is None
    if nan_policy == "propagate":
        raise ValueError("`nan_policy='propagate'` is not supported by this function.")
    if nan_policy not in (None, "raise", "omit"):
        raise ValueError("nan_policy must be one of {None, 'raise', 'omit'}")
    checked = ()
    if concrete:
        ydata = ydata if isinstance(ydata, jax.Array) else np.asarray(ydata, np.float64)
        if check_finite:
            checked = _check_finite_data(xdata, ydata)
        elif nan_policy is not None:
            xdata, ydata, sigma = _omit_nan(xdata, ydata, sigma, nan_policy)
    # eager calls prepare the data with NumPy (an eager jnp operation compiles per shape)
    xnp = np if concrete and not isinstance(ydata, jax.Array) else jnp
    ydata = xnp.asarray(ydata)
    if ydata.ndim != 1:
        ydata = xnp.ravel(ydata)
    if ydata.size == 0:
        raise ValueError("`ydata` must not be empty!")
    if isinstance(xdata, (list, tuple, np.ndarray)):
        xdata = np.asarray(xdata) if concrete else jnp.asarray(xdata)
    m = int(ydata.size)
    if p0 is None:
        n = _n_params(f)
        p0 = initialize_feasible(*broadcast_bounds(as_bounds(bounds, n), n, np.float64))
    p0 = as_x0(p0)
    p0 = np.atleast_1d(np.asarray(p0, dtype=jnp.result_type(float))) if is_concrete(p0) \
        else jnp.atleast_1d(jnp.asarray(p0, dtype=jnp.result_type(float)))
    n = int(p0.size)
    check_p0_arity(f, n)
    bounds = as_bounds(bounds, n)
    unbounded = is_concrete(bounds) and all(
        np.all(np.isinf(np.asarray(b, float))) for b in bounds if not isinstance(b, dict))
    lm_rule = method == "lm" or (method is None and unbounded)
    _check_point_count(m, n, lm_rule)
    kind, extra = _sigma_args(sigma, ydata, m, concrete, xnp)
    return CurveFitProblem(_residual_for(f, kind), p0, (xdata, ydata, *extra), kind,
                           bounds, n, m, lm_rule, checked, concrete)


def _check_finite_data(xdata, ydata) -> tuple:
    """scipy's ``check_finite``: ``(xdata, ydata)``, checked finite."""
    for arr, name in ((xdata, "xdata"), (ydata, "ydata")):
        if not all_finite(arr):
            raise ValueError(f"{name} contains NaN or Inf (array must not contain infs or "
                             "NaNs); remove those points or pass nan_policy='omit'.")
    return xdata, ydata


def _omit_nan(xdata, ydata, sigma, nan_policy):
    """``nan_policy="omit"``/``"raise"``: the points with NaN in ``xdata``/``ydata``."""
    xa, ya = np.asarray(xdata, np.float64), np.asarray(ydata, np.float64)
    has_nan = np.isnan(xa)
    has_nan = has_nan.any(axis=tuple(range(has_nan.ndim - 1))) if xa.ndim else \
        np.zeros(ya.shape, bool)
    has_nan = has_nan | np.isnan(ya)
    if not np.any(has_nan):
        return xdata, ydata, sigma
    if nan_policy == "raise":
        raise ValueError("The input contains nan values")
    if sigma is not None:
        s = np.asarray(sigma)
        sigma = s[~has_nan] if s.ndim == 1 and s.size > 1 else (
            s[~has_nan][:, ~has_nan] if s.ndim == 2 else sigma)
    return jnp.asarray(xa[..., ~has_nan]), jnp.asarray(ya[~has_nan]), sigma


def _sigma_args(sigma, ydata, m: int, concrete: bool, xnp):
    """``(kind, extra args)`` of ``sigma``: none, 1-D standard deviations (the residual
    times ``1/sigma``) or an ``(m, m)`` covariance (its Cholesky factor ``L``,
    ``r = L^-1 (f - y)``)."""
    if sigma is None:
        return "none", ()
    s = xnp.asarray(sigma, dtype=ydata.dtype if jnp.issubdtype(ydata.dtype, jnp.floating)
                    else float)
    if s.size == 1 or s.shape == (m,):
        if concrete and np.any(np.asarray(s) <= 0):
            raise ValueError("1-D `sigma` must be positive (standard deviations).")
        with np.errstate(over="ignore", divide="ignore"):
            return "1d", (xnp.broadcast_to(1.0 / s.reshape(-1), (m,)),)
    if s.shape == (m, m):
        L = jnp.linalg.cholesky(s)
        if concrete and not np.all(np.isfinite(np.asarray(L))):
            raise ValueError("`sigma` must be positive definite (a covariance matrix).")
        return "2d", (L,)
    raise ValueError(f"`sigma` has incorrect shape {tuple(s.shape)}: expected a scalar, "
                     f"({m},) standard deviations or a ({m}, {m}) covariance matrix.")
