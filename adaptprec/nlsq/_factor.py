"""The factored Gauss-Newton model: ``R`` (n x n) and ``qtf`` with ``R^T R = J^T J`` and
``R^T qtf = J^T f``, from the Jacobian (QR of ``[J f]``, or the normal equations) or
from the summed Gram matrix of streamed data.

Example:
    >>> import jax.numpy as jnp
    >>> from adaptprec.nlsq._factor import _factor
    >>> R, qtf = _factor(jnp.eye(3, 2), jnp.ones(3), "qr")
    >>> [round(abs(float(v)), 6) for v in qtf]
    [1.0, 1.0]
"""

from __future__ import annotations

import jax.numpy as jnp

__all__ = ["_factor", "_factor_gram"]


def _promote(dtype):
    return jnp.promote_types(dtype, jnp.float32)


def _factor_gram(A, b):
    """``R`` and ``qtf`` with ``R^T R = A`` and ``R^T qtf = b`` from the Gram matrix
    ``A = J^T J`` and ``b = J^T f`` (symmetric eigendecomposition, rank-revealing)."""
    n = A.shape[0]
    lam, V = jnp.linalg.eigh(A)
    lam = jnp.maximum(lam, 0.0)
    sq = jnp.sqrt(lam)
    # Rank test on the Gram matrix (eigenvalues carry absolute error ~ n eps ||A||),
    # not scipy's eps * max(m, n) for J: with m = 1e6 in float32 that would drop
    # every direction below 10% of the largest singular value.
    keep = lam > n * jnp.finfo(A.dtype).eps * jnp.max(lam)
    R = sq[:, None] * V.T
    qtf = jnp.where(keep, (V.T @ b) / jnp.where(keep, sq, 1.0), 0.0)
    return R, qtf


def _factor(J, f, linear_solver):
    """``R`` (n x n) and ``qtf`` with ``R^T R = J^T J`` and ``R^T qtf = J^T f``."""
    m, n = J.shape
    if linear_solver == "normal":
        A = jnp.einsum("mi,mj->ij", J, J, preferred_element_type=J.dtype)
        b = jnp.einsum("mi,m->i", J, f, preferred_element_type=J.dtype)
        return _factor_gram(A, b)
    A = jnp.concatenate([J, f[:, None]], axis=1)
    if m < n + 1:
        A = jnp.concatenate([A, jnp.zeros((n + 1 - m, n + 1), A.dtype)])
    Raug = jnp.linalg.qr(A, mode="r")
    return Raug[:n, :n], Raug[:n, n]
