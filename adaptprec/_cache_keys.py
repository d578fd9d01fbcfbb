"""Where the program cache lives, and the names of its entries.

Where: ``$ADAPTPREC_CACHE_DIR`` if set, else ``$XDG_CACHE_HOME/adaptprec``, else
``~/.cache/adaptprec``. ``ADAPTPREC_CACHE_DIR=off`` (or ``0``/``none``/empty) turns the
cache off: nothing is read or written. The variable is read at every lookup, so it can be
changed in a running process.

An entry's full key is the ``repr`` of: this environment's fingerprint (the entry
format, the jax and jaxlib versions, a hash of adaptprec's own source files so that a
changed library never loads an old program, the backend, device kind and platform
version, the CPU's machine and instruction-set flags, the device and process counts),
whether x64 is on, and the program's key (its name, the arguments' shapes and dtypes
from :func:`signature`, the compiler options). The file is named by the first 40 hex
digits of the key's SHA-256; the full key is stored in the entry and compared on load.
A key whose text holds a memory address (``0x...``: a program built from an object
without a stable ``repr``) is kept in memory only.

Example:
    >>> import numpy as np
    >>> from adaptprec._cache_keys import signature
    >>> _, leaves = signature((np.ones(3), 2.0))
    >>> leaves[0][0], leaves[1][2]   # a shape; a Python float is weakly typed
    ((3,), True)
"""

from __future__ import annotations

import hashlib
import os
import platform
import re

import jax
import numpy as np

__all__ = ["cache_dir", "max_bytes", "entry", "signature", "ENTRY_NAME", "MAX_BYTES"]

#: the entry format (3: an HMAC-authenticated file, see :mod:`adaptprec._cache_trust`)
FORMAT = 3
#: default size bound of the cache directory (bytes); ``$ADAPTPREC_CACHE_MAX_MB``
MAX_BYTES = 256 * 2 ** 20
#: values of ``ADAPTPREC_CACHE_DIR`` (lowercased, stripped) that turn the cache off
OFF = ("off", "0", "none", "false", "")
#: the files the cache writes: entries and their temporary files (nothing else is touched)
ENTRY_NAME = re.compile(r"^[0-9a-f]{40}\.xla$|^\.tmp-")

_fingerprint: list = []


def cache_dir() -> str | None:
    """The cache directory in use, or ``None`` when the cache is off (see the module
    docstring)."""
    env = os.environ.get("ADAPTPREC_CACHE_DIR")
    if env is not None:
        return None if env.strip().lower() in OFF else os.path.expanduser(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"),
                                                            ".cache")
    return os.path.join(base, "adaptprec")


def max_bytes() -> int:
    """The size bound in bytes: ``$ADAPTPREC_CACHE_MAX_MB`` megabytes, else
    :data:`MAX_BYTES`."""
    try:
        return int(float(os.environ["ADAPTPREC_CACHE_MAX_MB"]) * 2 ** 20)
    except (KeyError, ValueError):
        return MAX_BYTES


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
        # per argument, and fails in a process with several devices (and back)
        _fingerprint.append((FORMAT, jax.__version__, jaxlib.__version__, _source_hash(),
                             dev.platform, dev.device_kind, dev.client.platform_version,
                             platform.machine(), _cpu_flags(), len(jax.devices()),
                             jax.process_count()))
    return _fingerprint[0]


def entry(key) -> tuple[str | None, str | None, str | None]:
    """``(directory, file name, full key)`` of ``key``'s entry; ``None`` s when the cache
    is off or the key is not stable across processes."""
    directory = cache_dir()
    if directory is None:
        return None, None, None
    from .precision import x64_enabled

    full_key = repr((_environment(), x64_enabled(), key))
    if "0x" in full_key:  # an object's address: not stable across processes
        return None, None, None
    return directory, hashlib.sha256(full_key.encode()).hexdigest()[:40] + ".xla", full_key


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
    key of a program with the program's key (a repeat's lookups: ~1 us per leaf), and in
    the disk key (``repr``)."""
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
