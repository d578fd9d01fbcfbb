r"""Restarted, right-preconditioned GMRES (one restart cycle on one rung).

A cycle is one GMRES(m) cycle on the correction equation ``A d = r / s``: Arnoldi on
``A M`` from ``v_0 = r / ||r||`` with classical Gram–Schmidt applied twice (CGS2, as
stable as modified Gram–Schmidt and two matrix-vector passes over the basis),
Givens rotations on the Hessenberg matrix, and ``d = M V_k y`` with
``y = argmin || beta e_1 - H_k y ||``. The basis lives in the rung's dtype, ``H`` and the
rotations in the top dtype.

The restart is the reliable update: the loop recomputes the true residual in the top
dtype between cycles, which makes this GMRES-based iterative refinement with a
low-precision inner GMRES (Lindquist, Luszczek and Dongarra, "Accelerating restarted
GMRES with mixed precision arithmetic", IEEE TPDS 33(4), 2022). The cycle ends after
``restart`` steps, when the rotated residual estimate reaches the cycle's target, or on a
"lucky" breakdown (``h_{j+1,j} = 0``: the Krylov space holds the correction).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from ..._pytree import Module, field
from .common import NONFINITE, OK, RESIDUAL_GAP, CycleContext, KrylovSolver, cast, finite

__all__ = ["GMRES", "DEFAULT_RESTART"]

#: scipy.sparse.linalg.gmres's default ``restart`` (and lineax's GMRES)
DEFAULT_RESTART = 20


class _GMRESState(Module):
    k: jax.Array
    V: jax.Array          # (m + 1, n) basis, rung dtype
    H: jax.Array          # (m + 1, m) rotated Hessenberg (upper triangular part), top dtype
    cs: jax.Array
    sn: jax.Array
    g: jax.Array          # (m + 1,) rotated right-hand side beta e_1
    lucky: jax.Array      # h_{j+1,j} = 0: the space holds the solution
    breakdown: jax.Array


class GMRES(KrylovSolver):
    """GMRES(``restart``) for a general square ``A``."""

    restart: int = field(static=True, default=DEFAULT_RESTART)
    name = "gmres"
    reliable_delta = 0.0

    def judge(self, d, r_old, r_new, s, claim):
        # a minimal-residual cycle cannot raise the residual: only the rung's rounding can
        rn = jnp.linalg.norm(r_new)
        return rn < jnp.linalg.norm(r_old), rn <= RESIDUAL_GAP * s * claim

    def cycle_length(self) -> int:
        return self.restart

    def carry_init(self, n, dtype) -> Any:
        return ()

    def init(self, ctx: CycleContext, r, s, carry):
        m, n = self.restart, r.shape[0]
        w = ctx.compute
        beta = jnp.sqrt(jnp.dot(r, r, preferred_element_type=w))
        v0 = cast(ctx, r.astype(w) / jnp.where(beta > 0, beta, 1.0))
        V = jnp.zeros((m + 1, n), ctx.dtype).at[0].set(v0)
        return _GMRESState(
            k=jnp.asarray(0, jnp.int32), V=V, H=jnp.zeros((m + 1, m), w),
            cs=jnp.zeros((m,), w), sn=jnp.zeros((m,), w),
            g=jnp.zeros((m + 1,), w).at[0].set(beta), lucky=jnp.asarray(False),
            breakdown=jnp.asarray(OK, jnp.int32))

    def _orthogonalize(self, ctx, V, w_vec):
        """CGS2: ``w - V (V^T w)`` twice; returns the new vector and the coefficients."""
        acc = ctx.compute
        h = jnp.zeros((V.shape[0],), acc)
        for _ in range(2):
            c = jnp.dot(V, w_vec, preferred_element_type=acc)
            w_vec = (w_vec.astype(acc) - jnp.dot(cast(ctx, c), V, preferred_element_type=acc)
                     ).astype(ctx.dtype)
            h = h + c
        return w_vec, h

    def step(self, ctx, st: _GMRESState) -> _GMRESState:
        j = st.k
        acc = ctx.compute
        u = ctx.precond(st.V[j]) if ctx.preconditioned else st.V[j]
        w_vec, h = self._orthogonalize(ctx, st.V, ctx.matvec(u))
        hn = jnp.sqrt(jnp.dot(w_vec, w_vec, preferred_element_type=acc))
        h = h.at[j + 1].set(hn)
        # the new direction is rounding noise of the rung: the space holds the correction
        lucky = ~(hn > jnp.finfo(ctx.dtype).eps * jnp.linalg.norm(h))
        V = st.V.at[j + 1].set(cast(ctx, w_vec.astype(acc) / jnp.where(lucky, 1.0, hn)))

        def rotate(i, h):
            t0 = st.cs[i] * h[i] + st.sn[i] * h[i + 1]
            t1 = -st.sn[i] * h[i] + st.cs[i] * h[i + 1]
            return jnp.where(i < j, h.at[i].set(t0).at[i + 1].set(t1), h)

        h = lax.fori_loop(0, self.restart, rotate, h)
        a, b = h[j], h[j + 1]
        den = jnp.hypot(a, b)
        safe = jnp.where(den > 0, den, 1.0)
        c = jnp.where(den > 0, a / safe, 1.0)
        sgn = jnp.where(den > 0, b / safe, 0.0)
        h = h.at[j].set(den).at[j + 1].set(0.0)
        g = st.g.at[j + 1].set(-sgn * st.g[j]).at[j].set(c * st.g[j])
        code = jnp.where(finite(h, g), OK, NONFINITE).astype(jnp.int32)
        return _GMRESState(k=j + 1, V=V, H=st.H.at[:, j].set(h), cs=st.cs.at[j].set(c),
                           sn=st.sn.at[j].set(sgn), g=g, lucky=lucky, breakdown=code)

    def residual(self, st: _GMRESState):
        return jnp.abs(st.g[st.k])

    def terminate(self, ctx, st: _GMRESState):
        return (jnp.abs(st.g[st.k]) <= ctx.target) | st.lucky | (st.breakdown != OK)

    def postprocess(self, ctx, st: _GMRESState, s, carry):
        m = self.restart
        acc = ctx.compute
        used = jnp.arange(m) < st.k
        R = jnp.where(used[:, None] & used[None, :], st.H[:m, :m], jnp.eye(m, dtype=acc))
        diag = jnp.diagonal(R)
        R = R + jnp.diag(jnp.where(diag == 0, 1.0, 0.0).astype(acc))
        rhs = jnp.where(used, st.g[:m], 0.0)
        y = jax.scipy.linalg.solve_triangular(R, rhs, lower=False)
        y = jnp.where(used & (st.breakdown == OK), y, 0.0)
        u = cast(ctx, jnp.dot(cast(ctx, y), st.V[:m], preferred_element_type=acc))
        d = ctx.precond(u) if ctx.preconditioned else u
        return d, carry, st.breakdown
