r"""Per-fit parameter covariance from the undamped Jacobian at the solution.

``curve_fit`` semantics, batched: :func:`adaptprec.nlsq.common.covariance`
(SVD, scipy's rank threshold, ``inf`` rows/columns for parameters that are not
identifiable) under ``vmap``, scaled by :math:`s^2 = 2\,\mathrm{cost}/(m-n)` unless
``absolute_sigma``; with no degrees of freedom (``m <= n``) and relative sigma the whole
matrix is ``inf``, as scipy does.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ..nlsq.common import covariance, scale_pcov

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
    pcov = jax.vmap(covariance)(jac)
    return jax.vmap(lambda p, c: scale_pcov(p, c, m, n, lm_rule=False,
                                            absolute_sigma=absolute_sigma,
                                            xnp=jnp))(pcov, cost)
