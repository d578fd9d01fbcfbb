"""Sampled checks of entrywise kernels: which kernels qualify, and the sampled error.

A kernel is *entrywise* when every output entry depends only on the same entry of each
array input (:func:`entrywise_jaxpr`, decided on its jaxpr); then a sample of entries can
be re-evaluated in the widest dtype from the user's inputs (:func:`sampled_error`).
:func:`error_of_samples` compares samples with their reference, for this check and the
sampled rows and convolution positions (:mod:`adaptprec._rowwise`,
:mod:`adaptprec._convsample`).
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from . import _jaxpr as jx
from ._autocast.interpret import _is_dynamic
from ._reductions import materialized, nan_to_inf

__all__ = ["is_entrywise", "entrywise_jaxpr", "sampled_error", "error_of_samples",
           "ENTRYWISE_EXTRA"]


def _is_float(dtype) -> bool:
    return dtype is not None and jnp.issubdtype(dtype, jnp.floating)


ENTRYWISE_EXTRA = frozenset({"convert_element_type", "broadcast_in_dim", "copy", "copy_p",
                              "stop_gradient", "select_n", "clamp"})


def is_entrywise(flat_fn: Callable, avals) -> bool:
    """Whether every output entry of ``flat_fn(*arrays)`` (a list of arrays out) depends
    only on the same entry of each array input (all non-scalar inputs and outputs share
    one shape; rank-0 inputs and constants broadcast): then it may be re-evaluated on a
    sample of entries. ``avals``: ShapeDtypeStructs of the arrays."""
    return entrywise_jaxpr(jax.make_jaxpr(flat_fn)(*avals), avals)


def entrywise_jaxpr(closed, avals) -> bool:
    """:func:`is_entrywise` on the kernel's traced ``closed`` jaxpr (the one structure
    trace of :mod:`adaptprec._structure`). Loops and branches qualify when their bodies
    do (a fixed-point iteration per entry)."""
    from ._opkind import ENTRYWISE
    shapes = {tuple(x.shape) for x in avals if len(x.shape)}
    outs = {tuple(a.shape) for a in closed.out_avals}
    if len(shapes) != 1 or outs != shapes:
        return False

    shape = next(iter(shapes))

    def loop_ok(eqn) -> bool:
        """A loop whose body (and exit test) is entrywise, carrying scalars or arrays of
        the kernel's shape, scanning nothing but scalars per step, stacking nothing."""
        p = eqn.params
        if eqn.primitive.name == "scan":
            xs = eqn.invars[p["num_consts"] + p["num_carry"]:]
            if any(np.ndim(v.aval) > 1 for v in xs):
                return False
            if any(type(v).__name__ != "DropVar" for v in eqn.outvars[p["num_carry"]:]):
                return False
            return ok(p["jaxpr"].jaxpr)
        if eqn.primitive.name == "while":
            return ok(p["cond_jaxpr"].jaxpr) and ok(p["body_jaxpr"].jaxpr)
        return all(ok(b.jaxpr) for b in p["branches"])      # cond

    def ok(jaxpr) -> bool:
        for eqn in jaxpr.eqns:
            name = eqn.primitive.name
            body = jx.call_body(eqn, remat=True, custom=True)
            if body is not None:
                if not ok(body[0]):
                    return False
            elif name in ("scan", "while", "cond"):
                if not loop_ok(eqn):
                    return False
            elif name == "broadcast_in_dim":
                if np.ndim(eqn.invars[0].aval) != 0 and tuple(
                        eqn.invars[0].aval.shape) != tuple(eqn.outvars[0].aval.shape):
                    return False
            elif name not in ENTRYWISE and name not in ENTRYWISE_EXTRA:
                return False
            if any(tuple(v.aval.shape) not in ((), shape) for v in eqn.outvars
                   if type(v).__name__ != "DropVar"):
                return False
        return True

    return ok(closed.jaxpr)


def sampled_error(fn: Callable, args: tuple, kwargs: dict, inputs: tuple, outs, dtypes,
                  ref_dtype, k: int = 256, seed: int = 0, floor: float = 0.0) -> jax.Array:
    """Normwise relative difference, on ``k`` evenly spaced entries (offset by
    ``seed``), between the rung's outputs ``outs`` (each sample cast to the dtype in
    ``dtypes`` it is returned in) and ``fn`` re-evaluated in
    ``ref_dtype`` from the user's inputs (an entrywise ``fn``: :func:`is_entrywise`).
    ``max |y_s - ref_s| / max |ref_s|`` (inf when a discrete output differs)."""
    leaves, treedef = jax.tree_util.tree_flatten(inputs)
    shape = next(tuple(x.shape) for x in leaves if _is_dynamic(x) and np.ndim(x))
    n = int(np.prod(shape))
    k = min(k, n)
    off = (seed * 0x9E3779B1) % max(n // k, 1)
    idx = jnp.asarray((np.arange(k, dtype=np.int64) * n) // k + off, jnp.int32)

    def take(x):
        if not _is_dynamic(x) or np.ndim(x) == 0:
            return x.astype(ref_dtype) if _is_dynamic(x) and _is_float(x.dtype) else x
        x = jnp.ravel(lax.stop_gradient(x))[idx]
        return x.astype(ref_dtype) if _is_float(x.dtype) else x

    a, kw = jax.tree_util.tree_unflatten(treedef, [take(x) for x in leaves])
    ref = jax.tree_util.tree_leaves(fn(*a, **kw))
    # the samples are read from the materialized outputs (a cond's operands): fused into
    # their producers, the gather made XLA split the rung's own fusion and write its
    # intermediates (exp and log1p of 2^20 entries: the check cost ~0.5 of the rung; an
    # optimization_barrier is dropped by XLA:CPU before fusion)
    return error_of_samples([materialized(lambda y: jnp.ravel(y)[idx], y).astype(dt)
                             for y, dt in zip(outs, dtypes)], ref, floor)


def error_of_samples(samples, ref, floor: float = 0.0):
    """The largest normwise relative error of the cheap rung's sampled outputs against
    their wider reference (``inf`` for a NaN, or a differing integer/bool entry); shared by
    the sampled-entries and sampled-rows checks. ``floor``: ``atol / rtol``, added to the
    magnitude the error is relative to."""
    err = jnp.float32(0)
    for ys, r in zip(samples, ref):
        if _is_float(ys.dtype):
            w = np.dtype(jnp.promote_types(r.dtype, jnp.float32))
            d = jnp.max(nan_to_inf(jnp.abs(ys.astype(w) - r.astype(w))))
            # normwise over the sample: max|y_s| <= max|y|, so this is the larger
            # (safer) ratio, and it costs no pass over the whole output
            e = jnp.where(d == 0, 0.0, d / (jnp.max(jnp.abs(r.astype(w))) + floor))
        else:
            e = jnp.where(jnp.any(ys != r), jnp.inf, 0.0)
        err = jnp.maximum(err, jnp.asarray(e, jnp.float32))
    return jnp.where(jnp.isnan(err), jnp.inf, err)
