"""Sharding: split the batch axis of a solve across the devices of a ``jax.sharding.Mesh``.

Fits are independent, so the batch is cut into one contiguous block per device with
:func:`jax.shard_map` (``in_specs=P(axis)`` for starts and batched data, ``P()`` for shared
args) and every device runs the whole pipeline — LM, compaction, per-fit escalation — on
its block, with no communication at all. Each fit's iterates depend only on its own data,
so results equal a one-device run (tested with 8 host devices). The batch is padded to a
multiple of the device count by repeating the first fit; the padding is dropped.

Inputs that are already sharded with a :class:`~jax.sharding.NamedSharding` over their
leading axis are recognised: their mesh and axis name are used when ``mesh`` is not given.

Multi-host: after ``jax.distributed.initialize()`` build the mesh over ``jax.devices()``
(all hosts) and pass globally sharded arrays; the same code runs SPMD on every host (see
``docs/batch.md``; not measured here).
"""

from __future__ import annotations

import functools
from typing import Callable, Optional

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from ._compile import tuned_jit
from .chunking import pad_rows

__all__ = ["infer_mesh", "shard_solve"]


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
        if sh.mesh.shape[axis] > 1:
            return sh.mesh, axis
    return None, None


def _place(a, mesh: Mesh, spec):
    """Put ``a`` on ``mesh`` with ``spec`` (``jax.reshard`` when traced)."""
    sharding = NamedSharding(mesh, spec)
    if isinstance(a, jax.core.Tracer):
        return jax.reshard(a, sharding)
    if not hasattr(a, "shape"):
        a = jnp.asarray(a)
    return jax.device_put(a, sharding)


@functools.lru_cache(maxsize=32)
def _sharded(solve: Callable, mesh: Mesh, axis: str):
    # a tuned_jit solver: its tuned function runs under our compiler options, the plain
    # one inside a user's jit (see adaptprec.batch._compile)
    fns = (getattr(solve, "__wrapped__", solve), getattr(solve, "plain_fn", solve))
    tuned, plain = (jax.shard_map(f, mesh=mesh, in_specs=(P(axis), P(axis), P()),
                                  out_specs=P(axis), check_vma=False) for f in fns)
    return tuned_jit(tuned, plain)


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

    x0p, bargsp = pad_rows((x0, bargs), pad)
    x0p, bargsp = jax.tree.map(lambda a: _place(a, mesh, P(axis)), (x0p, bargsp))
    sargs = jax.tree.map(lambda a: _place(a, mesh, P()), sargs)
    out = _sharded(solve, mesh, axis)(x0p, bargsp, sargs)
    return jax.tree.map(lambda a: a[:size], out)
