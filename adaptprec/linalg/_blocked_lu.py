r"""Blocked LU with half-precision trailing updates (the tensor-core factorization).

Right-looking blocked LU with partial pivoting, as in Haidar, Tomov, Dongarra & Higham
("Harnessing GPU tensor cores for fast FP16 arithmetic to speed up mixed-precision
iterative refinement solvers", SC18, the "FP16-TC" variant): for each block column

1. factor the panel ``A[k:, k:k+nb]`` in float32 (``lax.linalg.lu`` on a tall matrix);
2. apply its row interchanges to the rest of the rows;
3. ``U12 = L11^{-1} A12`` (float32 triangular solve);
4. ``A22 -= L21 @ U12`` with ``L21`` and ``U12`` rounded to the half format (bf16/f16) and
   the products accumulated in float32 (``preferred_element_type``) — the O(n^3) part, which
   tensor cores run at many times the float32 (and ~15x the float64) rate.

The factors are stored in float32; their backward error is of the order of the half
format's unit roundoff, which is what GMRES-IR (Carson & Higham 2017, 2018) tolerates.
On CPU XLA upcasts half-precision GEMMs and the Python-level blocking cannot beat LAPACK's
``sgetrf``, so :func:`adaptprec.linalg.solve` uses this path only on accelerators (see
``benchmarks/RESULTS.md`` for the CPU measurement).
"""

from __future__ import annotations

import math

import numpy as np

import jax.numpy as jnp
from jax import lax

__all__ = ["blocked_lu", "default_block"]


def default_block(n: int) -> int:
    """Block size: 256 for large matrices, smaller (>= 16) so small ones still block.

    Example:
        >>> from adaptprec.linalg._blocked_lu import default_block
        >>> default_block(32), default_block(4096)
        (16, 256)
    """
    return int(min(256, max(16, 2 ** round(math.log2(max(n, 1) / 8)))))


def blocked_lu(a, *, low, block: int | None = None):
    """Factor one square float32 matrix ``a[perm] = L U`` with low-precision GEMM updates.

    Args:
        a: ``(n, n)`` float32 (or wider) matrix.
        low: dtype of the GEMM inputs of the trailing updates (``jnp.bfloat16``,
            ``jnp.float16``; ``a.dtype`` gives a plain blocked LU).
        block: panel width (default :func:`default_block`).

    Returns:
        ``(lu, perm)``: packed unit-lower ``L`` and upper ``U`` in ``a``'s dtype, and the
        row permutation (``int32``), as ``lax.linalg.lu`` returns them.

    Example:
        >>> import numpy as np, jax.numpy as jnp
        >>> from adaptprec.linalg._blocked_lu import blocked_lu
        >>> a = jnp.asarray(np.random.default_rng(0).standard_normal((40, 40)), jnp.float32)
        >>> lu, perm = blocked_lu(a, low=jnp.bfloat16, block=16)
        >>> L = jnp.tril(lu, -1) + jnp.eye(40); U = jnp.triu(lu)
        >>> err = float(jnp.abs(a[perm] - L @ U).max() / jnp.abs(a).max())
        >>> 1e-5 < err < 0.05          # bf16-level, not float32-level, backward error
        True
    """
    n = a.shape[-1]
    nb = default_block(n) if block is None else int(block)
    acc = a.dtype
    low = np.dtype(low)
    perm = jnp.arange(n, dtype=jnp.int32)
    for k0 in range(0, n, nb):
        k1 = min(k0 + nb, n)
        w = k1 - k0
        plu, _, pperm = lax.linalg.lu(a[k0:, k0:k1])
        rows = a[k0:][pperm]
        perm = perm.at[k0:].set(perm[k0:][pperm])
        if k1 < n:
            u12 = lax.linalg.triangular_solve(plu[:w], rows[:w, k1:], left_side=True,
                                              lower=True, unit_diagonal=True)
            upd = jnp.matmul(plu[w:].astype(low), u12.astype(low),
                             preferred_element_type=acc)
            a22 = rows[w:, k1:] - upd.astype(acc)
            right = jnp.concatenate([u12, a22], axis=0)
            rows = jnp.concatenate([rows[:, :k0], plu, right], axis=1)
        else:
            rows = jnp.concatenate([rows[:, :k0], plu], axis=1)
        a = rows if k0 == 0 else jnp.concatenate([a[:k0], rows], axis=0)
    return a, perm
