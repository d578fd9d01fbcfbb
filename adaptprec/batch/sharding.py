"""Sharding: split the batch axis of a solve across the devices of a ``jax.sharding.Mesh``.

Fits are independent, so the batch is cut into one contiguous block per device with
:func:`jax.shard_map` (``in_specs=P(axis)`` for starts and batched data, ``P()`` for shared
args) and every device runs the whole pipeline — LM, compaction, per-fit escalation — on
its block, with no communication at all. Each fit's iterates depend only on its own data,
so results equal a one-device run (tested with 8 host devices). The batch is padded to a
multiple of the device count by repeating the first fit; the padding is dropped.

Inputs that are already sharded with a :class:`~jax.sharding.NamedSharding` over their
leading axis are recognised: their mesh and axis name are used when ``mesh`` is not given.

Across processes (``jax.distributed``): build the mesh over ``jax.devices()`` (every
process's devices) and pass global arrays, e.g. from
``jax.make_array_from_process_local_data(NamedSharding(mesh, P("fits")), local_rows)``;
every process calls ``solve_nlsq_batch`` with the same arguments (SPMD). Each device still
solves only its own rows, so the compiled solve contains no collective at all (counted in
the HLO by :func:`collective_counts`; tested with 2 processes x 2 devices), and results come
back with the inputs' sharding. Whatever needs the whole batch on one host (``nan_policy=
"raise"``, bounds checks, ``BatchResult.status_counts``...) looks at the process's own rows
(:func:`local_rows`; a bad fit anywhere makes every process raise, :func:`raise_together`)
or gathers the small per-fit summaries with ``multihost_utils.process_allgather``
(:func:`host_array`). Chunks are cut from every device's own rows
(:func:`run_chunked_local`). Global inputs must divide evenly over the mesh (no padding
across processes).
"""

from __future__ import annotations

from typing import Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from ..nlsq import _caches
from ._compile import tuned_jit
from .chunking import pad_rows

__all__ = ["infer_mesh", "shard_solve", "spans_processes", "local_rows", "host_array",
           "raise_together", "collective_counts", "run_chunked_local"]

_COLLECTIVES = ("all-reduce", "all-gather", "all-to-all", "collective-permute",
                "reduce-scatter", "collective-broadcast")


def spans_processes(*trees) -> bool:
    """True if a leaf is a ``jax.Array`` with shards on other processes' devices.

    Example:
        >>> import jax.numpy as jnp
        >>> from adaptprec.batch.sharding import spans_processes
        >>> spans_processes(jnp.ones(3), (1.0, None))
        False
    """
    return any(isinstance(a, jax.Array) and not isinstance(a, jax.core.Tracer)
               and not a.is_fully_addressable for a in jax.tree.leaves(trees))


def local_rows(a, like=None):
    """``(rows, values)``: the leading-axis rows this process holds and their values (NumPy).

    For an array on this process only (NumPy, or a fully addressable ``jax.Array``), all
    rows, or with ``like`` (an array spanning processes) the rows ``like`` holds here. For
    an array spanning processes, its addressable shards' rows, in order, each once.

    Example:
        >>> import numpy as np
        >>> from adaptprec.batch.sharding import local_rows
        >>> rows, vals = local_rows(np.arange(6.0).reshape(3, 2))
        >>> rows.tolist(), vals.shape
        ([0, 1, 2], (3, 2))
    """
    def ranges(x):
        out = {}
        for sh in x.addressable_shards:
            idx = sh.index[0] if sh.index else slice(None)
            lo, hi, _ = idx.indices(x.shape[0])
            out.setdefault((lo, hi), sh)
        return sorted(out.items())

    if isinstance(a, jax.Array) and not a.is_fully_addressable:
        parts = ranges(a)
        rows = np.concatenate([np.arange(lo, hi) for (lo, hi), _ in parts])
        return rows, np.concatenate([np.asarray(sh.data) for _, sh in parts], axis=0)
    a = np.asarray(a)
    if like is not None and isinstance(like, jax.Array) and not like.is_fully_addressable:
        rows = np.concatenate([np.arange(lo, hi) for (lo, hi), _ in ranges(like)])
        return rows, a[rows]
    return np.arange(a.shape[0]), a


def host_array(a):
    """``a`` as one NumPy array on every process (``process_allgather`` when ``a`` spans
    processes; a collective, so every process must call it). Other leaves pass through.

    Example:
        >>> import jax.numpy as jnp
        >>> from adaptprec.batch.sharding import host_array
        >>> host_array(jnp.arange(3)).tolist()
        [0, 1, 2]
    """
    if isinstance(a, jax.Array) and not a.is_fully_addressable:
        from jax.experimental import multihost_utils
        return np.asarray(multihost_utils.process_allgather(a, tiled=True))
    return np.asarray(a)


def raise_together(error: Optional[Exception], *trees) -> None:
    """Raise ``error`` if not ``None``; when ``trees`` span processes, every process raises
    if any process has an error (one small all-gather of flags), so no process is left
    waiting in the solve for one that stopped.

    Example:
        >>> import numpy as np
        >>> from adaptprec.batch.sharding import raise_together
        >>> raise_together(None, np.ones(2))
        >>> raise_together(ValueError("bad fit 3"), np.ones(2))
        Traceback (most recent call last):
        ...
        ValueError: bad fit 3
    """
    if spans_processes(*trees):
        from jax.experimental import multihost_utils
        flags = np.asarray(multihost_utils.process_allgather(
            np.array([error is not None], np.int32))).ravel()
        if error is None and flags.any():
            raise ValueError(f"invalid input on process(es) {np.flatnonzero(flags).tolist()} "
                             "(their error says which fits); every process stops")
    if error is not None:
        raise error


def collective_counts(hlo_text: str) -> dict[str, int]:
    """How many cross-device collective ops (all-reduce, all-gather, all-to-all,
    collective-permute, reduce-scatter, collective-broadcast) an HLO module's text holds.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from adaptprec.batch.sharding import collective_counts
        >>> text = jax.jit(lambda x: x * 2).lower(jnp.ones(2)).compile().as_text()
        >>> sum(collective_counts(text).values())
        0
    """
    import re
    counts = {}
    for name in _COLLECTIVES:
        # an instruction "= f32[...] all-reduce(" or its async "all-reduce-start("
        counts[name] = len(re.findall(rf"\s{re.escape(name)}(?:-start)?\(", hlo_text))
    return counts


def infer_mesh(x0) -> tuple[Optional[Mesh], Optional[str]]:
    """The ``(mesh, axis_name)`` of an input sharded over its leading axis, else ``(None, None)``.

    Example:
        >>> import jax.numpy as jnp
        >>> from adaptprec.batch.sharding import infer_mesh
        >>> infer_mesh(jnp.zeros((4, 2)))
        (None, None)
    """
    sh = getattr(x0, "sharding", None)
    if isinstance(sh, NamedSharding) and len(sh.spec) > 0 and sh.spec[0] is not None:
        axis = sh.spec[0]
        if isinstance(axis, tuple):
            if len(axis) != 1:
                return None, None
            axis = axis[0]
        # a one-device axis is solved unsharded, unless it is Explicit (jax.make_mesh's
        # default): such arrays carry their sharding in their type and need shard_map
        explicit = dict(zip(sh.mesh.axis_names, getattr(sh.mesh, "axis_types", ()))).get(
            axis) == jax.sharding.AxisType.Explicit
        if sh.mesh.shape[axis] > 1 or explicit:
            return sh.mesh, axis
    return None, None


def _place(a, mesh: Mesh, spec):
    """Put ``a`` on ``mesh`` with ``spec`` (``jax.reshard`` when traced)."""
    sharding = NamedSharding(mesh, spec)
    if isinstance(a, jax.core.Tracer):
        return jax.reshard(a, sharding)
    if not hasattr(a, "shape"):
        a = jnp.asarray(a)
    if not sharding.is_fully_addressable and (
            not isinstance(a, jax.Array) or a.is_fully_addressable):
        # process-local data (e.g. shared args, built bounds) onto a mesh spanning
        # processes: every process holds the same values (SPMD), so each puts its own
        # devices' part from host memory (device_put would all-gather it)
        a = np.asarray(a)
        return jax.make_array_from_process_local_data(sharding, a, a.shape)
    return jax.device_put(a, sharding)


def _sharded(solve: Callable, mesh: Mesh, axis: str):
    """``solve`` under ``shard_map`` over ``mesh[axis]`` (memoised: ``SHARD_PROGRAMS``)."""
    def build():
        # a tuned_jit solver: its tuned function runs under our compiler options, the
        # plain one inside a user's jit (see adaptprec.batch._compile)
        fns = (getattr(solve, "__wrapped__", solve), getattr(solve, "plain_fn", solve))
        tuned, plain = (jax.shard_map(f, mesh=mesh, in_specs=(P(axis), P(axis), P()),
                                      out_specs=P(axis), check_vma=False) for f in fns)
        return tuned_jit(tuned, plain)

    return _caches.SHARD_PROGRAMS.get_or_build(("solve", solve, mesh, axis), build)


def _uneven(size: int, ndev: int, axis: str):
    raise ValueError(
        f"{size} fits do not divide evenly over the {ndev} devices of mesh axis {axis!r}, "
        f"and the inputs span processes (padding would move fits between them); pad each "
        f"process's rows to a multiple of its device count (e.g. repeat its last fit) "
        f"before building the global arrays, and drop those fits from the result")


def shard_solve(solve: Callable, mesh: Mesh, axis: str, x0, bargs, sargs):
    """Run ``solve(x0, bargs, sargs)`` with the batch axis split over ``mesh[axis]``.

    ``solve`` must treat fits independently and return a pytree whose leaves have the batch
    axis first (``None`` leaves allowed).

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from jax.sharding import Mesh
        >>> from adaptprec.batch.sharding import shard_solve
        >>> mesh = Mesh(jax.devices()[:1], ("fits",))
        >>> shard_solve(lambda x, b, s: {"y": x + s}, mesh, "fits", jnp.ones((3, 1)), (), 1.0)["y"].tolist()
        [[2.0], [2.0], [2.0]]
    """
    if axis not in mesh.shape:
        raise ValueError(f"mesh has axes {tuple(mesh.shape)}, no axis named {axis!r}; pass "
                         "batch_axis= naming the mesh axis to split the fits over")
    ndev = mesh.shape[axis]
    size = x0.shape[0]
    pad = (-size) % ndev
    if pad and spans_processes(x0, bargs, sargs):
        _uneven(size, ndev, axis)

    x0p, bargsp = pad_rows((x0, bargs), pad)
    x0p, bargsp = jax.tree.map(lambda a: _place(a, mesh, P(axis)), (x0p, bargsp))
    sargs = jax.tree.map(lambda a: _place(a, mesh, P()), sargs)
    out = _sharded(solve, mesh, axis)(x0p, bargsp, sargs)
    if not pad:
        return out
    return jax.tree.map(lambda a: a[:size], out)


def _slicer(mesh: Mesh, axis: str, rows: int):
    """Jitted: rows ``[start, start + rows)`` of every device's own block (no transfer)."""
    def take(start, tree):
        return jax.tree.map(
            lambda a: jax.lax.dynamic_slice_in_dim(a, start, rows, axis=0), tree)

    return _caches.SHARD_PROGRAMS.get_or_build(("slice", rows, mesh, axis), lambda: jax.jit(
        jax.shard_map(take, mesh=mesh, in_specs=(P(), P(axis)), out_specs=P(axis),
                      check_vma=False)))


def _joiner(mesh: Mesh, axis: str, keep: tuple):
    """Jitted: every device's chunk outputs joined, chunk ``i`` from row ``keep[i]`` on."""
    def join(*parts):
        return jnp.concatenate([p[k:] for p, k in zip(parts, keep)], axis=0)

    return _caches.SHARD_PROGRAMS.get_or_build(("join", keep, mesh, axis), lambda: jax.jit(
        jax.shard_map(join, mesh=mesh, in_specs=P(axis), out_specs=P(axis),
                      check_vma=False)))


def run_chunked_local(solve: Callable, mesh: Mesh, axis: str, x0, bargs, sargs,
                      chunk: int, progress=None):
    """``shard_solve`` in chunks of ``chunk`` fits per device, each cut from every
    device's own rows, so no fit moves between devices or processes (for global arrays
    spanning processes; ``x0.shape[0]`` must divide over ``mesh[axis]``). The last chunk
    of a device overlaps the one before (re-solving a few of its fits) instead of
    padding, so one program serves all chunks; ``progress(done, total)`` as in
    :func:`~adaptprec.batch.chunking.run_chunked` (``done`` counts all devices' fits).

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from jax.sharding import Mesh
        >>> from adaptprec.batch.sharding import run_chunked_local
        >>> mesh = Mesh(jax.devices()[:1], ("fits",))
        >>> seen = []
        >>> out = run_chunked_local(lambda x, b, s: {"y": x * s}, mesh, "fits",
        ...                         jnp.arange(5.0)[:, None], (), 2.0, 2,
        ...                         progress=lambda d, t: seen.append(d))
        >>> out["y"][:, 0].tolist(), seen
        ([0.0, 2.0, 4.0, 6.0, 8.0], [0, 2, 4, 5])
    """
    from .chunking import _notify_compiling, _resolve_progress

    ndev = mesh.shape[axis]
    size = x0.shape[0]
    if size % ndev:
        _uneven(size, ndev, axis)
    local = size // ndev
    chunk = int(max(1, min(chunk, local)))
    progress = _resolve_progress(progress)
    los = list(range(0, local, chunk))
    starts = [min(lo, local - chunk) for lo in los]
    take = _slicer(mesh, axis, chunk)
    if progress is not None:
        progress(0, size)
        _notify_compiling(progress, True)
    outs = []
    for c, (lo, start) in enumerate(zip(los, starts)):
        part = take(np.int32(start), (x0, bargs))
        out = shard_solve(solve, mesh, axis, part[0], part[1], sargs)
        outs.append(out)
        if progress is not None:
            jax.block_until_ready(out)
            if c == 0:
                _notify_compiling(progress, False)
            progress(min(lo + chunk, local) * ndev, size)
    if len(outs) == 1:
        return outs[0]
    join = _joiner(mesh, axis, tuple(lo - start for lo, start in zip(los, starts)))
    return jax.tree.map(lambda *parts: join(*parts), *outs)
