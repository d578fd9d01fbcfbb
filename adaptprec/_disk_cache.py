"""The library's own on-disk cache of compiled programs (for fresh processes).

A new Python process compiles every program again: for a small ``curve_fit`` that is
most of the first call (the trust-region step alone compiles in 0.2-0.4 s). Programs
whose key is stable across processes (the host driver's step programs, keyed by their
options; residual programs, keyed by the residual's closed jaxpr text, see
:mod:`adaptprec.nlsq._identity`) are stored here with
``jax.experimental.serialize_executable`` after they compile, and the next process loads
them (a few ms) instead of compiling. JAX's global ``jax_compilation_cache_dir`` option is
the user's switch and is never touched.

This module holds the programs in memory and loads, compiles and stores them; where the
cache lives and how entries are named is :mod:`adaptprec._cache_keys`, the files
:mod:`adaptprec._cache_files`.

Safety: an entry is a pickle, and unpickling runs code, so nothing is unpickled from a
directory or file that is not yours or that others can write, nor any file without the
right HMAC tag under your own secret key: such a file was not written by you (it is
deleted and the program compiled again). A directory that fails the check is reported
once (a ``RuntimeWarning`` saying what is wrong and how to fix it) and the cache runs in
memory only for the rest of the process (:mod:`adaptprec._cache_trust`). An entry that
passes but fails to load (written by another version, a hash collision: the full key is
stored and compared) is deleted and the program recompiled.

Example:
    >>> import os, tempfile, jax, jax.numpy as jnp
    >>> from adaptprec import _disk_cache as dc
    >>> saved, d = os.environ.get("ADAPTPREC_CACHE_DIR"), tempfile.mkdtemp()
    >>> os.environ["ADAPTPREC_CACHE_DIR"] = d
    >>> f = jax.jit(lambda x: 2.0 * x)
    >>> c = dc.compiled(f, ("doc", "twice"), (jnp.ones(3),))
    >>> float(c(jnp.ones(3))[0]), len(os.listdir(d)) == 1
    (2.0, True)
    >>> dc.clear_memory(); float(dc.compiled(f, ("doc", "twice"), (jnp.ones(3),))(jnp.ones(3))[1])
    2.0
    >>> dc.stats()["disk_hits"] >= 1
    True
    >>> _ = (os.environ.pop("ADAPTPREC_CACHE_DIR") if saved is None
    ...      else os.environ.update(ADAPTPREC_CACHE_DIR=saved))
"""

from __future__ import annotations

import collections
import contextlib
import os
import pickle
import threading

import jax

from . import _cache_files
from ._cache_files import Refused, disk_info
from ._cache_keys import MAX_BYTES, OFF, cache_dir, entry, signature
from ._lapack_init import ensure_lapack
from ._tracing import ThreadScoped

__all__ = ["cache_dir", "compiled", "compiled_lowered", "on_disk", "prefetch",
           "prefetch_lowered", "held", "hold", "start_held", "signature", "load_meta",
           "store_meta", "stats", "clear_memory", "disk_info", "clear_disk", "MAX_BYTES"]

_MEMORY_SIZE = 512

_lock = threading.Lock()
_memory: collections.OrderedDict = collections.OrderedDict()
_stats = {"compiles": 0, "disk_hits": 0, "disk_writes": 0, "disk_errors": 0,
          "disk_refused": 0, "memory_hits": 0, "prefetched": 0, "background_compiles": 0}
_pending: dict = {}   # memory key -> _Pending (a background load, see prefetch)


def stats() -> dict:
    """Counters: ``compiles``, ``disk_hits``, ``disk_writes``, ``disk_errors`` (entries
    that could not be used or written), ``disk_refused`` (of those, the files refused
    before unpickling: not yours, writable by others, or without the right tag),
    ``memory_hits``, ``prefetched`` (disk hits loaded in the background by
    :func:`prefetch`) and ``background_compiles`` (programs :func:`prefetch` compiled in
    the background that a later :func:`compiled` used; they count in ``compiles``)."""
    return dict(_stats)


def clear_memory() -> None:
    """Forget the programs held in memory (the disk entries stay) and reset
    :func:`stats`."""
    with _lock:
        _memory.clear()
        _pending.clear()
        for k in _stats:
            _stats[k] = 0


def clear_disk() -> int:
    """Delete the cache's entries from disk (only files the cache wrote: ``<hash>.xla``
    and its temporary files; anything else in the directory is left alone) and forget the
    programs held in memory. Returns the number of files deleted."""
    clear_memory()
    return _cache_files.delete_entries()


def _read(directory: str, name: str):
    """The unpickled entry ``name``, or ``None`` (none, or refused: counted)."""
    try:
        body = _cache_files.read(directory, name)
    except Refused:
        _stats["disk_refused"] += 1
        _stats["disk_errors"] += 1
        return None
    return None if body is None else pickle.loads(body)


def _drop(directory: str, name: str) -> None:
    """Forget an entry that could not be used (incompatible, another version)."""
    _stats["disk_errors"] += 1
    _cache_files.remove(directory, name)


def _load(directory: str, name: str, full_key: str):
    from jax.experimental.serialize_executable import deserialize_and_load

    try:
        item = _read(directory, name)
        if item is None or item.get("key") != full_key:
            return None  # none, refused, or a hash collision: recompile, overwrite
        # (the tag covers every byte: a changed payload, which aborts the process inside
        # XLA, never gets here)
        ensure_lapack()   # LAPACK's kernels, which the loaded program calls (as lowering)
        # on the devices it was compiled for: by default every local device, and a
        # one-device program then expects one shard per device
        by_id = {d.id: d for d in jax.local_devices()}
        devices = [by_id[i] for i in item["device_ids"]]
        return deserialize_and_load(item["payload"], item["in_tree"], item["out_tree"],
                                    execution_devices=devices)
    except Exception:  # incompatible (another version, other devices): drop, recompile
        _drop(directory, name)
        return None


def _write(directory: str, name: str, body: bytes) -> None:
    try:
        written = _cache_files.write(directory, name, body)
    except OSError as exc:  # read-only, not a directory, full disk: memory only
        _stats["disk_errors"] += 1
        _warn_unwritable(directory, exc)
        return
    _stats["disk_writes"] += written


def _store(directory: str, name: str, full_key: str, comp) -> None:
    from jax.experimental.serialize_executable import serialize

    try:
        payload, in_tree, out_tree = serialize(comp)
        device_ids = [d.id for d in comp.runtime_executable().local_devices()]
        body = pickle.dumps({"key": full_key, "payload": payload, "in_tree": in_tree,
                             "out_tree": out_tree, "device_ids": device_ids},
                            protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:  # not serialisable: memory only
        _stats["disk_errors"] += 1
        return
    _write(directory, name, body)


_warned: set = set()


def _warn_unwritable(directory: str, exc: OSError) -> None:
    """One warning per directory and process: the cache runs memory-only."""
    if directory in _warned:
        return
    _warned.add(directory)
    import warnings

    warnings.warn(f"adaptprec's program cache directory {directory!r} cannot be written "
                  f"({exc.strerror or exc}); compiled programs are kept in memory only "
                  "for this process. Set ADAPTPREC_CACHE_DIR to a writable directory, or "
                  "to 'off'.", RuntimeWarning, stacklevel=2)


def load_meta(key):
    """A small picklable object stored by :func:`store_meta` under ``key`` in an earlier
    process, or ``None``."""
    directory, name, full_key = entry(("meta", key))
    if name is None:
        return None
    try:
        item = _read(directory, name)
        if item is not None and item.get("key") == full_key:
            return item["value"]
    except Exception:
        _drop(directory, name)
    return None


def store_meta(key, value) -> None:
    """Store ``value`` (picklable) under ``key`` for later processes (atomic)."""
    directory, name, full_key = entry(("meta", key))
    if name is not None:
        try:
            body = pickle.dumps({"key": full_key, "value": value})
        except Exception:   # not picklable: memory only
            _stats["disk_errors"] += 1
            return
        _write(directory, name, body)


def compiled(jitted, key: tuple, args: tuple, options: dict | None = None):
    """``jitted.lower(*args).compile()``, from memory, from the disk cache or compiled
    (and then stored). ``key`` names the program (with ``jitted``'s compiler
    ``options``, it must determine the program given the argument shapes); the result is
    a ``jax.stages.Compiled`` to call with arguments of the same shapes and dtypes."""
    sig = signature(args)
    mem_key = (key, sig)
    # (without the lock: a repeat's lookups are its host loop's overhead; each
    # OrderedDict call is atomic under the GIL)
    hit = _memory.get(mem_key)
    if hit is not None:
        try:
            _memory.move_to_end(mem_key)
        except KeyError:   # evicted by another thread meanwhile
            pass
        _stats["memory_hits"] += 1
        return hit
    with _lock:
        pending = _pending.pop(mem_key, None)
    comp, loaded = None, False
    if pending is not None:   # started by prefetch(): wait for it
        pending.start()   # (held: see held())
        pending.done.wait()
        comp, loaded = pending.value, pending.loaded
        _stats["prefetched"] += comp is not None and loaded
        _stats["background_compiles"] += comp is not None and not loaded
    directory, name, full_key = entry((key, sig, sorted((options or {}).items())))
    if comp is None and name is not None:
        comp = _load(directory, name, full_key)
        loaded = True
    if comp is not None:
        _stats["disk_hits"] += loaded
    else:
        ensure_lapack()  # before lowering: jaxlib's own start-up imports scipy.linalg
        comp = jitted.lower(*args).compile()
        _stats["compiles"] += 1
        if name is not None:
            _store(directory, name, full_key, comp)
    with _lock:
        _memory[mem_key] = comp
        if len(_memory) > _MEMORY_SIZE:
            _memory.popitem(last=False)
    return comp


def background_compile() -> bool:
    """Whether :func:`prefetch` may compile in a background thread
    (``ADAPTPREC_BACKGROUND_COMPILE=0`` turns it off: every program then compiles when
    first called, in the calling thread)."""
    return os.environ.get("ADAPTPREC_BACKGROUND_COMPILE", "1").strip().lower() not in OFF


def on_disk(key: tuple, args: tuple, options: dict | None = None) -> bool:
    """Whether :func:`compiled` would find ``key``'s program (for these argument shapes
    and compiler ``options``) in memory or on disk, without loading or compiling it."""
    sig = signature(args)
    with _lock:
        if (key, sig) in _memory:
            return True
    directory, name, _ = entry((key, sig, sorted((options or {}).items())))
    return name is not None and _cache_files.exists(directory, name)


def compiled_lowered(lowered, key: tuple, args: tuple, options: dict | None = None):
    """:func:`compiled` for a program already lowered (``jax.stages.Lowered``): on a miss
    it is compiled (``lowered.compile()``) and stored. The lowering (Python, holds the
    GIL) can then happen in one thread and the compilation (releases it) in another."""

    class _Lowered:
        def lower(self, *_):
            return lowered

    return compiled(_Lowered(), key, args, options)


def prefetch_lowered(lowered, key: tuple, args: tuple, options: dict | None = None) -> bool:
    """:func:`prefetch` for a program already lowered: its compilation (or load, when
    on disk) starts in a background thread and the caller's thread is free meanwhile
    (to lower other programs); a later :func:`compiled_lowered` or :func:`compiled`
    with the same key waits for it."""

    class _Lowered:
        def lower(self, *_):
            return lowered

    return prefetch(key, args, options, _Lowered())


class _Pending:
    __slots__ = ("done", "value", "loaded", "thread", "started")

    def __init__(self, loaded: bool):
        self.done, self.value, self.loaded = threading.Event(), None, loaded
        self.thread, self.started = None, False

    def start(self) -> None:
        """Start the background thread (once; it may have been held)."""
        with _lock:
            if self.started or self.thread is None:
                return
            self.started = True
        self.thread.start()


_defer = ThreadScoped(False)   # within held()
_held: list = []    # pendings whose thread waits for a start (see held())
_tasks: dict = {}   # key -> work put off (see hold())
_exit_hook: list = []


def _exit_hook_registered() -> None:
    with _lock:
        if not _exit_hook:
            import atexit

            atexit.register(_finish_held_at_exit)
            _exit_hook.append(True)


@contextlib.contextmanager
def held():
    """The background compilations and loads :func:`prefetch` would start in this thread
    within the block are held: each starts when a :func:`compiled` or :func:`prefetch`
    of its program asks for it, at :func:`start_held`, or at process exit when the
    cache is on (then it is compiled and stored, for later processes)."""
    with _defer.set(True):
        yield


def hold(key, task) -> None:
    """Put ``task()`` (work that lowers and prefetches programs) off, once per ``key``:
    it runs at :func:`start_held`, or at process exit when the cache is on, so its
    programs reach the disk for later processes without costing this one's calls. The
    host driver's step programs after a first solve on the whole-solve program
    (:func:`adaptprec.nlsq._promote.first_solve`): lowered during that solve they cost it
    ~5-10% more CPU, and compiled beside the calls after it they made calls 2-30 of a
    fresh-process loop ~3x slower."""
    from .precision import x64_enabled

    x64 = x64_enabled()   # (the caller's: curve_fit's float64 scope, say)

    def in_scope():
        with jax.enable_x64(x64):
            task()

    with _lock:
        _tasks.setdefault(key, in_scope)
    _exit_hook_registered()


def _run_tasks() -> None:
    while True:
        with _lock:
            if not _tasks:
                return
            task = _tasks.pop(next(iter(_tasks)))
        try:
            task()
        except Exception:  # noqa: BLE001 - work for later only
            pass


def _take_held() -> list:
    with _lock:
        todo = list(_held)
        _held.clear()
    return todo


def start_held() -> list:
    """Run the tasks put off by :func:`hold` (their prefetches held too) and start every
    held compilation; returns the pendings started."""
    with held():
        _run_tasks()
    todo = _take_held()
    for pending in todo:
        pending.start()
    return todo


def _finish_held_at_exit() -> None:
    """At exit, when the cache is on (otherwise it is dropped): :func:`start_held`, and
    wait for it (the interpreter's own join of non-daemon threads ran before the exit
    hooks, and XLA must not run into the interpreter's finalisation)."""
    if cache_dir() is None:
        return
    for pending in start_held():
        if pending.thread is not None:
            pending.thread.join(timeout=120)


def prefetch(key: tuple, args: tuple, options: dict | None = None, jitted=None) -> bool:
    """Start loading the program :func:`compiled` would return for ``(key, args,
    options)`` from disk in a background thread, and return at once (``True`` if a load
    was started). ``args`` may be ``jax.ShapeDtypeStruct`` s of the arguments. Given
    ``jitted`` (as for :func:`compiled`), a program not on disk (or with the cache off)
    is lowered here and compiled in the background thread (then stored).

    XLA's deserialisation of an executable (rebuilding its HLO module: ~0.15 s for the
    host driver's step program) and its compilation release the GIL, so they overlap with
    tracing the residual and with loading or compiling the other programs (XLA:CPU
    compiles each of our programs on one thread: :mod:`adaptprec.nlsq._compile`). A
    later :func:`compiled` with the same key and argument shapes waits for the thread
    (or compiles, if it failed). Nothing happens when the program is in memory or already
    pending, or, without ``jitted``, when the cache is off or the entry is not on disk.

    Example:
        >>> import os, tempfile, jax, jax.numpy as jnp
        >>> from adaptprec import _disk_cache as dc
        >>> saved, d = os.environ.get("ADAPTPREC_CACHE_DIR"), tempfile.mkdtemp()
        >>> os.environ["ADAPTPREC_CACHE_DIR"] = d
        >>> f, x = jax.jit(lambda x: x + 1.0), jnp.ones(2)
        >>> _ = dc.compiled(f, ("doc", "plus-one"), (x,))   # compiled, stored
        >>> dc.clear_memory()
        >>> dc.prefetch(("doc", "plus-one"), (jax.ShapeDtypeStruct(x.shape, x.dtype),))
        True
        >>> float(dc.compiled(f, ("doc", "plus-one"), (x,))(x)[0])
        2.0
        >>> dc.stats()["disk_hits"], dc.stats()["prefetched"], dc.stats()["compiles"]
        (1, 1, 0)
        >>> _ = (os.environ.pop("ADAPTPREC_CACHE_DIR") if saved is None
        ...      else os.environ.update(ADAPTPREC_CACHE_DIR=saved))
    """
    sig = signature(args)
    mem_key = (key, sig)
    with _lock:
        if mem_key in _memory:
            return False
        pending = _pending.get(mem_key)
    if pending is not None:
        pending.start()   # (held: asked for now)
        return False
    directory, name, full_key = entry((key, sig, sorted((options or {}).items())))
    on_disk_ = name is not None and _cache_files.exists(directory, name)
    if not on_disk_ and (jitted is None or not background_compile()):
        return False
    ensure_lapack()   # here, not in the thread (it may import)
    lowered = None
    if not on_disk_:
        try:   # lowering runs Python (holds the GIL): here; the thread only compiles
            lowered = jitted.lower(*args)
        except Exception:  # compiled() lowers again and raises it where it belongs
            return False
    pending = _Pending(loaded=on_disk_)
    with _lock:
        if mem_key in _memory or mem_key in _pending:
            return False
        _pending[mem_key] = pending
        if len(_pending) > _MEMORY_SIZE:   # never consumed (the solve failed): forget
            _pending.pop(next(iter(_pending)))

    def run():
        try:
            if lowered is None:
                pending.value = _load(directory, name, full_key)
            else:
                comp = lowered.compile()
                with _lock:
                    _stats["compiles"] += 1
                if name is not None:
                    # before anyone runs it: serialising an executable that has run
                    # failed now and then ("UNIMPLEMENTED: `LessThan` is not
                    # serializable", a whole-solve program, jax 0.10.2)
                    _store(directory, name, full_key, comp)
                pending.value = comp
        except BaseException:  # _load handles its own errors; never leave it waiting
            pending.value = None
        finally:
            pending.done.set()

    # Not a daemon: Python joins it before shutting down. A daemon thread still inside
    # XLA's deserialisation when a short script ends aborts the process at exit
    # ("terminate called after throwing ...", exit code 134: a warm-cache fit that ran on
    # the promoted program and never waited for the prefetched step programs).
    pending.thread = threading.Thread(target=run, name="adaptprec-prefetch", daemon=False)
    if _defer.get():   # within held(): started when asked for
        with _lock:
            _held.append(pending)
        _exit_hook_registered()
    else:
        pending.start()
    return True
