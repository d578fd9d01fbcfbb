"""Confidence and prediction bands of a fitted model by the delta method.

At new points ``x`` the model's gradient with respect to the parameters,
``g(x) = d model(x, *p) / dp`` (forward-mode autodiff), gives the variance of the fitted
curve ``g^T C g`` (``C`` the parameter covariance; on the identifiable subspace, see
:mod:`.identifiability`). The confidence band is ``f(x) ± q sqrt(g^T C g)``; the
prediction band adds the variance of a new observation. ``q`` is Student's t quantile
with the fit's degrees of freedom (the variance estimated from the residuals), or the
normal one when ``absolute_sigma=True``. Everything runs in the working precision of
``x`` (``popt``/``pcov`` are cast to it) and works under ``jit``, ``vmap`` and ``grad``.

Example:
    >>> import jax.numpy as jnp
    >>> from adaptprec.analysis.bands import fit_band
    >>> line = lambda x, a, b: a * x + b
    >>> pcov = jnp.array([[0.01, 0.0], [0.0, 0.04]])
    >>> band = fit_band(line, jnp.array([0.0, 1.0]), jnp.array([2.0, 1.0]), pcov, dof=None)
    >>> [round(float(v), 4) for v in band.stderr], round(float(band.upper[0]), 4)
    ([0.2, 0.2236], 1.392)
"""

from __future__ import annotations

from typing import Callable, Optional

import jax
import jax.numpy as jnp

from .._pytree import Module
from ._quantiles import two_sided_quantile

__all__ = ["Band", "fit_band", "model_gradient"]


class Band(Module):
    """A band at points ``x``: ``fit`` (the model), ``stderr`` (standard deviation of the
    fitted curve, or of a new observation for a prediction band), ``lower``/``upper``
    (``fit ∓ quantile * stderr``) and the ``quantile`` used."""

    fit: jax.Array
    stderr: jax.Array
    lower: jax.Array
    upper: jax.Array
    quantile: jax.Array


def _working_dtype(x, popt):
    dt = jnp.result_type(x)
    return dt if jnp.issubdtype(dt, jnp.floating) else jnp.result_type(popt, float)


def model_gradient(model: Callable, x, popt):
    """``(f, g)``: the model at ``x`` (flat, ``(k,)``) and its Jacobian with respect to the
    parameters ``(k, n)``, by forward-mode autodiff."""
    def f(p):
        return jnp.ravel(model(x, *[p[i] for i in range(p.shape[0])]))
    return f(popt), jax.jacfwd(f)(popt)


def fit_band(model: Callable, x, popt, pcov, *, level: float = 0.95,
             dof: Optional[float] = None, kind: str = "confidence",
             noise_sigma=None, null_space=None) -> Band:
    """The confidence (``kind="confidence"``) or prediction band of ``model`` at ``x``.

    Args:
        model: ``model(x, *params)`` as given to ``curve_fit``.
        x: points to evaluate at (any shape the model takes; the band is flat).
        popt, pcov: parameters and their covariance (finite: use the identifiable-subspace
            covariance of :class:`~adaptprec.FitResult`, ``result.cov_identifiable``).
        level: two-sided coverage (0.95).
        dof: degrees of freedom for Student's t; ``None`` for the normal quantile
            (variance known, ``absolute_sigma=True``).
        kind: ``"confidence"`` (the fitted curve) or ``"prediction"`` (a new observation).
        noise_sigma: the standard deviation of a new observation at ``x`` (scalar or per
            point), needed for ``kind="prediction"``.
        null_space: ``(n, k)`` undetermined parameter directions; where the model's
            gradient has a component along them the band is ``inf`` (the data do not
            determine the model there).
    """
    if kind not in ("confidence", "prediction"):
        raise ValueError(f"kind must be 'confidence' or 'prediction', got {kind!r}")
    if kind == "prediction" and noise_sigma is None:
        raise ValueError("a prediction band needs noise_sigma, the standard deviation of a "
                         "new observation (FitResult.band fills it in from the fit)")
    dtype = _working_dtype(x, popt)
    popt = jnp.asarray(popt, dtype)
    pcov = jnp.asarray(pcov, dtype)
    f, g = model_gradient(model, jnp.asarray(x, dtype) if jnp.issubdtype(
        jnp.result_type(x), jnp.integer) else x, popt)
    f = f.astype(dtype)
    g = g.astype(dtype)
    var = jnp.einsum("ki,ij,kj->k", g, pcov, g)
    var = jnp.maximum(var, 0.0)
    if null_space is not None:
        N = jnp.asarray(null_space, dtype)
        along = jnp.linalg.norm(g @ N, axis=-1)
        size = jnp.linalg.norm(g, axis=-1) * jnp.max(jnp.linalg.norm(N, axis=0))
        var = jnp.where(along > jnp.sqrt(jnp.finfo(dtype).eps) * size, jnp.inf, var)
    if kind == "prediction":
        var = var + jnp.broadcast_to(jnp.asarray(noise_sigma, dtype) ** 2, var.shape)
    stderr = jnp.sqrt(var)
    q = two_sided_quantile(level, dof).astype(dtype)
    return Band(f, stderr, f - q * stderr, f + q * stderr, q)
