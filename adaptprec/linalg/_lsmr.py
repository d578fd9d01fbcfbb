"""LSMR (Fong & Saunders 2011) in JAX: a port of ``scipy.sparse.linalg.lsmr`` (same
recurrences, the same stopping tests ``atol``/``btol``/``conlim``/``maxiter`` and ``istop``
codes) to a ``lax.while_loop`` over a matrix-free operator (``matvec``, ``rmatvec``), so it
runs under ``jit``, ``vmap`` and inside a solver's loop (``tr_solver="lsmr"`` of the
least-squares solvers, :mod:`adaptprec.nlsq.trf`).

Example:
    >>> import jax.numpy as jnp
    >>> from adaptprec.linalg._lsmr import lsmr
    >>> A = jnp.array([[2.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    >>> x, istop, itn = lsmr(lambda v: A @ v, lambda u: A.T @ u, jnp.array([2.0, 1.0, 2.0]),
    ...                      2, atol=1e-12, btol=1e-12)
    >>> [round(float(v), 8) for v in x], int(istop) in (1, 2, 4, 5)
    ([1.0, 1.0], True)
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

__all__ = ["lsmr"]


def _sym_ortho(a, b):
    """Stable Givens rotation ``(c, s, r)`` with ``[c s; -s c] [a; b] = [r; 0]``."""
    aa, ab = jnp.abs(a), jnp.abs(b)
    big_b = ab > aa
    safe_b = jnp.where(b == 0, 1.0, b)
    safe_a = jnp.where(a == 0, 1.0, a)
    tau_b = a / safe_b
    s_b = jnp.sign(b) / jnp.sqrt(1 + tau_b * tau_b)
    c_b = s_b * tau_b
    r_b = b / jnp.where(s_b == 0, 1.0, s_b)
    tau_a = b / safe_a
    c_a = jnp.sign(a) / jnp.sqrt(1 + tau_a * tau_a)
    s_a = c_a * tau_a
    r_a = a / jnp.where(c_a == 0, 1.0, c_a)
    c = jnp.where(big_b, c_b, c_a)
    s = jnp.where(big_b, s_b, s_a)
    r = jnp.where(big_b, r_b, r_a)
    c = jnp.where(b == 0, jnp.sign(a), jnp.where(a == 0, 0.0, c))
    s = jnp.where(b == 0, 0.0, jnp.where(a == 0, jnp.sign(b), s))
    r = jnp.where(b == 0, aa, jnp.where(a == 0, ab, r))
    return c, s, r


class _S(NamedTuple):
    itn: jax.Array
    istop: jax.Array
    x: jax.Array
    u: jax.Array
    v: jax.Array
    alpha: jax.Array
    h: jax.Array
    hbar: jax.Array
    zetabar: jax.Array
    alphabar: jax.Array
    rho: jax.Array
    rhobar: jax.Array
    cbar: jax.Array
    sbar: jax.Array
    betadd: jax.Array
    betad: jax.Array
    rhodold: jax.Array
    tautildeold: jax.Array
    thetatilde: jax.Array
    zeta: jax.Array
    d: jax.Array
    normA2: jax.Array
    maxrbar: jax.Array
    minrbar: jax.Array


def lsmr(matvec, rmatvec, b, n: int, *, damp=0.0, atol=1e-6, btol=1e-6, conlim=1e8,
         maxiter=None):
    """``min ||A x - b||^2 + damp^2 ||x||^2`` by LSMR from ``x = 0`` (scipy's ``lsmr``).

    ``matvec(v) = A v`` and ``rmatvec(u) = A^T u`` for an ``(m, n)`` operator; ``maxiter``
    defaults to ``min(m, n)``. Returns ``(x, istop, itn)`` with scipy's ``istop`` codes
    (0: x = 0 is exact, 1/2: converged on ``btol``/``atol``, 3: ``conlim``, 4-6: the same
    at machine precision, 7: ``maxiter``).
    """
    b = jnp.asarray(b)
    dt = b.dtype
    m = b.shape[0]
    maxiter = min(m, n) if maxiter is None else int(maxiter)
    one = jnp.ones((), dt)
    zero = jnp.zeros((), dt)
    damp = jnp.asarray(damp, dt)
    normb = jnp.linalg.norm(b)
    beta = normb
    u = jnp.where(beta > 0, b / jnp.where(beta > 0, beta, 1.0), b)
    v = jnp.where(beta > 0, rmatvec(u), jnp.zeros((n,), dt))
    alpha = jnp.linalg.norm(v)
    v = jnp.where(alpha > 0, v / jnp.where(alpha > 0, alpha, 1.0), v)
    ctol = 1.0 / conlim if conlim > 0 else 0.0
    trivial = (alpha * beta == 0) | (normb == 0)
    st = _S(itn=jnp.zeros((), jnp.int32), istop=jnp.zeros((), jnp.int32),
            x=jnp.zeros((n,), dt), u=u, v=v, alpha=alpha, h=v, hbar=jnp.zeros((n,), dt),
            zetabar=alpha * beta, alphabar=alpha, rho=one, rhobar=one, cbar=one,
            sbar=zero, betadd=beta, betad=zero, rhodold=one, tautildeold=zero,
            thetatilde=zero, zeta=zero, d=zero, normA2=alpha * alpha, maxrbar=zero,
            minrbar=jnp.asarray(1e100, dt))

    def cond(s):
        return (~trivial) & (s.istop == 0) & (s.itn < maxiter)

    def body(s):
        itn = s.itn + 1
        u = matvec(s.v) - s.alpha * s.u
        beta = jnp.linalg.norm(u)
        pos = beta > 0
        u = jnp.where(pos, u / jnp.where(pos, beta, 1.0), u)
        v_new = rmatvec(u) - beta * s.v
        alpha_new = jnp.linalg.norm(v_new)
        v_new = jnp.where(alpha_new > 0, v_new / jnp.where(alpha_new > 0, alpha_new, 1.0),
                          v_new)
        v = jnp.where(pos, v_new, s.v)
        alpha = jnp.where(pos, alpha_new, s.alpha)

        chat, shat, alphahat = _sym_ortho(s.alphabar, damp)
        rhoold = s.rho
        c, sn, rho = _sym_ortho(alphahat, beta)
        thetanew = sn * alpha
        alphabar = c * alpha
        rhobarold = s.rhobar
        zetaold = s.zeta
        thetabar = s.sbar * rho
        rhotemp = s.cbar * rho
        cbar, sbar, rhobar = _sym_ortho(s.cbar * rho, thetanew)
        zeta = cbar * s.zetabar
        zetabar = -sbar * s.zetabar
        hbar = s.h - s.hbar * (thetabar * rho / (rhoold * rhobarold))
        x = s.x + (zeta / (rho * rhobar)) * hbar
        h = v - s.h * (thetanew / rho)

        betaacute = chat * s.betadd
        betacheck = -shat * s.betadd
        betahat = c * betaacute
        betadd = -sn * betaacute
        thetatildeold = s.thetatilde
        ctildeold, stildeold, rhotildeold = _sym_ortho(s.rhodold, thetabar)
        thetatilde = stildeold * rhobar
        rhodold = ctildeold * rhobar
        betad = -stildeold * s.betad + ctildeold * betahat
        tautildeold = (zetaold - thetatildeold * s.tautildeold) / rhotildeold
        taud = (zeta - thetatilde * tautildeold) / rhodold
        d = s.d + betacheck * betacheck
        normr = jnp.sqrt(d + (betad - taud) ** 2 + betadd * betadd)
        normA2 = s.normA2 + beta * beta
        normA = jnp.sqrt(normA2)
        normA2 = normA2 + alpha * alpha
        maxrbar = jnp.maximum(s.maxrbar, rhobarold)
        minrbar = jnp.where(itn > 1, jnp.minimum(s.minrbar, rhobarold), s.minrbar)
        condA = jnp.maximum(maxrbar, rhotemp) / jnp.minimum(minrbar, rhotemp)
        normar = jnp.abs(zetabar)
        normx = jnp.linalg.norm(x)
        test1 = normr / normb
        den = normA * normr
        test2 = jnp.where(den != 0, normar / jnp.where(den != 0, den, 1.0), jnp.inf)
        test3 = 1.0 / condA
        t1 = test1 / (1 + normA * normx / normb)
        rtol = btol + atol * normA * normx / normb
        istop = jnp.zeros((), jnp.int32)
        for cnd, code in ((itn >= maxiter, 7), (1 + test3 <= 1, 6), (1 + test2 <= 1, 5),
                          (1 + t1 <= 1, 4), (test3 <= ctol, 3), (test2 <= atol, 2),
                          (test1 <= rtol, 1)):
            istop = jnp.where(cnd, code, istop)
        return _S(itn=itn, istop=istop, x=x, u=u, v=v, alpha=alpha, h=h, hbar=hbar,
                  zetabar=zetabar, alphabar=alphabar, rho=rho, rhobar=rhobar, cbar=cbar,
                  sbar=sbar, betadd=betadd, betad=betad, rhodold=rhodold,
                  tautildeold=tautildeold, thetatilde=thetatilde, zeta=zeta, d=d,
                  normA2=normA2, maxrbar=maxrbar, minrbar=minrbar)

    out = jax.lax.while_loop(cond, body, st)
    return out.x, out.istop, out.itn
