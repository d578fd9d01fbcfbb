r"""Per-fit parameter covariance from the undamped Jacobian at the solution.

``curve_fit`` semantics, batched: :func:`adaptprec.nlsq.common.covariance_from_jac`
(SVD, scipy's rank threshold, ``inf`` rows/columns for parameters that are not
identifiable) under ``vmap``, scaled by :math:`s^2 = 2\,\mathrm{cost}/(m-n)` unless
``absolute_sigma``; with no degrees of freedom (``m <= n``) and relative sigma the whole
matrix is ``inf``, as scipy does.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ..nlsq.common import covariance_from_jac

__all__ = ["batched_pcov"]


def batched_pcov(jac: jax.Array, cost: jax.Array, absolute_sigma: bool = False) -> jax.Array:
    """Covariance ``(B, n, n)`` from Jacobians ``(B, m, n)`` and costs ``(B,)``.

    Example:
        >>> import jax.numpy as jnp
        >>> from adaptprec.batch.covariance import batched_pcov
        >>> J = jnp.array([[[1.0, 0.0], [0.0, 2.0], [0.0, 0.0]], [[1.0, 1.0], [1.0, 1.0], [0.0, 0.0]]])
        >>> p = batched_pcov(J, jnp.array([0.5, 0.5]))
        >>> p[0].tolist(), bool(jnp.isinf(p[1]).all())
        ([[1.0, 0.0], [0.0, 0.25]], True)
    """
    _, m, n = jac.shape
    pcov, _ = jax.vmap(covariance_from_jac)(jac)
    if absolute_sigma:
        return pcov
    if m <= n:
        return jnp.full_like(pcov, jnp.inf)
    scaled = pcov * (2.0 * cost / (m - n))[:, None, None]
    return jnp.where(jnp.isinf(pcov), jnp.inf, scaled)
