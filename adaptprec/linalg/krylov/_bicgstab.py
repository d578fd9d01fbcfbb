r"""Preconditioned BiCGStab with reliable updates (one cycle on one rung).

Van der Vorst's BiCGStab (SIAM J. Sci. Stat. Comput. 13, 1992), right-preconditioned as
in scipy's ``bicgstab``, on the correction equation ``A d = r / s``:

.. math::
    \rho_k = \hat r^T r_k,\; p_k = r_k + \tfrac{\rho_k}{\rho_{k-1}}\tfrac{\alpha}{\omega}
    (p_{k-1} - \omega v_{k-1}),\; v_k = A M p_k,\; \alpha = \rho_k / \hat r^T v_k,\;
    s = r_k - \alpha v_k,\; t = A M s,\; \omega = t^T s / t^T t,

``d += alpha M p_k + omega M s``, ``r_{k+1} = s - omega t``. Two products per iteration.

Reliable updates as for CG (Clark et al. 2010 ran both CG and BiCGStab this way; Sleijpen
and van der Vorst, "Reliable updated residuals in hybrid Bi-CG methods", Computing 56,
1996): a cycle ends when the recursive residual has dropped by ``RELIABLE_DELTA``; the
next cycle restarts the recurrence from the true residual with the same shadow residual
``r_hat`` (carried in the top dtype). A breakdown (``rho = 0`` or ``omega = 0``) ends the
cycle and the next one starts with a fresh shadow residual ``r_hat = r``.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from ..._pytree import Module
from .common import (BREAKDOWN, NONFINITE, OK, STAGNATION, CycleContext, KrylovSolver, cast,
                     dot, finite)

__all__ = ["BiCGStab"]


class _BiCGStabState(Module):
    k: jax.Array
    d: jax.Array
    r: jax.Array
    rhat: jax.Array
    p: jax.Array
    v: jax.Array
    rho: jax.Array
    alpha: jax.Array
    omega: jax.Array
    rr: jax.Array
    breakdown: jax.Array


class BiCGStab(KrylovSolver):
    """BiCGStab for a general square ``A``."""

    name = "bicgstab"

    def capped_cycle_counts(self, top, best):
        return ~top | (best > STAGNATION)

    def carry_init(self, n, dtype) -> Any:
        # the shadow residual; zero means "take the cycle's residual"
        return jnp.zeros((n,), dtype)

    def init(self, ctx: CycleContext, r, s, carry):
        w = ctx.compute
        fresh = ~jnp.any(carry != 0)
        rhat = jnp.where(fresh, r, cast(ctx, carry))
        one = jnp.asarray(1.0, w)
        zero = jnp.zeros_like(r)
        return _BiCGStabState(k=jnp.asarray(0, jnp.int32), d=zero, r=r, rhat=rhat, p=zero,
                              v=zero, rho=one, alpha=one, omega=one, rr=dot(ctx, r, r),
                              breakdown=jnp.asarray(OK, jnp.int32))

    def step(self, ctx, st: _BiCGStabState) -> _BiCGStabState:
        M = (lambda y: ctx.precond(y)) if ctx.preconditioned else (lambda y: y)
        rho = dot(ctx, st.rhat, st.r)
        beta = (rho / st.rho) * (st.alpha / st.omega)
        p = st.r + cast(ctx, beta) * (st.p - cast(ctx, st.omega) * st.v)
        phat = M(p)
        v = ctx.matvec(phat)
        rv = dot(ctx, st.rhat, v)
        alpha = rho / jnp.where(rv != 0, rv, 1.0)
        s_vec = st.r - cast(ctx, alpha) * v
        shat = M(s_vec)
        t = ctx.matvec(shat)
        tt = dot(ctx, t, t)
        omega = jnp.where(tt > 0, dot(ctx, t, s_vec) / jnp.where(tt > 0, tt, 1.0), 0.0)
        d = st.d + cast(ctx, alpha) * phat + cast(ctx, omega) * shat
        r = s_vec - cast(ctx, omega) * t
        rr = dot(ctx, r, r)
        done_in_s = ~(dot(ctx, s_vec, s_vec) > 0)       # s = 0: alpha alone solved it
        broke = ((rho == 0) | (rv == 0) | (omega == 0)) & ~done_in_s
        nonfinite = ~finite(rho, alpha, omega, rr)
        code = jnp.where(nonfinite, NONFINITE, jnp.where(broke, BREAKDOWN, OK))
        bad = code != OK
        keep = lambda new, old: jnp.where(bad, old, new)
        return _BiCGStabState(k=st.k + 1, d=keep(d, st.d), r=keep(r, st.r), rhat=st.rhat,
                              p=p, v=v, rho=rho, alpha=alpha, omega=omega, rr=keep(rr, st.rr),
                              breakdown=code.astype(jnp.int32))

    def residual(self, st: _BiCGStabState):
        return jnp.sqrt(st.rr)

    def terminate(self, ctx, st: _BiCGStabState):
        return (st.rr <= ctx.target * ctx.target) | (st.breakdown != OK)

    def postprocess(self, ctx, st: _BiCGStabState, s, carry):
        restart = st.breakdown != OK
        rhat = st.rhat.astype(ctx.top)
        return st.d, jnp.where(restart, jnp.zeros_like(rhat), rhat), st.breakdown
