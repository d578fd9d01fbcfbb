"""Tests of the residuals for a misfit model: the Wald–Wolfowitz runs test on their signs
and their lag-1 autocorrelation (jit/vmap-safe).

A model that misses the data's shape leaves residuals with long runs of one sign (too few
runs) and a positive lag-1 autocorrelation; independent noise gives about
``2 n+ n- / n + 1`` runs. The residuals are taken in the order of ``x`` (sort them first;
:class:`~adaptprec.FitResult` does for 1-D ``x``).

Example:
    >>> import jax.numpy as jnp
    >>> from adaptprec.analysis.residual_tests import runs_test
    >>> r = runs_test(jnp.array([1.0, 2.0, 1.0, -1.0, -2.0, -1.0, 1.0, 2.0, 1.0, -1.0]))
    >>> int(r.runs), round(float(r.expected), 2), bool(r.pvalue < 0.5)
    (4, 5.8, True)
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.scipy.special import ndtr

from .._pytree import Module

__all__ = ["RunsTest", "runs_test", "lag1_autocorrelation"]


class RunsTest(Module):
    """``runs`` (count of sign runs), ``expected`` and ``z`` (normal approximation),
    ``pvalue`` (one-sided: the probability of so few runs under independence)."""

    runs: jax.Array
    expected: jax.Array
    z: jax.Array
    pvalue: jax.Array


def _real_first(r, mask):
    """``r`` and ``mask`` with the real points first, in their order (padding last)."""
    order = jnp.argsort(~mask, axis=-1, stable=True)
    return jnp.take_along_axis(r, order, -1), jnp.take_along_axis(mask, order, -1)


def runs_test(residuals, mask=None) -> RunsTest:
    """The Wald–Wolfowitz runs test on the signs of ``residuals`` (1-D, in ``x`` order;
    zeros count as positive). ``pvalue`` is one-sided (too few runs); with all residuals
    of one sign it is 0 (``z = -inf``). ``mask``: the real points (padding is left out)."""
    r = jnp.asarray(residuals)
    if mask is None:
        mask = jnp.ones(r.shape, bool)
    else:
        r, mask = _real_first(r, jnp.asarray(mask, bool))
    pos = r >= 0
    n = jnp.sum(mask, axis=-1).astype(r.dtype)
    n_pos = jnp.sum(pos & mask, axis=-1).astype(r.dtype)
    n_neg = n - n_pos
    runs = 1 + jnp.sum((pos[..., 1:] != pos[..., :-1]) & mask[..., 1:], axis=-1)
    expected = 2.0 * n_pos * n_neg / n + 1.0
    var = 2.0 * n_pos * n_neg * (2.0 * n_pos * n_neg - n) / (n * n * (n - 1.0))
    z = jnp.where(var > 0, (runs - expected) / jnp.sqrt(jnp.where(var > 0, var, 1.0)),
                  -jnp.inf)
    return RunsTest(runs, expected, z, ndtr(z))


def lag1_autocorrelation(residuals, mask=None):
    """``sum r_i r_{i+1} / sum r_i^2`` of the mean-removed residuals (0 for white noise,
    towards 1 for a misfit that leaves smooth structure); ``mask``: the real points."""
    r = jnp.asarray(residuals)
    if mask is None:
        mask = jnp.ones(r.shape, bool)
    else:
        r, mask = _real_first(r, jnp.asarray(mask, bool))
    n = jnp.maximum(jnp.sum(mask, axis=-1, keepdims=True), 1)
    r = jnp.where(mask, r - jnp.sum(jnp.where(mask, r, 0.0), axis=-1, keepdims=True) / n,
                  0.0)
    num = jnp.sum(r[..., 1:] * r[..., :-1], axis=-1)
    den = jnp.sum(r * r, axis=-1)
    return num / jnp.where(den > 0, den, 1.0)
