"""Levenberg–Marquardt trust-region step (Moré 1978, the MINPACK ``lmder`` tradition).

The model Jacobian is held as the ``n x n`` triangular factor ``R`` of ``[J f] = Q R`` (or
a square root of the Gram matrix when ``linear_solver="normal"``), with ``qtf = Q^T f``.
In scaled variables ``p~ = D p`` (``D`` = Jacobian column norms when ``x_scale="jac"``,
never decreasing, as in MINPACK) the step solves

    min_p ||J p + f||  subject to  ||D p|| <= Delta,

i.e. ``(J^T J + alpha D^T D) p = -J^T f`` with the Levenberg–Marquardt parameter ``alpha``
found by Moré's safeguarded Newton iteration on the secular equation
(:func:`adaptprec.nlsq.common.solve_lsq_trust_region`), via an SVD of the ``n x n``
``R D^-1``. Each step costs ``O(n^3)``; the ``O(m n^2)`` QR is paid once per Jacobian.

Example:
    >>> import jax.numpy as jnp
    >>> from adaptprec.nlsq.lm import lm_step
    >>> R, qtf = jnp.eye(2), jnp.array([1.0, -2.0])   # J = I, f = (1, -2)
    >>> st = lm_step(jnp.zeros(2), R, qtf, jnp.ones(2), 10.0, 0.0, m=2)
    >>> [float(v) for v in st.x_new]                  # Gauss–Newton step -f
    [-1.0, 2.0]
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.scipy.linalg import solve_triangular

from .._status import Status
from .common import solve_lsq_trust_region

__all__ = ["Step", "lm_step", "predicted_reduction", "minpack_gnorm", "minpack_delta0",
           "minpack_radius", "verify_minimum", "NOT_A_MINIMUM_COSINE",
           "RUNAWAY_FACTOR", "at_noise_level",
           "FLAT_DIRECTION_RATIO", "flat_direction"]


class Step(NamedTuple):
    """A proposed step: new point, predicted cost reduction, scaled step norm, whether it
    reached the trust-region boundary, the new LM parameter, and the singular values of
    the scaled model Jacobian (for the condition estimate)."""

    x_new: jax.Array
    predicted: jax.Array
    step_norm: jax.Array
    bound_hit: jax.Array
    alpha: jax.Array
    s: jax.Array


def predicted_reduction(s, suf, y):
    """``-(0.5 ||J p||^2 + g^T p)`` with ``y = V^T p`` in the SVD basis of ``J``.

    Example:
        >>> import jax.numpy as jnp
        >>> from adaptprec.nlsq.lm import predicted_reduction
        >>> float(predicted_reduction(jnp.ones(1), jnp.array([-2.0]), jnp.array([2.0])))
        2.0
    """
    return -(0.5 * jnp.sum((s * y) ** 2) + jnp.sum(suf * y))


def lm_step(x, R, qtf, scale_inv, Delta, alpha, *, m: int) -> Step:
    """One Levenberg–Marquardt trust-region step from the factored model ``(R, qtf)``.

    ``scale_inv`` is ``D`` (the variable scaling), ``Delta`` the trust radius in scaled
    variables, ``alpha`` the previous LM parameter (warm start; 0 for none).

    Example:
        >>> import jax.numpy as jnp
        >>> from adaptprec.nlsq.lm import lm_step
        >>> st = lm_step(jnp.zeros(1), jnp.eye(1), jnp.array([-4.0]), jnp.ones(1), 1.0,
        ...              0.0, m=1)
        >>> float(st.x_new[0]), bool(st.bound_hit)     # truncated to the radius
        (1.0, True)
    """
    d = 1.0 / scale_inv
    U, s, VT = jnp.linalg.svd(R * d[None, :], full_matrices=False)
    suf = s * (U.T @ qtf)
    p_h, alpha_new, _ = solve_lsq_trust_region(s, VT.T, suf, Delta, alpha, m)
    # A model whose numerical null space is exactly its zero columns (parameters the
    # data never see) takes MINPACK's Gauss-Newton step on the numerical range when it
    # fits in the radius (lmpar: par = 0): the trust-region solve would stretch the step
    # along rounding-level directions to reach the radius.
    n = s.shape[0]
    keep = s > jnp.finfo(s.dtype).eps * jnp.maximum(m, n) * s[0]
    p_rank = -VT.T @ jnp.where(keep, suf / jnp.where(keep, s * s, 1.0), 0.0)
    zero_cols = jnp.sum(jnp.all(R == 0, axis=0))
    dropped = jnp.sum(~keep)
    rank_gn = ((dropped > 0) & (dropped == zero_cols) & jnp.any(keep)
               & (jnp.linalg.norm(p_rank) <= Delta))
    p_h = jnp.where(rank_gn, p_rank, p_h)
    alpha_new = jnp.where(rank_gn, 0.0, alpha_new)
    hn = jnp.linalg.norm(p_h)
    pred = predicted_reduction(s, suf, VT @ p_h)
    return Step(x + d * p_h, pred, hn, hn > 0.95 * Delta, alpha_new, s)


def minpack_gnorm(x, g, R, fnorm, lb=None, ub=None):
    """MINPACK's ``gtol`` measure: ``max_j |g_j| / (||J_j|| ||f||)`` (column norms of
    ``J`` are those of ``R``), the cosine between the residual and each Jacobian column.

    Example:
        >>> import jax.numpy as jnp
        >>> from adaptprec.nlsq.lm import minpack_gnorm
        >>> float(minpack_gnorm(None, jnp.array([1.0]), 2.0 * jnp.eye(1), 4.0))
        0.125
    """
    cn = jnp.sqrt(jnp.sum(R * R, axis=0))
    den = cn * fnorm
    return jnp.max(jnp.where(den > 0, jnp.abs(g) / jnp.where(den > 0, den, 1.0), 0.0))


#: MINPACK's ``factor`` for the initial radius: 1, not MINPACK's 100, which sends far
#: starts onto plateaus with its first, huge step (docs/nlsq.md, "Robustness").
DELTA0_FACTOR = 1.0


def minpack_delta0(x, scale_inv, g=None, lb=None, ub=None, factor=DELTA0_FACTOR):
    """MINPACK's initial radius ``factor * ||D x0||`` (``factor`` if that is zero), with
    ``factor`` = :data:`DELTA0_FACTOR`.

    Example:
        >>> import jax.numpy as jnp
        >>> from adaptprec.nlsq.lm import minpack_delta0
        >>> float(minpack_delta0(jnp.zeros(2), jnp.ones(2)))
        1.0
        >>> float(minpack_delta0(jnp.ones(1), 2 * jnp.ones(1), factor=100.0))
        200.0
    """
    d = factor * jnp.linalg.norm(x * scale_inv)
    return jnp.where(d > 0, d, factor)


def minpack_radius(Delta, ratio, step_norm, alpha, blew_up):
    """MINPACK ``lmder``'s trust-radius update (Moré 1978, section 4): ``ratio < 1/4``
    shrinks to ``temp * min(Delta, 10 ||D p||)`` (``temp = 1/2``, or ``1/10`` when the
    cost ``blew_up`` by more than 100x; MINPACK interpolates between them); a very good
    step (``ratio >= 3/4``) or a Gauss–Newton step (``alpha == 0``) sets
    ``Delta = 2 ||D p||``; otherwise ``Delta`` is kept.
    Unlike scipy's ``trf`` rule, the radius follows the length of successful steps,
    which keeps the LM parameter small along a long curved valley.

    Example:
        >>> from adaptprec.nlsq.lm import minpack_radius
        >>> float(minpack_radius(1.0, 0.9, 0.1, 0.0, False))
        0.2
        >>> float(minpack_radius(1.0, 0.1, 0.5, 1.0, False))
        0.5
    """
    temp = jnp.where(blew_up, 0.1, 0.5)
    return jnp.where(ratio < 0.25, temp * jnp.minimum(Delta, 10.0 * step_norm),
                     jnp.where((ratio >= 0.75) | (alpha == 0), 2.0 * step_norm, Delta))


def optx_radius(Delta, ratio, step_norm):
    """The portfolio's second radius rule (:data:`.common.PORTFOLIO`): optimistix's
    ``ClassicalTrustRegion`` constants in radius form. ``ratio < 0.01`` shrinks to
    ``0.25 min(Delta, ||D p||)``, ``ratio > 0.99`` grows to ``3.5 Delta``, otherwise
    ``Delta`` is kept (optimistix scales its LM step size ``1/lambda`` the same way).

    Example:
        >>> from adaptprec.nlsq.lm import optx_radius
        >>> [float(optx_radius(1.0, r, 0.5)) for r in (0.0, 0.5, 1.0)]
        [0.125, 1.0, 3.5]
    """
    return jnp.where(ratio < 0.01, 0.25 * jnp.minimum(Delta, step_norm),
                     jnp.where(ratio > 0.99, 3.5 * Delta, Delta))


#: Runaway parameters: a convergence with ``||x|| > RUNAWAY_FACTOR ||x0||`` is not
#: trusted by the portfolio (:data:`.common.PORTFOLIO`): along a direction where the
#: model flattens (a minimum at infinity) the gradient test is met without a minimum ...
RUNAWAY_FACTOR = 1e6

#: ... but only with evidence that the model flattens there (distance alone is not:
#: Arrhenius' pre-factor has its minimum at 3.6e11): some parameter combination must be
#: undetermined even to its order of magnitude, ``||(R D)^-1|| ||f|| >
#: FLAT_DIRECTION_RATIO`` with ``D = diag(|x|)``.
FLAT_DIRECTION_RATIO = 1e3


def flat_direction(x, R, fnorm, x0_norm, triangular=True):
    """Whether the model at ``x`` has a flat direction: a relative change of the
    parameters by more than ``FLAT_DIRECTION_RATIO`` (orders of magnitude) that moves the
    model by no more than the residual, ``||f|| / sigma_min(R D) > FLAT_DIRECTION_RATIO``
    with ``D = diag(max(|x|, ||x0||))`` (``R^T R = J^T J``; a parameter near zero is
    measured on the start's scale). The 2-norm of ``(R D)^-1`` is bounded by its
    Frobenius norm from one triangular solve (``triangular``: ``R`` from a QR; the Gram
    path's ``R`` is not triangular, an LU solve then). A singular ``R D`` is flat.

    Example:
        >>> import jax.numpy as jnp
        >>> from adaptprec.nlsq.lm import flat_direction
        >>> x = jnp.array([1e9, 1e9])
        >>> well = jnp.array([[1e-9, 0.0], [0.0, 1e-9]])    # each column ~ 1 / x
        >>> flat = jnp.array([[1e-9, 1e-9], [0.0, 1e-21]])  # nearly collinear columns
        >>> [bool(flat_direction(x, R, 1.0, 1.0)) for R in (well, flat)]
        [False, True]
    """
    d = jnp.maximum(jnp.abs(x), x0_norm)
    RD = R * d[None, :]
    eye = jnp.eye(R.shape[0], dtype=R.dtype)
    if triangular:
        inv = solve_triangular(RD, eye, lower=False)
    else:
        inv = jnp.linalg.solve(RD, eye)
    ratio = jnp.linalg.norm(inv) * fnorm
    return ~(ratio <= FLAT_DIRECTION_RATIO)  # (nan or inf: singular, flat)

#: A point is not a minimum when the residual keeps this cosine with a Jacobian column.
NOT_A_MINIMUM_COSINE = 0.1
#: ... unless the residual is at the rounding level of the model (``||f|| <= c eps ||J x||``):
#: the cosine of a rounding-noise residual means nothing (zero-residual problems).
_NOISE_FACTOR = 1e5


def at_noise_level(x, R, fnorm):
    """Whether the residual norm ``fnorm`` is at the rounding level of the model,
    ``||f|| <= 1e5 eps ||J x||`` (``||J x|| = ||R x||``): a zero-residual point.

    Example:
        >>> import jax.numpy as jnp
        >>> from adaptprec.nlsq.lm import at_noise_level
        >>> [bool(at_noise_level(jnp.ones(1), jnp.eye(1), f)) for f in (1e-15, 1e-3)]
        [True, False]
    """
    eps = jnp.finfo(R.dtype).eps
    return fnorm <= _NOISE_FACTOR * eps * jnp.linalg.norm(R @ x)


def verify_minimum(status, x, R, qtf, fnorm, tol=NOT_A_MINIMUM_COSINE):
    """Honest success: a convergence ``status`` (``ftol``/``xtol``/``gtol``) becomes
    ``Status.NOT_A_MINIMUM`` when, on the top rung's model ``(R, qtf)`` at ``x``, the
    residual still has a cosine above ``tol`` with a Jacobian column (MINPACK's gtol
    measure, :func:`minpack_gnorm`): the steps stopped (radius collapse, a plateau where
    the model saturates) at a point that is not stationary. Zero-residual fits
    (``||f|| <= sqrt(eps) ||J x||``) and degenerate minima (``J -> 0``) are exempt.

    Example:
        >>> import jax.numpy as jnp
        >>> from adaptprec.nlsq.lm import verify_minimum
        >>> R = jnp.eye(2)                       # J = I; f = (1, 0) lies along column 0
        >>> int(verify_minimum(3, jnp.ones(2), R, jnp.array([1.0, 0.0]), 1.0))
        -10
        >>> int(verify_minimum(3, jnp.ones(2), R, jnp.zeros(2), 1.0))  # g = 0: a minimum
        3
    """
    g = R.T @ qtf
    cosine = minpack_gnorm(x, g, R, fnorm)
    eps = jnp.finfo(R.dtype).eps
    noise = at_noise_level(x, R, fnorm)
    # A degenerate minimum (J -> 0 with a nonzero residual, e.g. p**2 + 5 at 0) has a
    # cosine near 1 but a gradient that moves the cost by nothing: exempt it.
    flat = jnp.max(jnp.abs(g) * jnp.maximum(jnp.abs(x), 1.0)) <= jnp.sqrt(eps) * fnorm ** 2
    # A stop where the model reproduces the data to sqrt(eps) of its size is a
    # zero-residual fit (with m < n every residual lies in range(J), so the cosine is ~1
    # at any such point); the model's size is ||J x||, or ||J diag(max(|x|, 1))|| where
    # the parameters are ~0.
    size = jnp.maximum(jnp.linalg.norm(R @ x),
                       jnp.linalg.norm(R * jnp.maximum(jnp.abs(x), 1.0)[None, :]))
    fitted = fnorm <= jnp.sqrt(eps) * size
    converged = (status > 0) & (status < Status.RUNNING)
    return jnp.where(converged & (cosine > tol) & ~noise & ~flat & ~fitted,
                     Status.NOT_A_MINIMUM, status).astype(jnp.int32)
