"""Identifiability at the solution: the covariance on the identifiable subspace, the
singular values of the scaled Jacobian, and names for the combinations the data do not
determine ("a and b are not separately identifiable (only a·b is)").

The Jacobian's columns are scaled by ``|p_i|`` (derivatives with respect to ``log p_i``;
a parameter at 0 is scaled by its column's inverse norm), so a singular value measures a
relative change and a product model ``a·b`` has the null vector ``(1, -1)`` whatever the
sizes of ``a`` and ``b``. Directions whose singular value is at most
``max(m, n) * eps * s_max`` (scipy's rank rule, applied to the scaled Jacobian) are the
null space. The covariance is the pseudo-inverse restricted to the other directions:
every quantity orthogonal to the null space (an identifiable parameter such as ``c`` in
``a·b·x + c``, the product ``a·b``, the model's prediction) keeps its finite variance,
exactly the variance of the same quantity in a reparametrised, identifiable model. A
parameter with a component in the null space gets ``inf``. scipy's ``curve_fit`` instead
returns an all-inf ``pcov`` for ``method="lm"`` (and a finite, meaningless one for
``trf``); :func:`adaptprec.curve_fit` keeps scipy's rule.

Example:
    >>> import jax.numpy as jnp
    >>> from adaptprec.analysis.identifiability import subspace_covariance
    >>> x = jnp.linspace(0.0, 1.0, 5)
    >>> J = jnp.stack([3.0 * x, 2.0 * x, jnp.ones(5)], axis=1)  # d/da, d/db, d/dc of a*b*x+c
    >>> cov = subspace_covariance(J, jnp.array([2.0, 3.0, 1.0]))
    >>> int(cov.rank), [bool(v) for v in cov.identifiable]
    (2, [False, False, True])
"""

from __future__ import annotations


from fractions import Fraction

import jax
import jax.numpy as jnp
import numpy as np

from .._pytree import Module

__all__ = ["SubspaceCovariance", "subspace_covariance", "name_combination",
           "describe_null_space"]


class SubspaceCovariance(Module):
    """The unscaled covariance ``(J^T J)^+`` on the identifiable subspace, and the SVD of
    the scaled Jacobian it came from (all jnp arrays; a pytree, batched under ``vmap``).

    Fields: ``cov`` ``(n, n)`` pseudo-inverse (finite); ``identifiable`` ``(n,)`` bool;
    ``singular_values`` ``(n,)`` of ``J diag(scale)``, descending; ``directions``
    ``(n, n)`` right singular vectors in the scaled (log) space, one per column;
    ``scale`` ``(n,)``; ``rank`` (int); ``null`` ``(n,)`` bool, the columns of
    ``directions`` in the null space.
    """

    cov: jax.Array
    identifiable: jax.Array
    singular_values: jax.Array
    directions: jax.Array
    scale: jax.Array
    rank: jax.Array
    null: jax.Array

    def null_space(self):
        """``(n, n)`` raw-parameter null-space directions (zero columns where not null)."""
        return self.scale[:, None] * self.directions * self.null[None, :]


#: up to this many parameters the SVD is one-sided Jacobi in jnp (unrolled rotations):
#: batched over many small fits it is about 2-2.5x faster than LAPACK's per-matrix gesdd on CPU
#: (benchmarks/bench_fit_report.py); its compiled size grows with n^2
JACOBI_MAX_N = 6
JACOBI_SWEEPS = 7


def _jacobi_svd(A):
    """``(s, Vt)`` of ``A`` (``(m, n)``, small ``n``) by one-sided Jacobi rotations (Hestenes):
    columns are rotated pairwise until orthogonal; the norms are the singular values.
    High relative accuracy (Demmel–Veselić); for ``m > 2n`` it runs on ``R`` of a QR."""
    m, n = A.shape
    if m > 2 * n:
        A = jnp.linalg.qr(A, mode="r")
    eps, tiny = jnp.finfo(A.dtype).eps, jnp.finfo(A.dtype).tiny

    def sweep(_, AV):  # one sweep: every pair once (unrolled, on column lists); the
        A, V = AV      # sweeps are a loop, which keeps the compiled size to one sweep's
        cols = [A[:, i] for i in range(n)]
        vs = [V[:, i] for i in range(n)]
        for i in range(n - 1):
            for j in range(i + 1, n):
                a, b = cols[i], cols[j]
                alpha, beta, gamma = a @ a, b @ b, a @ b
                done = jnp.abs(gamma) <= eps * jnp.sqrt(alpha * beta) + tiny
                zeta = (beta - alpha) / (2.0 * jnp.where(done, 1.0, gamma))
                t = jnp.sign(zeta) / (jnp.abs(zeta) + jnp.sqrt(1.0 + zeta * zeta))
                t = jnp.where(done, 0.0, jnp.where(zeta == 0, 1.0, t))
                c = 1.0 / jnp.sqrt(1.0 + t * t)
                s = c * t
                cols[i], cols[j] = c * a - s * b, s * a + c * b
                vs[i], vs[j] = c * vs[i] - s * vs[j], s * vs[i] + c * vs[j]
        return jnp.stack(cols, axis=1), jnp.stack(vs, axis=1)

    A, V = jax.lax.fori_loop(0, JACOBI_SWEEPS, sweep, (A, jnp.eye(n, dtype=A.dtype)))
    sv = jnp.sqrt(jnp.sum(A * A, axis=0))
    order = jnp.argsort(-sv)
    return sv[order], V[:, order].T


def subspace_covariance(J, p, rtol=None) -> SubspaceCovariance:
    """``(J^T J)^+`` restricted to the identifiable subspace of ``J`` (``(m, n)``, the
    weighted residual's Jacobian at the solution ``p``); jit/vmap/grad-safe.

    ``rtol``: singular values of the scaled Jacobian at most ``rtol * s_max`` span the
    null space (default ``max(m, n) * eps``, scipy's rank rule).
    """
    J = jnp.asarray(J)
    p = jnp.asarray(p, J.dtype)
    m, n = J.shape
    eps = jnp.finfo(J.dtype).eps
    if rtol is None:
        rtol = max(m, n) * eps
    colnorm = jnp.sqrt(jnp.sum(J * J, axis=0))
    scale = jnp.where(p != 0, jnp.abs(p),
                      jnp.where(colnorm > 0, 1.0 / jnp.where(colnorm > 0, colnorm, 1.0), 1.0))
    if n <= JACOBI_MAX_N:
        s, Vt = _jacobi_svd(J * scale)
    else:
        _, s, Vt = jnp.linalg.svd(J * scale, full_matrices=False)
    keep = s > rtol * s[0]
    inv_s2 = jnp.where(keep, 1.0 / jnp.where(keep, s, 1.0) ** 2, 0.0)
    cov_scaled = (Vt.T * inv_s2) @ Vt
    cov = scale[:, None] * cov_scaled * scale[None, :]
    # a parameter with a (more than rounding) component in a null direction is not
    # identifiable; sqrt(eps) as adaptprec's curve_fit rule for trf
    in_null = jnp.max(jnp.where(keep[:, None], 0.0, jnp.abs(Vt)), axis=0)
    identifiable = in_null <= jnp.sqrt(eps)
    return SubspaceCovariance(cov, identifiable, s, Vt.T, scale,
                              jnp.sum(keep).astype(jnp.int32), ~keep)


# ----------------------------------------------------------------- naming (host side)

def _small_ratio(a: float, b: float, tol: float = 0.02):
    """``a / b`` as a small fraction p/q (|p|, q <= 4), or None."""
    if b == 0:
        return None
    fr = Fraction(a / b).limit_denominator(4)
    if abs(fr.numerator) > 4 or fr == 0 or abs(float(fr) - a / b) > tol * abs(a / b):
        return None
    return fr


def _power(name: str, k: Fraction) -> str:
    k = abs(k)
    if k == 1:
        return name
    if k.denominator == 1:
        return f"{name}^{k.numerator}"
    return f"{name}^({k.numerator}/{k.denominator})"


def _product_form(names, i, j, u, p):
    """``p_i^α p_j^β`` (integer powers) constant along ``d log p = u``
    (``α u_i + β u_j = 0``): ``(text, value, gradient)``, or None."""
    r = _small_ratio(-float(u[j]), float(u[i]))
    if r is None:
        return None
    num, den = abs(r.numerator), r.denominator
    w = np.zeros(p.size)
    w[i], w[j] = (num if r > 0 else -num), den
    a, b = _power(names[i], Fraction(num)), _power(names[j], Fraction(den))
    text = f"{a}·{b}" if r > 0 else f"{b}/{a}"
    with np.errstate(divide="ignore", invalid="ignore"):
        value = float(np.prod(np.where(w != 0, p, 1.0) ** w))
        grad = np.where(w != 0, w * value / p, 0.0)
    return text, value, grad


def _sum_form(names, i, j, v, p):
    """``α p_i ± p_j`` constant along ``dp = v``: ``(text, value, gradient)``, or None."""
    r = _small_ratio(-float(v[j]), float(v[i]))
    if r is None:
        return None
    coef = "" if abs(r) == 1 else f"{abs(r)}·"
    sign = 1.0 if r > 0 else -1.0
    grad = np.zeros(p.size)
    grad[i], grad[j] = float(abs(r)), sign
    text = f"{coef}{names[i]} {'+' if r > 0 else '-'} {names[j]}"
    return text, float(grad @ p), grad


def name_combination(names, popt, u, scale, involved, predict=None):
    """The identifiable combination of two parameters ``i, j = involved`` whose
    undetermined direction is ``u`` in ``log p`` (``scale * u`` in ``p``): a product
    ``p_i^α p_j^β`` or a sum ``α p_i ± p_j`` with small integer/rational ``α``, as
    ``(text, value, gradient)``; ``None`` when neither applies. Both forms fit the
    tangent; with ``predict(p)`` (the model at the data) the one whose finite move
    (a 10 % change) leaves the model unchanged wins, the product first.
    """
    i, j = involved
    p = np.asarray(popt, np.float64)
    raw = u * scale
    candidates = []
    prod = _product_form(names, i, j, u, p)
    if prod is not None:
        candidates.append((prod, p * np.exp(0.1 * u / np.max(np.abs(u)))))
    lin = _sum_form(names, i, j, raw, p)
    if lin is not None:
        candidates.append((lin, p + 0.1 * raw / np.max(np.abs(raw)) *
                           np.max(np.abs(p[[i, j]]) + 1e-300)))
    if not candidates:
        return None
    if predict is None:
        return candidates[0][0]
    f0 = np.asarray(predict(p), np.float64)
    size = np.linalg.norm(f0) + 1e-300
    for form, q in candidates:  # the product first: a ray through 0 keeps both a/b and
        # 1.5 a - b = 0, and only the ratio stays constant off that ray
        if np.linalg.norm(np.asarray(predict(q), np.float64) - f0) <= 1e-8 * size:
            return form
    return None


def describe_null_space(names, sub: SubspaceCovariance, popt, predict=None,
                        cov=None) -> list[str]:
    """Sentences naming each undetermined direction (host NumPy; concrete inputs).
    ``predict(p)``: the model at the data, to tell a product from a sum
    (:func:`name_combination`); ``cov``: the scaled covariance on the identifiable
    subspace, to give the named combination's value and standard error."""
    null = np.asarray(sub.null)
    V = np.asarray(sub.directions, np.float64)
    scale = np.asarray(sub.scale, np.float64)
    out = []
    for k in np.flatnonzero(null):
        u = V[:, k]
        weight = np.abs(u) / np.max(np.abs(u))
        involved = [i for i in range(len(names)) if weight[i] > 0.05]
        if len(involved) == 1:
            out.append(f"{names[involved[0]]} is not identifiable: the model does not "
                       "depend on it at the data")
            continue
        listed = ", ".join(names[i] for i in involved[:-1]) + f" and {names[involved[-1]]}"
        combo = None
        if len(involved) == 2:
            combo = name_combination(names, popt, u, scale, involved, predict)
        if combo is not None:
            text, value, grad = combo
            est = ""
            if cov is not None:
                se = float(np.sqrt(max(grad @ np.asarray(cov, np.float64) @ grad, 0.0)))
                est = f": {text} = {value:.6g} ± {se:.2g}"
            out.append(f"{listed} are not separately identifiable (only {text} is{est})")
        else:
            terms = ", ".join(f"{names[i]}: {u[i] / u[involved[0]]:+.3g}" for i in involved)
            out.append(f"{listed} are not separately identifiable: changing the "
                       f"log-parameters along ({terms}) leaves the model unchanged at the "
                       "data")
    return out
