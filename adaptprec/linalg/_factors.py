r"""Low-precision factors of :func:`~adaptprec.linalg.solve`, solves with them, and the
condition estimate they give.

1. ``A`` is rounded once to the factor precision (after a power-of-2 scaling into range
   for float16) and ``A^T`` is factored: ``A^T[perm] = L U``, or ``A^T = A = L L^T``;
2. ``op(A)^{-1} r`` is a (transposed) triangular solve with those factors, each column of
   ``r`` scaled by its inf-norm before the cast down and scaled back after the upcast;
3. ``\kappa_\infty(op(A)) = \|op(A)\|_\infty \|op(A)^{-T}\|_1``, the 1-norm estimated by
   two Hager–Higham steps with the same solves.
"""

from __future__ import annotations

from functools import partial

import numpy as np

import jax
import jax.numpy as jnp
from jax import lax

from .._normest import norm1_estimate
from .._pytree import Module
from ..precision import max_value
from ._common import lu_solve, zero_pivot
from ._getrf import lu_factor_transposed
from ._trsv import MIN_N, Panels, panel_solve

__all__ = ["Factors", "factor_low", "chol_ok", "chol_solve", "chol_inverse_norm1", "low_one",
           "low_solver", "hh_kappa", "deferred_kappa", "norm1", "use_panels"]

#: right-hand sides up to this many are solved column by column (see low_one)
SPLIT_COLUMNS = 3
#: f16 factors: A is scaled by a power of 2 so that ||A||_inf lands at this fraction of the
#: format's largest value (Higham, Pranesh & Zounon 2019 scale into range before the cast).
F16_HEADROOM = 2.0 ** -4
#: largest factor (bytes, whole batch) for which the panel solves are used: cutting the
#: panels writes a second copy of the factor, and above ~32 MB that buffer comes fresh
#: from the OS on every call (glibc's mmap threshold), page faults included
#: (benchmarks/bench_linalg.py: a gain at n = 2048, a loss at n = 4096).
PANEL_MAX_BYTES = 32 * 2 ** 20


class Factors(Module):
    """Low-precision factors of ``A^T`` (not ``A``): LAPACK wants column-major input, and
    the column-major layout of ``A^T`` is the row-major buffer of ``A``, so factoring the
    transpose saves a transposing copy of ``A`` (here and in the fallback). Solves with
    ``A`` are then transposed solves with these factors. With ``assume_a="pos"`` ``lu``
    holds the Cholesky factor ``L`` (``A^T = A = L L^T``) and ``perm`` is None."""

    lu: jax.Array         # (m, n, n) factor compute dtype: A^T[perm] = L U, or L
    perm: jax.Array | None  # (m, n), None for Cholesky
    scale: jax.Array      # (m,) the factors are of scale * A (a power of 2; f16 range)
    cast_ok: jax.Array    # (m,) A finite after rounding to the factor precision
    factor_ok: jax.Array  # (m,) no zero / non-finite pivot (Cholesky: no breakdown)
    norminf: jax.Array    # (m,) ||A||_inf, working dtype


def chol_ok(L):
    """No Cholesky breakdown: every diagonal entry of ``L`` finite and positive."""
    d = jnp.diagonal(L, axis1=-2, axis2=-1)
    return jnp.all(jnp.isfinite(d) & (d > 0), axis=-1)


def factor_low(A, storage, compute, kind, method) -> Factors:
    """Round A once to the factor precision and factor ``A^T``.

    ``||A||_inf`` comes from one read of ``A`` in the working precision; it also decides
    whether the cast can overflow (no entry can exceed the largest row sum), so a NaN/Inf
    or too-large entry sets ``cast_ok = False`` without another pass over ``A``.
    """
    w = A.dtype
    ninf = jnp.max(jnp.sum(jnp.abs(A), axis=-1), axis=-1)
    top = max_value(storage)
    if top < 1e6:      # f16: scale into range first (bf16 and f32 have float32's range)
        target = F16_HEADROOM * top
        e = jnp.floor(jnp.log2(target / jnp.where(ninf > 0, ninf, 1.0)))
        scale = jnp.where(jnp.isfinite(e) & (ninf > 0), jnp.exp2(e), 1.0).astype(w)
        a = A * scale[:, None, None]
    else:
        scale = jnp.ones_like(ninf)
        a = A
    cast_ok = ninf * scale <= top
    if method == "blocked":
        from ._blocked_lu import blocked_lu
        lu, perm = jax.vmap(partial(blocked_lu, low=storage))(
            jnp.swapaxes(a, -1, -2).astype(compute))
        factor_ok = ~jax.vmap(zero_pivot)(lu)
        return Factors(lu, perm, scale, cast_ok, factor_ok, ninf)
    a_low = a.astype(storage)
    if np.dtype(compute) != np.dtype(storage):
        a_low = a_low.astype(compute)
    if kind == "chol":
        L = lax.linalg.cholesky(jnp.swapaxes(a_low, -1, -2), symmetrize_input=False)
        return Factors(L, None, scale, cast_ok, chol_ok(L), ninf)
    f, perm = lu_factor_transposed(a_low)          # f = lu^T: a_low's own buffer
    lu = jnp.swapaxes(f, -1, -2)
    factor_ok = ~jax.vmap(zero_pivot)(lu)
    return Factors(lu, perm, scale, cast_ok, factor_ok, ninf)


def chol_solve(L, b):
    """``(L L^T)^{-1} b``: two triangular solves."""
    y = lax.linalg.triangular_solve(L, b, left_side=True, lower=True)
    return lax.linalg.triangular_solve(L, y, left_side=True, lower=True, transpose_a=True)


def low_one(lu, perm, scale, r, w, trans_m):
    """``op(A)^{-1} r`` for one system from its low-precision factors.

    ``trans_m`` says whether the solve is transposed with respect to the factored matrix
    ``M = A^T`` (True for ``op(A) = A``). Each column of ``r`` is scaled by its inf-norm
    before the cast down so that neither overflow nor underflow in the low format can
    occur; the result is upcast, scaled back, and multiplied by the factor scaling.
    """
    s = jnp.max(jnp.abs(r), axis=0, keepdims=True)
    s = jnp.where(s > 0, s, jnp.ones_like(s))
    if isinstance(lu, Panels):          # blocked GEMV solves (CPU, large n; see _trsv)
        y = panel_solve(lu, perm, (r / s).astype(lu.diag[0].dtype), transpose=trans_m)
        return y.astype(w) * (s * scale)
    y = (r / s).astype(lu.dtype)

    def one(y):
        return chol_solve(lu, y) if perm is None else lu_solve(lu, perm, y,
                                                               transpose=trans_m)

    k = y.shape[-1]
    if 1 < k <= SPLIT_COLUMNS:
        # xTRSM with 2..~64 right-hand sides is slower than one column at a time (OpenBLAS)
        y = jnp.concatenate([one(y[:, i:i + 1]) for i in range(k)], axis=1)
    else:
        y = one(y)
    return y.astype(w) * (s * scale)


def low_solver(lu, perm, scale, w):
    """``low(R, trans)``: :func:`low_one` over a batch of factors ``(m, n, n)`` and
    right-hand sides ``R`` ``(m, n, k)``; ``trans`` as :func:`low_one`'s ``trans_m``."""
    if perm is None:
        def low(R, trans):
            return jax.vmap(lambda l, s, r: low_one(l, None, s, r, w, trans))(lu, scale, R)
    else:
        def low(R, trans):
            return jax.vmap(lambda l, p, s, r: low_one(l, p, s, r, w, trans))(
                lu, perm, scale, R)
    return low


def norm1(A):
    """||A||_1 of each matrix of a batch (only computed by consumers that need it)."""
    return jnp.max(jnp.sum(jnp.abs(A), axis=-2), axis=-1)


def chol_inverse_norm1(L, dtype):
    """``||(L L^T)^{-1}||_1`` by Hager–Higham (:func:`norm1_estimate`); ``inf`` after a
    breakdown or a non-finite estimate."""
    n = L.shape[-1]

    def mv(v):
        return chol_solve(L, v[:, None].astype(L.dtype))[:, 0].astype(dtype)

    est = norm1_estimate(mv, mv, n, dtype)     # A^{-1} is symmetric
    return jnp.where(chol_ok(L) & jnp.isfinite(est), est, jnp.asarray(jnp.inf, dtype))


def hh_kappa(low, anrm, tm, n):
    """``kappa_inf(op(A)) = ||op(A)||_inf ||op(A)^{-T}||_1`` from low-precision factors.

    The 1-norm is estimated by the first two Hager–Higham steps (LAPACK xLACN2, from
    x = e/n) plus Higham's alternating test vector: four single-column low-precision solves
    (``low(R, trans)``; multi-column xTRSM is slower, see low_one). (Starting from the
    alternating vector instead saves one solve but underestimates kappa of the 1-D Poisson
    matrix 8x; e/n finds it.)
    """
    m = anrm.shape[0]
    w = anrm.dtype

    def solve_t(v, trans):          # v: (n,) shared or (m, n) per system
        v = jnp.broadcast_to(v, (m, n))
        return low(v[..., None], trans)[..., 0]

    i = jnp.arange(n)
    e = jnp.full((n,), 1.0 / n, w)
    alt = (jnp.where(i % 2 == 0, 1.0, -1.0).astype(w)
           * (1.0 + i / max(n - 1, 1)).astype(w))      # in w also when x64 is on
    y1 = solve_t(e, not tm)
    ya = solve_t(alt, not tm)
    est = jnp.maximum(jnp.sum(jnp.abs(y1), axis=1),
                      2.0 * jnp.sum(jnp.abs(ya), axis=1) / (3.0 * n))
    xi = jnp.where(y1 >= 0, 1.0, -1.0).astype(w)
    z1 = solve_t(xi, tm)
    j = jnp.argmax(jnp.abs(z1), axis=1)
    y2 = solve_t(jax.nn.one_hot(j, n, dtype=w), not tm)
    est = jnp.maximum(est, jnp.sum(jnp.abs(y2), axis=1))
    return anrm * est


@jax.jit
def deferred_kappa(f, perm, scale, anorm):
    """The refinement path's condition estimate from kept factors (any batch shape):
    ``f`` is the transposed factor (the row-major view of LAPACK's), as
    :attr:`SolveInfo.cond_factors` holds it."""
    batch, n = anorm.shape, f.shape[-1]
    lu = jnp.swapaxes(f.reshape((-1, n, n)), -1, -2)
    p = None if perm is None else perm.reshape((-1, n))
    low = low_solver(lu, p, scale.reshape(-1), anorm.dtype)
    kappa = hh_kappa(low, anorm.reshape(-1), True, n)   # solves with A: transposed
    return jnp.where(jnp.isfinite(kappa), kappa, jnp.asarray(jnp.inf, anorm.dtype)
                     ).reshape(batch)


def use_panels(fac: Factors, refine: str) -> bool:
    """Blocked GEMV triangular solves (:mod:`._trsv`) instead of LAPACK xTRSM: LU factors
    on CPU with n >= ``MIN_N`` and at most ``PANEL_MAX_BYTES``, LU-IR (GMRES-IR keeps its
    per-vector preconditioner)."""
    return (fac.perm is not None and refine == "lu" and fac.lu.shape[-1] >= MIN_N
            and fac.lu.size * fac.lu.dtype.itemsize <= PANEL_MAX_BYTES
            and jax.default_backend() == "cpu")
