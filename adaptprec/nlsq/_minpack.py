"""MINPACK's ``fjac``/``ipvt``/``qtf`` (scipy ``leastsq``'s ``infodict`` fields) from the
final Jacobian and residual, by a column-pivoted QR in JAX (works under ``jit``).

``fjac`` is stored as scipy returns it: shape ``(n, m)``, ``fjac.T[:n]`` holding ``R``
in its upper triangle (MINPACK keeps Householder vectors below the diagonal; here they are
zero). With the permutation ``ipvt`` (0-based, as scipy >= 1.15 returns it),
``J[:, ipvt] = Q R`` and ``qtf = Q^T fvec``, so scipy's recipe for the covariance,
``inv(R^T R)`` un-permuted, applies unchanged.

Example:
    >>> import numpy as np, jax.numpy as jnp
    >>> from adaptprec.nlsq._minpack import minpack_fields
    >>> J = jnp.array([[1.0, 0.0], [0.0, 3.0], [1.0, 1.0]])
    >>> d = minpack_fields(J, jnp.array([1.0, 2.0, 3.0]))
    >>> d["fjac"].shape, d["ipvt"].tolist()
    ((2, 3), [1, 0])
    >>> R = np.triu(np.asarray(d["fjac"]).T[:2])
    >>> bool(np.allclose(R.T @ R, (J[:, d["ipvt"]].T @ J[:, d["ipvt"]])))
    True
"""

from __future__ import annotations

import jax.numpy as jnp
from jax.scipy.linalg import qr

__all__ = ["minpack_fields"]


def minpack_fields(J, f) -> dict:
    """``{"fjac", "ipvt", "qtf"}`` for the Jacobian ``J`` (m, n) and residual ``f`` (m,)."""
    J = jnp.asarray(J)
    f = jnp.asarray(f)
    m, n = J.shape
    k = min(m, n)
    Q, R, P = qr(J, pivoting=True, mode="economic")
    fjac = jnp.zeros((m, n), J.dtype).at[:k, :].set(R[:k])
    qtf = jnp.zeros((n,), J.dtype).at[:k].set((Q.T @ f)[:k])
    return {"fjac": fjac.T, "ipvt": P.astype(jnp.int32), "qtf": qtf}
