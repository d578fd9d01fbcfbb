r"""Per-fit parameter covariance from the undamped Jacobian at the solution.

scipy ``curve_fit`` semantics, batched: with the thin SVD :math:`J = U S V^\top`, singular
values below :math:`\varepsilon \max(m, n)\, s_{\max}` are discarded and
:math:`\mathrm{pcov} = V S^{-2} V^\top`, scaled by :math:`s^2 = 2\,\mathrm{cost}/(m-n)`
unless ``absolute_sigma``. Where the Jacobian is rank-deficient (a parameter is not
identifiable) or :math:`m \le n`, the whole matrix of that fit is ``inf``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

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
    b, m, n = jac.shape
    _, s, vt = jnp.linalg.svd(jac, full_matrices=False)
    eps = jnp.finfo(jac.dtype).eps
    thresh = eps * max(m, n) * s[:, :1]
    keep = s > thresh
    inv_s2 = jnp.where(keep, 1.0 / jnp.where(keep, s, 1) ** 2, 0)
    pcov = jnp.einsum("bki,bk,bkj->bij", vt, inv_s2, vt)
    if not absolute_sigma:
        dof = m - n
        scale = 2.0 * cost / dof if dof > 0 else jnp.full_like(cost, jnp.inf)
        pcov = pcov * scale[:, None, None]
    bad = ~jnp.all(keep, axis=-1) | (m <= n and not absolute_sigma)
    return jnp.where(bad[:, None, None], jnp.inf, pcov)
