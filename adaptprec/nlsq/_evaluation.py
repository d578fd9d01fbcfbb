"""The evaluation contract between the data and the step, and the final evaluation.

Every data source evaluates the model at a trial point ``z`` on a rung and hands the step
(:func:`._loop.build_loop`'s ``advance``) the same five values, :func:`_ev_avals`:
``(cost, R, qtf, ||f||, jac_ok)``, the factored Gauss-Newton model. The
implementations: in memory, the fused loop's ``fj_branches`` (:mod:`._loop`); bucketed
(padded, masked) data, the host driver's evaluation program (:mod:`._host`); streamed
chunks and sharded arrays, their summed normal equations (:mod:`._chunks`,
:mod:`._sharded`) factored by :mod:`._stream`. A new data source implements this
contract. :func:`final_eval` is the last evaluation on the top rung (residual,
loss-scaled Jacobian, gradient, cost) for the in-memory drivers.

Example:
    >>> import numpy as np
    >>> from adaptprec.nlsq._evaluation import _ev_avals
    >>> [a.shape for a in _ev_avals(3, np.float64)]
    [(), (3, 3), (3,), (), ()]
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp
import numpy as np

from ._blocks import PointBlocks
from ._pack import Packer
from .common import robust_cost, scale_for_robust_loss

if TYPE_CHECKING:
    from ._loop import LoopConfig

__all__ = ["final_eval"]


def _ev_avals(n: int, top) -> tuple:
    """An evaluation's result ``(cost, R, qtf, fsn, jac_ok)``: the contract between a
    residual's ``evaluate`` program and the step program (checked when tracing)."""
    sds = jax.ShapeDtypeStruct
    return (sds((), top), sds((n, n), top), sds((n,), top), sds((), top), sds((), np.bool_))


def _ev_packer(n: int, top) -> Packer:
    """:func:`_ev_avals` packed into one vector of the top dtype."""
    return Packer(_ev_avals(n, top), bool_as=top)


def final_eval(fun_flat, cfg: LoopConfig, x, args_top, f_scale):
    """The final evaluation on the top rung: ``(f, Js, g, cost)`` (residual, loss-scaled
    Jacobian, gradient, cost), shared by both drivers."""
    top_dt = cfg.rungs[-1]
    loss = cfg.loss
    if cfg.point_axes is not None:
        # block by block: f, loss-scaled J, g and the cost without an m x n transpose
        blocks = PointBlocks(cfg.m, cfg.point_axes)

        def body(carry, f, JT):
            g, cost = carry
            f, JT = f.astype(top_dt), JT.astype(top_dt)
            fs, Js = scale_for_robust_loss(loss, f, JT.T, f_scale)
            return (g + Js.T @ fs, cost + robust_cost(loss, f, f_scale)), (f, Js)

        init = (jnp.zeros((cfg.n,), top_dt), jnp.zeros((), top_dt))
        (g, cost), (f, Js) = blocks.scan_rows(fun_flat, x, blocks.block(args_top), body,
                                              init)
        return blocks.points(f), blocks.points(Js), g, cost
    if callable(cfg.jac):
        f = fun_flat(x, *args_top)
        J = jnp.asarray(cfg.jac(x, *args_top))
    else:
        jf = jax.jacfwd if cfg.jac == "fwd" else jax.jacrev
        J, f = jf(lambda z: (fun_flat(z, *args_top),) * 2, has_aux=True)(x)
    f = f.astype(top_dt)
    J = J.astype(top_dt)
    cost = robust_cost(loss, f, f_scale)
    fs, Js = scale_for_robust_loss(loss, f, J, f_scale)
    return f, Js, Js.T @ fs, cost
