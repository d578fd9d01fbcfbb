r"""Mixed-precision linear least squares: low-precision QR, working-precision refinement.

For tall ``A`` (``m >= n``, full column rank) ``x = argmin ||b - A x||_2``:

1. round ``A`` to the factor precision and compute the reduced QR ``A = Q R``;
2. ``x_0 = R^{-1} Q^T b`` in the factor precision;
3. repeat: ``r_i = b - A x_i`` in the working precision, ``d_i = R^{-1} Q^T r_i`` from the
   low-precision factors, ``x_{i+1} = x_i + d_i``. The fixed point satisfies the normal
   equations ``A^T r = 0`` exactly as computed in the working precision; the contraction
   factor is about ``kappa_2(A) u_factor`` (plus ``kappa_2(A)^2 u_factor ||r|| /
   (||A|| ||x||)`` for large-residual problems), so this is the least-squares analogue of
   dsgesv (Björck, *Numerical Methods for Least Squares Problems*, §2.9);
4. stop when the normwise optimality measure

   .. math:: \eta = \frac{\|A^T r\|_\infty}{\|A\|_1\,(\|A\|_\infty \|x\|_\infty
             + \|b\|_\infty)} \le \mathrm{tol} = \sqrt{n}\,u_{working};

5. otherwise (cast overflow, rank-deficient low-precision ``R``, stagnation,
   ``max_iters``) fall back to a working-precision QR, for the failing systems only
   (gathered into a buffer, :func:`adaptprec._compaction.recompute_rows`; under ``vmap``
   a ``custom_vmap`` rule folds the mapped axis into the batch so this still holds).
"""

from __future__ import annotations

import math
from functools import partial

import numpy as np

import jax
import jax.numpy as jnp
from jax import lax
from jax.custom_batching import custom_vmap

from .._compaction import capacity_for, recompute_rows
from .._first_order import nan_max_abs
from .._normest import norm1_estimate
from .._status import Reason, Status
from .._x64_rule import float64_call
from ..precision import max_value, unit_roundoff
from ._common import (check_array, check_options, pow2_scale, prepare_system,
                      resolve_precisions, x64_need)
from ._solve_info import SolveInfo, colnorm, inaccurate_above, relative_residual

__all__ = ["lstsq"]

_STAGNATION = 0.5


def _rdiag_bad(R):
    d = jnp.diagonal(R, axis1=-2, axis2=-1)
    return jnp.any((d == 0) | ~jnp.isfinite(d), axis=-1)


def _r_solve(R, y, transpose=False):
    return lax.linalg.triangular_solve(R, y, left_side=True, lower=False,
                                       transpose_a=transpose)


def _cond_r(R, dtype):
    """Hager–Higham estimate of kappa_1(R) for one triangular factor."""
    n = R.shape[-1]

    def mv(v):
        return _r_solve(R, v[:, None].astype(R.dtype))[:, 0].astype(dtype)

    def rmv(v):
        return _r_solve(R, v[:, None].astype(R.dtype), True)[:, 0].astype(dtype)

    rn1 = jnp.max(jnp.sum(jnp.abs(R), axis=0)).astype(dtype)
    est = rn1 * norm1_estimate(mv, rmv, n, dtype)
    return jnp.where(_rdiag_bad(R) | ~jnp.isfinite(est), jnp.asarray(jnp.inf, dtype), est)


def _norms(A):
    absA = jnp.abs(A)
    return jnp.max(jnp.sum(absA, axis=-1), axis=-1), jnp.max(jnp.sum(absA, axis=-2), axis=-1)


def _measures(A, B, x, r, ninf, n1):
    """eta = ||A^T r|| / (||A||_1 (||A||_inf ||x|| + ||b||)) and the consistency
    ||b - r - A x|| / (||A||_inf ||x|| + ||b||) of the carried residual."""
    f = B - r - jnp.matmul(A, x)
    g = -jnp.matmul(jnp.swapaxes(A, -1, -2), r)
    scale = ninf[:, None] * jnp.max(jnp.abs(x), axis=1) + jnp.max(jnp.abs(B), axis=1)
    safe = jnp.where(scale > 0, scale, 1)
    # NaN counts as inf (a plain max drops it from 4096 entries on under XLA:CPU: issue
    # 31), so the refinement stalls on a NaN instead of converging on it
    eta = nan_max_abs(g, axis=1) / (n1[:, None] * safe)
    fit = nan_max_abs(f, axis=1) / safe
    return f, g, eta, fit


def _fallback(ops):
    """Working-precision QR solve of the given rows (any number of them)."""
    A, B, cast_ok, factor_ok, converged = ops
    w = A.dtype
    u_w = unit_roundoff(w)
    Q64, R64 = lax.linalg.qr(A, full_matrices=False)
    xf = jax.vmap(_r_solve)(R64, jnp.matmul(jnp.swapaxes(Q64, -1, -2), B))
    ninf, n1 = _norms(A)
    ef = _measures(A, B, xf, B - jnp.matmul(A, xf), ninf, n1)[2]
    zero = _rdiag_bad(R64)
    finite_in = (jnp.all(jnp.isfinite(A), axis=(1, 2))
                 & jnp.all(jnp.isfinite(B), axis=(1, 2)))
    kappa = jax.vmap(partial(_cond_r, dtype=w))(R64)
    xf = jnp.where((zero | ~finite_in)[:, None, None], jnp.asarray(jnp.nan, w), xf)
    # numerically rank-deficient by LAPACK's and numpy's rank rule (sigma_min <= eps
    # max(m, n) sigma_max): an exactly rank-deficient A leaves kappa_1(R) at 3e15-7e15
    # through rounding, just under 1/u (CONVERGED with entries of 1e14)
    rank_tol = 2 * u_w * max(A.shape[-2:])
    status = jnp.select(
        [~finite_in, zero, kappa * rank_tol >= 1],
        [int(Status.NONFINITE_INPUT), int(Status.SINGULAR), int(Status.ILL_CONDITIONED)],
        default=int(Status.CONVERGED)).astype(jnp.int32)
    reason = jnp.select(
        [~finite_in, ~cast_ok, ~factor_ok, ~converged],
        [int(Reason.NONFINITE), int(Reason.OVERFLOW), int(Reason.SINGULAR_FACTOR),
         int(Reason.STAGNATION)],
        default=int(Reason.ILL_CONDITIONED)).astype(jnp.int32)   # kappa(R_f) u_f >= 1
    return xf, ef, status, reason, kappa


def _lstsq_core(A, B, *, storage, compute, max_iters, tol, capacity):
    w = A.dtype
    # ||A|| far from 1: (s A, s b) has the same solution, and the optimality measure
    # is scale invariant (at 1e307 A^T r overflowed: CONVERGED with a NaN measure)
    s1, s2 = pow2_scale(jnp.max(jnp.abs(A), axis=(1, 2)), A.dtype)
    A, B = A * s1 * s2, B * s1 * s2
    ninf, n1 = _norms(A)                                         # (p,)
    cast_ok = (ninf <= max_value(storage)) & (n1 <= max_value(storage))
    a_low = A.astype(storage)
    if np.dtype(compute) != np.dtype(storage):
        a_low = a_low.astype(compute)
    Q, R = lax.linalg.qr(a_low, full_matrices=False)
    factor_ok = ~_rdiag_bad(R)

    def low_aug(f, g):
        """Correction of the augmented system [[I, A], [A^T, 0]] [dr; dx] = [f; g] from the
        low-precision Q, R: h = R^{-T} g, z = Q^T f, dx = R^{-1}(z - h), dr = f - Q(z - h)."""
        sf = jnp.maximum(jnp.max(jnp.abs(f), axis=1, keepdims=True),
                         jnp.max(jnp.abs(g), axis=1, keepdims=True))
        sf = jnp.where(sf > 0, sf, jnp.ones_like(sf))
        h = jax.vmap(partial(_r_solve, transpose=True))(R, (g / sf).astype(compute))
        z = jnp.matmul(jnp.swapaxes(Q, -1, -2), (f / sf).astype(compute))
        dx = jax.vmap(_r_solve)(R, z - h).astype(w) * sf
        dr = f - jnp.matmul(Q, z - h).astype(w) * sf
        return dx, dr

    def measures(x, r):
        return _measures(A, B, x, r, ninf, n1)

    # x0 = R^{-1} Q^T b: the augmented correction from x = 0, r = 0 (f = b, g = 0).
    x0, _ = low_aug(B, jnp.zeros(A.shape[:1] + (A.shape[2], B.shape[2]), w))
    r0 = B - jnp.matmul(A, x0)
    inf_k = jnp.full(B.shape[:1] + B.shape[2:], jnp.inf, w)
    false_k = jnp.zeros(inf_k.shape, bool)

    def cond(s):
        it, _, _, _, conv, stalled, _ = s
        return (it <= max_iters) & jnp.any(~conv & ~stalled)

    def body(s):
        it, its, x, r, conv, stalled, dxn_prev = s
        f, g, eta, fit = measures(x, r)
        conv = conv | ((eta <= tol) & (fit <= tol))
        stalled = stalled | ~(jnp.isfinite(eta) & jnp.isfinite(fit))
        active = ~conv & ~stalled & (it < max_iters)
        dx, dr = low_aug(f, g)
        dxn = nan_max_abs(dx, axis=1)      # a NaN correction fails the contraction test
        # the corrections must contract (rate ~ kappa u_factor); otherwise give up
        stalled = stalled | (active & (it > 0) & ~(dxn <= _STAGNATION * dxn_prev))
        active = active & ~stalled
        x = jnp.where(active[:, None, :], x + dx, x)
        r = jnp.where(active[:, None, :], r + dr, r)
        its = its + jnp.any(active, axis=1).astype(jnp.int32)
        return it + 1, its, x, r, conv, stalled, jnp.where(active, dxn, dxn_prev)

    init = (jnp.asarray(0, jnp.int32), jnp.zeros(A.shape[:1], jnp.int32), x0, r0, false_k,
            false_k, inf_k)
    _, its, x, _, conv, _, _ = lax.while_loop(cond, body, init)

    def eta_of(x):
        """The optimality measure with the true residual b - A x of the returned x."""
        return measures(x, B - jnp.matmul(A, x))[2]

    e = eta_of(x)
    kappa_low = jax.vmap(partial(_cond_r, dtype=w))(R)
    # the refinement is backed by theory only for kappa_2(A) u_f < 1: beyond it the
    # low-precision R can neither vouch for x nor estimate kappa (an
    # exactly rank-deficient A "converged" with entries of 1e5, kappa_1(R_f32) 2e8)
    trusted = kappa_low * unit_roundoff(compute) < 1
    converged = jnp.all(conv, axis=1)
    need = ~(cast_ok & factor_ok & converged & trusted)
    p = need.shape[0]
    current = (x, e, jnp.full((p,), int(Status.CONVERGED), jnp.int32),
               jnp.full((p,), int(Reason.NONE), jnp.int32), jnp.zeros((p,), w))
    # only the rows that need it are refactored in the working precision (compaction)
    x, e, status, reason, kappa_f = recompute_rows(
        need, _fallback, (A, B, cast_ok, factor_ok, converged), current,
        capacity=capacity_for(capacity, p))
    # honest: a non-finite x has no meaningful optimality measure
    e = jnp.where(jnp.all(jnp.isfinite(x), axis=1), e, jnp.inf)
    # "CONVERGED" only where the measure says so (the fallback is not checked by the
    # refinement's stopping rule), as in solve
    status = jnp.where((status == int(Status.CONVERGED))
                       & ~(jnp.max(e, axis=1) <= inaccurate_above(tol, max(A.shape[1:]), w)),
                       int(Status.INACCURATE), status).astype(jnp.int32)
    res = B - jnp.matmul(A, x)         # one O(m n k) product for the info's residual
    info = SolveInfo(iterations=its, backward_error=jnp.max(e, axis=1),
                     fell_back=need, cond_value=jnp.where(need, kappa_f, kappa_low),
                     status=status, reason=reason,
                     residual_norm=relative_residual(colnorm(res), colnorm(B)).astype(w),
                     kind="lstsq")
    return x, info


@partial(jax.jit, static_argnames=("storage", "compute", "max_iters", "tol", "capacity"))
def _lstsq_batched(A, B, **kw):
    """:func:`_lstsq_core` with a ``custom_vmap`` rule that folds a ``vmap`` axis into the
    batch, so the fallback stays a compacted ``switch`` instead of a ``select``."""

    @custom_vmap
    def run(A, B):
        return _lstsq_core(A, B, **kw)

    @run.def_vmap
    def rule(axis_size, in_batched, A, B):
        folded = []
        for x, batched in zip((A, B), in_batched):
            if not batched:
                x = jnp.broadcast_to(x[None], (axis_size,) + x.shape)
            folded.append(x.reshape((axis_size * x.shape[1],) + x.shape[2:]))
        out = _lstsq_batched(*folded, **kw)
        out = jax.tree_util.tree_map(lambda y: y.reshape((axis_size, -1) + y.shape[1:]),
                                     out)
        return out, jax.tree_util.tree_map(lambda _: True, out)

    return run(A, B)


@partial(float64_call, describe=x64_need("lstsq", "f32"))
def lstsq(A, b, *, factor="f32", working="f64", max_iters=30, tol=None,
          fallback_capacity=0.125):
    r"""Least-squares solution of a tall system by low-precision QR plus refinement.

    Minimises ``||b - A x||_2`` for ``A`` of shape ``(..., m, n)`` with ``m >= n`` and full
    column rank. Semantics follow :func:`solve`: factor in ``factor`` precision, refine in
    ``working`` precision until the optimality measure ``eta = ||A^T r||_inf / (||A||_1
    (||A||_inf ||x||_inf + ||b||_inf))`` is at most ``tol`` (default ``sqrt(n) u_working``),
    else fall back to a working-precision QR (only executed when needed). Returns ``(x,
    info)`` with a :class:`SolveInfo`; ``info.backward_error`` is ``eta`` and
    ``info.cond_estimate`` estimates ``kappa_1(R)`` (a proxy for ``kappa_2(A)``).

    ``jit`` and ``vmap`` work. Reverse-mode differentiation is not implemented (the
    refinement loop is a ``while_loop``); differentiate :func:`solve` on the normal
    equations or ``jnp.linalg.lstsq`` instead.

    Args:
        A: ``(..., m, n)`` floating array, ``m >= n``.
        b: ``(m,)``, ``(..., m)`` or ``(..., m, k)``.
        factor, working, max_iters, tol, fallback_capacity: as in :func:`solve` (only
            the systems that need the working-precision QR compute it, up to
            ``fallback_capacity`` of a batch or of a ``vmap``; beyond that the whole batch).

    Example:
        >>> import numpy as np, jax.numpy as jnp
        >>> import adaptprec as ap
        >>> t = jnp.linspace(0.0, 1.0, 50)
        >>> A = jnp.stack([jnp.ones_like(t), t, t ** 2], axis=1)    # float64 (x64 on)
        >>> b = 1.0 + 2.0 * t - 3.0 * t ** 2 + 1e-3 * jnp.cos(40 * t)
        >>> x, info = ap.linalg.lstsq(A, b)
        >>> ref = np.linalg.lstsq(np.asarray(A), np.asarray(b), rcond=None)[0]
        >>> bool(np.allclose(x, ref, rtol=1e-12, atol=0)), ap.Status(int(info.status)).name
        (True, 'CONVERGED')
    """
    what = "lstsq"
    check_options("lu", max_iters, tol, what)
    storage, compute, w = resolve_precisions(factor, working, what=what)
    A = check_array(A, "A", what)
    if A.ndim < 2 or A.shape[-2] < A.shape[-1]:
        raise ValueError(
            f"{what}: A must be tall, shape (..., m, n) with m >= n; got shape "
            f"{tuple(A.shape)}. Wide (underdetermined) systems are not supported."
        )
    n = A.shape[-1]
    A3, B3, out_shape, batch = prepare_system(A, b, w, what)
    tol_ = float(math.sqrt(n) * unit_roundoff(w)) if tol is None else float(tol)
    capacity_for(fallback_capacity, 1)          # validates
    x, info = _lstsq_batched(A3, B3, storage=storage, compute=compute,
                             max_iters=int(max_iters), tol=tol_,
                             capacity=fallback_capacity)
    return x.reshape(out_shape), jax.tree_util.tree_map(lambda f: f.reshape(batch), info)
