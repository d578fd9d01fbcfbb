"""The compiled batched solve of one residual and :class:`~adaptprec.batch._options.
BatchConfig`: blocks of fits through the ladder (:func:`~adaptprec.batch.escalation.
solve_ladder`), then the answer made differentiable and reported (:class:`BatchResult`).

One program per (residual, configuration), memoised in :mod:`adaptprec.nlsq._caches`
(``BATCH_PROGRAMS``); ``jit`` keeps one executable per input shape.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from .._status import Reason
from ..nlsq import _caches
from ..nlsq.common import robust_cost, scale_for_robust_loss
from ..precision import dtype_name
from . import _status as st
from ._compile import tuned_jit
from ._fits_last import vmap_last
from ._model import make_fj, move_batch_axis
from ._options import BatchConfig
from ._problem import Residual
from .chunking import map_blocks
from .covariance import batched_pcov
from .escalation import solve_ladder
from .implicit import implicit_solution
from .result import BatchResult
from .runaway import runaway_status

__all__ = ["batch_solver"]


def batch_solver(residual: Residual, cfg: BatchConfig) -> Callable:
    """The jitted solver ``solve(x0, bargs, sargs, count=None)`` for one residual and
    configuration (memoised; shapes are cached by ``jit``).

    Eager calls run the program compiled with :mod:`adaptprec.batch._compile`'s options;
    inside a user's ``jit`` (no compiler options possible) the Gram matrix is formed with
    batched ``einsum`` dots instead, the form XLA's default YNNPACK fusions run fastest.
    """
    def build():
        plain = cfg._replace(plans=tuple(
            p._replace(opts=p.opts._replace(gram="einsum")) for p in cfg.plans))
        return tuned_jit(_build(residual, cfg), _build(residual, plain))

    return _caches.BATCH_PROGRAMS.get_or_build((residual, cfg), build)


def _build(residual: Residual, cfg: BatchConfig) -> Callable:
    def solve(x0, bargs, sargs, count=None):
        """``count`` (traced int, optional): rows from ``count`` on are the padding of a
        bucketed batch (:func:`adaptprec.batch._run.pad_batch`); blocks of padding only
        are not solved."""
        if cfg.strategy == "stream" or not cfg.serial:
            return solve_block(x0, bargs, sargs)
        return map_blocks(solve_block, x0, bargs, sargs, cfg.block_size, count)

    def solve_block(x0, bargs, sargs, live=None):
        if live is None:
            return solve_fits(residual, cfg, x0, bargs, sargs)
        # a block of padding only (its rows are dropped) costs nothing
        return jax.lax.cond(live, lambda: solve_fits(residual, cfg, x0, bargs, sargs),
                            lambda: _padding_result(x0.shape[0], x0.shape[1], cfg))

    return solve


def solve_fits(residual: Residual, cfg: BatchConfig, x0, bargs, sargs) -> BatchResult:
    """Every fit of one block through the ladder, then the result: ``x`` and the cost
    differentiable by the implicit function theorem, the covariance if asked for, and the
    runaway test on the status."""
    size = x0.shape[0]
    cap = max(cfg.escalate_min, int(np.ceil(min(size, cfg.block_size) * cfg.escalate_fraction)))
    # the iterations are not differentiated (see implicit_solution below)
    x0_, bargs_, sargs_ = jax.lax.stop_gradient((x0, bargs, sargs))
    s, rung, reason = solve_ladder(residual, x0_, bargs_, sargs_, cfg.plans,
                                   escalate_capacity=min(size, cap), cond_tol=cfg.cond_tol,
                                   noise_floor=cfg.noise_floor, strategy=cfg.strategy,
                                   slots=cfg.block_size, compaction_factor=cfg.compaction_factor,
                                   compaction_min=cfg.compaction_min)
    top = cfg.plans[-1]
    loss, f_scale = top.opts.loss, top.opts.f_scale
    x = implicit_solution(residual, s.x, bargs, sargs, loss, f_scale,
                          bounds_of=residual.bounds)

    cost = _reported_cost(residual, top.acc_dtype, loss, f_scale, s.cost, x, bargs, sargs)
    m = jax.eval_shape(lambda: make_fj(residual, top.acc_dtype, top.acc_dtype)(
        s.x, bargs, sargs))[0].shape[1]
    points = residual.points(bargs_, sargs_, m)
    fixed = residual.fixed(bargs_)
    dof = points - (x0.shape[1] if fixed is None else jnp.sum(~fixed, axis=1))
    pcov = _covariance(residual, cfg, s, bargs, sargs, points, fixed) \
        if cfg.return_pcov else None
    status = runaway_status(s, x0_)
    if residual.has_mask:   # fewer real points than free parameters: as scipy's m < n
        status = jnp.where(dof < 0, st.IMPROPER_INPUT, status).astype(status.dtype)
    return BatchResult(
        x=x, cost=cost, status=status, success=status > 0, rung=rung,
        nfev=s.nfev, njev=s.njev, nit=s.nit,
        optimality=jnp.max(jnp.abs(s.jtf), axis=-1), pcov=pcov,
        ladder=tuple(dtype_name(p.dtype) for p in cfg.plans), escalation_reason=reason,
        dof=dof.astype(jnp.int32))


def _covariance(residual: Residual, cfg: BatchConfig, s, bargs, sargs, points, fixed):
    """Per-fit ``pcov`` at the solution: ``curve_fit``'s (a robust loss's scaled
    Jacobian, as scipy), or for a Poisson fit the inverse Fisher information (the
    Jacobian of ``2 sqrt(f)``, never scaled: the variance of a count is its mean). With
    neither a mask nor fixed parameters, the plain batched covariance."""
    top = cfg.plans[-1]
    loss, f_scale = top.opts.loss, top.opts.f_scale
    poisson = residual.likelihood == "poisson"
    of = dataclasses.replace(residual, fisher=True) if poisson else residual
    f0, jt = make_fj(of, top.acc_dtype, top.acc_dtype)(s.x, bargs, sargs)
    jac = jnp.swapaxes(jt, 1, 2)
    if not (isinstance(loss, str) and loss == "linear"):   # scipy: scaled Jacobian
        jac = jax.vmap(lambda r, j: scale_for_robust_loss(loss, r, j, f_scale)[1])(
            f0, jac)
    if not (residual.has_mask or residual.has_fixed):
        return batched_pcov(jac, s.cost, cfg.absolute_sigma or poisson)
    return batched_pcov(jac, s.cost, cfg.absolute_sigma or poisson, points, fixed)


def _reported_cost(residual, dtype, loss, f_scale, cost, x, bargs, sargs):
    """The solve's cost at ``x`` (the top rung's last evaluation there, or the Gauss–Newton
    model's after a verified hand-off step), differentiable: its tangent is that of the
    cost re-evaluated at ``x`` (a ``custom_jvp``: the residual is evaluated again only
    when a derivative is asked for; ``x`` carries its implicit derivative)."""
    def cost_one(xb, s):
        r = jnp.asarray(residual(xb[0], xb[1], s)).astype(dtype)
        return robust_cost(loss, r, f_scale)

    def cost_at(x, b, s):   # fits last, as every other evaluation of the solve
        return vmap_last(cost_one)((x.T, move_batch_axis(b, 0, -1)), s)

    @jax.custom_jvp
    def reported(value, x, b, s):
        return value

    @reported.defjvp
    def _jvp(primals, tangents):
        value, x, b, s = primals
        _, dx, db, ds = tangents
        return value, jax.jvp(cost_at, (x, b, s), (dx, db, ds))[1]

    return reported(jax.lax.stop_gradient(cost), x, bargs, sargs)


def _padding_result(size: int, n: int, cfg: BatchConfig) -> BatchResult:
    """What a block of padding rows (NaN starts) returns without being solved: the result
    of a non-finite start (status -3, NaN ``x``/``cost``), no work counted. Its rows are
    dropped; the fields only have to match a solved block's."""
    acc = cfg.plans[-1].acc_dtype
    nan = functools.partial(jnp.full, fill_value=jnp.nan, dtype=acc)
    ints = functools.partial(jnp.full, fill_value=0, dtype=jnp.int32)
    why = Reason.NONFINITE if len(cfg.plans) > 1 else Reason.NONE
    return BatchResult(
        x=nan((size, n)), cost=nan((size,)),
        status=jnp.full((size,), st.NONFINITE_RESIDUAL, jnp.int32),
        success=jnp.zeros((size,), bool), rung=ints((size,)) + (len(cfg.plans) - 1),
        nfev=ints((size,)), njev=ints((size,)), nit=ints((size,)), optimality=nan((size,)),
        pcov=nan((size, n, n)) if cfg.return_pcov else None,
        ladder=tuple(dtype_name(p.dtype) for p in cfg.plans),
        escalation_reason=jnp.full((size,), why, jnp.int32), dof=ints((size,)))
