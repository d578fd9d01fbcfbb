r"""Iterative refinement of a batch of systems on low-precision factors, and the
working-precision fallback: the body of :func:`~adaptprec.linalg.solve`.

For ``A`` ``(m, n, n)``, ``B`` ``(m, n, k)`` and the factors of ``A^T``
(:class:`~adaptprec.linalg._factors.Factors`), :func:`refine_and_fall_back` runs

1. :func:`correctors`: ``x_0 = op(A)^{-1} B`` from the factors, and the correction
   ``d \approx op(A)^{-1} r`` (LU-IR: from the factors; GMRES-IR: FGMRES in the working
   precision, preconditioned by them);
2. :func:`initial_kappa`: the factors' estimate of ``\kappa_\infty(op(A))`` where the call
   needs it;
3. :func:`refinement_loop`: ``x_{i+1} = x_i + d_i`` until each column converges or stalls;
4. :func:`screen_conditioning`: ``ILL_CONDITIONED`` where convergence does not bound
   ``\kappa``;
5. :func:`fallback_solve` on the systems that did not converge (compacted by
   :func:`~adaptprec._compaction.recompute_rows`);
6. :func:`solve_info`: backward error, residual and status of the returned ``x``.

:func:`refine_batched` adds the ``custom_vmap`` rule that folds a ``vmap`` axis into the
batch.
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
from jax import lax
from jax.custom_batching import custom_vmap

from .._compaction import capacity_for, recompute_rows
from .._status import Reason, Status
from ..precision import unit_roundoff
from ._common import apply, lu_solve, pow2_scale, zero_pivot
from ._factors import (Factors, chol_inverse_norm1, chol_ok, chol_solve, hh_kappa, low_one,
                       low_solver, norm1, use_panels)
from ._getrf import lu_factor_transposed
from ._gmres import fgmres
from ._solve_info import (CondFactors, SolveInfo, backward_error, colnorm, inaccurate_above,
                          relative_residual)
from ._trsv import make_panels
from .cond import inverse_norm1

__all__ = ["refine_and_fall_back", "refine_batched"]

#: GMRES-IR: FGMRES restart length and the relative tolerance each correction is solved to
#: (refinement needs a contraction, not an accurate correction)
GMRES_RESTART = 30
GMRES_TOL = 1e-4
#: a refinement step must reduce ||r||_inf by this factor, else the column has stagnated
STAGNATION = 0.5
CONVERGED = int(Status.CONVERGED)


def correctors(A, fac: Factors, *, transpose, refine):
    r"""``(low, correct)`` for the batch; the factors are of ``A^T``, so solves with
    ``op(A)`` are transposed solves with them (``tm = not transpose``).

    ``low(R)`` solves ``op(A) X = R`` with the low-precision factors.
    ``correct(r, lu, trans=tm)`` is the refinement's correction ``d \approx op(A)^{-1} r``
    from the factor ``lu`` the loop carries (with ``trans`` flipped:
    ``op(A)^{-T} r``, for the condition estimate):

    * ``refine="lu"`` (LU-IR): ``d = op(A)^{-1} r`` with the low-precision factors (blocked
      panel solves when :func:`~adaptprec.linalg._factors.use_panels`);
    * ``refine="gmres"`` (GMRES-IR): FGMRES on ``op(A) d = r`` with working-precision
      products, preconditioned by the low-precision solve, each column to ``GMRES_TOL``.
    """
    w = A.dtype
    n = A.shape[-1]
    tm = not transpose

    if use_panels(fac, refine):
        solver = make_panels(jnp.swapaxes(fac.lu, -1, -2))     # one copy of the factor
    else:
        solver = None
    low_t = low_solver(fac.lu if solver is None else solver, fac.perm, fac.scale, w)

    def low(R, trans=tm):
        return low_t(R, trans)

    if refine == "lu":
        def correct(r, lu, trans=tm):
            return low_solver(lu if solver is None else solver, fac.perm, fac.scale,
                              w)(r, trans)
        return low, correct

    def correct_one(a, lu, perm, sc, r, trans=tm):
        # trans == tm: op(A) d = r; otherwise op(A)^T d = r (the condition estimate)
        op_t = transpose if trans == tm else not transpose

        def matvec(v):
            return apply(a, v[:, None], transpose=op_t)[:, 0]

        def precond(v):
            return low_one(lu, perm, sc, v[:, None], w, trans)[:, 0]

        col = partial(fgmres, matvec, precond, restart=min(n, GMRES_RESTART), tol=GMRES_TOL)
        return jax.vmap(col, in_axes=1, out_axes=1)(r)

    def correct(r, lu, trans=tm):
        one = partial(correct_one, trans=trans)
        if fac.perm is None:
            return jax.vmap(lambda a, l, sc, r: one(a, l, None, sc, r))(
                A, lu, fac.scale, r)
        return jax.vmap(one)(A, lu, fac.perm, fac.scale, r)

    return low, correct


def initial_kappa(low, anrm, fac_good, *, computed, tm, n, w):
    """The factors' estimate of ``kappa_inf(op(A))`` (:func:`hh_kappa`, four single-column
    low-precision solves) when ``computed``: ``inf`` where the factors are bad or the
    estimate is not finite. NaN for every system when not ``computed`` (deferred or off).
    """
    m = anrm.shape[0]
    if not computed:
        return jnp.full((m,), jnp.nan, w)
    kappa_low = hh_kappa(low, anrm, tm, n)
    return jnp.where(fac_good & jnp.isfinite(kappa_low), kappa_low, jnp.asarray(jnp.inf, w))


def refinement_loop(A, B, x0, lu, fac_good, anrm, *, correct, mv, tol, max_iters):
    r"""Refine every column of every system until it converges or stalls.

    .. math:: r_i = b - op(A)\,x_i, \qquad x_{i+1} = x_i + d_i, \qquad
              d_i = \mathrm{correct}(r_i).

    A column converges when :math:`\|r\|_\infty \le \mathrm{tol}\,\|x\|_\infty
    \|op(A)\|_\infty` (dsgesv's test); it stalls when a step does not reduce
    :math:`\|r\|_\infty` by ``STAGNATION``, and from the start when ``x_0`` or ``r_0`` is not
    finite or its factors are bad (``fac_good`` false). A step that makes the residual grow
    is reverted (the column keeps its best ``x``). At most ``max_iters`` steps.

    The factor ``lu`` travels through the loop and comes back out: the corrections read it
    from the loop state and the deferred condition estimate keeps the loop's output, one
    buffer throughout (tests/test_linalg_cost.py checks on the compiled program that
    returning it costs no copy).

    Returns ``(iterations (m,), x, r, converged (m, k), lu)``.
    """
    m, w = A.shape[0], A.dtype
    thresh = (anrm * jnp.asarray(tol, w))[:, None]       # (m, 1)
    r0 = B - mv(A, x0)
    rn0 = colnorm(r0)
    xn0 = colnorm(x0)
    conv0 = rn0 <= xn0 * thresh
    bad0 = ~(jnp.isfinite(rn0) & jnp.isfinite(xn0)) | ~fac_good[:, None]
    its0 = jnp.zeros((m,), jnp.int32)

    def cond(s):
        it, _, _, _, _, conv, stalled, _ = s
        return (it < max_iters) & jnp.any(~conv & ~stalled)

    def body(s):
        it, its, x, r, rn, conv, stalled, lu = s
        active = ~conv & ~stalled                                  # (m, k)
        d = correct(r, lu)
        x_new = jnp.where(active[:, None, :], x + d, x)
        r_new = B - mv(A, x_new)
        rn_new = colnorm(r_new)
        xn_new = colnorm(x_new)
        conv_new = conv | (active & (rn_new <= xn_new * thresh))
        progress = rn_new <= STAGNATION * rn                        # False on NaN
        stalled_new = stalled | (active & ~conv_new & ~progress)
        keep_old = active & ~(rn_new <= rn)                         # residual grew: revert
        x_out = jnp.where(keep_old[:, None, :], x, x_new)
        r_out = jnp.where(keep_old[:, None, :], r, r_new)
        rn_out = jnp.where(keep_old, rn, rn_new)
        its = its + jnp.any(active, axis=1).astype(jnp.int32)
        return it + 1, its, x_out, r_out, rn_out, conv_new, stalled_new, lu

    init = (jnp.asarray(0, jnp.int32), its0, x0, r0, rn0, conv0, bad0, lu)
    _, its, x, r, _, conv, _, lu_out = lax.while_loop(cond, body, init)
    return its, x, r, conv, lu_out


def screen_conditioning(kappa_low, need, *, screen, at_working, estimate_cond, u_factor,
                        correct, lu, anrm, tm, n, w):
    r"""``(status, kappa)`` of the systems refinement solved (``need`` false).

    Refinement converges only where :math:`\kappa\,u_f < 1` (LU-IR), which bounds
    :math:`\kappa\,u_w` when the factors are coarser than the working precision. Two cases
    need the estimate to decide ``ILL_CONDITIONED`` (:math:`\kappa\,u_w \ge 1`, as the
    fallback decides it):

    * ``screen`` (GMRES-IR): it converges beyond :math:`\kappa\,u_f \approx 1`, where the
      factors are numerically singular at their own precision and no longer estimate
      :math:`\kappa`. There :math:`\kappa` is estimated again by the same Hager–Higham
      steps with solves through GMRES-IR itself (working-precision products, the factors
      as preconditioner), only when some system needs it (``lax.cond``);
    * ``at_working`` (LU-IR with factors at the working precision): ``x_0`` passes the
      stopping test at once whatever :math:`\kappa`, so the factors' estimate decides.

    With ``estimate_cond="none"`` the returned ``kappa`` is NaN again in both cases.
    ``w`` is the working dtype (``u_w`` is its unit roundoff).
    """
    m = need.shape[0]
    u_w = unit_roundoff(w)
    status = jnp.full((m,), CONVERGED, jnp.int32)
    if screen:
        untrusted = ~(kappa_low * u_factor < 1) & ~need

        def through_gmres(_):
            return hh_kappa(lambda R, trans: correct(R, lu, trans), anrm, tm, n)

        kappa_gm = lax.cond(jnp.any(untrusted), through_gmres,
                            lambda _: jnp.zeros((m,), w), None)
        kappa_low = jnp.where(untrusted, jnp.maximum(kappa_gm, kappa_low), kappa_low)
        status = jnp.where(untrusted & ~(kappa_low * u_w < 1),
                           int(Status.ILL_CONDITIONED), status).astype(jnp.int32)
        if estimate_cond == "none":
            kappa_low = jnp.full((m,), jnp.nan, w)
    if at_working:
        status = jnp.where(~need & ~(kappa_low * u_w < 1),
                           int(Status.ILL_CONDITIONED), status).astype(jnp.int32)
        if estimate_cond == "none":
            kappa_low = jnp.full((m,), jnp.nan, w)
    return status, kappa_low


def fallback_solve(ops, *, transpose, kind):
    r"""Working-precision solve of the given rows (any number of them):
    ``(x, r, ||op(A)||_inf, status, reason, kappa)``.

    ``(s A) x = s b`` with ``s`` a power of 2 that brings ``\|A\|`` near 1
    (:func:`~adaptprec.linalg._common.pow2_scale`; ``\kappa`` does not change), factored
    in the working precision (LU of ``A^T``, or Cholesky), with ``\kappa_\infty(op(A)) =
    \|op(A)\|_\infty \|op(A)^{-T}\|_1`` estimated on these factors. Status: non-finite
    input, a zero pivot (or Cholesky breakdown), ``\kappa u_w \ge 1``, else ``CONVERGED``;
    ``x`` is NaN after the first two. Reason: why the low-precision path did not suffice
    (non-finite input, overflow in the cast, a singular factor, else stagnation).
    """
    A_, B_, cast_ok, factor_ok = ops
    w = A_.dtype
    u_w = unit_roundoff(w)
    tm = not transpose
    mv = jax.vmap(partial(apply, transpose=transpose))
    finite_in = (jnp.all(jnp.isfinite(A_), axis=(1, 2))
                 & jnp.all(jnp.isfinite(B_), axis=(1, 2)))
    anrm_f = norm1(A_) if transpose else jnp.max(jnp.sum(jnp.abs(A_), axis=-1), -1)
    s1, s2 = pow2_scale(anrm_f, w)
    As, Bs = A_ * s1 * s2, B_ * s1 * s2
    anrm_s = anrm_f * s1[:, 0, 0] * s2[:, 0, 0]   # ||s A||: kappa does not change
    At = jnp.swapaxes(As, -1, -2)
    if kind == "chol":
        L = lax.linalg.cholesky(At, symmetrize_input=False)
        bad = ~chol_ok(L)
        xf = jax.vmap(chol_solve)(L, Bs)
        kappa = anrm_s * jax.vmap(partial(chol_inverse_norm1, dtype=w))(L)
        s_bad = int(Status.NOT_POSITIVE_DEFINITE)
    else:
        f64_, perm64 = lu_factor_transposed(As)
        lu64 = jnp.swapaxes(f64_, -1, -2)
        bad = jax.vmap(zero_pivot)(lu64)
        xf = jax.vmap(partial(lu_solve, transpose=tm))(lu64, perm64, Bs)
        kappa = anrm_s * jax.vmap(
            partial(inverse_norm1, dtype=w, transpose=not tm))(lu64, perm64)
        s_bad = int(Status.SINGULAR)
    rf = B_ - mv(A_, xf)
    nan_out = bad | ~finite_in
    xf = jnp.where(nan_out[:, None, None], jnp.asarray(jnp.nan, w), xf)
    status = jnp.select(
        [~finite_in, bad, kappa * u_w >= 1],
        [int(Status.NONFINITE_INPUT), s_bad, int(Status.ILL_CONDITIONED)],
        default=CONVERGED).astype(jnp.int32)
    reason = jnp.select(
        [~finite_in, ~cast_ok, ~factor_ok],
        [int(Reason.NONFINITE), int(Reason.OVERFLOW), int(Reason.SINGULAR_FACTOR)],
        default=int(Reason.STAGNATION)).astype(jnp.int32)
    return xf, rf, anrm_f, status, reason, kappa


def solve_info(x, r, B, anrm, *, iterations, fell_back, status, reason, kappa,
               cond_factors, tol, w):
    r"""The :class:`SolveInfo` of the returned ``x``: ``\eta`` (:func:`backward_error`) and
    the relative residual, maximised over the right-hand sides.

    ``CONVERGED`` holds only with a working-precision backward error: a fallback's answer
    is not checked by refinement's stopping test, so ``\eta`` above
    :func:`inaccurate_above` turns it into ``INACCURATE``.
    """
    n = B.shape[1]
    rn, bn = colnorm(r), colnorm(B)
    eta = backward_error(anrm, colnorm(x), rn, bn)
    eta_max = jnp.max(eta, axis=1)
    status = jnp.where((status == CONVERGED) & ~(eta_max <= inaccurate_above(tol, n, w)),
                       int(Status.INACCURATE), status).astype(jnp.int32)
    return SolveInfo(iterations=iterations, backward_error=eta_max.astype(w),
                     fell_back=fell_back, cond_value=kappa, status=status, reason=reason,
                     residual_norm=relative_residual(rn, bn).astype(w),
                     cond_factors=cond_factors)


def refine_and_fall_back(A, B, fac: Factors, *, transpose, refine, max_iters, tol,
                         estimate_cond, kind, capacity, u_factor):
    """Refine all systems of the batch and fall back where needed: ``(x, SolveInfo)``.

    ``A`` ``(m, n, n)``, ``B`` ``(m, n, k)``; solves ``op(A) x = B`` with ``op(A) = A^T``
    when ``transpose`` (the adjoint of a gradient). The steps are the module docstring's.
    ``estimate_cond``: ``"lazy"`` keeps the factors in the info for the deferred estimate
    (also for the transposed solve, whose aux info must have the forward structure),
    ``"eager"`` computes it here, ``"none"`` gives NaN.
    """
    w = A.dtype
    m, n, _ = A.shape
    anrm = norm1(A) if transpose else fac.norminf   # ||op(A)||_inf
    tm = not transpose   # the factors are of A^T: solves with op(A) flip the transpose
    mv = jax.vmap(partial(apply, transpose=transpose))
    low, correct = correctors(A, fac, transpose=transpose, refine=refine)
    fac_good = fac.cast_ok & fac.factor_ok
    x0 = low(B)
    screen = refine == "gmres"
    at_working = refine == "lu" and not u_factor > float(unit_roundoff(w))
    keep_factors = estimate_cond == "lazy" and not (screen or at_working)
    kappa_low = initial_kappa(low, anrm, fac_good, tm=tm, n=n, w=w,
                              computed=estimate_cond == "eager" or screen or at_working)
    its, x, r, conv, lu_out = refinement_loop(A, B, x0, fac.lu, fac_good, anrm,
                                              correct=correct, mv=mv, tol=tol,
                                              max_iters=max_iters)
    # F = lu^T is the row-major view of the LAPACK factor: no copy
    cond_factors = (CondFactors(jnp.swapaxes(lu_out, -1, -2), fac.perm, fac.scale,
                                fac.norminf) if keep_factors else None)
    need = ~(fac_good & jnp.all(conv, axis=1))
    status, kappa_low = screen_conditioning(
        kappa_low, need, screen=screen, at_working=at_working, estimate_cond=estimate_cond,
        u_factor=u_factor, correct=correct, lu=fac.lu, anrm=anrm, tm=tm, n=n, w=w)
    current = (x, r, anrm, status, jnp.full((m,), int(Reason.NONE), jnp.int32), kappa_low)
    x, r, anrm, status, reason, kappa = recompute_rows(
        need, partial(fallback_solve, transpose=transpose, kind=kind),
        (A, B, fac.cast_ok, fac.factor_ok), current, capacity=capacity_for(capacity, m))
    info = solve_info(x, r, B, anrm, iterations=its, fell_back=need, status=status,
                      reason=reason, kappa=kappa, cond_factors=cond_factors, tol=tol, w=w)
    return x, info


def refine_batched(A, B, fac: Factors, **kw):
    """:func:`refine_and_fall_back` with a ``custom_vmap`` rule: a ``vmap`` axis is folded
    into the batch axis (so the fallback stays a compacted ``switch``, not a ``select``)."""
    leaves, treedef = jax.tree_util.tree_flatten(fac)

    @custom_vmap
    def run(A, B, *leaves):
        fac = jax.tree_util.tree_unflatten(treedef, leaves)
        return refine_and_fall_back(A, B, fac, **kw)

    @run.def_vmap
    def rule(axis_size, in_batched, A, B, *leaves):
        args = (A, B) + tuple(leaves)
        if not any(in_batched):
            out = run(*args)
            return out, jax.tree_util.tree_map(lambda _: False, out)
        if not in_batched[0] and not any(in_batched[2:]):
            # only b is mapped (e.g. jacfwd): the members share A and its factors, so the
            # mapped axis becomes more right-hand sides of the same systems (no copies of
            # A); their info is shared, i.e. the worst case over the members
            m, n, k = B.shape[1:]
            Bf = jnp.moveaxis(B, 0, -2).reshape(m, n, axis_size * k)
            x, info = refine_batched(A, Bf, jax.tree_util.tree_unflatten(treedef, leaves),
                                     **kw)
            x = jnp.moveaxis(x.reshape(m, n, axis_size, k), -2, 0)
            info = jax.tree_util.tree_map(
                lambda f: jnp.broadcast_to(f[None], (axis_size,) + f.shape), info)
            out = (x, info)
            return out, jax.tree_util.tree_map(lambda _: True, out)
        folded = []
        for x, batched in zip(args, in_batched):
            if not batched:
                x = jnp.broadcast_to(x[None], (axis_size,) + x.shape)
            folded.append(x.reshape((axis_size * x.shape[1],) + x.shape[2:]))
        fac_f = jax.tree_util.tree_unflatten(treedef, folded[2:])
        out = refine_batched(folded[0], folded[1], fac_f, **kw)
        out = jax.tree_util.tree_map(lambda y: y.reshape((axis_size, -1) + y.shape[1:]),
                                     out)
        return out, jax.tree_util.tree_map(lambda _: True, out)

    return run(A, B, *leaves)
