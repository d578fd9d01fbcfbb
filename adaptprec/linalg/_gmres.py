"""Flexible GMRES (right-preconditioned, one restart cycle) for GMRES-IR corrections.

FGMRES builds the Krylov basis ``V`` in the working precision and keeps the preconditioned
vectors ``Z = [M^{-1} v_0, ...]``; the correction is ``d = Z y`` with ``y`` minimising
``||beta e_1 - H y||_2``. Because the minimisation uses ``A Z`` computed in the working
precision, an *inexact* (here: low-precision LU) preconditioner only slows convergence, it
does not bias the answer (Saad 1993). Orthogonalisation is classical Gram–Schmidt applied
twice (CGS2), which is as stable as modified Gram–Schmidt and vectorises.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

__all__: list[str] = []


def fgmres(matvec, precond, r, *, restart: int, tol: float):
    """Approximately solve ``A d = r`` for one vector ``r`` of shape ``(n,)``.

    Runs at most ``restart`` Arnoldi steps and stops early when the (Givens-updated)
    residual estimate ``|g_j|`` drops below ``tol * ||r||_2``. Returns ``d``.
    """
    n = r.shape[0]
    m = restart
    dt = r.dtype
    beta = jnp.linalg.norm(r)
    safe_beta = jnp.where(beta > 0, beta, jnp.ones_like(beta))
    V = jnp.zeros((m + 1, n), dt).at[0].set(r / safe_beta)
    Z = jnp.zeros((m, n), dt)
    H = jnp.zeros((m + 1, m), dt)
    cs = jnp.zeros((m,), dt)
    sn = jnp.zeros((m,), dt)
    g = jnp.zeros((m + 1,), dt).at[0].set(beta)
    target = tol * beta

    def cond(state):
        j, _, _, _, _, _, g = state
        return (j < m) & (jnp.abs(g[j]) > target)

    def body(state):
        j, V, Z, H, cs, sn, g = state
        z = precond(V[j])
        w = matvec(z)
        h1 = V @ w
        w = w - V.T @ h1
        h2 = V @ w
        w = w - V.T @ h2
        h = h1 + h2
        hn = jnp.linalg.norm(w)
        h = h.at[j + 1].set(hn)
        V = V.at[j + 1].set(w / jnp.where(hn > 0, hn, jnp.ones_like(hn)))
        Z = Z.at[j].set(z)

        def rotate(i, h):
            t0 = cs[i] * h[i] + sn[i] * h[i + 1]
            t1 = -sn[i] * h[i] + cs[i] * h[i + 1]
            return jnp.where(i < j, h.at[i].set(t0).at[i + 1].set(t1), h)

        h = lax.fori_loop(0, m, rotate, h)
        a, b = h[j], h[j + 1]
        den = jnp.hypot(a, b)
        c = jnp.where(den > 0, a / jnp.where(den > 0, den, 1), jnp.ones_like(a))
        s = jnp.where(den > 0, b / jnp.where(den > 0, den, 1), jnp.zeros_like(b))
        h = h.at[j].set(den).at[j + 1].set(0)
        cs = cs.at[j].set(c)
        sn = sn.at[j].set(s)
        g = g.at[j + 1].set(-s * g[j]).at[j].set(c * g[j])
        H = H.at[:, j].set(h)
        return j + 1, V, Z, H, cs, sn, g

    init = (jnp.asarray(0, jnp.int32), V, Z, H, cs, sn, g)
    j, V, Z, H, cs, sn, g = lax.while_loop(cond, body, init)
    used = jnp.arange(m) < j
    R = H[:m, :m]
    R = jnp.where(used[:, None] & used[None, :], R, jnp.eye(m, dtype=dt))
    diag = jnp.diagonal(R)
    R = R + jnp.diag(jnp.where(diag == 0, jnp.ones_like(diag), jnp.zeros_like(diag)))
    rhs = jnp.where(used, g[:m], 0)
    y = lax.linalg.triangular_solve(R, rhs[:, None], left_side=True, lower=False)[:, 0]
    return Z.T @ y
