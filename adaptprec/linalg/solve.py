r"""Mixed-precision linear solve: low-precision LU, working-precision refinement, fallback.

This is LAPACK ``dsgesv`` (and cuSOLVER IRS) for JAX:

1. round ``A`` to the factor precision (float32 by default) and factor ``P A = L U``;
2. ``x_0 = U^{-1} L^{-1} P b`` in the factor precision, upcast to the working precision;
3. repeat: ``r_i = b - A x_i`` in the working precision, correction ``d_i`` from the
   low-precision factors (``refine="lu"``) or from LU-preconditioned FGMRES run in the
   working precision (``refine="gmres"``, GMRES-IR), ``x_{i+1} = x_i + d_i``;
4. stop when every column satisfies (dsgesv's rule)

   .. math:: \|r\|_\infty \le \mathrm{tol}\,\|x\|_\infty\,\|A\|_\infty, \qquad
             \mathrm{tol} = \sqrt{n}\,u_{working} \text{ by default};

5. fall back to a working-precision LU when the cast overflowed, the low-precision factor
   is singular, or refinement stagnated (residual not halved) or hit ``max_iters``.

The fallback is a ``lax.cond`` on one scalar predicate (any system of the batch needs it),
so the working-precision factorization executes only when needed. Gradients are implicit
(``lax.custom_linear_solve``): the adjoint is another refined solve with ``A^T`` that reuses
the low-precision factors.
"""

from __future__ import annotations

import math
from functools import partial

import numpy as np

import jax
import jax.numpy as jnp
from jax import lax

from .._pytree import Module
from ..precision import max_value, unit_roundoff
from ._common import (
    apply,
    check_array,
    check_options,
    prepare_system,
    lu_solve,
    matrix_norms,
    resolve_precisions,
    scaled_lowsolve,
    zero_pivot,
)
from ._gmres import fgmres
from .cond import inverse_norm1

__all__ = ["solve", "SolveInfo", "STATUS_MESSAGES"]

#: Status codes of :class:`SolveInfo` (``success`` is ``status <= 3``).
STATUS_MESSAGES = {
    0: "converged: refinement from the low-precision factors reached working-precision "
       "accuracy",
    1: "converged after fallback: casting A to the factor precision overflowed, so A was "
       "factored in the working precision",
    2: "converged after fallback: the low-precision factor is singular or non-finite, so A "
       "was factored in the working precision",
    3: "converged after fallback: refinement stagnated or reached max_iters (A is too "
       "ill-conditioned for the factor precision), so A was factored in the working "
       "precision",
    4: "singular matrix: the working-precision factor has a zero pivot; x is NaN",
    5: "ill-conditioned: the condition estimate exceeds 1/u_working; x has a small backward "
       "error but may have no correct digits",
    6: "non-finite input: A or b contains NaN or Inf; x is NaN",
}

_GMRES_RESTART = 30
_GMRES_TOL = 1e-4
_STAGNATION = 0.5


class SolveInfo(Module):
    """Diagnostics of :func:`solve` / :func:`lstsq`, one entry per system.

    All fields are arrays with the leading batch shape of ``A`` (scalars for one system),
    so the info works under ``jit``/``vmap`` and can be returned from compiled code.

    Attributes:
        iterations: refinement steps after the initial low-precision solve (dsgesv's
            ``ITER``); for ``refine="gmres"`` these are outer steps.
        backward_error: normwise backward error of the returned ``x``, maximised over
            right-hand sides: ``||b - A x||_inf / (||A||_inf ||x||_inf + ||b||_inf)``
            (for :func:`lstsq`: ``||A^T r||_inf / (||A||_inf ||A||_1 ||x||_inf + ...)``,
            see its docstring).
        fell_back: True when the answer comes from the working-precision factorization.
        cond_estimate: Hager–Higham estimate of ``kappa_1(A)`` from the factors that
            produced ``x``.
        status: int code; :data:`STATUS_MESSAGES` has the text, ``message`` looks it up.

    Example:
        >>> import jax.numpy as jnp
        >>> import adaptprec as ap
        >>> x, info = ap.linalg.solve(jnp.eye(3) * 2.0, jnp.ones(3))  # float64: x64 on
        >>> int(info.status), bool(info.success), bool(info.fell_back)
        (0, True, False)
        >>> info.message
        'converged: refinement from the low-precision factors reached working-precision accuracy'
    """

    iterations: jax.Array
    backward_error: jax.Array
    fell_back: jax.Array
    cond_estimate: jax.Array
    status: jax.Array

    @property
    def success(self) -> jax.Array:
        """Boolean array: the returned ``x`` is a trustworthy answer (status 0..3)."""
        return self.status <= 3

    @property
    def message(self):
        """Text for ``status`` (a string, or a nested list for a batch). Needs concrete
        values: call it outside ``jit``."""
        if isinstance(self.status, jax.core.Tracer):
            raise TypeError(
                "SolveInfo.message needs a concrete status; return the info from jit and "
                "read .message outside, or use STATUS_MESSAGES[int(status)]"
            )
        codes = np.asarray(self.status)
        if codes.ndim == 0:
            return STATUS_MESSAGES[int(codes)]
        return np.vectorize(lambda c: STATUS_MESSAGES[int(c)], otypes=[object])(
            codes).tolist()


class _Factors(Module):
    """Low-precision LU of ``A^T`` (not ``A``): LAPACK wants column-major input, and the
    column-major layout of ``A^T`` is the row-major buffer of ``A``, so factoring the
    transpose saves a transposing copy of ``A`` (here and in the fallback). Solves with
    ``A`` are then transposed solves with these factors."""

    lu: jax.Array        # (m, n, n) factor compute dtype: A^T[perm] = L U
    perm: jax.Array      # (m, n)
    cast_ok: jax.Array   # (m,) A finite after rounding to the factor precision
    factor_ok: jax.Array  # (m,) no zero / non-finite pivot
    norminf: jax.Array   # (m,) ||A||_inf, working dtype


def _factor(A, storage, compute) -> _Factors:
    """Round A once to the factor precision and factor ``A^T``.

    ``||A||_inf`` comes from one read of ``A`` in the working precision; it also decides
    whether the cast can overflow (no entry can exceed the largest row sum), so a NaN/Inf
    or too-large entry sets ``cast_ok = False`` without another pass over ``A``.
    """
    ninf = jnp.max(jnp.sum(jnp.abs(A), axis=-1), axis=-1)
    cast_ok = ninf <= max_value(storage)
    a_low = A.astype(storage)
    if np.dtype(compute) != np.dtype(storage):
        a_low = a_low.astype(compute)
    lu, _, perm = lax.linalg.lu(jnp.swapaxes(a_low, -1, -2))
    factor_ok = ~jax.vmap(zero_pivot)(lu)
    return _Factors(lu, perm, cast_ok, factor_ok, ninf)


def _colnorm(x):
    """inf-norm of every column of a batch ``(m, n, k)`` -> ``(m, k)``."""
    return jnp.max(jnp.abs(x), axis=1)


def _norm1(A):
    """||A||_1 of each matrix of a batch (only computed by consumers that need it)."""
    return jnp.max(jnp.sum(jnp.abs(A), axis=-2), axis=-1)


def _refine(A, B, fac: _Factors, *, transpose, refine, max_iters, tol, estimate_cond):
    """Refine all systems of the batch; fall back where needed. A (m,n,n), B (m,n,k)."""
    w = A.dtype
    m, n, _ = A.shape
    anrm = _norm1(A) if transpose else fac.norminf   # ||op(A)||_inf
    tf = not transpose   # the factors are of A^T: solves with op(A) flip the transpose
    mv = jax.vmap(partial(apply, transpose=transpose))
    low = jax.vmap(partial(scaled_lowsolve, work_dtype=w, transpose=tf))

    if refine == "lu":
        def correct(r):
            return low(fac.lu, fac.perm, r)
    else:
        def correct_one(a, lu, perm, r):
            def matvec(v):
                return apply(a, v[:, None], transpose=transpose)[:, 0]

            def precond(v):
                return scaled_lowsolve(lu, perm, v[:, None], w, transpose=tf)[:, 0]

            col = partial(fgmres, matvec, precond, restart=min(n, _GMRES_RESTART),
                          tol=_GMRES_TOL)
            return jax.vmap(col, in_axes=1, out_axes=1)(r)

        def correct(r):
            return jax.vmap(correct_one)(A, fac.lu, fac.perm, r)

    thresh = (anrm * jnp.asarray(tol, w))[:, None]       # (m, 1)

    x0 = low(fac.lu, fac.perm, B)
    r0 = B - mv(A, x0)
    rn0 = _colnorm(r0)
    xn0 = _colnorm(x0)
    conv0 = rn0 <= xn0 * thresh
    bad0 = ~(jnp.isfinite(rn0) & jnp.isfinite(xn0))
    its0 = jnp.zeros((m,), jnp.int32)

    def cond(s):
        it, _, _, _, _, conv, stalled = s
        return (it < max_iters) & jnp.any(~conv & ~stalled)

    def body(s):
        it, its, x, r, rn, conv, stalled = s
        active = ~conv & ~stalled                                  # (m, k)
        d = correct(r)
        x_new = jnp.where(active[:, None, :], x + d, x)
        r_new = B - mv(A, x_new)
        rn_new = _colnorm(r_new)
        xn_new = _colnorm(x_new)
        conv_new = conv | (active & (rn_new <= xn_new * thresh))
        progress = rn_new <= _STAGNATION * rn                       # False on NaN
        stalled_new = stalled | (active & ~conv_new & ~progress)
        keep_old = active & ~(rn_new <= rn)                         # residual grew: revert
        x_out = jnp.where(keep_old[:, None, :], x, x_new)
        r_out = jnp.where(keep_old[:, None, :], r, r_new)
        rn_out = jnp.where(keep_old, rn, rn_new)
        its = its + jnp.any(active, axis=1).astype(jnp.int32)
        return it + 1, its, x_out, r_out, rn_out, conv_new, stalled_new

    init = (jnp.asarray(0, jnp.int32), its0, x0, r0, rn0, conv0, bad0)
    _, its, x, r, _, conv, _ = lax.while_loop(cond, body, init)

    ok = fac.cast_ok & fac.factor_ok & jnp.all(conv, axis=1)
    need = ~ok
    u_w = unit_roundoff(w)

    def fallback(ops):
        x, r, anrm_ = ops
        lu64, _, perm64 = lax.linalg.lu(jnp.swapaxes(A, -1, -2))
        xf = jax.vmap(partial(lu_solve, transpose=tf))(lu64, perm64, B)
        rf = B - mv(A, xf)
        zero = jax.vmap(zero_pivot)(lu64)
        finite_in = (jnp.all(jnp.isfinite(A), axis=(1, 2))
                     & jnp.all(jnp.isfinite(B), axis=(1, 2)))
        n1, ninf = jax.vmap(matrix_norms)(A)
        anrm_f = n1 if transpose else ninf
        # kappa_1(op(A)) = ||op(A)||_1 ||op(A)^{-1}||_1; op(A)^{-1} = M^{-T} for tf.
        kappa = (ninf if transpose else n1) * jax.vmap(
            partial(inverse_norm1, dtype=w, transpose=tf))(lu64, perm64)
        nan_out = need & (zero | ~finite_in)
        sel = need[:, None, None]
        x = jnp.where(sel, xf, x)
        x = jnp.where(nan_out[:, None, None], jnp.asarray(jnp.nan, w), x)
        r = jnp.where(sel, rf, r)
        status = jnp.select(
            [~finite_in, zero, kappa * u_w >= 1, ~fac.cast_ok, ~fac.factor_ok],
            [6, 4, 5, 1, 2], default=3).astype(jnp.int32)
        return x, r, jnp.where(need, anrm_f, anrm_), jnp.where(need, status, 0), kappa

    def keep(ops):
        x, r, anrm_ = ops
        return x, r, anrm_, jnp.zeros((m,), jnp.int32), jnp.zeros((m,), w)

    x, r, anrm, status, kappa_f = lax.cond(jnp.any(need), fallback, keep, (x, r, anrm))

    if estimate_cond:
        kappa_low = (fac.norminf if transpose else _norm1(A)) * jax.vmap(
            partial(inverse_norm1, dtype=w, transpose=tf))(fac.lu, fac.perm)
    else:
        kappa_low = jnp.full((m,), jnp.nan, w)
    kappa = jnp.where(need, kappa_f, kappa_low)
    bn, xn, rn = _colnorm(B), _colnorm(x), _colnorm(r)
    denom = anrm[:, None] * xn + bn
    eta = jnp.where(denom > 0, rn / jnp.where(denom > 0, denom, 1), jnp.where(rn > 0, jnp.inf, 0))
    info = SolveInfo(iterations=its, backward_error=jnp.max(eta, axis=1).astype(w),
                     fell_back=need, cond_estimate=kappa, status=status)
    return x, info


@partial(jax.jit, static_argnames=("storage", "compute", "refine", "max_iters", "tol",
                                   "estimate_cond"))
def _solve_batched(A, B, *, storage, compute, refine, max_iters, tol, estimate_cond):
    A_s = lax.stop_gradient(A)
    fac = _factor(A_s, storage, compute)
    kw = dict(refine=refine, max_iters=max_iters, tol=tol, estimate_cond=estimate_cond)

    def matvec(X):
        return jnp.matmul(A, X)

    def solve_fn(_matvec, rhs):
        return _refine(A_s, rhs, fac, transpose=False, **kw)

    def transpose_solve_fn(_vecmat, rhs):
        return _refine(A_s, rhs, fac, transpose=True, **kw)

    return lax.custom_linear_solve(matvec, B, solve_fn, transpose_solve_fn, has_aux=True)


def solve(A, b, *, factor="f32", working="f64", refine="lu", max_iters=30, tol=None,
          estimate_cond=True):
    r"""Solve ``A x = b`` by low-precision LU and working-precision iterative refinement.

    LAPACK ``dsgesv`` semantics (see the module docstring and ``docs/linalg.md``): factor
    ``A`` once in ``factor`` precision, refine in ``working`` precision until
    :math:`\|r\|_\infty \le \mathrm{tol}\,\|x\|_\infty\|A\|_\infty` for every right-hand
    side, else fall back to a ``working``-precision LU (executed only when needed).

    Args:
        A: ``(..., n, n)`` floating array.
        b: ``(n,)``, ``(..., n)`` (one vector per matrix: ``b.ndim == A.ndim - 1``) or
            ``(..., n, k)`` (``k`` right-hand sides). Batch dimensions broadcast.
        factor: precision of the LU factors: ``"f32"`` (default), ``"bf16"``/``"f16"``
            (A is rounded to that format and factored with float32 arithmetic: XLA has no
            half-precision LU) or the working precision itself.
        working: precision of ``x``, residuals and the fallback (``"f64"`` needs
            ``jax_enable_x64``; ``"f32"`` with a half-precision factor also works).
        refine: ``"lu"`` (corrections from the low-precision factors, dsgesv) or
            ``"gmres"`` (GMRES-IR: LU-preconditioned FGMRES in the working precision,
            converges for larger condition numbers before falling back).
        max_iters: cap on refinement steps (dsgesv's ``ITERMAX = 30``).
        tol: stopping tolerance; default :math:`\sqrt{n}\,u_{working}`.
        estimate_cond: compute ``info.cond_estimate`` on the refinement path (a few
            pairs of O(n^2) triangular solves; under ``jit`` XLA drops it anyway when the
            caller ignores it). ``False`` gives NaN there; the fallback path always
            estimates it (it decides status 5).

    Returns:
        ``(x, info)``: ``x`` in the working dtype with ``b``'s shape (batch-broadcast), and
        a :class:`SolveInfo` whose fields have the batch shape.

    Raises:
        ValueError: non-square ``A``, mismatched shapes, non-floating dtypes, unknown
            options, or (for concrete inputs, outside ``jit``) NaN/Inf in ``A`` or ``b``.
            Inside ``jit`` non-finite input gives status 6 and NaN ``x``.

    ``jit``, ``vmap`` and ``grad``/``jvp`` work (gradients by implicit differentiation:
    ``b_bar = A^{-T} x_bar``, ``A_bar = -b_bar x^T``, with the adjoint refined on the same
    factors). Under ``jax.vmap`` the fallback ``lax.cond`` becomes a ``select`` and the
    working-precision LU runs for every member; pass the batch as leading dimensions
    instead to run it only when some member needs it.

    Example:
        >>> import jax.numpy as jnp
        >>> import adaptprec as ap
        >>> A = jnp.array([[4.0, 1.0], [1.0, 3.0]])          # float64 (x64 on)
        >>> x, info = ap.linalg.solve(A, jnp.array([1.0, 2.0]))
        >>> bool(jnp.allclose(A @ x, jnp.array([1.0, 2.0]), rtol=0, atol=1e-15))
        True
        >>> int(info.status), bool(info.fell_back), bool(info.backward_error < 1e-15)
        (0, False, True)
    """
    what = "solve"
    check_options(refine, max_iters, tol, what)
    storage, compute, w = resolve_precisions(factor, working, what=what)
    A = check_array(A, "A", what)
    if A.ndim < 2 or A.shape[-1] != A.shape[-2]:
        raise ValueError(
            f"{what}: A must be a square matrix or a stack of them, shape (..., n, n); got "
            f"shape {tuple(A.shape)}. For rectangular A use ap.linalg.lstsq."
        )
    n = A.shape[-1]
    A3, B3, out_shape, batch = prepare_system(A, b, w, what)
    tol_ = float(math.sqrt(n) * unit_roundoff(w)) if tol is None else float(tol)
    x, info = _solve_batched(A3, B3, storage=storage, compute=compute, refine=refine,
                             max_iters=int(max_iters), tol=tol_,
                             estimate_cond=bool(estimate_cond))
    x = x.reshape(out_shape)
    info = jax.tree_util.tree_map(lambda f: f.reshape(batch), info)
    return x, info

