"""``vmap`` that keeps the batch axis LAST, for the batched solver's residual evaluations.

The batched LM loop keeps every per-fit quantity with the fits on the minor (contiguous)
axis (:mod:`adaptprec.batch.lm_batched`). ``jax.vmap(..., in_axes=-1, out_axes=-1)``
accepts and returns that layout, but its batching rules move the batch axis to the FRONT
whenever operands of different rank meet (a fit's scalar parameter against the shared
pixel grid, say) and transpose back at the end; XLA then computes the model with the fits
on the major axis and transposes inside the fused kernel. For Gpufit's 2-D Gaussian that
transpose made residual-and-Jacobian evaluation about twice as slow as the same arithmetic
in the fits-last layout.

:func:`vmap_last` traces the per-fit function once to a jaxpr and evaluates it with every
batched value carrying the batch axis last: elementwise primitives broadcast their
unbatched operands along a trailing axis, and the structural primitives
(``broadcast_in_dim``, ``reshape``, ``squeeze``, ``slice``, ``concatenate``, ``transpose``,
reductions) only need their shape parameters extended by that axis. Nested ``jit`` is
inlined. Every other primitive with a batched operand (``dot_general``, ``gather``,
control flow, ...) is evaluated by ``jax.vmap`` of that one primitive with
``out_axes=-1``: correct for anything ``vmap`` handles, just without the layout benefit.
The arithmetic is the same, primitive for primitive, as under ``jax.vmap``.
"""

from __future__ import annotations

from typing import Callable

import jax
from jax import lax

from .._opkind import AXIS_REDUCTIONS, ENTRYWISE
from .._jaxpr import bind, call_body, eval_jaxpr

__all__ = ["vmap_last"]


def _spread(x, shape: tuple, batched: bool, size: int):
    """``x`` broadcast to ``shape + (size,)``. Per fit, ``x`` has shape ``()`` or the rank of
    ``shape`` with dimensions equal or 1 (elementwise primitives broadcast size-1
    dimensions); a batched ``x`` also has the trailing batch axis."""
    target = tuple(shape) + (size,)
    if not hasattr(x, "shape"):      # a jaxpr literal (typed Python scalar)
        x = jax.numpy.asarray(x, dtype=getattr(x, "dtype", None))
    if x.shape == target:
        return x
    if batched:
        dims = tuple(range(x.ndim)) if x.ndim == len(target) else (len(shape),)
    else:
        dims = tuple(range(x.ndim))
    return lax.broadcast_in_dim(x, target, dims)


def _eval(jaxpr, consts, args, flags, size: int):
    """Evaluate ``jaxpr``; ``flags[i]`` says whether ``args[i]`` has a trailing batch axis.
    Returns ``(outs, out_flags)``. Values are ``(array, batched)`` pairs."""

    def step(eqn, ins):
        vals, bat = zip(*ins) if ins else ((), ())
        if not any(bat):
            return [(o, False) for o in bind(eqn, vals)]
        body = call_body(eqn, custom=False, remat=False)
        if body is not None:       # nested jit: inlined (custom derivatives are kept)
            outs, oflags = _eval(*body, vals, bat, size)
            return list(zip(outs, oflags))
        return [(o, True) for o in _batched(eqn, vals, bat, size)]

    res = eval_jaxpr(jaxpr, [(c, False) for c in consts], list(zip(args, flags)), step,
                     literal=lambda lit: (lit.val, False))
    outs, oflags = zip(*res) if res else ((), ())
    return list(outs), list(oflags)


def _batched(eqn, vals, bat, size: int) -> list:
    """Outputs of ``eqn`` (at least one operand batched), batch axis last."""
    name = eqn.primitive.name
    p = eqn.params
    if name in ENTRYWISE:
        shape = eqn.outvars[0].aval.shape
        return bind(eqn, [_spread(x, shape, b, size) for x, b in zip(vals, bat)])
    if name == "broadcast_in_dim":
        shape = tuple(p["shape"]) + (size,)
        dims = tuple(p["broadcast_dimensions"]) + (len(p["shape"]),)
        return [lax.broadcast_in_dim(vals[0], shape, dims)]
    if name == "reshape" and p.get("dimensions") is None and len(vals) == 1:
        return [lax.reshape(vals[0], tuple(p["new_sizes"]) + (size,))]
    if name == "squeeze":
        return [lax.squeeze(vals[0], p["dimensions"])]
    if name == "slice":
        strides = p["strides"]
        return [lax.slice(vals[0], tuple(p["start_indices"]) + (0,),
                          tuple(p["limit_indices"]) + (size,),
                          None if strides is None else tuple(strides) + (1,))]
    if name == "transpose":
        perm = tuple(p["permutation"])
        return [lax.transpose(vals[0], perm + (len(perm),))]
    if name == "concatenate":
        ops = [x if b else _spread(x, x.shape, False, size) for x, b in zip(vals, bat)]
        return [lax.concatenate(ops, p["dimension"])]
    if name in AXIS_REDUCTIONS and len(vals) == 1:
        return bind(eqn, vals)      # axes index the leading (per-fit) axes: unchanged
    # anything else: jax.vmap of this one primitive, batch axis last
    axes = [-1 if b else None for b in bat]
    out = jax.vmap(lambda *a: bind(eqn, a), in_axes=axes, out_axes=-1, axis_size=size)(*vals)
    return list(out)


def vmap_last(fn: Callable) -> Callable:
    """``vmap_last(fn)(batched, shared)``: ``fn(one, shared)`` for every slice ``one`` of
    ``batched`` along its LAST axis; every output leaf gets a trailing batch axis.

    ``batched`` is a pytree of arrays that all end in the batch size ``B``; ``shared`` is
    passed to every call unchanged. Equivalent to
    ``jax.vmap(fn, in_axes=(-1, None), out_axes=-1)`` (same primitives, so the same
    results), but evaluated in the fits-last layout throughout (see the module docstring).

    Example:
        >>> import jax.numpy as jnp
        >>> from adaptprec.batch._fits_last import vmap_last
        >>> f = lambda p, grid: p[0] * jnp.exp(-p[1] * grid)
        >>> p = jnp.array([[1.0, 2.0, 3.0], [0.0, 1.0, 2.0]])      # 3 fits, batch axis last
        >>> out = vmap_last(f)(p, jnp.array([0.0, 1.0]))
        >>> out.shape, bool(jnp.allclose(out, jax.vmap(f, (-1, None), -1)(p, jnp.array([0.0, 1.0]))))
        ((2, 3), True)
    """
    def call(batched, shared):
        leaves, tree = jax.tree.flatten(batched)
        if not leaves:
            raise ValueError("vmap_last needs at least one batched array")
        size = leaves[0].shape[-1]
        for a in leaves:
            if a.ndim == 0 or a.shape[-1] != size:
                raise ValueError(f"every batched leaf must end in the batch size {size}; "
                                 f"got shape {a.shape}")
        one = [jax.ShapeDtypeStruct(a.shape[:-1], a.dtype) for a in leaves]
        s_leaves, s_tree = jax.tree.flatten(shared)
        s_leaves = [jax.numpy.asarray(a) for a in s_leaves]   # python scalars stay weak

        def flat_fn(b_flat, s_flat):
            return fn(jax.tree.unflatten(tree, b_flat), jax.tree.unflatten(s_tree, s_flat))

        closed, out_shape = jax.make_jaxpr(flat_fn, return_shape=True)(one, s_leaves)
        args = list(leaves) + s_leaves
        flags = [True] * len(leaves) + [False] * len(s_leaves)
        outs, oflags = _eval(closed.jaxpr, closed.consts, args, flags, size)
        outs = [o if f else _spread(o, o.shape, False, size) for o, f in zip(outs, oflags)]
        return jax.tree.unflatten(jax.tree.structure(out_shape), outs)

    return call
