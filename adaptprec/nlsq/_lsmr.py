"""``tr_solver="lsmr"``: LSMR (Fong & Saunders 2011) in JAX, scipy's ``tr_options``, and
the 2-D trust-region subproblem of scipy's ``trf``/``dogbox`` lsmr variants.

:func:`lsmr` is a port of ``scipy.sparse.linalg.lsmr`` (same recurrences, same stopping
tests ``atol``/``btol``/``conlim``/``maxiter``, same ``istop`` codes) to a
``lax.while_loop`` over a matrix-free operator (``matvec``, ``rmatvec`` closures), so it
runs under ``jit``, ``vmap`` and inside the solver's loop.

How the trust-region methods use it (as scipy): ``trf`` solves the regularised
least-squares problem ``min ||[J_h; diag(diag_h + reg)^(1/2)] p - [f; 0]||`` (plus the
user's ``damp``) by LSMR, then minimises the quadratic model over the 2-D subspace
spanned by the scaled gradient and that LSMR direction (:func:`solve_trust_region_2d`);
``dogbox`` takes LSMR's Gauss-Newton step over the free variables for its dogleg.

The operator LSMR iterates on is the factored model the solver's loop keeps: ``R``
(``R^T R = J^T J``) and ``qtf`` (``R^T qtf = J^T f``), which define the same
least-squares problem as ``(J, f)``. The step is therefore scipy's lsmr step, but the
Jacobian is still formed and QR-factored by the loop: ``tr_solver="lsmr"`` gives scipy's
iterates, not scipy's memory saving for very large sparse problems (for those, use
``linear_solver="normal"``).

Example:
    >>> import jax.numpy as jnp
    >>> from adaptprec.nlsq._lsmr import lsmr
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
import numpy as np

__all__ = ["lsmr", "solve_trust_region_2d", "LSMR_DEFAULTS", "check_tr_options"]

#: scipy's ``lsmr`` defaults (``maxiter=None`` means ``min(m, n)``).
LSMR_DEFAULTS = {"damp": 0.0, "atol": 1e-6, "btol": 1e-6, "conlim": 1e8, "maxiter": None}


def check_tr_options(tr_options, method: str):
    """scipy's ``tr_options`` for ``tr_solver="lsmr"`` as a hashable, sorted tuple of
    ``(key, value)``: ``regularize`` (``trf`` only; dropped with a warning for
    ``dogbox`` as scipy does) and ``lsmr``'s ``damp``, ``atol``, ``btol``, ``conlim``,
    ``maxiter``. An unknown key raises ``TypeError`` (scipy's ``lsmr`` does);
    ``show=True`` (printing) and ``x0`` are not offered.

    Example:
        >>> from adaptprec.nlsq._lsmr import check_tr_options
        >>> check_tr_options({"btol": 1e-10}, "trf")
        (('atol', 1e-06), ('btol', 1e-10), ('conlim', 100000000.0), ('damp', 0.0), ('maxiter', None), ('regularize', True))
    """
    import warnings

    from ._arguments import OptionNotOffered

    opts = dict(tr_options or {})
    if method == "dogbox" and "regularize" in opts:
        warnings.warn("The keyword 'regularize' in `tr_options` is not relevant for "
                      "'dogbox' method.", UserWarning, stacklevel=4)
        del opts["regularize"]
    if opts.pop("show", False):
        raise OptionNotOffered("tr_options show=True (printing LSMR's iterations) is not "
                               "offered; the solver reports through res.message/res.nfev.")
    if opts.pop("x0", None) is not None:
        raise OptionNotOffered("tr_options x0 (LSMR's starting point) is not offered; "
                               "LSMR starts from 0 at every step, as scipy's trf does.")
    out = dict(LSMR_DEFAULTS)
    if method == "trf":
        out["regularize"] = bool(opts.pop("regularize", True))
    for k, v in opts.items():
        if k not in LSMR_DEFAULTS:
            raise TypeError(f"lsmr() got an unexpected keyword argument {k!r} (in "
                            f"tr_options); the keys are {sorted(LSMR_DEFAULTS)} and, for "
                            "trf, 'regularize'.")
        if k == "maxiter":
            out[k] = None if v is None else int(v)
        else:
            out[k] = float(v)
    return tuple(sorted(out.items()))


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


def solve_trust_region_2d(B, g, Delta):
    """``min 0.5 p^T B p + g^T p`` subject to ``||p|| <= Delta`` in two dimensions
    (scipy's ``solve_trust_region_2d``): the Newton step if ``B`` is positive definite
    and the step is inside; otherwise the best point on the circle, from the real roots
    of scipy's quartic in ``t = tan(phi / 2)`` (every candidate is a point on the
    circle, so the minimum over them is feasible even when the roots are inexact).

    Example:
        >>> import jax.numpy as jnp
        >>> from adaptprec.nlsq._lsmr import solve_trust_region_2d
        >>> p = solve_trust_region_2d(jnp.eye(2), jnp.array([-3.0, 0.0]), 1.0)
        >>> [round(float(v), 8) for v in p]
        [1.0, 0.0]
    """
    B = jnp.asarray(B)
    g = jnp.asarray(g)
    det = B[0, 0] * B[1, 1] - B[0, 1] * B[1, 0]
    pd = (B[0, 0] > 0) & (det > 0)
    safe_det = jnp.where(pd, det, 1.0)
    p_newton = -jnp.array([B[1, 1] * g[0] - B[0, 1] * g[1],
                           -B[1, 0] * g[0] + B[0, 0] * g[1]]) / safe_det
    inside = pd & (jnp.dot(p_newton, p_newton) <= Delta ** 2)
    a = B[0, 0] * Delta ** 2
    b = B[0, 1] * Delta ** 2
    c = B[1, 1] * Delta ** 2
    d = g[0] * Delta
    f = g[1] * Delta
    coeffs = jnp.stack([-b + d, 2 * (a - c + f), 6 * b, 2 * (-a + c + f), -b - d])
    # the quartic's roots, and the cubic's for a vanishing leading coefficient (np.roots
    # strips it); a zero leading coefficient is replaced by 1 (its roots are then
    # only extra candidates)
    quart = coeffs.at[0].set(jnp.where(coeffs[0] != 0, coeffs[0], 1.0))
    cub = coeffs[1:].at[0].set(jnp.where(coeffs[1] != 0, coeffs[1], 1.0))
    t = jnp.real(jnp.concatenate([jnp.roots(quart, strip_zeros=False),
                                  jnp.roots(cub, strip_zeros=False)]))
    t = jnp.where(jnp.isfinite(t), t, 0.0)
    # extra candidates on the circle: t = inf's point (0, -1), and a coarse ring so a
    # degenerate polynomial still leaves a feasible minimum
    ring = jnp.tan(0.5 * jnp.linspace(-np.pi, np.pi, 33)[1:-1])
    t = jnp.concatenate([t, ring.astype(t.dtype)])
    P = Delta * jnp.stack([2 * t / (1 + t ** 2), (1 - t ** 2) / (1 + t ** 2)])
    P = jnp.concatenate([P, jnp.array([[0.0], [-1.0]], P.dtype) * Delta], axis=1)
    value = 0.5 * jnp.sum(P * (B @ P), axis=0) + g @ P
    p_circle = P[:, jnp.argmin(value)]
    return jnp.where(inside, p_newton, p_circle)


def tr_solver_options(tr_solver, tr_options, method: str, host_kind):
    """scipy's ``tr_solver``/``tr_options``: ``None`` (exact step) or the lsmr options.

    ``tr_solver=None`` is ``"exact"`` unless the Jacobian is sparse (``host_kind``: ``jac``
    returns a sparse matrix or a ``LinearOperator``, or finite differences with
    ``jac_sparsity``): then ``"lsmr"``, as scipy chooses; ``tr_options`` with the exact
    solver are ignored with a warning (scipy ignores them silently), and ``lm``/``gn``
    ignore ``tr_solver`` with a warning (scipy's ``lm`` ignores it silently)."""
    import warnings

    if tr_solver is None:
        tr_solver = "lsmr" if host_kind is not None else "exact"
    if method in ("lm", "gn"):
        if tr_solver == "lsmr" or tr_options:
            warnings.warn(f"tr_solver / tr_options have no effect with method={method!r} "
                          "(its step is MINPACK's exact one); use method='trf' or "
                          "'dogbox' for tr_solver='lsmr'.", UserWarning, stacklevel=4)
        return None
    if tr_solver == "exact":
        if tr_options:
            warnings.warn("tr_options are ignored with tr_solver='exact' (they are "
                          "LSMR's options); pass tr_solver='lsmr' to use them.",
                          UserWarning, stacklevel=4)
        return None
    return check_tr_options(tr_options, method)
