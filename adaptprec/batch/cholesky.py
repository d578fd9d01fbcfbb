r"""Batched Cholesky solves of many small symmetric positive definite systems.

For a batch of ``B`` systems :math:`A_k x_k = b_k` with :math:`A_k \in \mathbb{R}^{n\times n}`
the factorisation :math:`A_k = L_k L_k^\top` and the two triangular solves are written with
the batch axis explicit. For ``n <= UNROLL_MAX`` the loops over rows and columns are
unrolled in Python, so every operation is an elementwise vector operation of length ``B``
that XLA fuses and vectorises across fits (the "closed form" of a 5 x 5 solve costs about
``n^3/6 + n^2`` fused multiply-adds per fit, no per-fit kernel launches). Larger ``n`` uses
:func:`jax.lax.linalg.cholesky` and :func:`jax.lax.linalg.triangular_solve`, which batch
over the leading axis.

A matrix that is not numerically positive definite gives a non-finite solution for that
fit only (``sqrt`` of a non-positive pivot); callers treat that as a rejected step.
Arithmetic is in the dtype of ``A`` (callers pass float32 or wider).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

__all__ = ["UNROLL_MAX", "cholesky_solve", "cholesky_solve_fits_last"]

UNROLL_MAX = 8


def _unrolled(entry, rhs, n: int, shift=None):
    """Unrolled Cholesky solve on per-fit vectors: ``entry(i, j)`` is ``A[i, j]`` and
    ``rhs(i)`` is ``b[i]`` for every fit (vectors over the batch). ``shift(j)``, when
    given, is added to the diagonal (``A + diag(shift)``) without forming that matrix.
    Returns the solution and ``diag(L)`` as lists of ``n`` vectors."""
    low = [[None] * n for _ in range(n)]
    inv_diag = [None] * n
    diag = [None] * n
    for j in range(n):
        s = entry(j, j) if shift is None else entry(j, j) + shift(j)
        for k in range(j):
            s = s - low[j][k] * low[j][k]
        d = jnp.sqrt(s)
        diag[j] = d
        inv_diag[j] = 1.0 / d
        for i in range(j + 1, n):
            s = entry(i, j)
            for k in range(j):
                s = s - low[i][k] * low[j][k]
            low[i][j] = s * inv_diag[j]
    y = [None] * n
    for i in range(n):
        s = rhs(i)
        for k in range(i):
            s = s - low[i][k] * y[k]
        y[i] = s * inv_diag[i]
    x = [None] * n
    for i in reversed(range(n)):
        s = y[i]
        for k in range(i + 1, n):
            s = s - low[k][i] * x[k]
        x[i] = s * inv_diag[i]
    return x, diag


def _library(a: jax.Array, b: jax.Array) -> tuple[jax.Array, jax.Array]:
    low = jax.lax.linalg.cholesky(a, symmetrize_input=False)
    y = jax.lax.linalg.triangular_solve(low, b[..., None], left_side=True, lower=True)
    x = jax.lax.linalg.triangular_solve(low, y, left_side=True, lower=True,
                                        transpose_a=True)
    return x[..., 0], jnp.diagonal(low, axis1=-2, axis2=-1)


def cholesky_solve(a: jax.Array, b: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Solve ``a[k] @ x[k] = b[k]`` for every ``k``; also return the Cholesky diagonals.

    Args:
        a: ``(B, n, n)`` symmetric positive definite matrices (only the lower triangle is
            read).
        b: ``(B, n)`` right-hand sides.

    Returns:
        ``(x, diag)``: solutions ``(B, n)`` and ``diag(L_k)`` ``(B, n)``. The ratio
        ``(max diag / min diag)**2`` is a cheap lower bound on the 2-norm condition number
        of ``a[k]``. Non-SPD systems give NaN in their own row only.

    Example:
        >>> import jax.numpy as jnp
        >>> from adaptprec.batch.cholesky import cholesky_solve
        >>> a = jnp.array([[[4.0, 2.0], [2.0, 3.0]], [[1.0, 0.0], [0.0, -1.0]]])
        >>> x, d = cholesky_solve(a, jnp.array([[2.0, 1.0], [1.0, 1.0]]))
        >>> [round(float(v), 6) for v in x[0]], bool(jnp.isnan(x[1]).any())
        ([0.5, 0.0], True)
    """
    if a.ndim != 3 or a.shape[-1] != a.shape[-2] or b.shape != a.shape[:2]:
        raise ValueError(f"cholesky_solve expects a (B, n, n) and b (B, n); got "
                         f"{a.shape} and {b.shape}")
    n = a.shape[-1]
    if n <= UNROLL_MAX:
        x, diag = _unrolled(lambda i, j: a[:, i, j], lambda i: b[:, i], n)
        return jnp.stack(x, axis=-1), jnp.stack(diag, axis=-1)
    return _library(a, b)


def cholesky_solve_fits_last(a: jax.Array, b: jax.Array, shift=None) -> jax.Array:
    """:func:`cholesky_solve` with the batch axis LAST: ``a`` ``(n, n, B)``, ``b`` ``(n, B)``.

    Solves ``(a[..., k] + diag(shift[:, k])) x[:, k] = b[:, k]`` (``shift`` ``(n, B)``, or
    ``None`` for no shift) and returns ``x`` ``(n, B)``. With the fits on the minor axis
    every entry ``a[i, j]`` is a contiguous vector over the fits, so the unrolled
    factorisation runs as full-width vector operations (the layout the batched LM loop
    keeps its state in).

    Example:
        >>> import jax.numpy as jnp
        >>> from adaptprec.batch.cholesky import cholesky_solve_fits_last
        >>> a = jnp.array([[4.0, 2.0], [2.0, 3.0]])[:, :, None]
        >>> x = cholesky_solve_fits_last(a, jnp.array([[2.0], [1.0]]))
        >>> [round(float(v), 6) for v in x[:, 0]]
        [0.5, 0.0]
        >>> x = cholesky_solve_fits_last(a, jnp.array([[2.0], [1.0]]), jnp.array([[1.0], [0.0]]))
        >>> [round(float(v), 5) for v in x[:, 0]]  # (a + diag(1, 0)) x = b: x = (4/11, 1/11)
        [0.36364, 0.09091]
    """
    n = a.shape[0]
    if a.ndim != 3 or a.shape[1] != n or b.shape != (n, a.shape[2]):
        raise ValueError(f"cholesky_solve_fits_last expects a (n, n, B) and b (n, B); got "
                         f"{a.shape} and {b.shape}")
    if n <= UNROLL_MAX:
        x, _ = _unrolled(lambda i, j: a[i, j], lambda i: b[i], n,
                         None if shift is None else (lambda j: shift[j]))
        return jnp.stack(x, axis=0)
    if shift is not None:
        a = a + jnp.eye(n, dtype=a.dtype)[:, :, None] * shift[None]
    x, _ = _library(jnp.moveaxis(a, -1, 0), b.T)
    return x.T
