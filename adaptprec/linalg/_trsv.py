r"""Blocked triangular solves with few right-hand sides from packed LU factors.

LAPACK ``xTRSM`` as called by ``lax.linalg.triangular_solve`` on CPU packs the triangular
matrix on every call; with one right-hand side it reads the factor at a few GB/s (measured:
~7.5 ms per triangular solve at n = 4096 in float32, against ~1.3 ms for a memory-bound
pass over the 32 MB triangle). Iterative refinement does two such solves per step, so
they dominate the refinement's cost. Here the factor is cut once into row panels and each
solve is a sequence of matrix-vector products (XLA's GEMV, memory-bound) plus small
``nb x nb`` triangular solves on the diagonal blocks.

With ``F = lu^T`` (``lu`` packed as ``lax.linalg.lu`` returns it for ``P M = L U``, so
``tril(F) = U^T`` and ``triu(F, 1) + I = L^T``), block row ``i`` of ``F`` (rows
``i0:i1``) is cut into ``lower[i] = F[i0:i1, :i0]``, ``diag[i] = F[i0:i1, i0:i1]`` and
``upper[i] = F[i0:i1, i1:]``. Both kinds of solve use the same panels:

* ``M^T x = b``: forward substitution with ``U^T`` (row-oriented, ``lower`` panels),
  backward with ``L^T`` (row-oriented, ``upper`` panels), then ``P^T``;
* ``M x = b``: ``P``, forward with ``L`` (column-oriented, ``upper[j]^T``), backward
  with ``U`` (column-oriented, ``lower[j]^T``).

Cutting the panels copies the factor once (one pass); the solves then read half of it
each.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from .._pytree import Module
from ._common import inv_perm

__all__ = ["Panels", "make_panels", "panel_solve", "BLOCK", "MIN_N"]

#: block size of the panels (rows); the diagonal blocks go to LAPACK xTRSM, whose cost with
#: one right-hand side grows with the square of the block (it packs the triangle on every
#: call): at n = 2048, 128 rows take ~0.6 ms of triangular solves per solve pair against
#: ~1.2 ms for 256, with the same bytes of GEMV (benchmarks/RESULTS.md)
BLOCK = 128
#: smallest n for the panel solves (measured gain from n = 512 on; see _factors.use_panels)
MIN_N = 512


class Panels(Module):
    """Row panels of ``F = lu^T`` (leading batch axes allowed on every leaf)."""

    lower: tuple   # lower[i] = F[i0:i1, :i0]   (empty for i = 0)
    diag: tuple    # diag[i]  = F[i0:i1, i0:i1]
    upper: tuple   # upper[i] = F[i0:i1, i1:]   (empty for the last block)


def _bounds(n, nb):
    return [(i0, min(n, i0 + nb)) for i0 in range(0, n, nb)]


def make_panels(f, nb: int = BLOCK) -> Panels:
    """Cut ``f`` (``(..., n, n)``, ``F = lu^T``) into :class:`Panels`."""
    n = f.shape[-1]
    b = _bounds(n, nb)
    return Panels(tuple(_materialised(f[..., i0:i1, :i0]) for i0, i1 in b),
                  tuple(_materialised(f[..., i0:i1, i0:i1]) for i0, i1 in b),
                  tuple(_materialised(f[..., i0:i1, i1:]) for i0, i1 in b))


def _materialised(x):
    """``x`` unchanged (NaN stays NaN) through a select, so that each panel is one buffer.

    A plain slice is "cheap" to XLA:CPU's fusion, which copies it into every consumer: the
    solve of ``x_0`` (outside the refinement loop, its dots on a bitcast view) and the loop
    state each got their own copy of all panels, a second 14 MB cut of the factor at
    n = 2048 (and its page faults) on every call. A select is not duplicated
    (see benchmarks/RESULTS.md)."""
    return jnp.where(jnp.isnan(x), jnp.nan, x)


def _tri(d, y, *, lower, transpose_a=False, unit):
    return lax.linalg.triangular_solve(d, y, left_side=True, lower=lower,
                                       transpose_a=transpose_a, unit_diagonal=unit)


def _solve_mt(p: Panels, y):
    """``M^T x = y`` without the permutation: ``x = L^{-T} U^{-T} y``."""
    b = [(i0, i0 + d.shape[-1]) for i0, d in zip(_starts(p), p.diag)]
    z = []
    for (i0, i1), lo, d in zip(b, p.lower, p.diag):          # U^T z = y (forward)
        rhs = y[i0:i1]
        if i0:
            rhs = rhs - lo @ jnp.concatenate(z)
        z.append(_tri(d, rhs, lower=True, unit=False))
    w = [None] * len(b)
    for i in reversed(range(len(b))):                         # L^T w = z (backward)
        rhs = z[i]
        if i < len(b) - 1:
            rhs = rhs - p.upper[i] @ jnp.concatenate(w[i + 1:])
        w[i] = _tri(p.diag[i], rhs, lower=False, unit=True)
    return jnp.concatenate(w)


def _solve_m(p: Panels, y):
    """``M x = y`` with ``y`` already permuted: ``x = U^{-1} L^{-1} y``."""
    b = [(i0, i0 + d.shape[-1]) for i0, d in zip(_starts(p), p.diag)]
    nblk = len(b)
    rest = y
    z = []
    for j, (j0, j1) in enumerate(b):                          # L z = y (forward, by columns)
        zj = _tri(p.diag[j], rest[:j1 - j0], lower=False, transpose_a=True, unit=True)
        z.append(zj)
        rest = rest[j1 - j0:]
        if j < nblk - 1:
            rest = rest - p.upper[j].T @ zj
    x = [None] * nblk
    rest = jnp.concatenate(z)
    for j in reversed(range(nblk)):                           # U x = z (backward, by columns)
        j0, j1 = b[j]
        xj = _tri(p.diag[j], rest[j0:j1], lower=True, transpose_a=True, unit=False)
        x[j] = xj
        rest = rest[:j0]
        if j0:
            rest = rest - p.lower[j].T @ xj
    return jnp.concatenate(x)


def _starts(p: Panels):
    out, i0 = [], 0
    for d in p.diag:
        out.append(i0)
        i0 += d.shape[-1]
    return out


def panel_solve(p: Panels, perm, y, *, transpose: bool):
    """One system: ``lu_solve(lu, perm, y, transpose=transpose)`` from the panels of
    ``F = lu^T`` (``y``: ``(n, k)``)."""
    if transpose:
        x = _solve_mt(p, y)
        return x[inv_perm(perm)]
    return _solve_m(p, y[perm])
