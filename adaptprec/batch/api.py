"""`solve_nlsq_batch`: many independent small least-squares fits sharing one model."""

from __future__ import annotations

import functools
from typing import Any, Callable, NamedTuple, Optional, Union

import jax
import jax.numpy as jnp
import numpy as np

from .._pytree import replace
from ..nlsq._buckets import bucket
from .._x64_rule import float64_entry
from ..nlsq.common import (DEFAULT_FTOL, DEFAULT_GTOL, DEFAULT_XTOL, check_loss,
                           check_loss_output, default_max_steps, robust_cost,
                           scale_for_robust_loss)
from ..precision import Ladder, dtype_name, is_adaptive, require_x64, unit_roundoff
from ._problem import Residual, build_problem, nonfinite_fits
from .._status import Reason
from .._tracing import is_eager, is_traced
from . import _status as st
from ._compile import tuned_jit
from .chunking import MIN_LANES, auto_chunk_size, map_blocks, run_chunked
from .covariance import batched_pcov
from .escalation import RungPlan, solve_ladder
from .implicit import implicit_solution
from ._fits_last import vmap_last
from .lm_batched import LMOptions, make_fj, move_batch_axis
from .result import BatchResult
from .runaway import runaway_status
from .verify import SE_FRACTION
from .sharding import (infer_mesh, raise_together, run_chunked_local, shard_solve,
                       spans_processes)

__all__ = ["solve_nlsq_batch"]

# A rung stops once progress is below what it can resolve: tolerance
# max(tol, _RUNG_TOL * u_rung) (for float64 and scipy's defaults that is the user's tol).
_RUNG_TOL = 16.0
# On an adaptive ladder a lower rung stops at this fraction of the standard errors: 3/4
# of what the top rung's one-evaluation check accepts (verify.SE_FRACTION), a margin for
# the lower rung's rounding. 2-D Gaussian, 1e5 fits: all accepted at 0.5 and 0.75, 12
# iterated on float64 at 1.0; 0.75 runs 0.14 fewer float32 iterations per fit than 0.5
# (3.5% faster, issue 31; max |x - x64| 1.4e-4 se).
LOW_RUNG_SE_FRACTION = 0.75 * SE_FRACTION


class _Config(NamedTuple):
    plans: tuple
    escalate_fraction: float
    escalate_min: int
    compaction_factor: int
    compaction_min: int
    cond_tol: float
    noise_floor: float
    return_pcov: bool
    absolute_sigma: bool
    block_size: int
    strategy: str


def _ladder(precision) -> Ladder:
    if isinstance(precision, Ladder):
        return precision
    if is_adaptive(precision):
        require_x64("f64")
        return Ladder.parse("f32,f64")
    if isinstance(precision, (str, tuple, list)):
        return Ladder.parse(precision)
    return Ladder.parse([precision])


def _plans(ladder: Ladder, ftol, xtol, gtol, max_steps, loss="linear", f_scale=1.0) -> tuple:
    plans = []
    rungs = tuple(ladder)
    for i, d in enumerate(rungs):
        acc = np.promote_types(d, np.float32)
        t = _RUNG_TOL * unit_roundoff(d)
        # an adaptive ladder's answer is judged against the standard errors: a lower rung
        # stops below 3/4 of what the top rung's one-evaluation check accepts
        # (batch/verify.py), which the top rung's own Gauss-Newton test then accepts too
        top = i == len(rungs) - 1
        multi = len(rungs) > 1
        opts = LMOptions(max(ftol, t), max(xtol, t), max(gtol, t), max_steps, loss=loss,
                         f_scale=f_scale,
                         se_below=LOW_RUNG_SE_FRACTION if multi and not top else 0.0,
                         se_accept=SE_FRACTION if multi and top else 0.0)
        plans.append(RungPlan(np.dtype(d), np.dtype(acc), opts))
    return tuple(plans)


def batch_bucket(size: int) -> int:
    """Batch sizes are padded to a bucket (``2^k`` or ``3 * 2^(k-1)``, at most 50% more
    fits) so that a new batch size in the bucket reuses the compiled solver.

    Example:
        >>> from adaptprec.batch.api import batch_bucket
        >>> [batch_bucket(b) for b in (1, 3, 1000, 1001, 1017, 1600)]
        [4, 4, 1024, 1024, 1024, 2048]
    """
    return max(bucket(size), MIN_LANES)


def _pad_batch(prob, size: int):
    """``x0`` and the batched args padded to ``size`` fits (NumPy, no compilation).
    Padded fits copy the last fit's data and start at NaN, so they are finished (status
    -3) before the first iteration and take no work; :func:`_unpad_batch` drops them."""
    def padded(a):
        a = np.asarray(a)
        out = _aligned_empty((size,) + a.shape[1:], a.dtype)
        out[:prob.size] = a
        out[prob.size:] = a[-1]
        return out

    x0 = padded(prob.x0)
    x0[prob.size:] = np.nan
    return x0, jax.tree.map(padded, prob.bargs)


def _aligned_empty(shape: tuple, dtype, align: int = 64) -> np.ndarray:
    """``np.empty(shape, dtype)`` starting on an ``align``-byte boundary: such an array
    goes on the CPU device without a copy (``jax.device_put`` aliases it; NumPy's own
    large allocations start 16 bytes past a page, and were copied)."""
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape)) * dtype.itemsize
    buf = np.empty(nbytes + align, np.uint8)
    start = -buf.ctypes.data % align
    return buf[start:start + nbytes].view(dtype).reshape(shape)


def _unpad_batch(result, size: int):
    """The first ``size`` fits of ``result`` (NumPy slicing, then back on the device)."""
    def cut(a):
        return jax.device_put(np.asarray(a)[:size]) if isinstance(a, jax.Array) else a

    return jax.tree.map(cut, result)


@functools.lru_cache(maxsize=64)
def _core(residual: Residual, cfg: _Config) -> Callable:
    """The jitted solver for one residual and configuration (shapes cached by jit).

    Eager calls run the program compiled with :mod:`adaptprec.batch._compile`'s options;
    inside a user's ``jit`` (no compiler options possible) the Gram matrix is formed with
    batched ``einsum`` dots instead, the form XLA's default YNNPACK fusions run fastest.
    """
    plain = cfg._replace(plans=tuple(
        p._replace(opts=p.opts._replace(gram="einsum")) for p in cfg.plans))
    return tuned_jit(_build(residual, cfg), _build(residual, plain))


def _build(residual: Residual, cfg: _Config) -> Callable:
    def solve(x0, bargs, sargs, count=None):
        """``count`` (traced int, optional): rows from ``count`` on are the padding of a
        bucketed batch (:func:`_pad_batch`); blocks of padding only are not solved."""
        if cfg.strategy == "stream":
            return solve_block(x0, bargs, sargs)
        return map_blocks(solve_block, x0, bargs, sargs, cfg.block_size, count)

    def solve_block(x0, bargs, sargs, live=None):
        if live is None:
            return solve_fits(x0, bargs, sargs)
        # a block of padding only (rows dropped by _unpad_batch) costs nothing: at 1e5
        # fits 12 of 53 blocks, which cost a third of a real block each (issue 31)
        return jax.lax.cond(live, lambda: solve_fits(x0, bargs, sargs),
                            lambda: _padding_result(x0.shape[0], x0.shape[1], cfg))

    def solve_fits(x0, bargs, sargs):
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
        # with the fits on the minor axis, as every other evaluation of the solve (the
        # fits-first vmap transposed inside its fused kernel)
        def cost_one(xb, s):
            r = jnp.asarray(residual(xb[0], xb[1], s)).astype(top.acc_dtype)
            return robust_cost(loss, r, f_scale)

        cost = vmap_last(cost_one)((x.T, move_batch_axis(bargs, 0, -1)), sargs)
        cost = jnp.where(jnp.isfinite(s.cost), cost, s.cost)
        pcov = None
        if cfg.return_pcov:
            fj = make_fj(residual, top.acc_dtype, top.acc_dtype)
            f0, jt = fj(s.x, bargs, sargs)
            jac = jnp.swapaxes(jt, 1, 2)
            if not (isinstance(loss, str) and loss == "linear"):   # scipy: scaled Jacobian
                jac = jax.vmap(lambda r, j: scale_for_robust_loss(loss, r, j, f_scale)[1])(
                    f0, jac)
            pcov = batched_pcov(jac, s.cost, cfg.absolute_sigma)
        status = runaway_status(s, x0_)
        return BatchResult(
            x=x, cost=cost, status=status, success=status > 0, rung=rung,
            nfev=s.nfev, njev=s.njev, nit=s.nit,
            optimality=jnp.max(jnp.abs(s.jtf), axis=-1), pcov=pcov,
            ladder=tuple(dtype_name(p.dtype) for p in cfg.plans), escalation_reason=reason)

    return solve


def _padding_result(size: int, n: int, cfg: _Config) -> BatchResult:
    """What a block of padding rows (NaN starts, :func:`_pad_batch`) returns without being
    solved: the result of a non-finite start (status -3, NaN ``x``/``cost``), no work
    counted. Its rows are dropped; the fields only have to match a solved block's."""
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
        escalation_reason=jnp.full((size,), why, jnp.int32))


def _to_host(tree):
    """NumPy leaves for the x64-scoped eager result, except arrays spanning processes
    (they stay global jax.Arrays: no process can hold them)."""
    return jax.tree.map(lambda a: np.asarray(a) if isinstance(a, jax.Array)
                        and a.is_fully_addressable else a, tree)


@float64_entry("solve_nlsq_batch", ("x0", "args", "ydata", "sigma", "bounds"),
               host=_to_host)
def solve_nlsq_batch(
    fun: Callable,
    x0,
    args: Any = (),
    *,
    in_axes: Union[int, None, tuple] = 0,
    ydata=None,
    sigma=None,
    absolute_sigma: bool = False,
    bounds=None,
    precision="adaptive",
    loss="linear",
    f_scale: float = 1.0,
    ftol: float = DEFAULT_FTOL,
    xtol: float = DEFAULT_XTOL,
    gtol: float = DEFAULT_GTOL,
    max_steps: Optional[int] = None,
    return_pcov: bool = False,
    nan_policy: str = "propagate",
    compaction: Union[str, int, None] = "auto",
    escalate_fraction: float = 0.125,
    cond_tol: float = 1e-2,
    noise_floor: float = 10.0,
    block_size: int = 2500,
    chunk_size: Optional[int] = None,
    progress: Union[bool, Callable[[int, int], None], None] = None,
    mesh=None,
    batch_axis: Optional[str] = None,
) -> BatchResult:
    r"""Solve ``B`` independent nonlinear least-squares fits that share one model.

    Each fit ``k`` minimises :math:`\tfrac12\|r(x_k)\|^2` by Levenberg–Marquardt (module
    :mod:`adaptprec.batch.lm_batched`), with the batch axis explicit: converged fits are
    frozen, stragglers are compacted into smaller buffers, and each fit escalates through
    the precision ladder on its own (float32 first; every fit then finishes in float64 from
    where float32 left it: one float64 evaluation verifies it, accepting a Gauss–Newton
    step below 1e-3 of every parameter's standard error, and only fits failing that check
    iterate in float64, :mod:`adaptprec.batch.verify`). The default's parameters agree
    with ``precision="f64"``'s to 1e-3 of their standard errors.

    Args:
        fun: the residual ``fun(x, *args) -> (m,)`` of one fit, or with ``ydata`` the model
            ``fun(x, *args) -> (m,)`` whose residual is ``(fun(x, *args) - ydata) / sigma``.
        x0: starts, shape ``(B, n)``, or a pytree of arrays (dict, namedtuple, list of
            arrays...) whose leaves all have the leading batch axis ``B``; ``fun`` then
            gets one fit's pytree and ``res.x`` has ``x0``'s structure (``pcov`` rows
            follow the leaves in ``jax.tree`` order, each flattened in C order).
        args: extra arguments of ``fun``. Batched ones have a leading axis of size ``B``
            (per-fit data); mark shared ones (e.g. a common grid) with ``in_axes``.
        in_axes: ``0`` (all args batched, default), ``None`` (all shared), or a tuple with
            one ``0``/``None`` per arg, as in :func:`jax.vmap`.
        ydata: per-fit data ``(B, m)`` for the model form; ``sigma`` ``(m,)`` or ``(B, m)``
            its standard deviations; ``absolute_sigma`` as in ``curve_fit``.
        bounds: ``(lb, ub)`` box constraints, each a scalar, ``(n,)`` (shared by all fits)
            or ``(B, n)`` (per fit), ``-inf``/``inf`` for an open side; for a pytree ``x0``
            each may also be a pytree like ``x0`` (leaves scalar, per-fit or batched).
            Solved by projected Levenberg–Marquardt: variables on a bound whose gradient
            points out of the box are held there, the step is solved for the others and
            projected back into the box (see ``docs/batch.md``). ``lb < ub`` and ``x0``
            inside the box are required (``ValueError`` otherwise, as scipy).
        precision: ``"adaptive"`` (ladder ``f32,f64``; needs ``jax_enable_x64``), a ladder
            string such as ``"bf16,f32,f64"``/:class:`~adaptprec.Ladder`, or one dtype
            (``"f32"``, ``"f64"``) to solve everything at that precision.
        loss, f_scale: robust loss as in scipy ``least_squares`` (``"linear"``,
            ``"soft_l1"``, ``"huber"``, ``"cauchy"``, ``"arctan"`` or a callable ``rho(z)``;
            the helpers of :mod:`adaptprec.nlsq.common`): the cost becomes
            ``0.5 f_scale^2 sum(rho((f/f_scale)^2))`` and ``J``/``f`` are rescaled as scipy
            does (scipy's ``lm`` has no loss; compare with its ``trf``).
        ftol, xtol, gtol: termination tolerances, the same defaults as
            :func:`~adaptprec.solve_nlsq` (1e-15, 1e-10, 1e-10); each rung uses
            ``max(tol, 16 u_rung)`` (float32: about 1e-6), so a float32 rung stops where
            float32 stops resolving progress and its guards decide about float64.
        max_steps: iterations per fit and rung (default ``100 * (n + 1)``, as
            :func:`~adaptprec.solve_nlsq`).
        return_pcov: also compute the per-fit covariance (``curve_fit`` semantics).
        nan_policy: ``"propagate"`` (fits with non-finite starts/data get status
            ``-3`` (non-finite residual); the others are unaffected) or ``"raise"`` (``ValueError`` listing the
            bad fits; needs concrete inputs).
        compaction: how converged fits stop costing work.
            ``"auto"``/``"staged"`` (default): blocks of ``block_size`` fits; when at most
            a quarter of a block is still iterating, those fits are regrouped into a
            buffer a quarter the size, down to 128 fits
            (:func:`~adaptprec.batch.compaction.run_compacted`). An int ``k >= 2``: the
            same with shrink factor ``k``. ``"stream"``: ``block_size`` lanes, a finished
            lane is refilled with the next fit
            (:func:`~adaptprec.batch.compaction.run_streaming`; measured slower on CPU,
            see ``docs/batch.md``). ``None``: plain lockstep blocks (every fit waits for
            the slowest of its block).
        escalate_fraction: lanes of the float64 (upper-rung) buffer as a fraction of
            ``block_size`` (at least 64); any number of flagged fits streams through it.
        cond_tol, noise_floor: escalation guards (see :mod:`adaptprec.batch.escalation`).
        block_size: fits iterated in lockstep inside the compiled program (lanes of the
            streaming buffer, or blocks run one after another through ``lax.map``); a few
            thousand keeps the working set in cache on CPU
            (:func:`~adaptprec.batch.chunking.map_blocks`).
        chunk_size: solve at most this many fits at a time (default: all, unless the
            working set would exceed about 1 GiB).
        progress: ``True`` for a progress bar (:class:`~adaptprec.batch.TqdmProgress` when
            ``tqdm`` is installed, else :class:`~adaptprec.batch.TextProgress`), or a
            callable ``progress(done, total)`` called after each chunk (eager calls only).
            Displays say when the solver is compiling, and their fits/s rate excludes
            compilation. Off by default.
        mesh, batch_axis: a :class:`jax.sharding.Mesh` and the name of its axis to split
            the fits over (default: its first axis). Inputs already sharded with a
            ``NamedSharding`` over their leading axis are split the same way. Global
            arrays spanning processes (``jax.distributed``; every process makes the same
            call) are solved where they live: results keep their sharding, the compiled
            solve communicates nothing, and ``chunk_size`` (fits at a time, all devices
            together) is cut from every device's own rows (see ``docs/batch.md``,
            "Across processes").

    Returns:
        :class:`~adaptprec.batch.BatchResult` with per-fit ``x``, ``cost``, ``status``,
        ``success``, ``rung``, ``nfev``, ``njev``, ``nit``, ``optimality`` and ``pcov``.
        ``cost`` is re-evaluated at ``x`` in the top rung's precision. ``x`` and ``cost``
        are differentiable (forward and reverse mode) w.r.t. the floating ``args``/``ydata``/
        ``sigma`` by the implicit function theorem
        (:mod:`adaptprec.batch.implicit`), not through the iterations.

    Raises:
        ValueError / TypeError: at the boundary, for an empty batch, batch sizes that
            disagree between ``x0`` and the data, a residual that is not 1-D, ``m < n``,
            mismatched ``sigma``, unknown options, or float64 without ``jax_enable_x64``.

    Example (x64 on, as under the tests):
        >>> import jax.numpy as jnp
        >>> import adaptprec as ap
        >>> t = jnp.linspace(0.0, 1.0, 8)
        >>> k = jnp.array([0.5, 1.0, 2.0])
        >>> y = 3.0 * jnp.exp(-k[:, None] * t)                      # (3 fits, 8 points)
        >>> model = lambda p, t: p[0] * jnp.exp(-p[1] * t)
        >>> res = ap.solve_nlsq_batch(model, jnp.ones((3, 2)), (t,), in_axes=None, ydata=y)
        >>> [round(float(v), 6) for v in res.x[:, 1]], res.success.all().item()
        ([0.5, 1.0, 2.0], True)
    """
    ladder = _ladder(precision)
    if len(ladder.rungs) > 1 and unit_roundoff(ladder.rungs[-1]) > unit_roundoff(np.float32):
        # (one half-precision rung runs, its state in float32; a ladder ending on one
        # failed with "data type ... not inexact")
        raise ValueError(
            f"precision={precision!r} ends on {dtype_name(ladder.rungs[-1])}: a ladder must "
            "end on float32 or float64, where every fit is verified; e.g. 'bf16,f32'.")
    if nan_policy not in ("propagate", "raise"):
        raise ValueError(f"nan_policy must be 'propagate' or 'raise', got {nan_policy!r}")
    prob = build_problem(fun, x0, args, in_axes, ydata, sigma, bounds)
    if max_steps is None:
        max_steps = default_max_steps(prob.n)
    if int(max_steps) < 1:
        raise ValueError(f"max_steps must be a positive integer, got {max_steps!r}")
    for name, tol in (("ftol", ftol), ("xtol", xtol), ("gtol", gtol)):
        if not (tol >= 0):
            raise ValueError(f"{name} must be >= 0, got {tol!r}")
    strategy, factor = "staged", 0
    if compaction == "stream":
        strategy = "stream"
    elif compaction in ("auto", "staged"):
        factor = 4
    elif compaction in (None, 0, False):
        factor = 0
    elif isinstance(compaction, int) and not isinstance(compaction, bool) and compaction >= 2:
        factor = compaction
    else:
        raise ValueError(f"compaction must be 'auto'/'stream', 'staged', None or an int >= 2, "
                         f"got {compaction!r}")
    if int(block_size) < 1:
        raise ValueError(f"block_size must be a positive integer, got {block_size!r}")
    if not 0 < escalate_fraction <= 1:
        raise ValueError(f"escalate_fraction must be in (0, 1], got {escalate_fraction!r}")
    traced = is_traced(prob.x0, prob.bargs, prob.sargs)
    if nan_policy == "raise":
        if traced:
            raise ValueError("nan_policy='raise' needs concrete inputs; under jit use "
                             "nan_policy='propagate' and read the per-fit status")
        bad = nonfinite_fits(prob)     # on inputs spanning processes: this process's fits
        raise_together(ValueError(
            f"{bad.size} fit(s) have non-finite starts or data, e.g. fits "
            f"{bad[:10].tolist()}; clean them or use nan_policy='propagate' (status -3 "
            f"for those fits only)") if bad.size else None, prob.x0, prob.bargs)

    loss = check_loss(loss)
    check_loss_output(loss, prob.m, ladder.rungs[-1])
    if not f_scale > 0:
        raise ValueError(f"f_scale must be > 0, got {f_scale!r}")
    cfg = _Config(_plans(ladder, float(ftol), float(xtol), float(gtol), int(max_steps), loss,
                         float(f_scale)),
                  float(escalate_fraction), 64, factor, 128, float(cond_tol),
                  float(noise_floor), bool(return_pcov), bool(absolute_sigma),
                  int(block_size), strategy)
    solve = _core(prob.residual, cfg)

    if mesh is None:
        mesh, inferred = infer_mesh(prob.x0)
        batch_axis = batch_axis or inferred
    if mesh is not None:
        axis = batch_axis or mesh.axis_names[0]
        inner = solve

        def solve(x, b, s, inner=inner):  # noqa: F811
            return shard_solve(inner, mesh, axis, x, b, s)

    if chunk_size is not None and int(chunk_size) < 1:
        raise ValueError(f"chunk_size must be a positive integer, got {chunk_size!r}")
    if spans_processes(prob.x0, prob.bargs, prob.sargs):
        if mesh is None:
            raise ValueError("the inputs span processes but x0 is not sharded with a "
                             "NamedSharding over its leading (fits) axis along one mesh "
                             "axis; build x0 with "
                             "jax.make_array_from_process_local_data(NamedSharding(mesh, "
                             "P('fits')), local_x0) or pass mesh= and batch_axis=")
        # global arrays: each device solves its own rows, in block_size blocks; chunks
        # (only if asked for) are cut from every device's rows, so no fit moves
        ndev = mesh.shape[axis]
        local = prob.size // ndev
        per_device = local if chunk_size is None else max(1, int(chunk_size) // ndev)
        if per_device >= local and progress in (None, False):
            result = solve(prob.x0, prob.bargs, prob.sargs)
        else:
            result = run_chunked_local(inner, mesh, axis, prob.x0, prob.bargs, prob.sargs,
                                       per_device, progress)
    else:
        if chunk_size is None:
            itemsize = max(p.acc_dtype.itemsize for p in cfg.plans)
            chunk_size = auto_chunk_size(prob.size, prob.m, prob.n, itemsize)
        if chunk_size >= prob.size and progress is None:
            size = prob.size
            # (eager only: under any active trace, also around concrete inputs when the
            # residual closes over a traced value, the result is traced and stays so)
            padded = mesh is None and is_eager(prob.x0, prob.bargs, prob.sargs) \
                and batch_bucket(size) != size
            x0b, bargs = prob.x0, prob.bargs
            if padded:
                # on the device without a copy: the padded arrays are this call's own
                # (nothing else holds or changes them), and jax.device_put aliases host
                # memory on CPU where passing NumPy to the program copies it (4-12 ms of
                # the 1e5-fit solve's data, in every precision; issue 31)
                x0b, bargs = jax.device_put(_pad_batch(prob, batch_bucket(size)))
                # (traced: every size of the bucket runs the same program)
                result = solve(x0b, bargs, prob.sargs, np.int32(size))
            else:
                result = solve(x0b, bargs, prob.sargs)
            if padded:
                result = _unpad_batch(result, size)
        else:
            result = run_chunked(solve, prob.x0, prob.bargs, prob.sargs, int(chunk_size),
                                 progress)
    if prob.spec is not None:  # x0 was a pytree: give x back in its structure
        result = replace(result, x=prob.spec.unravel_batched(result.x))
    return result
