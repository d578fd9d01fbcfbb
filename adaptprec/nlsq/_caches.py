"""Every memo of the fitting code, in one place: what each holds, its key and its size.

A repeated fit must not trace or compile again, so the fitting code remembers a few
things per residual and per data shape. Each memo is a :class:`Memo` (least recently used
entries beyond its size are dropped; thread-safe) declared here, and :func:`clear` empties
them all (``adaptprec.nlsq.clear_cache``). Compiled executables themselves live in
:mod:`adaptprec._disk_cache` (in memory, and on disk for later processes).

========================  ==========================================================  ====
memo                      key -> value                                                size
========================  ==========================================================  ====
``PROBLEMS``              (residual, shapes, options) -> a validated problem of the
                          common eager call (:func:`._inputs.prepare`); without the
                          data lengths -> the last padded one (a new length in its
                          bucket); curve_fit's problems                                64
``SIZES``                 (residual, x0 and args signatures) -> ``m``                  256
``POINT_AXES``            (residual, x0 and args signatures) -> point axes or None     256
``TRACES``                (residual, x0 and padded-args signatures, rungs) -> per-rung
                          :class:`._identity.TracedResidual` (the identity key)        128
``PROGRAMS``              (residual identity or object, options, outputs, bucket) ->
                          a compiled whole-solve program                                64
``FINAL_PROGRAMS``        (residual object, options) -> a lean solve's final
                          evaluation program                                            32
``STREAM_PROGRAMS``       (options, data layout) -> the streamed loop's programs       64
``RESIDUALS``             a user's function (and kind) -> a stable wrapper of it:
                          curve_fit's residual of a model, the starts' flat residual  256
``POINTS``                residual object (weakly) -> its point axes per argument
                          structure, so a new data length needs no trace               8 each
``BATCH_PROGRAMS``        (batched residual, batch configuration) -> the
                          jitted batched solver (:mod:`adaptprec.batch`)               64
``BATCH_SHAPES``          (batched residual, one fit's argument signatures) ->
                          the shape of one fit's residual                             256
``SHARD_PROGRAMS``        (kind, solver or row count, mesh, axis) -> a batched
                          solver, slicer or joiner under ``shard_map``                 96
========================  ==========================================================  ====

Example:
    >>> from adaptprec.nlsq import _caches
    >>> memo = _caches.Memo("example", 2)
    >>> memo.get_or_build("a", lambda: 1), memo.get_or_build("a", lambda: 2)
    (1, 1)
    >>> _caches.info()["SIZES"]["size"] >= 0
    True
"""

from __future__ import annotations

import collections
import threading

__all__ = ["Memo", "hashable_key", "PROBLEMS", "SIZES", "POINT_AXES", "TRACES", "PROGRAMS",
           "FINAL_PROGRAMS", "STREAM_PROGRAMS", "RESIDUALS", "POINTS", "BATCH_PROGRAMS",
           "BATCH_SHAPES", "SHARD_PROGRAMS", "clear", "info"]


class Memo:
    """A bounded, thread-safe least-recently-used map (``name`` for :func:`info`)."""

    def __init__(self, name: str, size: int):
        self.name, self.size = name, int(size)
        self._data: collections.OrderedDict = collections.OrderedDict()
        self._lock = threading.Lock()
        self.hits = self.misses = 0

    def get(self, key, default=None):
        with self._lock:
            value = self._data.get(key, _MISSING)
            if value is _MISSING:
                self.misses += 1
                return default
            self._data.move_to_end(key)
            self.hits += 1
            return value

    def put(self, key, value) -> None:
        with self._lock:
            self._data[key] = value
            self._data.move_to_end(key)
            while len(self._data) > self.size:
                self._data.popitem(last=False)

    def get_or_build(self, key, build):
        """The value for ``key``, built by ``build()`` on a miss (outside the lock: two
        threads may both build it, and the last one is kept); built every time for an
        unhashable key (a user's unhashable function)."""
        if hashable_key(key) is None:
            return build()
        value = self.get(key, _MISSING)
        if value is _MISSING:
            value = build()
            self.put(key, value)
        return value

    def clear(self) -> None:
        with self._lock:
            self._data.clear()
            self.hits = self.misses = 0

    def __len__(self) -> int:
        return len(self._data)


_MISSING = object()


def hashable_key(key):
    """``key`` if it is hashable (a memo key), else ``None``."""
    try:
        hash(key)
    except TypeError:
        return None
    return key


PROBLEMS = Memo("PROBLEMS", 64)
SIZES = Memo("SIZES", 256)
POINT_AXES = Memo("POINT_AXES", 256)
TRACES = Memo("TRACES", 128)
PROGRAMS = Memo("PROGRAMS", 64)
FINAL_PROGRAMS = Memo("FINAL_PROGRAMS", 32)
STREAM_PROGRAMS = Memo("STREAM_PROGRAMS", 64)
RESIDUALS = Memo("RESIDUALS", 256)
BATCH_PROGRAMS = Memo("BATCH_PROGRAMS", 64)
BATCH_SHAPES = Memo("BATCH_SHAPES", 256)
SHARD_PROGRAMS = Memo("SHARD_PROGRAMS", 96)
_ALL = (PROBLEMS, SIZES, POINT_AXES, TRACES, PROGRAMS, FINAL_PROGRAMS, STREAM_PROGRAMS,
        RESIDUALS, BATCH_PROGRAMS, BATCH_SHAPES, SHARD_PROGRAMS)


def _points():
    from ._buckets import PointMemo
    return PointMemo()


POINTS = _points()


def clear() -> None:
    """Empty every memo (compiled executables held by :mod:`adaptprec._disk_cache` in
    memory too; its disk entries stay)."""
    from .. import _disk_cache

    for memo in _ALL:
        memo.clear()
    POINTS.clear()
    _disk_cache.clear_memory()


def info() -> dict:
    """``{name: {"size", "limit", "hits", "misses"}}`` for every memo."""
    return {m.name: {"size": len(m), "limit": m.size, "hits": m.hits, "misses": m.misses}
            for m in _ALL}
