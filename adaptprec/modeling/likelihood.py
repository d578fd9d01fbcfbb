"""Poisson maximum likelihood as least squares: the deviance residuals.

For counts ``y_i`` with expected values ``f_i = model(x_i, p)``, the Poisson deviance
(Gpufit's MLE ``chi-square``, twice the log-likelihood ratio to the saturated model) is

    D(p) = 2 sum_i [ f_i - y_i - y_i log(f_i / y_i) ]      (the last term 0 where y_i = 0)

Each term is non-negative and zero at ``f_i = y_i``, so ``D = sum_i d_i^2`` with the
**deviance residual** ``d_i = sign(f_i - y_i) sqrt(2 [f_i - y_i - y_i log(f_i/y_i)])``.
Minimising ``sum d_i^2`` by least squares therefore finds the maximum-likelihood ``p``
exactly, on the same solvers, ladder, bounds and batch engine as any fit, and ``2 cost``
is the deviance. Its Gauss-Newton matrix is, to leading order in ``f - y``,
``sum (y_i / f_i^2) g_i g_i^T`` (``g_i = df_i/dp``): the Hessian Gpufit's MLE estimator
uses. Written as ``d = (f - y) / sqrt(y) * sqrt(h(u))`` with ``u = (f - y)/y`` and
``h(u) = 2 (u - log1p(u)) / u^2`` (its series near ``u = 0``), it is smooth through
``f = y``; where ``y = 0``, ``d = sqrt(2 f)``.

The covariance of a Poisson fit is the inverse **Fisher information**
``I = sum_i g_i g_i^T / f_i`` at the optimum (the variance of counts is their mean, so no
reduced chi-square scales it): the covariance of the whitened Jacobian ``g_i/sqrt(f_i)``
(:func:`fisher_jacobian`).

Example:
    >>> import numpy as np
    >>> from adaptprec.modeling.likelihood import deviance_residual
    >>> f, y = np.array([2.0, 3.0, 1.5]), np.array([2.0, 5.0, 0.0])
    >>> d = np.asarray(deviance_residual(f, y))
    >>> bool(np.isclose((d ** 2).sum(), 2 * (f - y - np.where(y > 0, y * np.log(f / np.where(
    ...     y > 0, y, 1)), 0)).sum())), float(d[0])
    (True, 0.0)
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from .._user_fn import named_like

__all__ = ["LIKELIHOODS", "deviance_residual", "poisson_model", "fisher_jacobian",
           "poisson_nll", "check_likelihood", "check_counts", "SERIES_U"]

#: the likelihoods a fit takes by name (``None``: Gaussian, least squares)
LIKELIHOODS = ("gaussian", "poisson")
#: below this ``|u| = |f - y| / y`` the deviance residual's ``h(u)`` is its series (the
#: direct formula loses ~``eps / u^2`` relative accuracy; the series' error is ``~u^5``)
SERIES_U = 1e-3


def _h(u):
    """``2 (u - log1p(u)) / u^2``, smooth (and differentiable) through ``u = 0``."""
    small = jnp.abs(u) < SERIES_U
    us = jnp.where(small, 1.0, u)     # each branch sees only its own range (gradients)
    uz = jnp.where(small, u, 0.0)
    direct = 2.0 * (us - jnp.log1p(us)) / (us * us)
    series = 1.0 + uz * (-2.0 / 3.0 + uz * (0.5 + uz * (-0.4 + uz / 3.0)))
    return jnp.where(small, series, direct)


def deviance_residual(f, y):
    """``d_i`` with ``sum d_i^2`` the Poisson deviance of expected counts ``f`` (> 0) for
    observed ``y`` (>= 0); NaN where ``f <= 0`` (the solver rejects such a step)."""
    f = jnp.asarray(f)
    y = jnp.asarray(y, f.dtype)
    pos, ok = y > 0, f > 0
    ys = jnp.where(pos, y, 1.0)
    fs = jnp.where(ok, f, 1.0)
    u = jnp.where(pos, (fs - ys) / ys, 0.0)
    d = jnp.where(pos, (fs - ys) / jnp.sqrt(ys) * jnp.sqrt(_h(u)), jnp.sqrt(2.0 * fs))
    return jnp.where(ok, d, jnp.nan)


@functools.lru_cache(maxsize=128)
def poisson_model(model):
    """``model'(X, *p) = deviance_residual(model(X["x"], *p), X["y"])``: curve_fit's
    model for ``xdata = {"x": x, "y": counts}`` and ``ydata = 0`` (one stable function
    per model)."""
    def deviance(X, *p):
        return deviance_residual(jnp.ravel(model(X["x"], *p)), X["y"])

    return named_like(deviance, model)


def fisher_jacobian(model, x, p):
    """``g_i / sqrt(f_i)`` at ``p`` (``(m, n)``): its ``(J^T J)^{-1}`` is the inverse
    Fisher information of a Poisson fit. Traceable."""
    p = jnp.asarray(p)

    def f(q):
        return jnp.ravel(model(x, *[q[i] for i in range(q.shape[0])]))

    return jax.jacfwd(f)(p) / jnp.sqrt(f(p))[:, None]


def poisson_nll(f, y) -> float:
    """``-log L = sum f - y log f + log y!`` (host, float64)."""
    from scipy.special import gammaln

    f = np.asarray(f, np.float64)
    y = np.asarray(y, np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        return float(np.sum(f - np.where(y > 0, y * np.log(f), 0.0) + gammaln(y + 1.0)))


def check_likelihood(likelihood, sigma=None, loss="linear") -> str | None:
    """``likelihood`` normalised (``None`` for Gaussian least squares); errors for what
    a likelihood fit cannot combine with."""
    if likelihood is None or likelihood == "gaussian":
        return None
    if likelihood != "poisson":
        raise ValueError(f"likelihood must be 'gaussian' or 'poisson' (or, in ap.fit, a "
                         f"callable nll(ydata, f)), got {likelihood!r}")
    if sigma is not None:
        raise ValueError("likelihood='poisson' takes no sigma: the variance of a count is "
                         "its expected value")
    if loss not in (None, "linear"):
        raise ValueError("likelihood='poisson' is not combined with a robust loss")
    return likelihood


def check_counts(y) -> None:
    """Poisson data must be finite and non-negative (counts; non-integers are allowed,
    as in Gpufit)."""
    y = np.asarray(y, np.float64)
    if not np.all(np.isfinite(y)) or np.any(y < 0):
        raise ValueError("likelihood='poisson' needs ydata of finite, non-negative counts"
                         f" ({int(np.sum(~(np.isfinite(y) & (y >= 0))))} value(s) are not)")


def positive_at_start(model, x, p0) -> None:
    """A Poisson model's expected counts must be positive at the start."""
    f = np.asarray(model(x, *[jnp.asarray(v) for v in np.asarray(p0, np.float64)]),
                   np.float64)
    if not np.all(f > 0):
        k = int(np.sum(~(f > 0)))
        raise ValueError(f"likelihood='poisson': the model's expected counts must be "
                         f"positive, but {k} of {f.size} are not at p0; start where the "
                         "model is positive (or bound its parameters)")



def _omit_nan(x, y):
    """``nan_policy="omit"``: the points with NaN in ``x`` (its last axis) or ``y``."""
    xa = np.asarray(x, np.float64)
    bad = np.isnan(y)
    if xa.ndim and xa.shape[-1] == y.size:
        bad = bad | np.isnan(xa).reshape(-1, y.size).any(axis=0)
        xa = xa[..., ~bad]
    return xa, y[~bad]


def curve_fit_poisson(curve_fit, covariance_at, f, xdata, ydata, p0, sigma, check_finite,
                      bounds, method, jac, full_output, nan_policy, kwargs):
    """:func:`adaptprec.curve_fit` with ``likelihood="poisson"``: the least-squares fit of
    the deviance residuals (module docstring), ``pcov`` the inverse Fisher information
    (never scaled by a reduced chi-square); ``infodict["deviance"]`` is ``2 cost``.
    ``curve_fit`` and ``covariance_at`` are the caller's (this layer sits above nlsq)."""
    from .._tracing import is_concrete

    check_likelihood("poisson", sigma, kwargs.get("loss", "linear"))
    if jac is not None:
        raise ValueError("likelihood='poisson' differentiates the model with JAX: leave "
                         "jac=None")
    concrete = is_concrete((xdata, ydata, p0))
    y = np.asarray(ydata, np.float64).ravel() if concrete else jnp.ravel(ydata)
    x = xdata
    if concrete:
        if nan_policy == "omit":
            x, y = _omit_nan(xdata, y)
        check_counts(y)
        if p0 is not None:
            positive_at_start(f, x, p0)
    out = curve_fit(poisson_model(f), {"x": x, "y": y}, np.zeros(y.shape) if concrete
                    else jnp.zeros(y.shape), p0, None, True, check_finite, bounds, method,
                    None, full_output=True, **kwargs)
    popt = out[0]
    pcov = covariance_at(fisher_jacobian(f, x, jnp.asarray(popt)))
    if concrete:
        pcov = np.asarray(pcov, np.float64)
    if not full_output:
        return popt, pcov
    info = dict(out[2], deviance=2.0 * out[2]["result"].cost)
    return (popt, pcov, info, *out[3:])
