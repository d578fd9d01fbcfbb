"""The library's own on-disk cache of compiled programs (for fresh processes).

A new Python process compiles every program again: for a small ``curve_fit`` that is
most of the first call. Programs whose key is stable across processes (a fit's whole
solve, keyed by its residual's closed jaxpr text, :mod:`adaptprec._identity`, and
its options) are stored here with ``jax.experimental.serialize_executable`` after they
compile, and the next process loads them instead of compiling. JAX's global ``jax_compilation_cache_dir`` option is
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
import pickle
import threading

import jax

from . import _cache_files
from ._cache_files import Refused, disk_info
from ._cache_keys import MAX_BYTES, cache_dir, entry, signature
from ._lapack_init import ensure_lapack

__all__ = ["cache_dir", "compiled", "signature", "stats", "clear_memory", "disk_info",
           "clear_disk", "MAX_BYTES"]

_MEMORY_SIZE = 512

_lock = threading.Lock()
_memory: collections.OrderedDict = collections.OrderedDict()
_stats = {"compiles": 0, "disk_hits": 0, "disk_writes": 0, "disk_errors": 0,
          "disk_refused": 0, "memory_hits": 0}


def stats() -> dict:
    """Counters: ``compiles``, ``disk_hits``, ``disk_writes``, ``disk_errors`` (entries
    that could not be used or written), ``disk_refused`` (of those, the files refused
    before unpickling: not yours, writable by others, or without the right tag) and
    ``memory_hits``."""
    return dict(_stats)


def clear_memory() -> None:
    """Forget the programs held in memory (the disk entries stay) and reset
    :func:`stats`."""
    with _lock:
        _memory.clear()
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


def compiled(jitted, key: tuple, args: tuple, options: dict | None = None):
    """``jitted.lower(*args).compile()``, from memory, from the disk cache or compiled
    (and then stored). ``key`` names the program (with ``jitted``'s compiler
    ``options``, it must determine the program given the argument shapes); the result is
    a ``jax.stages.Compiled`` to call with arguments of the same shapes and dtypes."""
    sig = signature(args)
    mem_key = (key, sig)
    # (without the lock: each OrderedDict call is atomic under the GIL)
    hit = _memory.get(mem_key)
    if hit is not None:
        try:
            _memory.move_to_end(mem_key)
        except KeyError:   # evicted by another thread meanwhile
            pass
        _stats["memory_hits"] += 1
        return hit
    directory, name, full_key = entry((key, sig, sorted((options or {}).items())))
    comp = _load(directory, name, full_key) if name is not None else None
    if comp is not None:
        _stats["disk_hits"] += 1
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
