"""Promotion: repeated fits of one model run as ONE compiled program.

The host driver (:mod:`._host`) runs a small eager solve as a Python loop over compiled
programs (``init``, then ``evaluate``/``step`` per iteration, then ``final``): about 36
compiled calls for a 3-parameter fit, each with its argument handling, so a repeat costs
milliseconds. Once a residual computation (:mod:`._identity`, with its data bucket,
ladder and options) has been solved more than :data:`PROMOTE_AFTER` times in a process
and its host-loop solves have taken :data:`PROMOTE_SECONDS` (0.2 s: ~60 repeats of a
3-parameter fit), the same functions are compiled into one program, the *whole solve*:
``init``, a ``while_loop`` over ``evaluate`` and the step, and the ``final``
evaluation, with every result packed into one vector per dtype (:mod:`._pack`). Later
solves of that computation are one executable call and one read-back.

* **Background.** The solve that promotes traces and lowers the whole-solve program
  (Python, ~0.1-0.2 s, once); XLA compiles it in a background thread (one at a time;
  the compilation releases the GIL), so no solve waits for the compilation: solves run
  the host loop until it is ready. (Tracing in the background thread was measured
  worse: holding the GIL, it slowed every host-loop solve meanwhile ~3x.) The thread
  runs with the caller's x64 state (``jax.enable_x64`` is thread-local); at exit a
  running compilation is waited for.
* **First solve.** Where the host loop's first solve would compile the step programs
  too (none built in this process or on disk: a fresh process on an empty cache, or a
  new parameter count or options), the process's first model compiles its whole-solve
  program instead (:func:`first_solve`, :data:`FIRST_SOLVE`): about the same cost for
  that solve, and every later one is promoted from the start. The step programs are
  built by the next model's solve, or at exit (with the disk cache on), for later
  processes.
* **Disk.** It is stored in adaptprec's program cache (:mod:`adaptprec._disk_cache`),
  keyed on the residual's identity, so a fresh process of the same script finds it and
  runs the whole-solve program from its first fit.
* **Bits.** It is compiled with the host programs' options (:func:`._compile.cpu_jit`,
  ``optimise=False``), from the same functions: the iterates, ``nfev`` and results are the
  host loop's bit for bit (tests/test_promote.py), so the first and the hundredth fit of
  a model agree exactly.
* **Switch.** ``ADAPTPREC_PROMOTE``: ``background`` (default), ``sync`` (compile in the
  calling thread, deterministic: tests use it), ``off``. Read at every solve. The test
  session sets ``off`` (conftest.py) and the promotion tests turn it on.

Example:
    >>> from adaptprec.nlsq import _promote
    >>> _promote.mode() in ("background", "sync", "off")
    True
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import os
import queue
import threading
from typing import Any, NamedTuple

import jax
import numpy as np

from .. import _disk_cache
from .._tracing import ThreadScoped
from ._compile import cpu_options, tuned_jit
from ._pack import Packer

__all__ = ["PROMOTE_AFTER", "PROMOTE_SECONDS", "FIRST_SOLVE", "mode", "Whole", "lookup",
           "first_solve", "record", "wait", "clear", "stats"]

#: host-loop solves of one residual computation (and bucket, ladder, options) before its
#: whole-solve program may be built (the (PROMOTE_AFTER + 1)-th at the earliest) ...
PROMOTE_AFTER = 2
#: ... and the time its host-loop solves must have taken first (seconds; its first solve,
#: which compiles, not counted). Promoting costs the promoting call ~0.1-0.2 s of tracing
#: and lowering; waiting until the host loop has cost as much (ski rental) bounds a
#: model's total at twice the best choice made in hindsight, and a model solved a few
#: times is not promoted (the NIST suite's Lanczos1-3, one model on the same 24 points:
#: six solves, 0.02-0.09 s of host loop after the first under load).
PROMOTE_SECONDS = 0.2
#: LLVM optimisation of the whole-solve program. Off (default): the host programs'
#: options, so the bits are the host loop's (all 54 NIST solves identical, nfev
#: included). On, it runs ~1.7x faster but rounds differently: on 31 of the 54 NIST
#: solves nfev changed, so a model's results would depend on whether (and, in the
#: background, when) it was promoted.
OPTIMISE = False
#: XLA passes the whole-solve program is compiled without (when not :data:`OPTIMISE`).
#: While-loop invariant code motion hoists what the loop body computes from loop
#: constants (``jacfwd``'s basis vectors, ``x ** 2`` of the data) out of the loop, so the
#: body's fusions are not the host programs' fusions. That changes the rounding: LLVM
#: contracts a multiply and an add into an FMA (XLA:CPU always allows it), at ``-O0``
#: apparently only in blocks that FastISel hands to SelectionDAG (here the one with the
#: basis vector's select, which hoisting moved out).
#: NIST MGH09 (both starts): the host's Jacobian fusion computed ``x*x + x*b2`` as
#: ``fma(x, x, x*b2)``, the promoted one ``hoisted(x*x) + x*b2``; from iteration 70 on,
#: ``R`` and ``qtf`` differed in the last bits, then ``x``. Without the pass, all 54 NIST
#: solves agree bit for bit (benchmarks/promote_bits.py); run time 0-8% more (Hahn1).
NO_HOIST_PASSES = "while-loop-invariant-code-motion"
#: A model's first solve runs the whole-solve program, compiled then
#: (:func:`first_solve`), when the host driver's step programs are cold: neither built in
#: this process nor in the disk cache (a fresh process on an empty cache, or a new step
#: configuration), and no first solve ran in this process before. The host loop's first solve would then compile its step programs, which
#: costs as much as the whole solve's program (4PL, 12 points, x64 off: 0.70 s against
#: 0.70 s in a fresh process), while every later solve of the model is one executable
#: call (0.4 ms) instead of the host loop's ~3 ms until promotion (issue 32 item 5:
#: calls 2-100 of a fresh-process loop). The step programs are then lowered, compiled
#: and stored at exit (:func:`adaptprec._disk_cache.hold`; with the cache on), so later
#: processes take the host loop's cheap first solve for a new model. One first solve
#: per process (the first model, which a loop most likely repeats): a model fitted once
#: pays the whole-solve program on top of the step programs the next model builds, so a
#: script of many one-off models (the NIST suite) would pay it for every step
#: configuration. The same bits either way (the promoted program's,
#: tests/test_promote.py).
FIRST_SOLVE = True
_MODES = ("background", "sync", "off")
_SIZE = 64

_lock = threading.Lock()
_ready: collections.OrderedDict = collections.OrderedDict()   # key -> Whole
_uses: dict = {}
_pending: set = set()   # keys queued or compiling
_failed: set = set()
_checked: set = set()   # keys already looked for on disk
_stats = {"promoted": 0, "first_solves": 0, "disk_loads": 0, "failures": 0,
          "compile_seconds": 0.0}
_queue: queue.Queue = queue.Queue()
_box = ThreadScoped()   # the innermost capture() block's box
#: entry points' fast plans (see :func:`capture`), keyed by the entry point; cleared
#: with the promoted programs
plans: collections.OrderedDict = collections.OrderedDict()
_worker: list = []
_stop = threading.Event()


def mode() -> str:
    """``$ADAPTPREC_PROMOTE`` (``background``, ``sync`` or ``off``; default
    ``background``)."""
    m = os.environ.get("ADAPTPREC_PROMOTE", "background").strip().lower()
    return m if m in _MODES else "background"


def stats() -> dict:
    """``promoted`` (programs compiled), ``first_solves`` (of them, compiled for a
    model's first solve: :func:`first_solve`), ``disk_loads``, ``failures``,
    ``compile_seconds`` (summed over promoted programs), ``ready`` (in memory),
    ``pending`` (being compiled)."""
    return {**_stats, "ready": len(_ready), "pending": len(_pending)}


def clear() -> None:
    """Forget promoted programs, use counts and fast plans (waits for a running
    compile)."""
    wait()
    with _lock:
        _ready.clear()
        plans.clear()
        _checked.clear()
        _uses.clear()
        _failed.clear()
        _pending.clear()
        _stats.update(promoted=0, first_solves=0, disk_loads=0, failures=0,
                      compile_seconds=0.0)


class Whole(NamedTuple):
    """A promoted solve: ``exe(ctx, consts, args, m) -> packed`` and the layout of its
    packed results (:class:`._pack.Packer` of a dict of result fields)."""

    exe: Any
    out: Packer


class Build(NamedTuple):
    """What is needed to build (or load) a whole-solve program: the traceable function,
    example arguments (shapes only matter) and the cache key."""

    fn: Any
    args: tuple
    key: tuple


def _jit(fn):
    return tuned_jit(fn, _options())


def _options() -> dict | None:
    """The compiler options of a whole-solve program (``None`` off CPU): the host
    programs', without loop-invariant code motion unless :data:`OPTIMISE`."""
    opts = cpu_options(optimise=OPTIMISE)
    if opts is not None and not OPTIMISE:
        opts["xla_disable_hlo_passes"] = NO_HOIST_PASSES
    return opts


def _layout_key(key):
    return ("whole-layout", key)


def _lower(build: Build):
    """Trace and lower one whole-solve program (one trace; Python, so in the calling
    thread): ``(lowered, layout of the packed results)``."""
    from .._lapack_init import ensure_lapack

    ensure_lapack()   # (else lowering a QR imports all of scipy.linalg: 0.2-0.4 s)
    box = {}

    def packed(*a):
        tree = build.fn(*a)
        box["out"] = out = Packer(tree, bool_as=np.int32)  # from the tracers' avals
        return out.pack(tree)

    lowered = _jit(packed).tuned.lower(*build.args)
    _disk_cache.store_meta(_layout_key(build.key), box["out"])
    return lowered, box["out"]


def _compile(build: Build, lowered=None, out=None) -> Whole:
    """Compile ``lowered`` (or load the program from the disk cache, where ``out`` is
    ``None``: its layout is stored there too) and time it."""
    import time

    t0 = time.perf_counter()
    if out is None:
        out = _disk_cache.load_meta(_layout_key(build.key))
    if lowered is None and isinstance(out, Packer) and \
            _disk_cache.on_disk(build.key, build.args, _options()):
        exe = _disk_cache.compiled(_NeverLower(), build.key, build.args, _options())
    else:
        if lowered is None:
            lowered, out = _lower(build)
        exe = _disk_cache.compiled_lowered(lowered, build.key, build.args, _options())
    with _lock:
        _stats["compile_seconds"] += time.perf_counter() - t0
    return Whole(exe, out)


class _NeverLower:
    """For a program found on disk: :func:`adaptprec._disk_cache.compiled` loads it."""

    def lower(self, *_):
        raise RuntimeError("the promoted program vanished from the disk cache")


def _install(key, whole: Whole) -> None:
    with _lock:
        _ready[key] = whole
        _pending.discard(key)
        if len(_ready) > _SIZE:
            _ready.popitem(last=False)


def _run_worker() -> None:
    while not _stop.is_set():
        item = _queue.get()
        if item is None:
            _queue.task_done()
            return
        task, x64 = item
        try:
            if not _stop.is_set():
                with jax.enable_x64(x64):
                    task()
        except Exception:  # noqa: BLE001 - background work only ever saves time
            pass
        finally:
            _queue.task_done()


def _shutdown() -> None:
    """At exit: start nothing new, let a running compile finish (XLA must not be torn
    down under it)."""
    _stop.set()
    if _worker and _worker[0].is_alive():
        _queue.put(None)
        _worker[0].join(timeout=60)


def _promote_task(build: Build, lowered, out):
    def task():
        try:
            whole = _compile(build, lowered, out)
        except Exception:  # noqa: BLE001 - the host loop keeps serving this model
            with _lock:
                _failed.add(build.key)
                _pending.discard(build.key)
                _stats["failures"] += 1
            return
        _install(build.key, whole)
        _stats["promoted"] += 1

    return task


def background(task) -> None:
    """Run ``task()`` in the background thread (one task at a time, in order, with the
    caller's x64 state); in ``sync`` mode run it now."""
    from ..precision import x64_enabled

    if mode() == "sync":
        task()
        return
    if not _worker:
        t = threading.Thread(target=_run_worker, name="adaptprec-promote", daemon=True)
        t.start()
        _worker.append(t)
        atexit.register(_shutdown)
    _queue.put((task, x64_enabled()))


def wait(timeout: float | None = None) -> None:
    """Block until every queued background compile has finished (tests, benchmarks)."""
    if not _worker:
        return
    if timeout is None:
        _queue.join()
        return
    import time

    end = time.monotonic() + timeout
    while _queue.unfinished_tasks and time.monotonic() < end:
        time.sleep(0.005)


def lookup(key) -> Whole | None:
    """The promoted program of ``key`` if it is ready in memory (and promotion is not
    ``off``), else ``None``."""
    hit = _ready.get(key)
    if hit is None or mode() == "off":
        return None
    return hit


def discard(key) -> None:
    """Stop using ``key``'s promoted program (it rejected its arguments)."""
    with _lock:
        _ready.pop(key, None)
        _failed.add(key)
        _stats["failures"] += 1


def lookup_disk(key, make_build) -> Whole | None:
    """On the first solve of ``key`` in this process: the whole-solve program from the
    disk cache, if an earlier process stored it (its layout entry is there). Checked once
    per key and process."""
    if mode() == "off" or key in _ready or key in _failed or key in _pending or \
            key in _checked:
        return _ready.get(key)
    with _lock:
        _checked.add(key)
        if len(_checked) > 4 * _SIZE:
            _checked.pop()
    if _disk_cache.load_meta(_layout_key(key)) is None:
        return None
    build = make_build()
    if not _disk_cache.on_disk(build.key, build.args, _options()):
        return None
    try:
        whole = _compile(build)  # loads it
    except Exception:  # noqa: BLE001 - unreadable: the host loop runs
        with _lock:
            _failed.add(key)
        return None
    _install(key, whole)
    _stats["disk_loads"] += 1
    return whole


def first_solve(key, make_build) -> Whole | None:
    """The whole-solve program of ``key`` compiled now, for a model's first solve when the
    host driver's step programs are cold (:data:`FIRST_SOLVE`; ``None`` when promotion
    is ``off`` or ``key`` failed before, or if it fails now: the host loop serves)."""
    if not FIRST_SOLVE or mode() == "off":
        return None
    with _lock:
        if key in _ready:
            return _ready[key]
        if key in _pending or key in _failed:
            return None
        _pending.add(key)
    try:
        build = make_build()
        lowered, out = _lower(build)
        # compiled in a thread, so that storing it on disk happens after this has it
        _disk_cache.prefetch_lowered(lowered, build.key, build.args, _options())
        whole = _compile(build, lowered, out)   # waits for its compilation
    except Exception:
        with _lock:
            _failed.add(key)
            _pending.discard(key)
            _stats["failures"] += 1
        if mode() == "sync":
            raise
        return None
    except BaseException:   # Ctrl-C: not the model's failure (see record)
        with _lock:
            _pending.discard(key)
        raise
    _install(key, whole)
    with _lock:
        _stats["promoted"] += 1
        _stats["first_solves"] += 1
    return whole


def record(key, make_build, seconds: float = 0.0) -> None:
    """Count one host-loop solve of ``key`` that took ``seconds``; once it has been solved
    more than :data:`PROMOTE_AFTER` times and its host-loop solves (the first, which
    compiles, not counted) took :data:`PROMOTE_SECONDS` in all, build its whole-solve
    program (``make_build() -> Build``) in the background (or now, in ``sync`` mode)."""
    m = mode()
    if m == "off":
        return
    with _lock:
        if key in _ready or key in _pending or key in _failed:
            return
        count, spent = _uses.get(key, (0, 0.0))
        count, spent = count + 1, spent + (seconds if count else 0.0)
        _uses[key] = (count, spent)
        if len(_uses) > 4 * _SIZE:
            _uses.pop(next(iter(_uses)))
        if count <= PROMOTE_AFTER or spent < PROMOTE_SECONDS:
            return
        _pending.add(key)
    try:
        build = make_build()
        lowered = out = None
        if not _disk_cache.on_disk(build.key, build.args, _options()):
            # tracing and lowering hold the GIL: here, once (~0.1-0.2 s), rather than in
            # the background thread, where they would slow every solve meanwhile
            lowered, out = _lower(build)
        if m == "sync":
            _install(key, _compile(build, lowered, out))
            _stats["promoted"] += 1
        else:  # XLA's compilation releases the GIL: the host loop runs on meanwhile
            background(_promote_task(build, lowered, out))
    except Exception:
        with _lock:
            _failed.add(key)
            _pending.discard(key)
            _stats["failures"] += 1
        if m == "sync":
            raise
    except BaseException:
        # Ctrl-C while building: not a failure of the model, so a later solve may
        # promote it; it stayed "pending" forever (newcomer audit 6)
        with _lock:
            _pending.discard(key)
        raise


@contextlib.contextmanager
def capture(covariance: bool = False):
    """Collect the fast solve (:class:`._host.FastSolve`) of a promoted solve run inside
    this block (``box["fast"]``), so an entry point can skip its boundary work on the
    next call with the same shapes and options. ``covariance``: a host-driver solve in
    the block computes ``(J^T J)^+`` in its final program (``box["cov"]``, NumPy)."""
    box: dict = {"want_cov": covariance}
    with _box.set(box):
        yield box


def offer(**items) -> None:
    """Hand ``items`` (``fast=``, ``cov=``) to the innermost :func:`capture` block, if
    any."""
    box = _box.get()
    if box is not None:
        box.update(items)


def withdraw(*names) -> None:
    """Take ``names`` (``"fast"``, ``"cov"``) back from the innermost :func:`capture`
    block: a solve after the one that offered them decided the answer (``starts="auto"``
    searched, so a repeat through the local fit's fast path would skip the search)."""
    box = _box.get()
    if box is not None:
        for k in names:
            box.pop(k, None)


def wants_covariance() -> bool:
    """Whether the innermost :func:`capture` block asked for the covariance."""
    box = _box.get()
    return bool(box and box["want_cov"])


def remember_plan(key, plan) -> None:
    with _lock:
        plans[key] = plan
        if len(plans) > _SIZE:
            plans.popitem(last=False)


def field_index(out: Packer) -> dict:
    """The packed results' field names, each with its slot number."""
    return jax.tree.unflatten(out.treedef, list(range(len(out.slots))))


def reader(out: Packer, names):
    """``read(packed) -> tuple`` of the result fields ``names`` as NumPy (one read-back
    per vector; views, no other field unpacked)."""
    index = field_index(out)
    slots = [(out.slots[index[k]], out.bools[index[k]]) for k in names]

    def read(packed):
        vecs = [np.asarray(v) for v in packed]
        return tuple((vecs[g][s:s + k].reshape(shape) != 0) if b else
                     vecs[g][s:s + k].reshape(shape) for (g, s, k, shape), b in slots)

    return read


def as_numpy(out: Packer, packed) -> dict:
    """The whole-solve program's result fields, as NumPy (one read-back per vector)."""
    return out.unpack_numpy(tuple(np.asarray(v) for v in packed))

