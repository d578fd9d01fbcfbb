"""Streamed data: a pointwise residual's normal equations summed chunk by chunk.

A pointwise residual (:mod:`._pointwise`) has normal equations that are sums over its
data points: ``J^T J``, ``J^T f`` and the cost. :func:`chunk_sums` forms them over one
chunk, block by block (:mod:`._blocks`); ONE compiled per-chunk program per rung ladder
(:func:`_chunk_program`; the last chunk padded with copies of its last point and masked,
so every chunk has one shape) and :class:`_Evaluator`, which walks a source's chunks and
adds the partial sums on the host in float64, keeping one chunk in flight. Chunks are
views, converted to the rung's dtype inside the program (no float64 copy of float32
data). The streamed driver (:mod:`._stream`) factors the sums and steps; sharded arrays
(:mod:`._sharded`) implement the same ``run(program, *head, tail=)`` with one ``psum``.

Example:
    >>> import numpy as np
    >>> from adaptprec.nlsq._chunks import _ArraySource
    >>> [len(c[0]) for c in _ArraySource((np.arange(10.0),), [0], 10, 4)]
    [4, 4, 2]
"""

from __future__ import annotations

import collections

from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from .._policy import cast_floating
from ._blocks import PointBlocks, block_size, residual_and_rows
from . import _caches
from .._backend import cpu_jit
from .common import robust_cost, scale_for_robust_loss

if TYPE_CHECKING:
    from ._state import Options

__all__ = ["chunk_sums"]


class _ArraySource:
    """Host arrays in ``args`` sliced into chunks of ``size`` points (views)."""

    def __init__(self, args, axes, m, size):
        self.args, self.axes, self.m, self.size = args, axes, m, size

    def __iter__(self):
        leaves, treedef = jax.tree.flatten(self.args)
        for s in range(0, self.m, self.size):
            e = min(s + self.size, self.m)
            out = [leaf if a is None else
                   leaf[(slice(None),) * a + (slice(s, e),)]
                   for leaf, a in zip(leaves, self.axes)]
            yield jax.tree.unflatten(treedef, out)


def _pad_chunk(leaves, axes, k, size):
    """Leaves of a chunk of ``k <= size`` points padded to ``size`` with copies of the
    last point (finite residuals; the mask zeroes them)."""
    if k == size:
        return leaves
    out = []
    for leaf, a in zip(leaves, axes):
        if a is None:
            out.append(leaf)
            continue
        leaf = np.asarray(leaf)
        idx = np.minimum(np.arange(size), k - 1)
        out.append(np.take(leaf, idx, axis=a))
    return out


def _split(leaves, axes, size):
    """``(leaves, k)`` pieces of at most ``size`` points of one chunk."""
    k = next(np.shape(leaf)[a] for leaf, a in zip(leaves, axes) if a is not None)
    for s in range(0, max(k, 1), size):
        e = min(s + size, k)
        yield [leaf if a is None else leaf[(slice(None),) * a + (slice(s, e),)]
               for leaf, a in zip(leaves, axes)], e - s


# ----------------------------------------------------------------------------- programs
# ----------------------------------------------------------------------------- programs
def _program(key, build):
    """The program built by ``build()`` for ``key`` (:data:`._caches.STREAM_PROGRAMS`)."""
    return _caches.STREAM_PROGRAMS.get_or_build(key, build)


def chunk_sums(fun, x, args, axes, size: int, n_valid, loss, f_scale, wt, top_dt,
               with_gram: bool = True):
    """``(A, b, cost)``: ``J^T J``, ``J^T f`` (loss-scaled) in ``wt`` and the cost in
    ``top_dt`` over the first ``n_valid`` of the ``size`` points of ``args`` (point axes
    ``axes``), block by block (:class:`._blocks.PointBlocks`). Traceable (``n_valid`` may
    be traced): the per-chunk program, and the per-device sum of a sharded fit."""
    n = x.shape[0]
    pb = PointBlocks(size, axes, size=block_size(size))
    blocked = pb.block(args)
    data, _ = pb.xs(blocked)
    valid = jnp.arange(pb.count * pb.size).reshape(pb.count, pb.size) < n_valid
    fs_w, fs_top = jnp.asarray(f_scale, wt), jnp.asarray(f_scale, top_dt)

    def one(carry, xs):
        A, b, cost = carry
        blk, v = xs
        f, JT = residual_and_rows(fun, x, pb.unblock(blocked, blk))
        f = jnp.where(v, f.astype(wt), 0.0)
        JT = jnp.where(v, JT.astype(wt), 0.0)
        cost = cost + robust_cost(loss, f.astype(top_dt), fs_top)
        fs, Js = scale_for_robust_loss(loss, f, JT.T, fs_w)
        JTs = Js.T
        if with_gram:
            A = A + JTs @ JTs.T
        return (A, b + JTs @ fs, cost), None

    init = (jnp.zeros((n, n), wt), jnp.zeros((n,), wt), jnp.zeros((), top_dt))
    (A, b, cost), _ = lax.scan(one, init, (data, valid))
    return A, b, cost


def _chunk_program(fun, opts: Options, axes, size: int, key):
    """One compiled program: the partial sums of one chunk on rung ``rung`` (a
    ``lax.switch`` over the ladder; the data cast to the rung inside)."""
    rungs = opts.rungs
    top_dt = rungs[-1]

    def branch(i):
        dt = rungs[i]
        wt = jnp.promote_types(dt, jnp.float32)

        def br(z, args, n_valid, f_scale):
            A, b, cost = chunk_sums(fun, z.astype(dt), cast_floating(args, dt), axes, size,
                                    n_valid, opts.loss, f_scale, wt, top_dt)
            return A.astype(top_dt), b.astype(top_dt), cost

        return br

    branches = [branch(i) for i in range(len(rungs))]

    def sums(rung, z, args, n_valid, f_scale):
        if len(branches) == 1:
            return branches[0](z, args, n_valid, f_scale)
        return lax.switch(rung, branches, z, args, n_valid, f_scale)

    return _program(("chunk",) + key, lambda: cpu_jit(sums))


def _final_chunk_program(fun, opts: Options, axes, size: int, key):
    top_dt = opts.rungs[-1]

    def final(x, args, n_valid, f_scale):
        return chunk_sums(fun, x, cast_floating(args, top_dt), axes, size, n_valid,
                          opts.loss, f_scale, top_dt, top_dt)

    return _program(("final",) + key, lambda: cpu_jit(final))


# ----------------------------------------------------------------------------- evaluator
# ----------------------------------------------------------------------------- driver
class _Evaluator:
    """Walks the chunks of a source and sums a per-chunk program's outputs in float64,
    keeping one chunk in flight (the next chunk is read while the device works)."""

    def __init__(self, source, axes, size, treedef, check_finite: bool):
        self.source, self.axes, self.size = source, axes, size
        self.treedef = treedef
        self.check_finite = check_finite
        self.m = None   # points, counted on the first pass

    def run(self, program, *head, tail=()):
        total, m = None, 0
        pending = collections.deque()
        for chunk in self.source:
            leaves = jax.tree.leaves(chunk)
            if len(leaves) != len(self.axes):
                raise ValueError(f"a chunk has {len(leaves)} arrays, the first had "
                                 f"{len(self.axes)}; every chunk must have the same layout")
            for piece, k in _split(leaves, self.axes, self.size):
                if k == 0:
                    continue
                if self.check_finite and self.m is None:
                    for leaf, a in zip(piece, self.axes):
                        arr = np.asarray(leaf)
                        if np.issubdtype(arr.dtype, np.inexact) and \
                                not np.all(np.isfinite(arr)):
                            raise ValueError(
                                "the data contain NaN or Inf (in the chunk starting at "
                                f"point {m}); clean the data first")
                padded = _pad_chunk(piece, self.axes, k, self.size)
                args = jax.tree.unflatten(self.treedef, padded)
                pending.append(program(*head, args, np.int32(k), *tail))
                m += k
                if len(pending) > 1:
                    total = _add(total, pending.popleft())
        while pending:
            total = _add(total, pending.popleft())
        if m == 0:
            raise ValueError("the chunk source gave no data points")
        if self.m is None:
            self.m = m
        elif m != self.m:
            raise ValueError(f"the chunk source gave {m} points on this pass and "
                             f"{self.m} on the first; it must give the same data each time")
        return total


def _add(total, part):
    part = [np.asarray(p, np.float64) for p in jax.device_get(part)]
    if total is None:
        return part
    return [t + p for t, p in zip(total, part)]
