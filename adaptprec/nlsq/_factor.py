"""The factored Gauss-Newton model: ``R`` (n x n) and ``qtf`` with ``R^T R = J^T J`` and
``R^T qtf = J^T f``, from the Jacobian (QR of ``[J f]``, or the normal equations) or
from a summed Gram matrix (blocked or streamed data).

Example:
    >>> import jax.numpy as jnp
    >>> from adaptprec.nlsq._factor import factor
    >>> R, qtf = factor(jnp.eye(3, 2), jnp.ones(3), "qr")
    >>> [round(abs(float(v)), 6) for v in qtf]
    [1.0, 1.0]
"""

from __future__ import annotations

import jax.numpy as jnp

from .._backend import qr_r

__all__ = ["factor", "factor_gram", "working_dtype"]


def working_dtype(dtype):
    """The dtype a rung's model is formed in: the rung's, at least float32 (bf16 and
    f16 products accumulate in float32)."""
    return jnp.promote_types(dtype, jnp.float32)


def factor_gram(A, b):
    """``R`` and ``qtf`` with ``R^T R = A`` and ``R^T qtf = b`` from the Gram matrix
    ``A = J^T J`` and ``b = J^T f`` (symmetric eigendecomposition, rank-revealing). The
    rank test is on the Gram matrix (eigenvalues carry absolute error ``~ n eps ||A||``),
    not scipy's ``eps max(m, n)`` for ``J``: with ``m = 1e6`` in float32 that would drop
    every direction below 10% of the largest singular value."""
    n = A.shape[0]
    lam, V = jnp.linalg.eigh(A)
    lam = jnp.maximum(lam, 0.0)
    sq = jnp.sqrt(lam)
    keep = lam > n * jnp.finfo(A.dtype).eps * jnp.max(lam)
    R = sq[:, None] * V.T
    qtf = jnp.where(keep, (V.T @ b) / jnp.where(keep, sq, 1.0), 0.0)
    return R, qtf


def factor(J, f, linear_solver: str):
    """``R`` (n x n) and ``qtf`` with ``R^T R = J^T J`` and ``R^T qtf = J^T f``:
    ``"normal"`` through the Gram matrix (accumulated in ``J``'s dtype), ``"qr"`` as the
    ``R`` factor of ``[J f]`` (its last column is ``qtf``)."""
    m, n = J.shape
    if linear_solver == "normal":
        A = jnp.einsum("mi,mj->ij", J, J, preferred_element_type=J.dtype)
        b = jnp.einsum("mi,m->i", J, f, preferred_element_type=J.dtype)
        return factor_gram(A, b)
    A = jnp.concatenate([J, f[:, None]], axis=1)
    if m < n + 1:
        A = jnp.concatenate([A, jnp.zeros((n + 1 - m, n + 1), A.dtype)])
    Raug = qr_r(A)
    return Raug[:n, :n], Raug[:n, n]
