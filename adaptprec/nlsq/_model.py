"""curve_fit's model ``f(xdata, *p)`` as a residual: the adapters from a model (and its
``jac``) to ``solve_nlsq``'s ``residual(p, *args)``, one stable function per model and
sigma kind (so compiled programs are found again), Shared by the in-memory and the streamed curve_fit.

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
from collections.abc import Callable

import jax.numpy as jnp
import numpy as np
from jax.scipy.linalg import solve_triangular

from .._user_fn import returns_arrays

__all__ = ["_residual_for", "_jac_for", "_n_params", "_call"]


def _jac2d(J, n):
    """A 1-D Jacobian (one parameter, or one data point) as 2-D, as scipy accepts."""
    J = jnp.asarray(J)
    return J.reshape(-1, n) if J.ndim < 2 else J


def _call(f, xdata, p, role="model"):
    """``f(xdata, *p)``; a non-array result is a TypeError naming the user's ``f``."""
    return returns_arrays(f, f(xdata, *[p[i] for i in range(p.shape[0])]), role)


def _model_minus_data(f, xdata, p, ydata):
    """``f(xdata, *p) - ydata``, refusing shapes that broadcast into something else (a
    model of shape ``(m, 1)`` against ``ydata`` of shape ``(m,)`` would give ``m * m``
    residuals and a wrong fit; scipy raises too). Checked when tracing: no run-time cost."""
    out = _call(f, xdata, p)
    a, b = np.shape(out), np.shape(ydata)
    try:
        both = np.broadcast_shapes(a, b)
    except ValueError:
        both = None
    if both is None or both not in (a, b):
        hint = (" (not a column: ravel it, or index with [:, 0])"
                if np.size(out) == np.prod(b) else "")
        raise ValueError(
            f"curve_fit: the model returned shape {a} but ydata has shape {b}; "
            f"f(xdata, *p) must return one value per data point, shape {b}{hint}")
    return out - ydata


@functools.lru_cache(maxsize=256)
def _residual_for(f: Callable, kind: str) -> Callable:
    """A stable residual function per (model, sigma kind), so solve_nlsq's cache hits."""
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
    cannot bind to ``f``'s signature (a signature that cannot be inspected is not
    checked). Called at the boundary, before any tracing: a short ``p0`` otherwise
    surfaced as the model's own ``TypeError`` from deep inside the first trace."""
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
