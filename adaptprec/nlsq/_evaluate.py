"""The in-memory evaluation: residual and Jacobian at a point on a rung, handed to the
step as the factored Gauss-Newton model (:class:`._state.Evaluation`), and the final
evaluation on the top rung.

Two forms, chosen statically by the solve's options:

* **dense**: the ``m x n`` Jacobian by ``jacfwd``/``jacrev`` (or the user's / finite
  differences), loss-scaled, factored by a QR of ``[J f]`` or the normal equations
  (:func:`._factor.factor`);
* **blocked** (a residual proven pointwise, the normal equations): ``J^T J``, ``J^T f``
  and the cost summed over blocks of points (:class:`._blocks.PointBlocks`), each block's
  residual and Jacobian rows formed and consumed while in cache. Below the top rung, with
  the linear loss, one Gram matrix of ``[J f]`` per block gives all three sums, and the
  model is moved from the point rounded to the rung back to ``x``.

Only ``O(n^2)`` leaves an evaluation: the ``m``-vectors stay inside.

Example:
    >>> import jax.numpy as jnp, numpy as np
    >>> from adaptprec.nlsq._evaluate import evaluation_branches
    >>> from adaptprec.nlsq._state import Options
    >>> opts = Options(n=1, rungs=(np.dtype("float64"),), method="lm", loss="linear",
    ...                jac="fwd", jac_scale=True, has_bounds=False, max_steps=10,
    ...                linear_solver="qr", max_rejections=4, cond_tol=1e-2, schedule=None)
    >>> (branch,) = evaluation_branches(lambda x, t: x[0] * t - 1.0, opts)
    >>> ev = branch(jnp.ones(1), ((jnp.arange(3.0),),), 1.0)
    >>> float(ev.cost)
    1.5
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from .. import guards
from ._blocks import TARGET_BLOCK, PointBlocks, block_size
from ._factor import factor, factor_gram, working_dtype
from ._state import Evaluation, Options
from .common import robust_cost, scale_for_robust_loss

__all__ = ["evaluation_branches", "final_evaluation", "rung_blocks", "LOWER_RUNG_BLOCK"]

#: Points per block on the rungs below the top (the top keeps ``_blocks.TARGET_BLOCK``):
#: a cheaper rung spends a larger share of its evaluation in the scan's fixed cost per
#: block; 16384 float32 points (6 vectors of a block, 375 KiB) still sit in L2.
LOWER_RUNG_BLOCK = 4 * TARGET_BLOCK


def rung_blocks(opts: Options) -> list | None:
    """The blocking of the data on each rung (``None``: the dense evaluation)."""
    if opts.point_axes is None:
        return None
    top = PointBlocks(opts.m, opts.point_axes)
    lower = [PointBlocks(opts.m, opts.point_axes, size=block_size(opts.m, LOWER_RUNG_BLOCK))
             for _ in opts.rungs[:-1]]
    return lower + [top]


def evaluation_branches(fun, opts: Options) -> list:
    """One evaluation per rung, ``branch(x, args_by_rung, f_scale) -> Evaluation``
    (``args_by_rung``: the data cast to each rung, blocked when the solve is)."""
    blocks = rung_blocks(opts)
    if blocks is None:
        return [_dense_branch(fun, opts, i) for i in range(len(opts.rungs))]
    return [_blocked_branch(fun, opts, i, blocks[i]) for i in range(len(opts.rungs))]


def _residual_and_jacobian(fun, jac, x, args):
    if callable(jac):
        return fun(x, *args), jac(x, *args)

    def both(z):
        out = fun(z, *args)
        return out, out

    jf = jax.jacfwd if jac == "fwd" else jax.jacrev
    J, f = jf(both, has_aux=True)(x)
    return f, J


def _dense_branch(fun, opts: Options, i: int):
    dt, top_dt = opts.rungs[i], opts.rungs[-1]
    wt = working_dtype(dt)
    loss = opts.loss

    def branch(x, args_all, f_scale):
        f, J = _residual_and_jacobian(fun, opts.jac, x.astype(dt), args_all[i])
        f = f.astype(wt)
        J = jnp.asarray(J).astype(wt)
        fs, Js = scale_for_robust_loss(loss, f, J, jnp.asarray(f_scale, wt))
        R, qtf = factor(Js, fs, opts.linear_solver)
        jok = guards.finite_values((R, qtf)).ok
        # ||f|| for MINPACK's gtol cosine; sqrt(2 cost) with a robust loss (the rescaled
        # residual can be huge where rho'' < 0)
        fnorm = jnp.sqrt(2.0 * robust_cost(loss, f, jnp.asarray(f_scale, wt)))
        cost = robust_cost(loss, f.astype(top_dt), jnp.asarray(f_scale, top_dt))
        return Evaluation(cost, R.astype(top_dt), qtf.astype(top_dt), fnorm.astype(top_dt),
                          jok)

    return branch


def _blocked_branch(fun, opts: Options, i: int, blocks: PointBlocks):
    dt, top_dt = opts.rungs[i], opts.rungs[-1]
    wt = working_dtype(dt)
    loss, n = opts.loss, opts.n
    lower_linear = dt != top_dt and isinstance(loss, str) and loss == "linear"

    def gram_block(carry, f, JT):
        # J^T J, J^T f and f^T f of the block from one (n+1) x (n+1) Gram matrix of
        # [J f] in the rung's dtype, summed over blocks in the top dtype (the block's
        # f^T f in float32 is off by ~1e-8 of the cost, far below float32's own error)
        Z = jnp.concatenate([JT.astype(wt), f.astype(wt)[None, :]])
        return carry + (Z @ Z.T).astype(top_dt), None

    def sums_block(carry, f, JT, fs_w, fs_top):
        A, b, cost = carry
        f, JT = f.astype(wt), JT.astype(wt)
        cost = cost + robust_cost(loss, f.astype(top_dt), fs_top)
        fs, Js = scale_for_robust_loss(loss, f, JT.T, fs_w)
        JTs = Js.T
        # each block's sums in the rung's dtype, their sum over blocks in the top dtype
        return (A + (JTs @ JTs.T).astype(top_dt), b + (JTs @ fs).astype(top_dt),
                cost), None

    def branch(x, args_all, f_scale):
        xr = x.astype(dt)
        fs_w, fs_top = jnp.asarray(f_scale, wt), jnp.asarray(f_scale, top_dt)
        if lower_linear:
            G, _ = blocks.scan_rows(fun, xr, args_all[i], gram_block,
                                    jnp.zeros((n + 1, n + 1), top_dt))
            A, b, cost = G[:n, :n], G[:n, n], 0.5 * G[n, n]
            # the model moved from the rounded point xr back to x, f(x) ~ f(xr) +
            # J (x - xr): float32 holds a parameter only to 6e-8 of its size, at 1e6
            # points ~1e-3 of its standard error
            d = x - xr.astype(top_dt)
            Ad = A @ d
            cost = jnp.maximum(cost + b @ d + 0.5 * (d @ Ad), 0.0)
            b = b + Ad
        else:
            init = (jnp.zeros((n, n), top_dt), jnp.zeros((n,), top_dt),
                    jnp.zeros((), top_dt))
            (A, b, cost), _ = blocks.scan_rows(
                fun, xr, args_all[i], lambda c, f, JT: sums_block(c, f, JT, fs_w, fs_top),
                init)
        R, qtf = factor_gram(A, b)   # n x n, in the top dtype
        jok = guards.finite_values((R, qtf)).ok
        return Evaluation(cost, R.astype(top_dt), qtf.astype(top_dt), jnp.sqrt(2.0 * cost),
                          jok)

    return branch


def final_evaluation(fun, opts: Options, x, args_top, f_scale):
    """The final evaluation on the top rung: ``(f, Js, g, cost)``, the residual, the
    loss-scaled Jacobian, the gradient and the cost (block by block for a blocked solve,
    without an ``m x n`` transpose)."""
    top_dt, loss = opts.rungs[-1], opts.loss
    blocks = rung_blocks(opts)
    if blocks is not None:
        top_blocks = blocks[-1]

        def body(carry, f, JT):
            g, cost = carry
            f, JT = f.astype(top_dt), JT.astype(top_dt)
            fs, Js = scale_for_robust_loss(loss, f, JT.T, f_scale)
            return (g + Js.T @ fs, cost + robust_cost(loss, f, f_scale)), (f, Js)

        init = (jnp.zeros((opts.n,), top_dt), jnp.zeros((), top_dt))
        (g, cost), (f, Js) = top_blocks.scan_rows(fun, x, top_blocks.block(args_top), body,
                                                  init)
        return top_blocks.points(f), top_blocks.points(Js), g, cost
    f, J = _residual_and_jacobian(fun, opts.jac, x, args_top)
    f = f.astype(top_dt)
    J = jnp.asarray(J).astype(top_dt)
    cost = robust_cost(loss, f, f_scale)
    fs, Js = scale_for_robust_loss(loss, f, J, f_scale)
    return f, Js, Js.T @ fs, cost
