r"""Preconditioners for the Krylov solvers: Jacobi and adaptive-precision block-Jacobi.

A preconditioner ``M`` approximates ``A^{-1}`` and is applied as ``z = M r`` (scipy's
convention). Like the operator, it runs on every rung: ``M.at(dtype)`` is
``r -> M r`` for ``r`` in the rung's dtype.

**Block-Jacobi with per-block storage precision** (Anzt, Flegar, Grützmacher and
Quintana-Ortí, "Adaptive precision in block-Jacobi preconditioning for iterative sparse
linear system solvers", Concurrency Computat. Pract. Exper. 31(6), e4460, 2019; Ginkgo's
``preconditioner::Jacobi`` with ``storage_optimization = autodetect``): the inverse of each
diagonal block ``D_i`` is stored in the cheapest format whose rounding keeps the
preconditioner's relative error below ``accuracy``:

.. math:: \kappa_1(D_i)\, u_p < \mathrm{accuracy} \quad (\text{Ginkgo's default } 0.1),

and whose range holds every entry of ``D_i^{-1}`` (no overflow, no nonzero entry below
the smallest normal number). Candidates go from 2 bytes (float16, then bfloat16) to
float32 and float64; ``storage`` reports the choice per block and ``cond`` the
``kappa_1(D_i)`` it was made from. JAX arrays hold one dtype, so the rounded blocks sit in
one array of the rung's dtype: the choice fixes the numerics of Ginkgo's reduced storage
(what the preconditioner *is*), not its memory traffic, which on this CPU is that of the
rung (float32 on the low rung).

Example:
    >>> import jax.numpy as jnp
    >>> import adaptprec as ap
    >>> A = jnp.diag(jnp.array([1.0, 2.0, 4.0, 8.0]))
    >>> M = ap.linalg.block_jacobi(A, block_size=2)
    >>> M.storage_names()
    ['float16', 'float16']
    >>> (M.at(jnp.float64)(jnp.ones(4))).tolist()
    [1.0, 0.5, 0.25, 0.125]
"""

from __future__ import annotations

import numpy as np

import jax
import jax.numpy as jnp

from ..._pytree import Module, field
from ...precision import FLOATING_DTYPES, max_value, smallest_normal, unit_roundoff

__all__ = ["Jacobi", "BlockJacobi", "jacobi", "block_jacobi"]

#: Ginkgo's default ``accuracy`` of the adaptive block-Jacobi (Anzt et al. 2019): the
#: storage rounding of a block may change the preconditioner by at most this, relatively
DEFAULT_ACCURACY = 0.1
#: Ginkgo's default (and largest supported) ``max_block_size``
DEFAULT_BLOCK_SIZE = 32
#: storage candidates, cheapest first (2 bytes: the more precise format first, as
#: Ginkgo's get_optimal_storage_reduction prefers more significand bits at equal size)
_CANDIDATES = (np.dtype(np.float16), FLOATING_DTYPES[0], np.dtype(np.float32),
               np.dtype(np.float64))


class Jacobi(Module):
    """``M = diag(A)^{-1}`` (zero diagonal entries are left at 1).

    Example:
        >>> import jax.numpy as jnp
        >>> import adaptprec as ap
        >>> ap.linalg.jacobi(jnp.diag(jnp.array([2.0, 4.0]))).inv_diag.tolist()
        [0.5, 0.25]
    """

    inv_diag: jax.Array

    def at(self, dtype):
        d = self.inv_diag.astype(dtype)
        return lambda r: r * d

    def transpose(self) -> "Jacobi":
        return self


class BlockJacobi(Module):
    """``M = blockdiag(D_1, ..., D_m)^{-1}``, each block's inverse rounded to its own
    storage precision (module docstring). Build it with :func:`block_jacobi`.

    Attributes:
        blocks: ``(m, b, b)`` inverses of the diagonal blocks, each already rounded to its
            storage precision (held in the working dtype); the last block is padded with
            the identity when ``b`` does not divide ``n``.
        storage: ``(m,)`` index into :data:`STORAGE_DTYPES` of each block's format.
        cond: ``(m,)`` ``kappa_1`` of each block (``inf`` for a singular block, which is
            replaced by the identity).
        n: the operator's size.
    """

    blocks: jax.Array
    storage: jax.Array
    cond: jax.Array
    n: int = field(static=True)

    @property
    def block_size(self) -> int:
        return int(self.blocks.shape[-1])

    def storage_names(self) -> list[str]:
        """The storage format of each block, by name (needs concrete values)."""
        return [STORAGE_DTYPES[int(i)].name for i in np.asarray(self.storage)]

    def at(self, dtype):
        B = self.blocks.astype(dtype)
        accumulate = np.promote_types(dtype, np.float32)
        m, b = B.shape[0], B.shape[-1]
        pad = m * b - self.n

        def apply(r):
            rb = jnp.pad(r, (0, pad)).reshape(m, b)
            z = jnp.einsum("mij,mj->mi", B, rb, preferred_element_type=accumulate)
            return z.reshape(-1)[: self.n].astype(dtype)

        return apply

    def transpose(self) -> "BlockJacobi":
        return BlockJacobi(jnp.swapaxes(self.blocks, -1, -2), self.storage, self.cond, self.n)


STORAGE_DTYPES = _CANDIDATES
"""The storage formats a block-Jacobi block can get, cheapest first (``BlockJacobi.storage``
indexes this tuple): float16, bfloat16, float32, float64."""


def _operator_of(A, what):
    from ._operator import as_operator, operator_size
    n = operator_size(A, None, what)
    dtype = getattr(A, "dtype", None)
    dtype = np.dtype(dtype) if dtype is not None else np.dtype(jnp.result_type(float))
    return as_operator(A, n, dtype), n, dtype


def jacobi(A) -> Jacobi:
    """The Jacobi preconditioner of ``A`` (dense, BCOO/BCSR, or a lineax operator; a
    matrix-free callable needs its diagonal: ``Jacobi(1 / diag)``).

    Example:
        >>> import jax.numpy as jnp
        >>> import adaptprec as ap
        >>> M = ap.linalg.jacobi(jnp.array([[4.0, 1.0], [1.0, 2.0]]))
        >>> M.inv_diag.tolist()
        [0.25, 0.5]
    """
    op, n, dtype = _operator_of(A, "jacobi")
    return jacobi_of(op, dtype)


def jacobi_of(op, dtype) -> Jacobi:
    """:func:`jacobi` of an :class:`~adaptprec.linalg.krylov._operator.Operator`."""
    d = op.diagonal(dtype)
    return Jacobi(jnp.where(d != 0, 1.0 / jnp.where(d != 0, d, 1), 1).astype(dtype))


def _diagonal_blocks(op, n, b, dtype):
    m = -(-n // b)
    if op.kind == "bcoo":
        A = op.data
        rows, cols = A.indices[:, 0], A.indices[:, 1]
        inside = (rows // b == cols // b) & (rows < n) & (cols < n)
        blk = jnp.where(inside, rows // b, m)
        D = jnp.zeros((m, b, b), dtype).at[blk, rows % b, cols % b].add(
            jnp.where(inside, A.data, 0).astype(dtype), mode="drop")
    else:
        full = op.dense(dtype)
        full = jnp.pad(full, ((0, m * b - n), (0, m * b - n)))
        D = full.reshape(m, b, m, b)[jnp.arange(m), :, jnp.arange(m), :]
    pad = jnp.arange(m * b) >= n              # identity on the padding
    return D + jnp.eye(b, dtype=dtype) * pad.reshape(m, b)[:, :, None]


def block_jacobi(A, block_size: int = DEFAULT_BLOCK_SIZE, *,
                 accuracy: float = DEFAULT_ACCURACY) -> BlockJacobi:
    r"""Adaptive-precision block-Jacobi preconditioner of ``A`` (module docstring).

    Args:
        A: dense ``(n, n)`` array, BCOO/BCSR matrix, lineax operator, or a matrix-free
            callable with ``n <= 4096`` (its dense form is probed).
        block_size: size ``b`` of the diagonal blocks (consecutive rows ``i b ... i b +
            b - 1``); Ginkgo's default 32.
        accuracy: the storage rounding of block ``i`` must satisfy
            ``kappa_1(D_i) u_p < accuracy`` (Ginkgo's default 0.1).

    Example:
        >>> import jax.numpy as jnp
        >>> import adaptprec as ap
        >>> A = jnp.array([[1.0, 0.999999, 0, 0], [0.999999, 1.0, 0, 0],
        ...                [0, 0, 2.0, 0.0], [0, 0, 0.0, 3.0]])
        >>> M = ap.linalg.block_jacobi(A, block_size=2)
        >>> M.storage_names()            # kappa 2e6 needs float64; kappa 1.5 fits in 2 bytes
        ['float64', 'float16']
    """
    if isinstance(block_size, bool) or not isinstance(block_size, (int, np.integer)) \
            or block_size < 1:
        raise ValueError(f"block_jacobi: block_size must be an int >= 1, got {block_size!r}")
    if not (isinstance(accuracy, (int, float)) and 0 < accuracy < 1):
        raise ValueError(f"block_jacobi: accuracy must be a float in (0, 1), got {accuracy!r}")
    op, n, dtype = _operator_of(A, "block_jacobi")
    return block_jacobi_of(op, n, dtype, block_size, accuracy)


def block_jacobi_of(op, n, dtype, block_size, accuracy) -> BlockJacobi:
    """:func:`block_jacobi` of an :class:`~adaptprec.linalg.krylov._operator.Operator`."""
    b = int(min(block_size, n))
    D = _diagonal_blocks(op, n, b, dtype)
    inv = jnp.linalg.inv(D)
    ok = jnp.all(jnp.isfinite(inv), axis=(1, 2))
    inv = jnp.where(ok[:, None, None], inv, jnp.eye(b, dtype=dtype))
    norm1 = lambda X: jnp.max(jnp.sum(jnp.abs(X), axis=-2), axis=-1)
    cond = jnp.where(ok, norm1(D) * norm1(inv), jnp.inf)
    big = jnp.max(jnp.abs(inv), axis=(1, 2))
    small = jnp.min(jnp.where(inv != 0, jnp.abs(inv), jnp.inf), axis=(1, 2))
    # formats narrower than the working dtype, then the working dtype itself (always fits)
    cands = [p for p in _CANDIDATES if p.itemsize < np.dtype(dtype).itemsize] + [np.dtype(dtype)]
    fits = [(cond * unit_roundoff(p) < accuracy) & (big <= max_value(p))
            & (small >= smallest_normal(p)) for p in cands[:-1]] + [jnp.ones_like(ok)]
    choice = jnp.argmax(jnp.stack(fits, axis=1), axis=1)
    rounded = jnp.stack([inv.astype(p).astype(dtype) for p in cands], axis=0)
    blocks = rounded[choice, jnp.arange(choice.shape[0])]
    storage = jnp.asarray([_CANDIDATES.index(p) for p in cands], jnp.int32)[choice]
    return BlockJacobi(blocks, storage, cond.astype(dtype), n)
