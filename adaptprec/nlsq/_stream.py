"""The streamed driver: single fits over data that is never in device memory at once
(the data side, chunk sums and their evaluators, is :mod:`._chunks` and :mod:`._sharded`).

A pointwise residual (:mod:`._pointwise`) has normal equations that are sums over its
data points: ``J^T J``, ``J^T f`` and the cost. Here those sums are formed chunk by
chunk. Per trust-region iteration a host loop walks the data in fixed-size chunks and
calls ONE compiled per-chunk program (residual and Jacobian rows block by block inside
the chunk, as :mod:`._blocks`; the last chunk padded with copies of its last point and
masked, so every chunk has one shape); the partial sums are added on the host in
float64 and the small ``n x n`` model is factored and stepped on the device by the
solver's own step (:class:`.solver.TrustRegion`'s ``advance`` and ``propose``, compiled
once per options). Device memory is bounded by the chunk; host memory is the
data (a ``np.memmap`` stays on disk) plus O(chunk): chunks are views, converted to the
rung's dtype inside the program (no float64 copy of float32 data).

Sources of data (:func:`solve_stream`):

* host NumPy arrays or ``np.memmap`` in ``args`` (``solve_nlsq(..., chunk_size=N)``, or
  automatically from :data:`STREAM_MIN_POINTS` points on);
* a :class:`Chunks` source: ``source()`` returns an iterable of chunks, each a tuple of
  arrays laid out as the residual's ``args`` (for ``curve_fit``: ``(xdata, ydata)`` or
  ``(xdata, ydata, sigma)``), with any number of points;
* ``jax.Array`` s sharded over a mesh along their point axis (:mod:`._sharded`): one
  "chunk", the per-device sums reduced with one ``psum`` of ``n^2 + n + 1`` numbers per
  iteration, the model replicated.

Semantics are those of every solve: the adaptive ladder (f32 first, the final answer and
the final evaluation on the top rung), the same status codes. Streaming is an eager host
loop: it raises :data:`TRACED_MESSAGE` under ``jit``/``vmap``/``grad``. The result has
``fun = jac = None`` (they would be as large as the data); ``grad``, ``cost``,
``optimality`` and the Gram matrix (for ``curve_fit``'s ``pcov``) are exact sums.

Example:
    >>> import numpy as np, jax.numpy as jnp
    >>> import adaptprec as ap
    >>> t = np.linspace(0.0, 1.0, 10_000)
    >>> y = 3.0 * np.exp(-2.0 * t)
    >>> res = ap.solve_nlsq(lambda p, t, y: p[0] * jnp.exp(-p[1] * t) - y, np.ones(2),
    ...                     args=(t, y), chunk_size=4096)
    >>> [round(float(v), 8) for v in res.x], res.rung_name, res.fun is None
    ([3.0, 2.0], 'f64', True)
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import jax
import jax.numpy as jnp
import numpy as np

from .._tracing import is_concrete
from ._chunks import (_ArraySource, _Evaluator, _chunk_program, _final_chunk_program,
                      _program)
from .._backend import cpu_jit
from ._factor import factor_gram
from .._user_fn import hashable
from ._sharded import ShardedEvaluator, plan, point_sharding, sharded_programs
from ._state import Context, Evaluation, Options
from .common import Status

__all__ = ["Chunks", "CHUNK", "STREAM_MIN_POINTS", "TRACED_MESSAGE", "solve_stream",
           "wants_stream", "covariance_from_gram"]

#: Default points per chunk (a multiple of the 4096-point block): 2^20 points of
#: float64 ``x`` and ``y`` are 16 MB on the device.
CHUNK = 1 << 20
#: Host NumPy data (``np.ndarray``/``np.memmap``, not ``jax.Array``) with at least this
#: many points is streamed without being asked (2^22, about 4.2e6). Measured
#: (benchmarks/bench_stream.py --crossover, curve_fit of a 3-parameter exponential on
#: NumPy float64 arrays, a busy 2-core machine): streamed vs in memory 0.17 s vs 0.68 s
#: at 1e6 points, 1.4 s vs 3.1 s and 0.45 vs 1.03 GB peak RSS at 4e6, 7.6 s vs 16.7 s and
#: 0.64 vs 2.98 GB at 1.6e7. Streaming won at every size; the switch sits where the
#: in-memory solve's copies pass ~1 GB, so smaller fits keep ``fun``/``jac`` in the
#: result.
STREAM_MIN_POINTS = 1 << 22

TRACED_MESSAGE = (
    "{entry}: streaming (chunk_size=, a Chunks source, or host NumPy data of "
    ">= {min_points} points) runs an eager host loop over the chunks and cannot run "
    "under jit/vmap/grad. Call it outside the transformation, or pass the data as "
    "jax.Arrays without chunk_size to use the in-memory (traceable) solver.")

#: solve_nlsq options streaming does not carry, with their default values.
UNSUPPORTED_DEFAULTS = {"throw": False, "starts": 1, "max_nfev": None,
                        "diff_step": None, "kwargs": None, "tr_solver": None,
                        "tr_options": None, "jac_sparsity": None, "verbose": 0,
                        "callback": None, "workers": None}


class Chunks:
    """A re-iterable source of data chunks for a streamed fit.

    ``source`` is a callable returning a fresh iterable of chunks (it is called once per
    pass over the data: once per trust-region iteration), or a list/tuple of chunks. A
    chunk is a tuple of arrays laid out as the residual's ``args`` (``solve_nlsq``), or
    ``(xdata, ydata)`` / ``(xdata, ydata, sigma)`` (``curve_fit``), each data array
    holding the chunk's points on its point axis (found from the residual, as for the
    in-memory blocked solve). Chunks may have different lengths: they are padded (and
    masked) or split to ``size`` points (default: the first chunk's length), so one
    compiled program serves them all. NumPy chunks are read as they are; convert nothing
    yourself.

    Example:
        >>> import numpy as np, jax.numpy as jnp
        >>> import adaptprec as ap
        >>> t = np.linspace(0.0, 4.0, 3000)
        >>> src = ap.Chunks(lambda: ((t[i:i + 1000], 2.0 * np.exp(-0.5 * t[i:i + 1000]))
        ...                          for i in range(0, 3000, 1000)))
        >>> popt, pcov = ap.curve_fit(lambda x, a, b: a * jnp.exp(-b * x), src, None,
        ...                           p0=[1.0, 1.0])
        >>> [round(float(v), 8) for v in popt]
        [2.0, 0.5]
    """

    def __init__(self, source, size: int | None = None):
        if not callable(source) and not isinstance(source, (list, tuple)):
            raise TypeError(
                "Chunks(source): source must be a callable returning a fresh iterable of "
                "chunks (it is called once per pass over the data), or a list of chunks; "
                f"got {type(source).__name__}. A generator object can be iterated only "
                "once: wrap it, e.g. Chunks(lambda: make_generator()).")
        if size is not None and (int(size) != size or size < 1):
            raise ValueError(f"Chunks size must be a positive integer, got {size!r}")
        self.source = source
        self.size = None if size is None else int(size)

    def __iter__(self):
        it = self.source() if callable(self.source) else self.source
        if not isinstance(it, Iterable):
            raise TypeError(f"Chunks: source() must return an iterable of chunks, got "
                            f"{type(it).__name__}")
        for chunk in it:
            if not isinstance(chunk, (tuple, list)):
                chunk = (chunk,)
            yield tuple(chunk)

    def __repr__(self):
        return f"Chunks({self.source!r}, size={self.size})"


# ----------------------------------------------------------------------------- helpers
def _is_host_array(a) -> bool:
    return isinstance(a, np.ndarray) and not isinstance(a, jax.Array)


def wants_stream(args, min_points: int | None = None) -> bool:
    """Whether ``args`` should be streamed without being asked: a :class:`Chunks`, data
    sharded over a mesh (:mod:`._sharded`), or a host NumPy array (incl. ``np.memmap``)
    leaf with at least ``min_points`` elements (default :data:`STREAM_MIN_POINTS`).

    Example:
        >>> import numpy as np
        >>> from adaptprec.nlsq._stream import wants_stream
        >>> wants_stream((np.zeros(10),)), wants_stream((np.zeros(10),), min_points=10)
        (False, True)
    """
    if isinstance(args, Chunks) or point_sharding(args) is not None:
        return True
    min_points = STREAM_MIN_POINTS if min_points is None else min_points
    if not is_concrete(args):
        return False
    return any(_is_host_array(a) and a.size >= min_points for a in jax.tree.leaves(args))


def covariance_from_gram(A, m: int):
    """``(J^T J)^+`` from the Gram matrix ``A = J^T J`` (NumPy, float64): the
    eigendecomposition's square roots are ``J``'s singular values; scipy's rank threshold
    ``eps * max(m, n) * s_max``, raised to the Gram matrix's own resolution
    ``sqrt(n eps) * s_max`` (its eigenvalues carry absolute error ``~ n eps ||A||``);
    parameters with a component in the numerical null space get ``inf``, as
    :func:`~adaptprec.nlsq.common.covariance`.

    Example:
        >>> import numpy as np
        >>> from adaptprec.nlsq._stream import covariance_from_gram
        >>> covariance_from_gram(np.array([[4.0, 0.0], [0.0, 1.0]]), 10).tolist()
        [[0.25, 0.0], [0.0, 1.0]]
    """
    A = np.asarray(A, np.float64)
    n = A.shape[0]
    eps = np.finfo(np.float64).eps
    lam, V = np.linalg.eigh((A + A.T) / 2)
    lam, V = lam[::-1], V[:, ::-1]
    s = np.sqrt(np.maximum(lam, 0.0))
    keep = s > max(eps * max(m, n), np.sqrt(n * eps)) * s[0]
    inv = np.where(keep, 1.0 / np.where(keep, lam, 1.0), 0.0)
    cov = (V * inv) @ V.T
    null_weight = np.sum(np.where(keep[None, :], 0.0, V ** 2), axis=1)
    bad = np.sqrt(null_weight) > np.sqrt(eps)
    return np.where(bad[:, None] | bad[None, :], np.inf, cov)


def _step_programs(opts: Options):
    """``(init, step, model)`` of the streamed loop, compiled once per options:
    ``init(x0, ctx) -> (state, proposal)``, ``step(state, proposal, ev, ctx) -> (state,
    proposal)`` (the solver's ``advance`` and honest end, then the next ``propose``) and
    ``model(A, b, cost) -> Evaluation`` from the summed normal equations."""
    from .solver import TrustRegion

    solver = TrustRegion(None, opts)

    def init(x0, ctx):
        st = solver.init(x0, ctx)
        return st, solver.propose(st, ctx)

    def step(st, prop, ev, ctx):
        st = solver.finish(solver.advance(st, prop, ev, ctx))
        return st, solver.propose(st, ctx)

    def model(A, b, cost):
        R, qtf = factor_gram(A, b)
        jok = jnp.all(jnp.isfinite(R)) & jnp.all(jnp.isfinite(qtf))
        return Evaluation(cost, R, qtf, jnp.sqrt(2.0 * cost), jok)

    def finish(x, g, lb, ub, xtol):
        ctx = Context(None, lb, ub, None, None, None, xtol, None, None, None)
        active = solver.active_mask(x, ctx)
        if opts.has_bounds and opts.method == "dogbox":
            from .dogbox import dogbox_gnorm
            return active, dogbox_gnorm(x, g, None, None, lb, ub)
        if opts.has_bounds:
            from .trf import cl_scaling
            v, _ = cl_scaling(x, g, lb, ub)
            return active, jnp.max(jnp.abs(g * v))
        return active, jnp.max(jnp.abs(g))

    key = ("stream-step", opts._replace(schedule=hashable(opts.schedule),
                                        loss=hashable(opts.loss)))
    return _program(key, lambda: tuple(cpu_jit(f, optimise=False).tuned
                                       for f in (init, step, model, finish)))


def _stream_loop(opts: Options, evaluator: _Evaluator, sums, final, x0, ctx):
    """The solver's iteration with each evaluation a pass over the data; returns
    ``(state, g, cost, Gram)`` (the final sums on the top rung)."""
    top_dt = opts.rungs[-1]
    init, step, model, _ = _step_programs(opts)
    fs = ctx.f_scale
    st, prop = init(x0, ctx)
    while True:
        status, rung = jax.device_get((st.status, st.rung))
        if int(status) != Status.RUNNING:
            break
        A, b, cost = evaluator.run(sums, rung, prop.z, tail=(fs,))
        ev = model(np.asarray(A, top_dt), np.asarray(b, top_dt), np.asarray(cost, top_dt))
        # (the point count is known after the first pass over a Chunks source)
        st, prop = step(st, prop, ev, ctx._replace(m=np.asarray(evaluator.m, np.int32)))
    st = jax.device_get(st)
    A, g, cost = evaluator.run(final, st.x, tail=(fs,))
    return st, g, cost, A


def solve_stream(residual: Callable, x0, args, *, chunk_size=None, method=None,
                 bounds=(-np.inf, np.inf), loss="linear", f_scale=1.0, x_scale=None,
                 jac=None, ftol=1e-15, xtol=1e-10, gtol=1e-10, max_steps=None,
                 precision="adaptive", schedule=None, linear_solver="auto",
                 max_rejections=4, cond_tol=1e-2, check_finite=True, auto=False,
                 entry="solve_nlsq", with_gram=False, **others):
    """:func:`adaptprec.solve_nlsq` over streamed data (see the module docstring);
    ``args`` is a :class:`Chunks` or a tuple with host arrays. With ``auto=True`` (not
    asked for, only large): ``None`` when the problem cannot be streamed (the caller
    then solves in memory). ``with_gram``: return ``(result, J^T J, m)``.
    """
    from ._arguments import (as_bounds, as_x0, check_method_loss, check_tolerances,
                             check_x0_inside, method_for_bounds, schedule_for,
                             step_budget, top_rungs)
    from ._inputs import _scale_inv, broadcast_bounds
    from .trf import make_strictly_feasible

    if not is_concrete(x0, args if not isinstance(args, Chunks) else (), bounds, f_scale):
        if auto:
            return None
        raise ValueError(TRACED_MESSAGE.format(entry=entry, min_points=STREAM_MIN_POINTS))
    if not _streamable_options(entry, auto, jac, linear_solver, others):
        return None
    if chunk_size is not None and (int(chunk_size) != chunk_size or chunk_size < 1):
        raise ValueError(f"chunk_size must be a positive integer, got {chunk_size!r}")
    loss = check_method_loss(method, loss)
    x0 = np.asarray(as_x0(x0))
    if x0.ndim != 1 or x0.size == 0:
        raise ValueError(f"streamed fits take a 1-D x0 with at least one parameter; got "
                         f"shape {x0.shape}")
    if not np.all(np.isfinite(x0)):
        raise ValueError("x0 contains NaN or Inf")
    rungs = top_rungs(precision)
    top_dt = np.dtype(rungs[-1])
    x0, n = x0.astype(top_dt), x0.size
    data = _data_source(residual, args, n, top_dt, chunk_size, check_finite, auto, entry)
    if data is None:
        return None
    fun_flat, evaluator, axes, treedef, avals, size, mesh, m = data
    lb, ub = broadcast_bounds(as_bounds(bounds, n), n, top_dt)
    has_bounds = bool(np.any(np.isfinite(lb)) or np.any(np.isfinite(ub)))
    method, x_scale = method_for_bounds(method, has_bounds, x_scale)
    check_x0_inside(x0, lb, ub)
    ftol, xtol, gtol = check_tolerances(ftol, xtol, gtol, method)
    if not (np.isscalar(f_scale) and np.isfinite(f_scale) and f_scale > 0):
        raise ValueError(f"f_scale must be a positive finite number, got {f_scale!r}")
    opts = Options(n=n, rungs=rungs, method=method, loss=loss, jac="fwd",
                   jac_scale=isinstance(x_scale, str), has_bounds=has_bounds,
                   max_steps=step_budget(max_steps, n)[0], linear_solver="normal",
                   max_rejections=int(max_rejections), cond_tol=float(cond_tol),
                   schedule=schedule_for(schedule, rungs), point_axes=None, portfolio=1)
    if has_bounds and method == "trf":
        x0 = np.asarray(make_strictly_feasible(x0, lb, ub), top_dt)
    key = (hashable(residual), rungs, str(loss) if isinstance(loss, str) else hashable(loss),
           treedef, tuple((a.shape if ax is None else a.shape[:ax] + a.shape[ax + 1:],
                           str(a.dtype)) for a, ax in zip(avals, axes)), axes, size, n)
    if mesh is not None:   # sharded over a mesh: per-device sums and one psum
        specs, names, local = plan(args, axes, m, mesh)
        evaluator = ShardedEvaluator(args, m, mesh, specs)
        skey = ("sharded", mesh, tuple(specs), names, local, m) + key
        sums, final = _program(skey, lambda: sharded_programs(
            fun_flat, opts, axes, treedef, specs, names, mesh, m, local))
    else:
        sums = _chunk_program(fun_flat, opts, axes, size, key).tuned
        final = _final_chunk_program(fun_flat, opts, axes, size, key).tuned

    def arr(v):
        return np.asarray(v, top_dt)

    ctx = Context(None, arr(lb), arr(ub), arr(_scale_inv(x_scale, n)), arr(f_scale),
                  arr(ftol), arr(xtol), arr(gtol), arr(x0), np.asarray(0, np.int32))
    st, g, cost, A = _stream_loop(opts, evaluator, sums, final, arr(x0), ctx)
    res = _result(opts, st, g, cost, ctx)
    return (res, np.asarray(A, np.float64), evaluator.m) if with_gram else res


def _streamable_options(entry, auto, jac, linear_solver, others) -> bool:
    """Whether the options allow streaming: the autodiff Jacobian and the normal
    equations; the options streaming does not carry at their defaults. ``False`` when
    ``auto`` (the caller fits in memory), an error otherwise."""
    bad = {k: v for k, v in others.items()
           if k in UNSUPPORTED_DEFAULTS and not _is_default(v, UNSUPPORTED_DEFAULTS[k])}
    unknown = set(others) - set(UNSUPPORTED_DEFAULTS)
    if unknown:
        raise TypeError(f"{entry}: unexpected keyword argument(s) {sorted(unknown)}")
    if jac in (None, "fwd") and linear_solver in ("auto", "normal") and not bad:
        return True
    if auto:
        return False
    from ._arguments import OptionNotOffered

    names = sorted(bad) + (["jac"] if jac not in (None, "fwd") else []) + (
        ["linear_solver"] if linear_solver not in ("auto", "normal") else [])
    raise OptionNotOffered(
        f"{entry}: streamed fits (chunk_size=, Chunks, sharded or large host data) use "
        f"the autodiff Jacobian and the normal equations accumulated chunk by chunk; "
        f"{', '.join(names)} cannot be combined with them. Drop those options, or "
        "fit in memory (jax.Arrays, no chunk_size).")


def _data_source(residual, args, n, top_dt, chunk_size, check_finite, auto, entry):
    """``(fun_flat, evaluator, axes, treedef, avals, size, mesh, m)`` of the data: its
    point axes proved from the residual on a sample (the first chunk), the chunk size,
    the evaluator that walks it (``m`` ``None`` for a :class:`Chunks` source until its
    first pass); ``None`` when ``auto`` and the data cannot or need not be streamed."""
    from .._pointwise import point_axes

    if isinstance(args, Chunks):
        it = iter(args)
        try:
            sample = next(it)
        except StopIteration:
            raise ValueError("the Chunks source gave no chunks") from None
        close = getattr(it, "close", None)
        if close is not None:
            close()
    else:
        args = args if isinstance(args, tuple) else (args,)
        sample = args
    treedef, leaves = jax.tree.structure(sample), jax.tree.leaves(sample)
    avals = [jax.ShapeDtypeStruct(np.shape(a), a.dtype if hasattr(a, "dtype") else
                                  np.result_type(a)) for a in leaves]
    shaped = jax.tree.unflatten(treedef, avals)

    def fun_flat(x, *a):
        return jnp.ravel(residual(x, *a))

    x_aval = jax.ShapeDtypeStruct((n,), top_dt)
    try:
        k0 = int(np.prod(jax.eval_shape(fun_flat, x_aval, *shaped).shape))
    except Exception:
        if auto:
            return None
        raise
    axes = point_axes(fun_flat, x_aval, shaped, k0)
    if axes is None:
        if auto:
            return None
        raise ValueError(
            f"{entry}: streaming needs a pointwise residual (its i-th entry computed from "
            "data point i alone, proved from its jaxpr), with the points on one axis of "
            "each data array; this residual is not provably pointwise (it reduces over "
            "the points, sorts, gathers or mixes points). Fit in memory instead.")
    if isinstance(args, Chunks):
        size = int(chunk_size or args.size or k0)
        source, mesh, m = args, None, None
    else:
        mesh, m = point_sharding(args), k0
        if auto and mesh is None and not any(_is_host_array(a) and ax is not None
                                             for a, ax in zip(leaves, axes)):
            return None
        size = min(int(chunk_size) if chunk_size is not None else CHUNK, m)
        source = _ArraySource(args, axes, m, size)
    evaluator = _Evaluator(source, axes, size, treedef, bool(check_finite))
    return fun_flat, evaluator, axes, treedef, avals, size, mesh, m


def _result(opts: Options, st, g, cost, ctx):
    from .result import NLSQResult

    top_dt = opts.rungs[-1]
    finish = _step_programs(opts)[3]
    g = np.asarray(g, top_dt)
    x = np.asarray(st.x, top_dt)
    active, optimality = finish(x, g, ctx.lb, ctx.ub, ctx.xtol)
    put = jax.device_put
    return NLSQResult(
        x=put(x), cost=put(np.asarray(cost, top_dt)), fun=None, jac=None, grad=put(g),
        optimality=optimality, active_mask=active, nfev=put(st.nfev),
        njev=put(st.njev + np.ones_like(st.njev)), nit=put(st.nit), status=put(st.status),
        rung=put(st.rung), escalations=put(st.escalations),
        rung_entered=put(st.rung_entered), rung_nfev=put(st.rung_nfev),
        escalation_reason=put(st.esc_reason), ladder=tuple(np.dtype(d) for d in opts.rungs))


def _is_default(v, d):
    return v is d or (v is None and d is None) or (
        not isinstance(v, (np.ndarray, jax.Array)) and v == d)


