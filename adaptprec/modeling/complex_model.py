"""Complex-valued models: the real and imaginary parts become residuals.

A model ``f(x, *p)`` returning complex values fitted to complex ``ydata`` minimises
``sum_i |(f_i - y_i) / sigma_i|^2 = sum_i (Re(f_i - y_i)/s_re)^2 + (Im(f_i - y_i)/s_im)^2``:
the fit is the real fit of the stacked parts ``[Re f_1, Im f_1, Re f_2, ...]`` against
``[Re y_1, Im y_1, ...]`` (lmfit's recipe for complex data, done for you), with ``2 m``
observations. ``sigma`` is real (the same standard deviation for both parts of a point)
or complex (``s_re + 1j s_im``, one per part).

Example:
    >>> import numpy as np, jax.numpy as jnp
    >>> from adaptprec.modeling.complex_model import real_model, real_data
    >>> g = real_model(lambda w, tau: 1.0 / (1.0 + 1j * w * tau))
    >>> np.asarray(g(np.array([0.0, 1.0]), 1.0)).round(3).tolist()
    [1.0, 0.0, 0.5, -0.5]
    >>> real_data(np.array([1 + 2j])).tolist()
    [1.0, 2.0]
"""

from __future__ import annotations

import functools

import jax.numpy as jnp
import numpy as np

from .._user_fn import named_like

__all__ = ["real_model", "real_data", "real_sigma", "curve_fit_complex"]


@functools.lru_cache(maxsize=128)
def real_model(model):
    """``g(x, *p)``: ``model``'s complex values as interleaved real and imaginary parts
    (one stable function per model)."""
    def parts(x, *p):
        f = jnp.ravel(jnp.asarray(model(x, *p)))
        return jnp.stack([jnp.real(f), jnp.imag(f)], axis=-1).ravel()

    return named_like(parts, model)


def real_data(y):
    """``[Re y_1, Im y_1, Re y_2, ...]``."""
    xnp = np if isinstance(y, (np.ndarray, list, tuple)) else jnp
    y = xnp.ravel(xnp.asarray(y))
    return xnp.stack([xnp.real(y), xnp.imag(y)], axis=-1).ravel()


def real_sigma(sigma, m: int):
    """``sigma`` for the interleaved parts: a real one per point (or a scalar) repeated
    for both parts, a complex one split into ``(s_re, s_im)``."""
    if sigma is None:
        return None
    s = np.asarray(sigma)
    if s.ndim > 1:
        raise ValueError("a complex fit takes sigma as standard deviations (a scalar or "
                         "one per point, real or complex), not a covariance matrix")
    s = np.broadcast_to(s.ravel() if s.ndim else s, (m,))
    if np.iscomplexobj(s):
        return np.stack([s.real, s.imag], axis=-1).ravel().astype(np.float64)
    return np.repeat(s.astype(np.float64), 2)


def curve_fit_complex(curve_fit, f, xdata, ydata, p0, sigma, absolute_sigma, check_finite,
                      bounds, method, jac, full_output, nan_policy, kwargs):
    """:func:`adaptprec.curve_fit` of a complex model to complex ``ydata`` (module
    docstring); ``infodict["complex_points"]`` is the number of complex values."""
    if jac is not None:
        raise ValueError("a complex fit differentiates the model with JAX: leave jac=None")
    if nan_policy not in (None, "raise"):
        raise ValueError("a complex fit does not drop NaN points: remove them first")
    if kwargs.get("likelihood", "gaussian") != "gaussian":
        raise ValueError("a likelihood is for real counts, not complex data")
    m = int(np.size(ydata))
    out = curve_fit(real_model(f), xdata, real_data(ydata), p0, real_sigma(sigma, m),
                    absolute_sigma, check_finite, bounds, method, None,
                    full_output=full_output, **kwargs)
    if not full_output:
        return out
    return (out[0], out[1], dict(out[2], complex_points=m), *out[3:])
