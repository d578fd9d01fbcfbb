r"""Per-fit parameter covariance from the undamped Jacobian at the solution.

``curve_fit`` semantics, batched: :func:`adaptprec.nlsq.common.covariance`
(SVD, scipy's rank threshold, ``inf`` rows/columns for parameters that are not
identifiable) under ``vmap``, scaled by :math:`s^2 = 2\,\mathrm{cost}/(m-n)` unless
``absolute_sigma``; with no degrees of freedom (``m <= n``) and relative sigma the whole
matrix is ``inf``, as scipy does.

With a mask, ``m`` is each fit's own count of real points (the padded rows of ``J`` are
zero). With fixed parameters, ``n`` counts the free ones and the covariance is that of
the free parameters, the fixed rows and columns **zero**: a fixed parameter is exact, as
in :func:`adaptprec.fit` and :func:`adaptprec.curve_fit` (``C_p = T C_q T^T`` with
``T = dp/dq``: zero rows for the fixed ones) and the covariance of scipy's fit of the
reduced model, bordered by zeros. (NaN would make every propagated sum NaN; lmfit leaves
fixed parameters out of its matrix.)
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ..nlsq.common import covariance, scale_pcov

__all__ = ["batched_pcov"]


def batched_pcov(jac: jax.Array, cost: jax.Array, absolute_sigma: bool = False,
                 points=None, fixed=None) -> jax.Array:
    """Covariance ``(B, n, n)`` from Jacobians ``(B, m, n)`` and costs ``(B,)``;
    ``points`` ``(B,)``: each fit's real rows (default ``m``), ``fixed`` ``(B, n)`` bool:
    the fixed parameters (default none).

    Example:
        >>> import jax.numpy as jnp
        >>> from adaptprec.batch.covariance import batched_pcov
        >>> J = jnp.array([[[1.0, 0.0], [0.0, 2.0], [0.0, 0.0]], [[1.0, 1.0], [1.0, 1.0], [0.0, 0.0]]])
        >>> p = batched_pcov(J, jnp.array([0.5, 0.5]))
        >>> p[0].tolist(), bool(jnp.isinf(p[1]).all())
        ([[1.0, 0.0], [0.0, 0.25]], True)
        >>> q = batched_pcov(J, jnp.array([0.5, 0.5]), True, fixed=jnp.array([[0, 0], [0, 1]],
        ...                  bool))                     # fit 1: the reduced model's (J^T J)^-1
        >>> jnp.round(q[1], 12).tolist()
        [[0.5, 0.0], [0.0, 0.0]]
    """
    _, m, n = jac.shape
    if points is None and fixed is None:
        pcov = jax.vmap(covariance)(jac)
        return jax.vmap(lambda p, c: scale_pcov(p, c, m, n, lm_rule=False,
                                                absolute_sigma=absolute_sigma,
                                                xnp=jnp))(pcov, cost)
    points = jnp.broadcast_to(m if points is None else points, cost.shape)
    held = jnp.zeros(jac.shape[::2], bool) if fixed is None else fixed

    def one(J, c, k, fx):
        if fixed is not None:
            # the free columns, bordered by one scaled unit row per fixed parameter:
            # J_aug^T J_aug = blockdiag(J_free^T J_free, s^2 I), whose inverse holds the
            # reduced model's covariance in its free block
            J = jnp.where(fx[None, :], 0, J)
            s = jnp.max(jnp.sqrt(jnp.sum(J * J, axis=0)))
            J = jnp.concatenate([J, jnp.diag(jnp.where(fx, jnp.where(s > 0, s, 1), 0))])
        cov = covariance(J, m=k)
        if not absolute_sigma:
            dof = k - (n - jnp.sum(fx))
            scaled = jnp.where(jnp.isinf(cov), cov,
                               cov * (2.0 * c / jnp.maximum(dof, 1)).astype(cov.dtype))
            cov = jnp.where(dof > 0, scaled, jnp.inf)
        return jnp.where(fx[:, None] | fx[None, :], 0, cov)

    return jax.vmap(one)(jac, cost, points, held)
