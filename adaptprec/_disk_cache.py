"""The library's own on-disk cache of compiled programs (for fresh processes).

A new Python process compiles every program again: for a small ``curve_fit`` that is
most of the first call (the trust-region step alone compiles in 0.2-0.4 s). Programs
whose key is stable across processes (the host driver's step programs, keyed by their
options; residual programs, keyed by the residual's closed jaxpr text, see
:mod:`adaptprec.nlsq._identity`) are stored here with
``jax.experimental.serialize_executable`` after they compile, and the next process loads
them (a few ms) instead of compiling. JAX's global ``jax_compilation_cache_dir`` option is
the user's switch and is never touched.

Where: ``$ADAPTPREC_CACHE_DIR`` if set, else ``$XDG_CACHE_HOME/adaptprec``, else
``~/.cache/adaptprec``. ``ADAPTPREC_CACHE_DIR=off`` (or ``0``/``none``/empty) turns the
cache off: nothing is read or written. The variable is read at every lookup, so it can be
changed in a running process.

Keys: the program's key and argument shapes/dtypes, the compiler options, whether x64 is
on, the jax and
jaxlib versions, a hash of adaptprec's own source files (a changed library never loads an
old program), the backend, device kind and platform version, and the CPU (machine and
instruction-set flags). A key whose text holds a memory address (``0x...``: a program
built from an object without a stable ``repr``) is kept in memory only.

Safety: writes go to a temporary file then ``os.replace`` (readers never see half a
file); an entry that fails to load (corrupt, truncated, written by another version, a
hash collision: the full key is stored and compared) is deleted and the program
recompiled. Size: at most :data:`MAX_BYTES` (default 256 MB,
``$ADAPTPREC_CACHE_MAX_MB``); when a write goes over, the least recently used entries
(by modification time; a load touches its file) are deleted down to 3/4 of it. Like
any pickle, an entry runs code when loaded: the directory must be writable only by you
(it is created with mode 0700).

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
import hashlib
import os
import pickle
import platform
import re
import tempfile
import threading

import jax
import numpy as np

from ._lapack_init import ensure_lapack
from ._tracing import ThreadScoped

__all__ = ["cache_dir", "compiled", "compiled_lowered", "on_disk", "prefetch",
           "prefetch_lowered", "held", "hold", "start_held", "signature", "load_meta", "store_meta", "stats", "clear_memory",
           "MAX_BYTES"]

_FORMAT = 2  # 2: a checksum of the payload, the device count in the key
#: default size bound of the cache directory (bytes); ``$ADAPTPREC_CACHE_MAX_MB``
MAX_BYTES = 256 * 2 ** 20
_OFF = ("off", "0", "none", "false", "")
_MEMORY_SIZE = 512

_lock = threading.Lock()
_memory: collections.OrderedDict = collections.OrderedDict()
_stats = {"compiles": 0, "disk_hits": 0, "disk_writes": 0, "disk_errors": 0,
          "memory_hits": 0, "prefetched": 0, "background_compiles": 0}
_fingerprint: list = []
_pending: dict = {}   # memory key -> _Pending (a background load, see prefetch)


def cache_dir() -> str | None:
    """The cache directory in use, or ``None`` when the cache is off (see the module
    docstring)."""
    env = os.environ.get("ADAPTPREC_CACHE_DIR")
    if env is not None:
        return None if env.strip().lower() in _OFF else os.path.expanduser(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"),
                                                            ".cache")
    return os.path.join(base, "adaptprec")


def stats() -> dict:
    """Counters: ``compiles``, ``disk_hits``, ``disk_writes``, ``disk_errors``,
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


_ENTRY_NAME = re.compile(r"^[0-9a-f]{40}\.xla$|^\.tmp-")


def disk_info() -> dict:
    """What the cache holds on disk: ``directory`` (``None`` when off), ``entries``
    (compiled programs and stored metadata), ``bytes`` and ``max_bytes``; the
    ``python -m adaptprec cache info`` command prints it.

    Example:
        >>> import os, tempfile
        >>> from adaptprec import _disk_cache as dc
        >>> saved, os.environ["ADAPTPREC_CACHE_DIR"] = os.environ.get("ADAPTPREC_CACHE_DIR"), tempfile.mkdtemp()
        >>> dc.disk_info()["entries"], dc.disk_info()["bytes"]
        (0, 0)
        >>> _ = (os.environ.pop("ADAPTPREC_CACHE_DIR") if saved is None
        ...      else os.environ.update(ADAPTPREC_CACHE_DIR=saved))
    """
    directory = cache_dir()
    info = {"directory": directory, "entries": 0, "bytes": 0, "max_bytes": _max_bytes()}
    if directory is None:
        return info
    try:
        for e in os.scandir(directory):
            if _ENTRY_NAME.match(e.name) and e.is_file(follow_symlinks=False):
                info["entries"] += 1
                info["bytes"] += e.stat().st_size
    except FileNotFoundError:
        pass
    return info


def clear_disk() -> int:
    """Delete the cache's entries from disk (only files the cache wrote: ``<hash>.xla``
    and its temporary files; anything else in the directory is left alone) and forget the
    programs held in memory. Returns the number of files deleted."""
    directory = cache_dir()
    clear_memory()
    if directory is None:
        return 0
    removed = 0
    try:
        for e in os.scandir(directory):
            if _ENTRY_NAME.match(e.name) and e.is_file(follow_symlinks=False):
                try:
                    os.remove(e.path)
                    removed += 1
                except OSError:
                    pass
    except FileNotFoundError:
        pass
    return removed


def _source_hash() -> str:
    root = os.path.dirname(os.path.abspath(__file__))
    h = hashlib.sha256()
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(filenames):
            if name.endswith(".py"):
                path = os.path.join(dirpath, name)
                h.update(os.path.relpath(path, root).encode())
                with open(path, "rb") as fh:
                    h.update(fh.read())
    return h.hexdigest()


def _cpu_flags() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith(("flags", "Features")):
                    return hashlib.sha256(line.encode()).hexdigest()[:16]
    except OSError:
        pass
    return platform.processor()


def _environment() -> tuple:
    if not _fingerprint:
        import jaxlib

        dev = jax.devices()[0]
        # the device count too: an executable compiled for one device expects one shard
        # per argument (newcomer audit 6: a cache filled with 1 CPU device crashed every
        # fit of a process with --xla_force_host_platform_device_count=4, and back)
        _fingerprint.append((_FORMAT, jax.__version__, jaxlib.__version__, _source_hash(),
                             dev.platform, dev.device_kind, dev.client.platform_version,
                             platform.machine(), _cpu_flags(), len(jax.devices()),
                             jax.process_count()))
    return _fingerprint[0]


_dtype_names: tuple = ({}, {})   # per x64 state: dtype -> the canonical dtype's name


def _dtype_name(dtype, names: dict) -> str:
    """``str(jax.dtypes.canonicalize_dtype(dtype))`` (``jnp.result_type``'s string),
    memoised (``names``: the current x64 state's): a signature is computed at every
    lookup."""
    name = names.get(dtype)
    if name is None:
        name = names[dtype] = str(jax.dtypes.canonicalize_dtype(dtype))
    return name


def _aval(a, names: dict):
    if isinstance(a, np.ndarray):
        return a.shape, _dtype_name(a.dtype, names), False
    if isinstance(a, (jax.Array, jax.ShapeDtypeStruct)):
        return a.shape, _dtype_name(a.dtype, names), a.weak_type
    weak = isinstance(a, (bool, int, float, complex))
    if hasattr(a, "aval"):
        weak = a.aval.weak_type
    return (tuple(np.shape(a)), str(jax.numpy.result_type(a)), weak)


def signature(args) -> tuple:
    """The arguments' structure, shapes, canonical dtypes and weak types: the in-memory
    key of a program with the program's key (a repeat's lookups: ~1 us per leaf; this
    replaced the host driver's own memo above it), and in the disk key
    (``repr``)."""
    from .precision import x64_enabled

    names = _dtype_names[x64_enabled()]
    leaves, treedef = jax.tree.flatten(args)
    out = []
    for a in leaves:   # (the common kinds inline: a call per leaf is most of the cost)
        if isinstance(a, np.ndarray):
            out.append((a.shape, names.get(a.dtype) or _dtype_name(a.dtype, names), False))
        elif isinstance(a, jax.Array):
            out.append((a.shape, names.get(a.dtype) or _dtype_name(a.dtype, names),
                        a.weak_type))
        else:
            out.append(_aval(a, names))
    return treedef, tuple(out)


def _max_bytes() -> int:
    try:
        return int(float(os.environ["ADAPTPREC_CACHE_MAX_MB"]) * 2 ** 20)
    except (KeyError, ValueError):
        return MAX_BYTES


def _init_custom_calls() -> None:
    """Initialise what lowering would have: jaxlib's LAPACK kernels (the step programs
    call LAPACK; an executable loaded in a process that never lowered a linear-algebra
    op otherwise calls through null pointers and crashes, jax 0.10.2). Without
    importing all of ``scipy.linalg`` (:mod:`adaptprec._lapack_init`)."""
    ensure_lapack()


def _load(path: str, full_key: str):
    from jax.experimental.serialize_executable import deserialize_and_load

    try:
        with open(path, "rb") as fh:
            entry = pickle.load(fh)
        if entry.get("key") != full_key:
            return None  # a hash collision, or another format: recompile, overwrite
        # a payload changed on disk must never reach XLA: it aborted the process
        # (newcomer audit 6: one changed byte gave "LLVM ERROR", SIGABRT, in every
        # later process too, since the entry stayed)
        if entry.get("sha256") != hashlib.sha256(entry["payload"]).hexdigest():
            raise ValueError("the payload does not match its checksum")
        _init_custom_calls()
        # on the devices it was compiled for: by default every local device, and a
        # one-device program then expected one shard per device (newcomer audit 6:
        # every warm-cache fit crashed with 4 CPU devices)
        by_id = {d.id: d for d in jax.local_devices()}
        devices = [by_id[i] for i in entry["device_ids"]]
        out = deserialize_and_load(entry["payload"], entry["in_tree"], entry["out_tree"],
                                   execution_devices=devices)
    except FileNotFoundError:
        return None
    except Exception:  # corrupt / truncated / incompatible: drop it and recompile
        _drop(path)
        return None
    try:
        os.utime(path)  # least-recently-used order for the size bound
    except OSError:
        pass
    return out


def _store(directory: str, path: str, full_key: str, comp) -> None:
    from jax.experimental.serialize_executable import serialize

    try:
        payload, in_tree, out_tree = serialize(comp)
        device_ids = [d.id for d in comp.runtime_executable().local_devices()]
        data = pickle.dumps({"key": full_key, "payload": payload, "in_tree": in_tree,
                             "out_tree": out_tree, "device_ids": device_ids,
                             "sha256": hashlib.sha256(payload).hexdigest()},
                            protocol=pickle.HIGHEST_PROTOCOL)
        _write(directory, path, data)
    except OSError as exc:  # read-only, not a directory, full disk: memory only
        _stats["disk_errors"] += 1
        _warn_unwritable(directory, exc)
        return
    except Exception:  # not serialisable: memory only
        _stats["disk_errors"] += 1
        return
    _stats["disk_writes"] += 1
    _trim(directory)


_warned: set = set()


def _warn_unwritable(directory: str, exc: OSError) -> None:
    """One warning per directory and process: the cache silently ran memory-only
    (newcomer audit 6: only a counter said so)."""
    if directory in _warned:
        return
    _warned.add(directory)
    import warnings

    warnings.warn(f"adaptprec's program cache directory {directory!r} cannot be written "
                  f"({exc.strerror or exc}); compiled programs are kept in memory only "
                  "for this process. Set ADAPTPREC_CACHE_DIR to a writable directory, or "
                  "to 'off'.", RuntimeWarning, stacklevel=2)


def _trim(directory: str) -> None:
    limit = _max_bytes()
    try:
        entries = [e for e in os.scandir(directory) if e.name.endswith(".xla")]
        sizes = [(e.stat().st_mtime, e.stat().st_size, e.path) for e in entries]
    except OSError:
        return
    total = sum(s for _, s, _ in sizes)
    if total <= limit:
        return
    for _, size, path in sorted(sizes):
        try:
            os.remove(path)
        except OSError:
            continue
        total -= size
        if total <= 0.75 * limit:
            break


def _entry(key) -> tuple[str | None, str | None, str | None]:
    """``(directory, path, full key)`` of ``key``'s entry; ``None`` s when the cache is
    off or the key is not stable across processes."""
    directory = cache_dir()
    if directory is None:
        return None, None, None
    from .precision import x64_enabled

    full_key = repr((_environment(), x64_enabled(), key))
    if "0x" in full_key:  # an object's address: not stable across processes
        return None, None, None
    name = hashlib.sha256(full_key.encode()).hexdigest()[:40] + ".xla"
    return directory, os.path.join(directory, name), full_key


def _drop(path: str) -> None:
    """Forget an entry that could not be read (corrupt, truncated, incompatible)."""
    _stats["disk_errors"] += 1
    try:
        os.remove(path)
    except OSError:
        pass


def load_meta(key):
    """A small picklable object stored by :func:`store_meta` under ``key`` in an earlier
    process, or ``None``."""
    directory, path, full_key = _entry(("meta", key))
    if path is None:
        return None
    try:
        with open(path, "rb") as fh:
            entry = pickle.load(fh)
        if entry.get("key") == full_key:
            return entry["value"]
    except FileNotFoundError:
        pass
    except Exception:
        _drop(path)
    return None


def store_meta(key, value) -> None:
    """Store ``value`` (picklable) under ``key`` for later processes (atomic)."""
    directory, path, full_key = _entry(("meta", key))
    if path is not None:
        try:
            _write(directory, path, pickle.dumps({"key": full_key, "value": value}))
        except Exception:
            _stats["disk_errors"] += 1


def _write(directory: str, path: str, data: bytes) -> None:
    os.makedirs(directory, mode=0o700, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.remove(tmp)
        except OSError:
            pass
        raise


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
    directory, path, full_key = _entry((key, sig, sorted((options or {}).items())))
    if comp is None and path is not None:
        comp = _load(path, full_key)
        loaded = True
    if comp is not None:
        _stats["disk_hits"] += loaded
    else:
        ensure_lapack()  # before lowering: jaxlib's own start-up imports scipy.linalg
        comp = jitted.lower(*args).compile()
        _stats["compiles"] += 1
        if path is not None:
            _store(directory, path, full_key, comp)
    with _lock:
        _memory[mem_key] = comp
        if len(_memory) > _MEMORY_SIZE:
            _memory.popitem(last=False)
    return comp


def background_compile() -> bool:
    """Whether :func:`prefetch` may compile in a background thread
    (``ADAPTPREC_BACKGROUND_COMPILE=0`` turns it off: every program then compiles when
    first called, in the calling thread)."""
    return os.environ.get("ADAPTPREC_BACKGROUND_COMPILE", "1").strip().lower() not in _OFF


def on_disk(key: tuple, args: tuple, options: dict | None = None) -> bool:
    """Whether :func:`compiled` would find ``key``'s program (for these argument shapes
    and compiler ``options``) in memory or on disk, without loading or compiling it."""
    sig = signature(args)
    with _lock:
        if (key, sig) in _memory:
            return True
    _, path, _ = _entry((key, sig, sorted((options or {}).items())))
    return path is not None and os.path.exists(path)


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
    directory, path, full_key = _entry((key, sig, sorted((options or {}).items())))
    on_disk_ = path is not None and os.path.exists(path)
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
                pending.value = _load(path, full_key)
            else:
                comp = lowered.compile()
                with _lock:
                    _stats["compiles"] += 1
                if path is not None:
                    # before anyone runs it: serialising an executable that has run
                    # failed now and then ("UNIMPLEMENTED: `LessThan` is not
                    # serializable", a whole-solve program, jax 0.10.2)
                    _store(directory, path, full_key, comp)
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
