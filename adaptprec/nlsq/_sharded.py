"""Sharded single fits: data sharded over a mesh along the point axis, the blocked sums
reduced with one ``psum``.

When the data arrays of a pointwise residual are ``jax.Array`` s with a
``NamedSharding`` that splits their point axis over mesh axes, each device forms the
partial sums ``J^T J``, ``J^T f`` and the cost of its own points (block by block,
:func:`._stream.chunk_sums`) inside ``shard_map``, and one ``psum`` over those mesh axes
(``n^2 + n + 1`` numbers per iteration) gives every device the full sums. The ``n x n``
model and the trust-region step are then replicated: the host loop of
:mod:`._stream` runs the same step on every process (same inputs, same bits), so a
multi-process run (``jax.distributed``; arrays built with
``jax.make_array_from_process_local_data``) needs no other communication. Only the data
stay distributed; nothing of length ``m`` is gathered.

Example:
    >>> import jax
    >>> from adaptprec.nlsq._sharded import point_sharding
    >>> point_sharding((jax.numpy.ones(4),)) is None   # one device: nothing sharded
    True
"""

from __future__ import annotations

import numpy as np

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import NamedSharding, PartitionSpec as P

from .._policy import cast_floating
from .._tracing import is_traced
from ._chunks import chunk_sums
from .._backend import cpu_jit

__all__ = ["point_sharding", "ShardedEvaluator", "sharded_programs"]


def _partitioned(spec) -> bool:
    return any(s is not None for s in spec)


def point_sharding(args):
    """The mesh of the first leaf of ``args`` that is a ``jax.Array`` whose
    ``NamedSharding`` partitions an axis (also over a one-device mesh: the in-memory
    blocked ``scan`` rejects data split over an explicit mesh axis), or ``None``."""
    for leaf in jax.tree.leaves(args):
        if is_traced(leaf):
            continue        # under a trace: the in-memory (fused) solver
        sh = getattr(leaf, "sharding", None)
        if isinstance(leaf, jax.Array) and isinstance(sh, NamedSharding) and \
                _partitioned(sh.spec):
            return sh.mesh
    return None


def _names(entry):
    if entry is None:
        return ()
    return tuple(entry) if isinstance(entry, (tuple, list)) else (entry,)


def plan(args, axes, m, mesh):
    """``(in_specs per leaf, mesh axis names of the point axis, points per shard)``;
    validates that every data leaf is split along its point axis (the same mesh axes
    for all) and nothing else, and that other leaves are not split. Data leaves not on
    the mesh (NumPy arrays) are split like the others when placed."""
    leaves = jax.tree.leaves(args)
    names, specs = None, []
    for leaf, a in zip(leaves, axes):
        sh = getattr(leaf, "sharding", None)
        spec = tuple(sh.spec) if isinstance(sh, NamedSharding) else ()
        spec = spec + (None,) * (np.ndim(leaf) - len(spec))
        if isinstance(sh, NamedSharding) and sh.mesh != mesh and _partitioned(spec):
            raise ValueError("the data arrays of a sharded fit must share one mesh")
        if a is None:
            if _partitioned(spec):
                raise ValueError("a sharded fit splits only the point axis of its data; "
                                 f"an argument without data points has the sharding {spec}")
            specs.append(P())
            continue
        if any(s is not None for d, s in enumerate(spec) if d != a):
            raise ValueError(f"a sharded fit splits the data along the point axis only; a "
                             f"data argument with point axis {a} has the sharding {spec}")
        nm = _names(spec[a])
        if not nm:          # data not on the mesh (a NumPy sigma): split like the rest
            specs.append(a)
            continue
        if names is None:
            names = nm
        elif nm != names:
            raise ValueError(f"every data argument must split its points over the same "
                             f"mesh axes; got {names} and {nm}")
        specs.append(P(*[spec[a] if d == a else None for d in range(np.ndim(leaf))]))
    entry = None if not names else names[0] if len(names) == 1 else names
    specs = [P(*[entry if d == s else None for d in range(np.ndim(leaf))])
             if isinstance(s, int) else s for s, leaf in zip(specs, leaves)]
    shards = int(np.prod([mesh.shape[nm] for nm in names])) if names else 1
    if not names or m % shards:
        raise ValueError(f"{m} data points do not split evenly over the {shards} shards of "
                         f"the mesh axes {names}; pad the data to a multiple of {shards}")
    return specs, names, m // shards


def _shard_index(names, mesh):
    idx = jnp.zeros((), jnp.int32)
    for nm in names:
        idx = idx * mesh.shape[nm] + lax.axis_index(nm)
    return idx


def sharded_programs(fun, opts, axes, treedef, specs, names, mesh, m, local):
    """``(sums, final)``: the per-iteration sums on rung ``rung`` and the final sums on
    the top rung, each one ``shard_map`` with a ``psum`` (signatures as
    :mod:`._stream`'s per-chunk programs without ``n_valid``: the global ``m`` is
    static)."""

    rungs = opts.rungs
    top_dt = rungs[-1]
    arg_specs = jax.tree.unflatten(treedef, specs)

    def local_sums(dt, z, args, f_scale):
        wt = jnp.promote_types(dt, jnp.float32)
        start = _shard_index(names, mesh) * local
        nv = jnp.clip(m - start, 0, local)
        A, b, cost = chunk_sums(fun, z.astype(dt), cast_floating(args, dt), axes, local,
                                nv, opts.loss, f_scale, wt, top_dt)
        return lax.psum((A.astype(top_dt), b.astype(top_dt), cost), names)

    def sums_body(rung, z, args, f_scale):
        branches = [lambda z, a, fs, dt=dt: local_sums(dt, z, a, fs) for dt in rungs]
        if len(branches) == 1:
            return branches[0](z, args, f_scale)
        return lax.switch(rung, branches, z, args, f_scale)

    def final_body(x, args, f_scale):
        return local_sums(top_dt, x, args, f_scale)

    sm_sums = jax.shard_map(sums_body, mesh=mesh, in_specs=(P(), P(), arg_specs, P()),
                            out_specs=P(), check_vma=False)
    sm_final = jax.shard_map(final_body, mesh=mesh, in_specs=(P(), arg_specs, P()),
                             out_specs=P(), check_vma=False)

    return cpu_jit(sm_sums).tuned, cpu_jit(sm_final).tuned


class ShardedEvaluator:
    """:class:`._stream._Evaluator` for sharded data: one "chunk", the global arrays;
    scalars and small arrays entering the program are made replicated global arrays
    (valid on every process)."""

    def __init__(self, args, m, mesh, specs):
        self.m, self.mesh = m, mesh
        self._rep = NamedSharding(mesh, P())
        leaves, treedef = jax.tree.flatten(args)

        def on_mesh(leaf):
            sh = getattr(leaf, "sharding", None)
            return isinstance(leaf, jax.Array) and isinstance(sh, NamedSharding) and \
                sh.mesh == mesh

        # arguments not yet on the mesh (tables, unsharded arrays) are placed there once
        self.args = jax.tree.unflatten(treedef, [
            leaf if on_mesh(leaf) else self._put(leaf, NamedSharding(mesh, spec))
            for leaf, spec in zip(leaves, specs)])

    @staticmethod
    def _put(v, sharding):
        v = np.asarray(v)
        return jax.make_array_from_callback(v.shape, sharding, lambda idx: v[idx])

    def run(self, program, *head, tail=()):
        head = [self._put(h, self._rep) for h in head]
        tail = [self._put(t, self._rep) for t in tail]
        out = program(*head, self.args, *tail)
        return [np.asarray(o, np.float64) for o in out]
