r"""Condition-number estimation on existing LU factors (Hager–Higham).

.. math::

    \kappa_1(A) = \|A\|_1 \, \|A^{-1}\|_1 \approx \|A\|_1 \cdot
    \mathrm{est}\bigl(x \mapsto U^{-1} L^{-1} P x,\; x \mapsto P^T L^{-T} U^{-T} x\bigr)

where ``est`` is the Hager–Higham 1-norm estimator (:func:`adaptprec._normest.
norm1_estimate`, LAPACK ``xLACN2`` logic). Given ``P A = L U`` the estimate costs a few
pairs of triangular solves, O(n^2), against the O(n^3) factorization. For the infinity
norm, :math:`\kappa_\infty(A) = \kappa_1(A^T)`, so the roles of the two solves swap.
"""

from __future__ import annotations

import numpy as np

import jax
import jax.numpy as jnp
from jax import lax

from .._normest import norm1_estimate
from functools import partial

from .._tracing import is_concrete
from .._x64_rule import float64_call
from ._common import check_array, matrix_norms, scaled_lowsolve, x64_need_arrays, zero_pivot

__all__ = ["cond_estimate"]


def inverse_norm1(lu, perm, dtype, *, transpose: bool = False, max_iter: int = 5):
    """Estimate ``||A^{-1}||_1`` (``||A^{-T}||_1`` with ``transpose``) from ``A[perm] = LU``.

    Single system; the solves run in the factor's dtype (scaled to avoid over/underflow)
    and the estimate is returned in ``dtype``. An exactly singular factor gives ``inf``.
    """
    n = lu.shape[-1]

    def mv(x):
        return scaled_lowsolve(lu, perm, x[:, None], dtype, transpose=transpose)[:, 0]

    def rmv(x):
        return scaled_lowsolve(lu, perm, x[:, None], dtype, transpose=not transpose)[:, 0]

    est = norm1_estimate(mv, rmv, n, dtype, max_iter=max_iter)
    bad = zero_pivot(lu) | ~jnp.isfinite(est)
    return jnp.where(bad, jnp.asarray(jnp.inf, dtype), est)


def _norm_arg(norm) -> bool:
    """Return ``transpose`` (True for the infinity norm)."""
    if norm in (1, "1"):
        return False
    if norm in (np.inf, "inf", "Inf"):
        return True
    raise ValueError(f"cond_estimate: norm must be 1 or numpy.inf ('inf'), got {norm!r}")


@partial(float64_call, describe=lambda A, *, lu=None, norm=1: x64_need_arrays(
    "cond_estimate", (A,), trees=(A, lu)))
def cond_estimate(A, *, lu=None, norm=1):
    r"""Estimate the 1-norm (or infinity-norm) condition number of square ``A``.

    Uses the Hager–Higham estimator on LU factors: O(n^2) once the factors exist. The
    estimate is a lower bound that is almost always within a factor 3 of the true
    :math:`\kappa_1(A) = \|A\|_1\|A^{-1}\|_1` (Higham, *Accuracy and Stability of
    Numerical Algorithms*, 2nd ed., §15.3). Works under ``jit`` and ``vmap``; leading
    batch dimensions are allowed. An exactly singular matrix gives ``inf``.

    Args:
        A: array of shape ``(..., n, n)`` with a floating dtype.
        lu: optional factors of ``A`` as returned by ``jax.lax.linalg.lu`` (``(lu,
            pivots, permutation)``) or a pair ``(lu, permutation)``. They may be in a
            lower precision than ``A`` (e.g. float32 factors of a float64 matrix); the
            estimate then describes the matrix the factors represent, which is accurate
            while :math:`\kappa(A) u_{factor} \ll 1`. Without ``lu``, ``A`` is factored in
            its own dtype, and the same holds: for a matrix that is numerically
            singular in that dtype the factor-3 bound is lost (the 10 x 10 Hilbert
            matrix in float32: 9.5e8 against ``numpy.linalg.cond``'s 7.1e9), though the
            estimate still exceeds ``1/u``.
        norm: ``1`` (default) or ``numpy.inf``.

    Returns:
        Array of shape ``A.shape[:-2]`` and ``A``'s dtype (float32 for float16 and
        bfloat16 ``A``, which are factored in float32).

    Example:
        >>> import numpy as np, jax.numpy as jnp
        >>> import adaptprec as ap
        >>> A = jnp.array([[1.0, 2.0], [3.0, 4.0]])
        >>> round(float(ap.linalg.cond_estimate(A)), 9)  # ||A||_1 ||A^-1||_1 = 6 * 3.5
        21.0
        >>> round(float(np.linalg.cond(np.asarray(A), 1)), 6)
        21.0
    """
    transpose = _norm_arg(norm)
    A = check_array(A, "A", "cond_estimate")
    if A.ndim < 2 or A.shape[-1] != A.shape[-2]:
        raise ValueError(f"cond_estimate: A must be square (..., n, n); got shape {A.shape}")
    A = jnp.asarray(A)
    if jnp.finfo(A.dtype).bits < 32:
        # LAPACK has no half-precision LU, and kappa of a half-precision matrix often
        # exceeds float16's range: estimate in float32 (as solve does)
        A = A.astype(jnp.float32)
    if lu is None:
        lu_, _, perm = lax.linalg.lu(A)
    else:
        if not isinstance(lu, (tuple, list)) or len(lu) not in (2, 3):
            raise ValueError(
                "cond_estimate: lu must be the tuple returned by jax.lax.linalg.lu "
                "(lu, pivots, permutation) or a pair (lu, permutation)"
            )
        lu_, perm = lu[0], lu[-1]
        if lu_.shape != A.shape or perm.shape != A.shape[:-1]:
            raise ValueError(
                f"cond_estimate: lu factors of shape {lu_.shape} / permutation "
                f"{perm.shape} do not match A of shape {A.shape}"
            )
        if is_concrete(perm):
            p = np.asarray(perm)
            if not np.array_equal(np.sort(p, axis=-1),
                                  np.broadcast_to(np.arange(p.shape[-1]), p.shape)):
                raise ValueError(
                    "cond_estimate: the second element of lu is not a permutation of "
                    "0..n-1. scipy.linalg.lu_factor returns LAPACK's row swaps (piv), not "
                    "a permutation: pass the output of jax.lax.linalg.lu (lu, pivots, "
                    "permutation), or no lu at all")
    return _cond_batched(A, lu_, perm, transpose)


@jax.jit(static_argnums=(3,))
def _cond_batched(A, lu, perm, transpose):
    dtype = A.dtype
    batch = A.shape[:-2]
    n = A.shape[-1]
    A2 = A.reshape((-1, n, n))
    lu2 = lu.reshape((-1, n, n))
    perm2 = perm.reshape((-1, n))

    def one(a, l, p):
        n1, ninf = matrix_norms(a)
        anorm = ninf if transpose else n1
        # a zero matrix is singular: inf, not 0 * inf = NaN (numpy's cond gives inf)
        return jnp.where(anorm > 0, anorm * inverse_norm1(l, p, dtype, transpose=transpose),
                         jnp.asarray(jnp.inf, dtype))

    return jax.vmap(one)(A2, lu2, perm2).reshape(batch)
