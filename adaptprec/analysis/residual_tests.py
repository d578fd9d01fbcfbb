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


def runs_test(residuals) -> RunsTest:
    """The Wald–Wolfowitz runs test on the signs of ``residuals`` (1-D, in ``x`` order;
    zeros count as positive). ``pvalue`` is one-sided (too few runs); with all residuals
    of one sign it is 0 (``z = -inf``)."""
    r = jnp.asarray(residuals)
    pos = r >= 0
    n = r.shape[-1]
    n_pos = jnp.sum(pos, axis=-1).astype(r.dtype)
    n_neg = n - n_pos
    runs = 1 + jnp.sum(pos[..., 1:] != pos[..., :-1], axis=-1)
    expected = 2.0 * n_pos * n_neg / n + 1.0
    var = 2.0 * n_pos * n_neg * (2.0 * n_pos * n_neg - n) / (n * n * (n - 1.0))
    z = jnp.where(var > 0, (runs - expected) / jnp.sqrt(jnp.where(var > 0, var, 1.0)),
                  -jnp.inf)
    return RunsTest(runs, expected, z, ndtr(z))


def lag1_autocorrelation(residuals):
    """``sum r_i r_{i+1} / sum r_i^2`` of the mean-removed residuals (0 for white noise,
    towards 1 for a misfit that leaves smooth structure)."""
    r = jnp.asarray(residuals)
    r = r - jnp.mean(r, axis=-1, keepdims=True)
    num = jnp.sum(r[..., 1:] * r[..., :-1], axis=-1)
    den = jnp.sum(r * r, axis=-1)
    return num / jnp.where(den > 0, den, 1.0)
