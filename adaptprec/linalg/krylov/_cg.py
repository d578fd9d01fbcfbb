r"""Preconditioned conjugate gradients with reliable updates (one cycle on one rung).

Within a cycle, on the correction equation ``A d = r / s`` (``common.py``), with ``z = M r``:

.. math::
    \alpha_k = \frac{r_k^T z_k}{p_k^T A p_k}, \quad d_{k+1} = d_k + \alpha_k p_k, \quad
    r_{k+1} = r_k - \alpha_k A p_k, \quad
    p_{k+1} = z_{k+1} + \frac{r_{k+1}^T z_{k+1}}{r_k^T z_k}\, p_k .

Across cycles the search direction is kept (Clark et al. 2010, QUDA's CG): the loop
replaces the recursive residual by the true one, and the next cycle continues with
``beta = r^T z / (r_k^T z_k)`` and the last direction ``p_k``, both carried in the top
dtype, instead of restarting from ``p = z`` (a restart loses the superlinear convergence
CG has built up). Dots accumulate in the top dtype.

``p^T A p <= 0`` (or a non-positive ``r^T z``) ends the cycle with ``INDEFINITE``: on a
lower rung the loop climbs, on the top rung the solve ends as ``NOT_POSITIVE_DEFINITE``.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from ..._pytree import Module
from .common import (INDEFINITE, NONFINITE, OK, RESIDUAL_GAP, CycleContext, KrylovSolver,
                     cast, dot, finite)

__all__ = ["CG"]


class _CGState(Module):
    k: jax.Array
    d: jax.Array          # correction (rung dtype)
    r: jax.Array          # recursive residual (rung dtype)
    z: jax.Array | None   # M r (None without a preconditioner: z is r)
    p: jax.Array          # the direction of the last step (the carry's, before the first)
    rz: jax.Array         # r^T z (compute dtype)
    rz_old: jax.Array     # r^T z when p was formed
    rr: jax.Array         # r^T r
    energy: jax.Array     # sum_k alpha_k r_k^T z_k / 2: the energy decrease CG claims
    breakdown: jax.Array


class CG(KrylovSolver):
    """Conjugate gradients (symmetric positive definite ``A`` and ``M``)."""

    name = "cg"

    def capped_cycle_counts(self, top, best):
        return ~top

    def claim(self, st):
        return st.energy

    def judge(self, d, r_old, r_new, s, claim):
        # CG minimises the energy f(x) = x^T A x / 2 - b^T x. A step d lowers it by
        # d^T (r_old + r_new) / 2 (A d = r_old - r_new), computed here without the
        # cancellation of |f|; the rung claims s^2 sum_k alpha_k r_k^T z_k / 2
        drop = 0.5 * jnp.vdot(d, r_old + r_new)
        return drop > 0, drop >= s * s * claim / RESIDUAL_GAP

    def carry_init(self, n, dtype) -> Any:
        # (the last direction, r^T z when it was formed): beta = 0 in the first cycle
        return jnp.zeros((n,), dtype), jnp.asarray(jnp.inf, dtype)

    def init(self, ctx: CycleContext, r, s, carry):
        p_prev, rz_prev = carry
        z = ctx.precond(r) if ctx.preconditioned else None
        rz = dot(ctx, r, z if ctx.preconditioned else r)
        rr = dot(ctx, r, r) if ctx.preconditioned else rz
        # this cycle's units are 1 / s of the top dtype's: p_prev / s, rz_prev / s^2
        p = cast(ctx, p_prev / s)
        rz_old = (rz_prev / (s * s)).astype(ctx.compute)
        return _CGState(k=jnp.asarray(0, jnp.int32), d=jnp.zeros_like(r), r=r, z=z, p=p,
                        rz=rz, rz_old=rz_old, rr=rr, energy=jnp.zeros_like(rz),
                        breakdown=jnp.asarray(OK, jnp.int32))

    def step(self, ctx, st: _CGState) -> _CGState:
        z = st.z if ctx.preconditioned else st.r
        beta = jnp.where(jnp.isfinite(st.rz_old) & (st.rz_old > 0), st.rz / st.rz_old, 0.0)
        p = z + cast(ctx, beta) * st.p
        q = ctx.matvec(p)
        pq = dot(ctx, p, q)
        bad = ~(pq > 0) | ~(st.rz > 0)
        alpha = jnp.where(bad, 0.0, st.rz / jnp.where(bad, 1.0, pq))
        a = cast(ctx, alpha)
        d = st.d + a * p
        r = st.r - a * q
        z = ctx.precond(r) if ctx.preconditioned else None
        rz = dot(ctx, r, z if ctx.preconditioned else r)
        rr = dot(ctx, r, r) if ctx.preconditioned else rz
        nonfinite = ~finite(pq, rz, rr)
        code = jnp.where(nonfinite, NONFINITE, jnp.where(bad, INDEFINITE, OK))
        return _CGState(k=st.k + 1, d=d, r=r, z=z, p=p, rz=rz, rz_old=st.rz, rr=rr,
                        energy=st.energy + 0.5 * alpha * st.rz,
                        breakdown=code.astype(jnp.int32))

    def residual(self, st: _CGState):
        return jnp.sqrt(st.rr)

    def terminate(self, ctx, st: _CGState):
        return (st.rr <= ctx.target * ctx.target) | (st.breakdown != OK)

    def postprocess(self, ctx, st: _CGState, s, carry):
        w = ctx.top
        keep = (st.breakdown == OK) & (st.k > 0)
        p_prev = jnp.where(keep, st.p.astype(w) * s, jnp.zeros_like(carry[0]))
        rz_prev = jnp.where(keep, st.rz_old.astype(w) * s * s, jnp.inf).astype(w)
        return st.d, (p_prev, rz_prev), st.breakdown
