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
from jax import lax

__all__ = ["_factor", "_factor_gram", "householder_r"]


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
    use_householder = (A.shape[1] <= HOUSEHOLDER_MAX_COLUMNS
                       and A.size >= HOUSEHOLDER_MIN_SIZE)
    Raug = householder_r(A) if use_householder else jnp.linalg.qr(A, mode="r")
    return Raug[:n, :n], Raug[:n, n]


#: Up to this many columns of ``[J f]`` the QR is :func:`householder_r` in XLA ops, not
#: LAPACK's ``geqrf`` (issue 32): jaxlib calls scipy's OpenBLAS there, whose threads cost
#: 55 ms for a 2000 x 12 QR on a loaded machine against 1.1 ms single-threaded, and one
#: step of a 2000-point fit is one such QR.
HOUSEHOLDER_MAX_COLUMNS = 32
#: ... and from this many entries: below it LAPACK's call stays single-threaded and is
#: 3-4x faster than the loop (measured, one process: 512 x 12 0.18 ms vs 0.56 ms,
#: 4096 x 3 0.04 vs 0.14; at 1024 x 12 59.6 ms vs 0.47, 2048 x 6 23.7 vs 0.34, 2048 x 12
#: 282 vs 0.57, 1e5 x 7 123 vs 56; jitted, median of 15, loaded machine, issue 32).
HOUSEHOLDER_MIN_SIZE = 12288


def householder_r(A):
    """The ``R`` factor (``(k, k)``, ``k = A.shape[1]``, rows ``>= k`` dropped) of a
    tall ``A`` (``m >= k``) by Householder reflections in XLA ops: one reflection per
    column in a ``fori_loop`` (``O(m k^2)``, backward stable as LAPACK's ``geqrf``; signs
    of the rows may differ from it). A zero column is left as it is.

    Example:
        >>> import jax.numpy as jnp
        >>> from adaptprec.nlsq._factor import householder_r
        >>> R = householder_r(jnp.array([[3.0, 1.0], [4.0, 2.0], [0.0, 2.0]]))
        >>> [[round(abs(float(v)), 6) for v in row] for row in R]
        [[5.0, 2.2], [0.0, 2.039608]]
    """
    m, k = A.shape
    rows = jnp.arange(m)

    def reflect(j, A):
        x = jnp.where(rows >= j, A[:, j], 0.0)
        norm_x = jnp.linalg.norm(x)
        xj = A[j, j]
        alpha = -jnp.where(xj >= 0, 1.0, -1.0).astype(A.dtype) * norm_x
        v = x.at[j].add(-alpha)
        vv = jnp.vdot(v, v)
        beta = jnp.where(vv > 0, 2.0 / jnp.where(vv > 0, vv, 1.0), 0.0)
        return A - (beta * v)[:, None] * (v @ A)[None, :]

    A = lax.fori_loop(0, k, reflect, A)
    return jnp.triu(A[:k])
