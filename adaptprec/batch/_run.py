"""How one :func:`~adaptprec.solve_nlsq_batch` call runs its compiled solver: on a mesh
(sharded fits), on global arrays spanning processes, in chunks (memory, progress), or as
one batch padded to its bucket so that every size of the bucket reuses the program.

Example:
    >>> from adaptprec.batch._run import batch_bucket
    >>> [batch_bucket(b) for b in (1, 3, 1000, 1001, 1017, 1600)]
    [4, 4, 1024, 1024, 1024, 2048]
"""

from __future__ import annotations

from typing import Callable

import jax
import numpy as np

from .. import _backend
from .._tracing import is_eager
from ..nlsq._buckets import bucket
from ._options import BatchConfig
from ._problem import Problem
from .chunking import MIN_LANES, auto_chunk_size, run_chunked
from .sharding import infer_mesh, run_chunked_local, shard_solve, spans_processes

__all__ = ["batch_bucket", "pad_batch", "aligned_empty", "run_solver"]


def batch_bucket(size: int) -> int:
    """Batch sizes are padded to a bucket (``2^k`` or ``3 * 2^(k-1)``, at most 50% more
    fits) so that a new batch size in the bucket reuses the compiled solver."""
    return max(bucket(size), MIN_LANES)


def aligned_empty(shape: tuple, dtype, align: int | None = None) -> np.ndarray:
    """``np.empty(shape, dtype)``, starting on an ``align``-byte boundary (default
    :func:`adaptprec._backend.host_alignment`; 0: NumPy's own allocation). On CPU a
    64-byte aligned array goes on the device without a copy (``jax.device_put`` aliases
    it; NumPy's large allocations start 16 bytes past a page, and were copied).

    Example:
        >>> from adaptprec.batch._run import aligned_empty
        >>> a = aligned_empty((3, 5), "float64", align=64)
        >>> a.shape, a.ctypes.data % 64
        ((3, 5), 0)
    """
    align = _backend.host_alignment() if align is None else align
    dtype = np.dtype(dtype)
    if not align:
        return np.empty(shape, dtype)
    nbytes = int(np.prod(shape)) * dtype.itemsize
    buf = np.empty(nbytes + align, np.uint8)
    start = -buf.ctypes.data % align
    return buf[start:start + nbytes].view(dtype).reshape(shape)


def pad_batch(prob: Problem, size: int):
    """``x0`` and the batched args padded to ``size`` fits (NumPy, no compilation).
    Padded fits copy the last fit's data and start at NaN, so they are finished (status
    -3) before the first iteration and take no work; :func:`_unpad` drops them."""
    def padded(a):
        a = np.asarray(a)
        out = aligned_empty((size,) + a.shape[1:], a.dtype)
        out[:prob.size] = a
        out[prob.size:] = a[-1]
        return out

    x0 = padded(prob.x0)
    x0[prob.size:] = np.nan
    return x0, jax.tree.map(padded, prob.bargs)


def _unpad(result, size: int):
    """The first ``size`` fits of ``result`` (NumPy slicing, then back on the device)."""
    def cut(a):
        return jax.device_put(np.asarray(a)[:size]) if isinstance(a, jax.Array) else a

    return jax.tree.map(cut, result)


def run_solver(solve: Callable, prob: Problem, cfg: BatchConfig, *, mesh, batch_axis,
               chunk_size, progress):
    """The result of ``solve`` (:func:`~adaptprec.batch._program.batch_solver`) on the
    problem's fits: sharded over ``mesh`` (given, or inferred from ``x0``'s sharding),
    per process for global arrays, in chunks of ``chunk_size`` (default: by memory), or
    as one batch padded to its bucket."""
    if chunk_size is not None and int(chunk_size) < 1:
        raise ValueError(f"chunk_size must be a positive integer, got {chunk_size!r}")
    if mesh is None:
        mesh, inferred = infer_mesh(prob.x0)
        batch_axis = batch_axis or inferred
    inner = solve
    if mesh is not None:
        axis = batch_axis or mesh.axis_names[0]

        def solve(x, b, s):  # noqa: F811
            return shard_solve(inner, mesh, axis, x, b, s)

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
            return solve(prob.x0, prob.bargs, prob.sargs)
        return run_chunked_local(inner, mesh, axis, prob.x0, prob.bargs, prob.sargs,
                                 per_device, progress)
    if chunk_size is None:
        itemsize = max(p.acc_dtype.itemsize for p in cfg.plans)
        chunk_size = auto_chunk_size(prob.size, prob.m, prob.n, itemsize)
    if chunk_size < prob.size or progress is not None:
        return run_chunked(solve, prob.x0, prob.bargs, prob.sargs, int(chunk_size), progress)
    size = prob.size
    # eager only: under any active trace (also around concrete inputs when the residual
    # closes over a traced value) the result is traced and stays so
    if not (mesh is None and is_eager(prob.x0, prob.bargs, prob.sargs)
            and batch_bucket(size) != size):
        return solve(prob.x0, prob.bargs, prob.sargs)
    # the padded arrays are this call's own (nothing else holds or changes them), so
    # jax.device_put may alias their host memory on CPU (passing NumPy arrays to the
    # program would copy them); the row count is traced: every size of the bucket runs
    # the same program
    x0b, bargs = jax.device_put(pad_batch(prob, batch_bucket(size)))
    return _unpad(solve(x0b, bargs, prob.sargs, np.int32(size)), size)
