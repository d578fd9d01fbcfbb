"""The host driver: small eager solves as a Python loop over compiled programs.

The fused driver compiles one program per residual (the whole ``while_loop``), which
costs 0.4-0.8 s for every new residual or data length. Here the same trust-region
iteration (:func:`._loop.build_loop`'s ``propose``/``advance``) is split so that only the
residual's evaluation depends on the residual:

* **step programs** ``init`` and ``step`` (``advance`` then the next ``propose``):
  compiled once per ``(n, method, ladder, options)``, for every residual and every data
  length (``m`` is an argument);
* **residual programs**, per residual *computation* (:mod:`._identity`: the closed jaxpr
  with captured arrays hoisted to arguments) and data bucket (:mod:`._buckets`): one per
  rung evaluating residual, Jacobian and the factored model, and one final evaluation.

A Python loop calls ``evaluate`` and ``step`` in turn, queuing :data:`QUEUE` iterations
before reading back the status (``step`` leaves a finished solve unchanged). Both
drivers run the same operations in the same order, so they agree with the same ``nfev``
(bit for bit on the NIST suite, tests/test_latency.py).

Promotion (:mod:`._promote`): a residual computation (and bucket) solved
more than ``_promote.PROMOTE_AFTER`` times (for ``_promote.PROMOTE_SECONDS`` of
host-loop time) in a process gets the same ``init``/``evaluate``/``step``/
``final`` functions compiled into one program (in a background thread, at the same
options, so the bits do not change); later fits of that model are one executable call.
While the step programs are cold (built neither in this process nor on disk), a model's
first solve compiles that program at once instead (``_promote.first_solve``).

Example:
    >>> import jax.numpy as jnp, numpy as np
    >>> import adaptprec as ap
    >>> t = np.linspace(0.0, 1.0, 30)
    >>> res = ap.solve_nlsq(lambda p, t, y: p[0] * jnp.exp(-p[1] * t) - y, np.ones(2),
    ...                     args=(t, 3.0 * np.exp(-2.0 * t)), driver="host")
    >>> [round(float(v), 8) for v in res.x], res.rung_name
    ([3.0, 2.0], 'f64')
"""

from __future__ import annotations

import collections
import threading
import time
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from .. import _disk_cache
from .._policy import cast_floating
from . import _promote
from ._buckets import masked, pad_points, padded_avals
from ._compile import cpu_jit
from ._evaluation import _ev_avals, _ev_packer, final_eval
from ._identity import jaxpr_function, trace_residual
from ._loop import LoopConfig, build_loop
from ._methods import method_fns
from ._pack import Packer
from ._x64 import numpy_results
from .common import Status, _covariance_svd
from .result import NLSQResult
from .trf import active_constraints, cl_scaling, make_strictly_feasible

__all__ = ["host_solve", "host_eligible", "cache_info", "clear_cache"]

_SIZE = 128
#: iterations queued between status checks (see host_solve)
QUEUE = 4
_programs: collections.OrderedDict = collections.OrderedDict()
_prepared: collections.OrderedDict = collections.OrderedDict()
_lock = threading.Lock()
_stats = {"programs_built": 0, "program_hits": 0, "traces": 0}


def clear_cache() -> None:
    """Drop the host driver's programs and traced residuals, the promoted programs
    (:mod:`._promote`) and the compiled programs held in memory by
    :mod:`adaptprec._disk_cache` (its disk entries stay)."""
    _promote.clear()
    _disk_cache.clear_memory()
    with _lock:
        _programs.clear()
        _prepared.clear()
        _prefetched.clear()
        _first_solved.clear()
        _stats.update(programs_built=0, program_hits=0, traces=0)


def cache_info() -> dict:
    """``{"programs", "programs_built", "program_hits", "traces"}`` of the host driver."""
    return {"programs": len(_programs), **_stats}


def _hashable(obj) -> bool:
    try:
        hash(obj)
        return True
    except TypeError:
        return False


def host_eligible(cfg: LoopConfig, throw: bool, *trees) -> bool:
    """Whether the host driver can run this solve: eager (concrete inputs), autodiff
    Jacobian, QR model (``m`` below the normal-equations crossover), no ``throw`` and
    hashable loss/schedule (they key the step programs), and no ``max_nfev`` cap or
    ``callback`` (the host step does not carry them yet)."""
    from .._tracing import is_eager

    return (not throw and cfg.jac in ("fwd", "rev") and cfg.linear_solver == "qr"
            and cfg.point_axes is None and not cfg.max_nfev and cfg.callback is None
            and _hashable(cfg.loss) and _hashable(cfg.schedule) and is_eager(*trees))


def _program(key, build):
    """The program built by ``build()`` for ``key`` (built once per process; its
    compiled executables come from :mod:`adaptprec._disk_cache` by ``key``)."""
    with _lock:
        fn = _programs.get(key)
        if fn is not None:
            _programs.move_to_end(key)
            _stats["program_hits"] += 1
            return fn
    fn = build()
    if not isinstance(fn, StepPrograms):
        fn.cache_key = key
    with _lock:
        _programs[key] = fn
        _stats["programs_built"] += 1
        if len(_programs) > _SIZE:
            _programs.popitem(last=False)
    return fn


# ----------------------------------------------------------------------------- step
def _step_cfg(cfg: LoopConfig) -> LoopConfig:
    """The options the step depends on (not the residual, ``m``, loss or Jacobian)."""
    return cfg._replace(m=0, loss=None, jac=None, point_axes=None)


def _ctl(st):
    return jnp.stack([st.status, st.rung]).astype(jnp.int32)


class StepPrograms(NamedTuple):
    """The compiled ``init``/``step`` of one step configuration, on packed state (see
    :mod:`._pack`): ``init(x0, ctx, m) -> (carry, z, ctl)`` and
    ``step(carry, ev, ctx, m) -> (carry, z, ctl)``, where ``carry`` packs the loop state
    and the proposal, ``ctx`` the per-solve constants (:attr:`ctx_packer`) and ``ctl`` is
    ``[status, rung]``."""

    init: Any
    step: Any
    carry: Packer  #: ``(state, proposal)`` (built on first use)
    ctx: Packer  #: ``(lb, ub, scale_inv0, f_scale, ftol, xtol, gtol, x0)``
    #: the unpacked functions behind them (for the promoted program):
    #: ``init_tree(x0, ctx, m) -> (state, proposal)``, ``loop(m)`` (:func:`build_loop`)
    init_tree: Any = None
    loop: Any = None


class _Lazy:
    """An object built on first use (its attributes are the built object's): the step
    state's layout, which a first solve on the whole-solve program does not need
    (:func:`._promote.first_solve`)."""

    def __init__(self, build):
        self._build, self._built = build, None

    def __getattr__(self, name):
        if self._built is None:   # (two threads may build it both: the same layout)
            self._built = self._build()
        return getattr(self._built, name)


def _step_programs(cfg: LoopConfig) -> StepPrograms:
    key = ("step", _step_cfg(cfg))
    return _program(key, lambda: _build_step_programs(cfg))


def _build_step_programs(cfg: LoopConfig) -> StepPrograms:
    scfg = _step_cfg(cfg)
    top = np.dtype(scfg.rungs[-1])

    def loop(m):
        return build_loop(None, scfg, *method_fns(scfg.method, m))

    def init_tree(x0, ctx, m):
        ctx = (None, *ctx)
        if scfg.has_bounds:
            x0 = make_strictly_feasible(x0, ctx[1], ctx[2])
        run = loop(m)
        st = run.init(x0, ctx)
        # The first iteration only evaluates at x0 (pending): nothing of the proposal
        # but z = x0 is used, so zeros stand in for the step (no step compiled here).
        shape = jax.eval_shape(run.propose, st, ctx)
        prop = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shape)
        return st, prop._replace(z=st.x)

    vec, sca = jax.ShapeDtypeStruct((scfg.n,), top), jax.ShapeDtypeStruct((), top)
    ctx_packer = Packer((vec, vec, vec, sca, sca, sca, sca, vec))

    def carry_layout() -> Packer:
        """The state's layout: from an earlier process (disk cache) or by tracing
        ``init`` (~30 ms)."""
        packer = _disk_cache.load_meta(("step-layout", scfg))
        if not isinstance(packer, Packer):
            ctx_avals = tuple(jax.ShapeDtypeStruct((k,), d)
                              for k, d in zip(ctx_packer.sizes, ctx_packer.dtypes))
            packer = Packer(jax.eval_shape(
                lambda x0, ctxv, m: init_tree(x0, ctx_packer.unpack(ctxv), m), vec,
                ctx_avals, jax.ShapeDtypeStruct((), jnp.int32)))
            _disk_cache.store_meta(("step-layout", scfg), packer)
        return packer

    carry_packer = _Lazy(carry_layout)

    def init(x0, ctxv, m):
        st, prop = init_tree(x0, ctx_packer.unpack(ctxv), m)
        return carry_packer.pack((st, prop)), prop.z, _ctl(st)

    ev_packer = _ev_packer(scfg.n, top)

    def step(carry, ev, ctxv, m):
        st, prop = carry_packer.unpack(carry)
        ev = ev_packer.unpack(ev)
        ctx = (None, *ctx_packer.unpack(ctxv))
        run = loop(m)
        new = run.finish(run.advance(st, prop, ev, ctx))   # finish: as the fused driver
        # a finished solve is left as it is: the host queues a few iterations at a time
        running = st.status == Status.RUNNING
        st = jax.tree.map(lambda a, b: jnp.where(running, a, b), new, st)
        prop = run.propose(st, ctx)
        return carry_packer.pack((st, prop)), prop.z, _ctl(st)

    init, step = cpu_jit(init, optimise=False), cpu_jit(step, optimise=False)
    init.cache_key, step.cache_key = ("step", scfg, "init"), ("step", scfg, "step")
    return StepPrograms(init, step, carry_packer, ctx_packer, init_tree, loop)


# ----------------------------------------------------------------------------- residual
def _arg_aval(a, dt):
    dtype = jnp.result_type(a)
    if jnp.issubdtype(dtype, jnp.floating):
        return jax.ShapeDtypeStruct(np.shape(a), dt)
    return jax.ShapeDtypeStruct(np.shape(a), dtype,
                                weak_type=isinstance(a, (bool, int, float, complex)))


def _eval_program(cfg: LoopConfig, traced, is_padded: bool):
    """Residual, Jacobian and the factored model at ``z`` on rung ``rung`` (a
    ``lax.switch`` over the rungs, as in the fused loop: the host need not know the
    rung, so it can queue iterations without waiting for their results)."""
    rungs = cfg.rungs
    ecfg = cfg._replace(schedule=None, point_axes=None)

    def evaluate(ctl, z, consts, mask, args, f_scale):
        rung = ctl[1]
        by_dtype = {np.dtype(d): jaxpr_function(tr.jaxpr, c)
                    for d, tr, c in zip(rungs, traced, consts)}
        fun = masked(lambda x, *a: by_dtype[np.dtype(x.dtype)](x, *a),
                     mask if is_padded else None)
        run = build_loop(fun, ecfg, None, None, None)
        args_all = tuple(cast_floating(args, d) for d in rungs)
        if len(rungs) == 1:
            ev = run.fj_branches[0](z, args_all, f_scale)
        else:
            ev = jax.lax.switch(rung, run.fj_branches, z, args_all, f_scale)
        got = [(a.shape, np.dtype(a.dtype)) for a in jax.tree.leaves(ev)]
        want = [(a.shape, np.dtype(a.dtype)) for a in _ev_avals(cfg.n, rungs[-1])]
        if got != want:
            raise AssertionError(f"evaluation result {got} does not match the step "
                                 f"program's layout {want}")
        return _ev_packer(cfg.n, rungs[-1]).pack(ev)

    key = ("eval", tuple(tr.key for tr in traced), is_padded, cfg.n, cfg.rungs, cfg.loss,
           cfg.jac, cfg.linear_solver)
    return _program(key, lambda: cpu_jit(evaluate, optimise=False))


def _final_program(cfg: LoopConfig, tr, is_padded: bool, covariance: bool = False):
    """The final evaluation at the solution; with ``covariance`` also ``(J^T J)^+`` of
    its Jacobian (scipy's SVD route, :func:`.common._covariance_svd`) for curve_fit's
    pcov. In the program, not in NumPy afterwards: NumPy run right after an XLA call is
    2-4x slower than warm (a QR of ``J`` 45-65 us instead of ~15), while in the program
    it is two small LAPACK calls; and the host loop's ``final`` and the promoted program
    compute it alike, so pcov has the same bits on the first and the hundredth fit."""
    top_dt = cfg.rungs[-1]
    fcfg = cfg._replace(schedule=None, point_axes=None)

    def final(x, consts, mask, args, f_scale, lb, ub, xtol):
        fun = masked(jaxpr_function(tr.jaxpr, consts), mask if is_padded else None)
        f, Js, g, cost = final_eval(fun, fcfg, x, cast_floating(args, top_dt), f_scale)
        if cfg.has_bounds:
            active = active_constraints(x, lb, ub, xtol)
            v, _ = cl_scaling(x, g, lb, ub)
            optimality = jnp.max(jnp.abs(g * v))
        else:
            active = jnp.zeros(x.shape, jnp.int32)
            optimality = jnp.max(jnp.abs(g))
        if not covariance:
            return f, Js, g, cost, optimality, active
        # the padded rows of Js are zero; the rank threshold takes the real point count
        m = jnp.sum(mask) if is_padded else Js.shape[0]
        cov, _ = _covariance_svd(Js, jnp.sqrt(jnp.finfo(Js.dtype).eps), m=m)
        return f, Js, g, cost, optimality, active, cov

    key = ("final", tr.key, is_padded, cfg.n, cfg.rungs, cfg.loss, cfg.jac, cfg.has_bounds,
           covariance)
    return _program(key, lambda: cpu_jit(final, optimise=False))


def _sig(tree):
    leaves, treedef = jax.tree.flatten(tree)
    return treedef, tuple((np.shape(a), str(jnp.result_type(a)),
                           isinstance(a, (bool, int, float, complex))) for a in leaves)


def _prepare(residual, fun_flat, x0_flat, args, cfg: LoopConfig, pad):
    """The residual traced at each rung on the (padded) argument shapes (memoised per
    residual object and argument shapes; a new object is traced again, and keyed by its
    computation, so it still finds its compiled programs)."""
    shaped = padded_avals(args, *pad) if pad is not None else args
    memo_key = None
    if _hashable(residual):
        # keyed on the padded shapes: a new length in the bucket is not traced again
        memo_key = (residual, _sig(x0_flat), _sig(shaped), cfg.rungs, pad)
        with _lock:
            hit = _prepared.get(memo_key)
        if hit is not None:
            return hit
    traced = []
    for dt in cfg.rungs:
        avals = jax.tree.map(lambda a: _arg_aval(a, dt), shaped)
        traced.append(trace_residual(fun_flat, jax.ShapeDtypeStruct((cfg.n,), dt), avals))
    _stats["traces"] += len(traced)
    prep = tuple(traced)
    if memo_key is not None:
        with _lock:
            _prepared[memo_key] = prep
            if len(_prepared) > _SIZE:
                _prepared.popitem(last=False)
    return prep


# ----------------------------------------------------------------------------- driver
def _compiled(prog, *args):
    """``prog``'s executable for these arguments (memory, disk cache, or compiled)."""
    return _disk_cache.compiled(prog.tuned, prog.cache_key, args, prog.options)


_deadline = threading.local()


class deadline:
    """Within this block a host-loop solve stops at ``time.perf_counter() >= at`` (checked
    every :data:`QUEUE` iterations) with status 0 (the evaluation budget's code): the
    starts of ``starts="auto"`` (:mod:`._auto_starts`) share one time budget. A promoted
    solve (one executable call) is not interrupted."""

    def __init__(self, at: float):
        self.at = at

    def __enter__(self):
        self.prev = getattr(_deadline, "at", None)
        _deadline.at = self.at if self.prev is None else min(self.at, self.prev)
        return self

    def __exit__(self, *exc):
        _deadline.at = self.prev


def _host_loop(init, step, evaluate, x0, consts, mask, args, ctx, f_scale, m):
    carry, z, ctl = _compiled(init, x0, ctx, m)(x0, ctx, m)
    # the executables are looked up once per solve and called directly in the loop
    evaluate = _compiled(evaluate, ctl, z, consts, mask, args, f_scale)
    ev = evaluate(ctl, z, consts, mask, args, f_scale)
    step = _compiled(step, carry, ev, ctx, m)
    carry, z, ctl = step(carry, ev, ctx, m)
    # Iterations are queued QUEUE at a time (JAX dispatches asynchronously) and the
    # status is read back once per batch: a finished solve is a no-op in `step`, so the
    # extra iterations change nothing but cost a little compute, far less than waiting
    # for every result on a busy CPU.
    at = getattr(_deadline, "at", None)
    while True:
        for _ in range(QUEUE):
            ev = evaluate(ctl, z, consts, mask, args, f_scale)
            carry, z, ctl = step(carry, ev, ctx, m)
        if int(np.asarray(ctl)[0]) != Status.RUNNING:
            return carry
        if at is not None and time.perf_counter() >= at:
            return carry  # still RUNNING: _solve_host_loop reports the budget's code


def _promotion_key(traced, is_padded, cfg: LoopConfig) -> tuple:
    """The whole-solve program's identity (:mod:`._promote`): the residual computation
    at each rung (its jaxpr holds the bucket's shapes) and every option of the step,
    evaluation and final programs."""
    return ("whole", tuple(tr.key for tr in traced), is_padded, _step_cfg(cfg), cfg.n,
            cfg.rungs, cfg.loss, cfg.jac, cfg.linear_solver, cfg.has_bounds)


def _arg_sig(args) -> tuple:
    """The data's structure, shapes and dtypes (Python scalars by type: weakly typed)."""
    leaves, treedef = jax.tree.flatten(args)
    return treedef, tuple((a.shape, a.dtype) if isinstance(a, (np.ndarray, jax.Array,
                                                                 np.generic))
                          else type(a) for a in leaves)


def _whole_fn(sp: StepPrograms, evaluate, final, M: int, is_padded: bool):
    """The host loop's solve as one traceable function ``(ctx, consts, args, m) ->
    result fields``: ``init``, a ``while_loop`` over ``evaluate`` and the step, then
    ``final``: the operations the host loop runs, in its order (so the same bits,
    tests/test_promote.py), without what only the host needs between calls (packing the
    state, and keeping a finished state: the loop stops there)."""
    evaluate, final = evaluate.plain_fn, final.plain_fn
    top = np.dtype(sp.ctx.dtypes[0])

    def whole(ctxv, consts, args, m):
        mask = jnp.arange(M) < m if is_padded else None
        ctx_t = sp.ctx.unpack(ctxv)
        lb, ub, _, fs, _, xtol, _, x0 = ctx_t
        ctx = (None, *ctx_t)
        run = sp.loop(m)
        ev_packer = _ev_packer(x0.shape[0], top)

        def body(c):
            st, prop = c
            ev = ev_packer.unpack(evaluate(_ctl(st), prop.z, consts, mask, args, fs))
            st = run.finish(run.advance(st, prop, ev, ctx))
            return st, run.propose(st, ctx)

        st, _ = jax.lax.while_loop(lambda c: c[0].status == Status.RUNNING, body,
                                   sp.init_tree(x0, ctx_t, m))
        return _fields(st, final(st.x, consts[-1], mask, args, fs, lb, ub, xtol),
                       st.njev + 1)

    return whole


_prefetched: set = set()
_first_solved: set = set()   # step configurations (_step_once) of a first solve


def _vecs(p: Packer) -> tuple:
    return tuple(jax.ShapeDtypeStruct((k,), d) for k, d in zip(p.sizes, p.dtypes))


def _init_avals(sp: StepPrograms, cfg: LoopConfig) -> tuple:
    """The argument shapes of ``init`` (they follow from the step configuration)."""
    sds = jax.ShapeDtypeStruct
    return sds((cfg.n,), np.dtype(cfg.rungs[-1])), _vecs(sp.ctx), sds((), np.int32)


def _step_avals(sp: StepPrograms, cfg: LoopConfig) -> tuple:
    """The argument shapes of ``step`` (the state's layout: built here if not yet)."""
    _, ctx, m = _init_avals(sp, cfg)
    return _vecs(sp.carry), _vecs(_ev_packer(cfg.n, np.dtype(cfg.rungs[-1]))), ctx, m


def _step_once(sp: StepPrograms) -> tuple:
    from ..precision import x64_enabled

    return sp.step.cache_key, x64_enabled()


def _steps_cold(sp: StepPrograms, cfg: LoopConfig) -> bool:
    """Whether the host loop's first solve would compile the step programs: neither
    fetched in this process nor in the disk cache (``init`` is looked for: ``step``'s
    shapes need the state's layout, and both are stored by one process)."""
    with _lock:
        if _step_once(sp) in _prefetched:
            return False
    return not _disk_cache.on_disk(sp.init.cache_key, _init_avals(sp, cfg),
                                   sp.init.options)


def _prefetch_step(sp: StepPrograms, cfg: LoopConfig) -> None:
    """Start loading the step programs from the disk cache in the background (they do
    not depend on the residual: the load overlaps with tracing it; issue 14), or, not
    on disk, lower them here and compile them in the background. Once per step
    configuration and process (their shapes follow from it)."""
    once = _step_once(sp)
    with _lock:
        if once in _prefetched:
            return
        _prefetched.add(once)
    _disk_cache.prefetch(sp.init.cache_key, _init_avals(sp, cfg), sp.init.options,
                         sp.init.tuned)
    _disk_cache.prefetch(sp.step.cache_key, _step_avals(sp, cfg), sp.step.options,
                         sp.step.tuned)


def _prefetch_residual(evaluate, final, n: int, top, consts, mask, args, f_scale, lb, ub,
                       xtol) -> None:
    """Start compiling (or loading) the residual's ``evaluate`` and ``final`` programs in
    the background: on 2 cores they compile beside the step programs, and ``final``
    meanwhile the loop runs (arguments as :func:`_solve_host_loop` passes them)."""
    from ..precision import x64_enabled

    once = (evaluate.cache_key, final.cache_key, x64_enabled(), n, str(top),
            _disk_cache.signature((consts, mask, args, f_scale)))
    if once in _prefetched:
        return  # a repeat: both programs were fetched for these shapes
    with _lock:
        _prefetched.add(once)
        if len(_prefetched) > 16 * _SIZE:
            _prefetched.clear()
    sds = jax.ShapeDtypeStruct
    ctl, z = sds((2,), np.int32), sds((n,), top)
    _disk_cache.prefetch(evaluate.cache_key, (ctl, z, consts, mask, args, f_scale),
                         evaluate.options, evaluate.tuned)
    _disk_cache.prefetch(final.cache_key, (z, consts[-1], mask, args, f_scale, lb, ub, xtol),
                         final.options, final.tuned)


def host_solve(residual, fun_flat, unravel, x0_shape, cfg: LoopConfig, pad, x0, args,
               lb, ub, scale_inv0, f_scale, ftol, xtol, gtol) -> NLSQResult:
    """Solve with the host driver (see the module docstring); inputs as
    :func:`adaptprec.solve_nlsq` after validation (``x0`` flat in the top dtype;
    ``pad``: ``(point axes, bucket length)`` or ``None``)."""
    rungs = cfg.rungs
    top = np.dtype(rungs[-1])
    sp = _step_programs(cfg)
    # a model's first solve on cold step programs compiles the whole-solve program
    # instead (_promote.FIRST_SOLVE); not within a deadline (a promoted solve cannot
    # be stopped)
    # (after a first solve of this step configuration, the step programs are fetched
    # only when the host loop needs them: not for that model's promoted solves)
    solved_first = _step_once(sp) in _first_solved
    first = (not _first_solved and _promote.FIRST_SOLVE and _promote.mode() != "off"
             and getattr(_deadline, "at", None) is None and _steps_cold(sp, cfg))
    if not first and not solved_first:
        _prefetch_step(sp, cfg)
    traced = _prepare(residual, fun_flat, x0, args, cfg, pad)
    m = cfg.m
    is_padded = pad is not None
    if is_padded:
        axes, M = pad
        args = pad_points(args, axes, m, M)
    else:
        M = m
    evaluate = _eval_program(cfg, traced, is_padded)
    covariance = _promote.wants_covariance()
    final = _final_program(cfg, traced[-1], is_padded, covariance)

    def arr(v):
        return np.asarray(v, top)

    lb, ub, fs, xtol = arr(lb), arr(ub), arr(f_scale), arr(xtol)
    # x0 last (the loop's ctx[8]; no rule reads it since a budget escalation continues)
    ctx_tree = (lb, ub, arr(scale_inv0), fs, arr(ftol), xtol, arr(gtol), arr(x0))
    ctx = sp.ctx.pack_numpy(ctx_tree)
    m_arr = np.asarray(m, np.int32)
    consts = tuple(tr.consts for tr in traced)
    # the data's own dtypes too: the residual is traced with its data cast to each rung,
    # but the whole-solve program takes the data as given (a float32 scalar and a float64
    # one trace alike and compile apart)
    pkey = (_promotion_key(traced, is_padded, cfg), _arg_sig(args), covariance)

    def make_build():
        return _promote.Build(_whole_fn(sp, evaluate, final, M, is_padded),
                              (ctx, consts, args, m_arr), pkey)

    # (a warm process that starts on the promoted program loads the step programs only
    # when a new bucket needs them: loading them in the background meanwhile was
    # measured worse, 0.6 s instead of 0.3 s for a new bucket fitted right after)
    whole = _promote.lookup(pkey) or _promote.lookup_disk(pkey, make_build)
    if whole is None and solved_first:
        _prefetch_step(sp, cfg)   # another model on this configuration: the host loop
    if whole is None and first:
        whole = _promote.first_solve(pkey, make_build)
        if whole is None:   # (failed) the host loop serves after all
            _prefetch_step(sp, cfg)
        else:
            # one per process: a model fitted once pays the whole-solve program on top
            # of the step programs the next model of its step configuration builds
            # (NIST, 27 models twice each in a cold process: 6.2-6.6 s against 4.8-5.2
            # with one per configuration); later models take the host loop's cheap first
            # solve. Not needed by later models, the step programs are built at exit,
            # for the disk cache
            with _lock:
                _first_solved.add(_step_once(sp))
            _disk_cache.hold(("step-programs", _step_once(sp)),
                             lambda: _prefetch_step(sp, cfg))
    fields = None
    if whole is not None:
        try:  # one executable call (NumPy straight in: jit's C++ path transfers it)
            fields = _promote.as_numpy(whole.out, whole.exe(ctx, consts, args, m_arr))
        except TypeError:  # arguments it was not compiled for: the host loop serves
            _promote.discard(pkey)
        # (curve_fit's repeat path, the only taker, needs the covariance from the program)
        if fields is not None and x0_shape is not None and covariance:
            _promote.offer(fast=FastSolve(whole, ctx, consts, pad, m, x0_shape))
    if fields is None:
        t0 = time.perf_counter()
        fields = _solve_host_loop(sp, evaluate, final, arr(x0), ctx, consts, args, m_arr,
                                  M, is_padded, fs, lb, ub, xtol)
        _promote.record(pkey, make_build, time.perf_counter() - t0)
    if "cov" in fields:
        _promote.offer(cov=fields.pop("cov"))
    if is_padded:
        fields["fun"], fields["jac"] = fields["fun"][:m], fields["jac"][:m]
    if x0_shape is not None:
        fields["x"] = fields["x"].reshape(x0_shape)
    if not numpy_results():
        fields = jax.device_put(fields)
    if x0_shape is None:
        fields["x"] = unravel(fields["x"])
    return NLSQResult(**fields, ladder=tuple(np.dtype(d) for d in rungs))


class FastSolve:
    """A promoted solve with everything but ``x0`` and the data fixed:
    ``fast(x0, args) -> (x, cost, cov, status)`` (NumPy; ``x`` in ``x0``'s shape, ``cov``
    the ``(J^T J)^+`` of a program that computes it, :func:`_final_program`). For entry
    points that validated one call and see the same shapes and options again
    (:func:`adaptprec.curve_fit`'s repeat path): no tracing, no lookups, one executable
    call, and only the fields it needs read out."""

    def __init__(self, whole, ctx, consts, pad, m: int, x0_shape):
        self.whole, self.consts, self.pad = whole, consts, pad
        self.m_arr = np.asarray(m, np.int32)
        self.x0_shape = x0_shape
        (vec,) = ctx  # the per-solve constants, x0 last (one top-dtype vector)
        n = int(np.prod(x0_shape))
        self.prefix, self.top = vec[:vec.size - n], vec.dtype
        if pad is not None:
            self.idx = np.minimum(np.arange(pad[1]), m - 1)
        self.has_cov = "cov" in _promote.field_index(whole.out)  # (always, as offered)
        self.read = _promote.reader(whole.out, ("x", "cost", "cov", "status"))

    def __call__(self, x0, args):
        ctx = (np.concatenate((self.prefix, np.ravel(np.asarray(x0, self.top)))),)
        if self.pad is not None:
            leaves, treedef = jax.tree.flatten(args)
            args = jax.tree.unflatten(treedef, [
                a if ax is None else np.take(np.asarray(a), self.idx, axis=ax)
                for a, ax in zip(leaves, self.pad[0])])
        x, cost, cov, status = self.read(self.whole.exe(ctx, self.consts, args,
                                                        self.m_arr))
        return x.reshape(self.x0_shape), cost, cov, status


def _solve_host_loop(sp, evaluate, final, x0, ctx, consts, args, m_arr, M, is_padded, fs,
                     lb, ub, xtol) -> dict:
    """The host loop (:func:`_host_loop`) and the final evaluation: the result fields
    (NumPy), as :func:`_whole_fn` gives them."""
    if is_padded:
        args, mask = jax.device_put((args, np.arange(M) < m_arr))
    else:
        mask = None
        args = jax.device_put(args)
    ctx, fs_d, m_d, consts = jax.device_put((ctx, fs, m_arr, consts))
    _prefetch_residual(evaluate, final, x0.shape[0], x0.dtype, consts, mask, args, fs_d,
                       lb, ub, xtol)
    carry = _host_loop(sp.init, sp.step, evaluate, x0, consts, mask, args, ctx, fs_d, m_d)
    carry = jax.device_get(carry)
    st, _ = sp.carry.unpack_numpy(carry)
    if int(st.status) == Status.RUNNING:  # stopped by a deadline
        st = st._replace(status=np.asarray(int(Status.MAX_EVALUATIONS), st.status.dtype))
    fargs = (st.x, consts[-1], mask, args, fs_d, lb, ub, xtol)
    out = jax.device_get(_compiled(final, *fargs)(*fargs))
    return _fields(st, out, st.njev + np.ones_like(st.njev))


def _fields(st, final_out, njev) -> dict:
    """The result fields from the loop's last state and the final program's outputs
    (``njev``: the loop's count plus the final evaluation's Jacobian), with ``cov`` when
    that program computed it; one layout for the host loop and the promoted program."""
    f, Js, g, cost, optimality, active, *cov = final_out
    return dict(x=st.x, cost=cost, fun=f, jac=Js, grad=g, optimality=optimality,
                active_mask=active, nfev=st.nfev, njev=njev, nit=st.nit,
                status=st.status, rung=st.rung, escalations=st.escalations,
                rung_entered=st.rung_entered, rung_nfev=st.rung_nfev,
                escalation_reason=st.esc_reason, **({"cov": cov[0]} if cov else {}))
