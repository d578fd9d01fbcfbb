"""Row-separable kernels and their sampled-rows check (checks cheaper than the
work they verify).

A kernel is *row-separable* in some of its array inputs (the "row inputs", all with the
same leading extent ``B``) when every output has leading extent ``B`` and output row
``i`` depends only on row ``i`` of the row inputs (and on all of the other inputs): an
MLP in its batch of activations, attention in its queries, a layer norm in its rows.
Then ``k`` rows of the answer can be re-evaluated in the widest dtype from the user's
inputs at ``k / B`` of the cost -- for attention that is a few percent of the rung,
where the first-order bound walks the ``B x B`` score matrix.

The property is decided on the kernel's jaxpr (structurally, not on sample data): a
forward pass tags each value "row" (axis 0 is the row axis) or "independent" (no row
input reaches it), and any operation that could mix rows (a reduction or contraction
over axis 0, a transpose or reshape that moves it, a gather) makes the kernel not
row-separable. Loops are walked to a fixed point of their carries' tags: an ODE
integrator stepping a batch of trajectories is separable in them, as long as no step
mixes trajectories, the loop does not scan over rows or stack rows per step, and a
``while`` loop's exit test does not read a row (each sample would stop on its own).

The check is statistical, like the sampled check of entrywise kernels: a bad row between
the samples is missed, and the report says "sampled".
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from . import _jaxpr as jx
from ._autocast.interpret import _is_dynamic
from ._reductions import materialized, nan_to_inf
from ._sampled import error_of_samples

__all__ = ["row_inputs", "row_inputs_jaxpr", "sampled_rows_error", "ROWS", "MIN_BATCH"]

#: rows re-evaluated by the check (``batch // 256`` of them, between ``MIN_ROWS`` and
#: ``ROWS``: a share of the work that stays small when the batch is, and more rows of a
#: long batch, whose rows' errors may spread widely: trajectories of a chaotic system),
#: and the least leading extent it is used at (below it the sample would be a large
#: share of the work, or too few rows to say much)
ROWS, MIN_ROWS, MIN_BATCH = 64, 8, 64

#: "row": axis 0 is the row axis; "ind": no row input reaches it; "pos": an iota along
#: axis 0 (depends on the row's position, which a sample renumbers)
_ROW, _IND, _POS = "row", "ind", "pos"

_REDUCE = frozenset({"reduce_sum", "reduce_max", "reduce_min", "reduce_prod",
                     "reduce_and", "reduce_or", "argmax", "argmin"})
_CUMULATIVE = frozenset({"cumsum", "cumprod", "cummax", "cummin", "cumlogsumexp"})


class _NotRowwise(Exception):
    pass


def _entrywise_names():
    from ._opkind import ENTRYWISE
    from ._sampled import ENTRYWISE_EXTRA
    return ENTRYWISE | ENTRYWISE_EXTRA - {"broadcast_in_dim"}


def _rows_of(aval) -> int | None:
    shape = getattr(aval, "shape", ())
    return shape[0] if len(shape) else None


def _walk(jaxpr, states: list, batch: int, entrywise) -> list:
    env = {}
    for v, s in zip(jaxpr.invars, states):
        env[v] = s
    for v in jaxpr.constvars:
        env[v] = _IND

    def read(v):
        return env.get(v, _IND) if not isinstance(v, jx.Literal) else _IND

    for eqn in jaxpr.eqns:
        ins = [read(v) for v in eqn.invars]
        name = eqn.primitive.name
        if _POS in ins:
            raise _NotRowwise(name)
        if name == "iota" and eqn.params["dimension"] == 0 and _rows_of(
                eqn.outvars[0].aval) == batch:
            out = [_POS]
        elif all(s == _IND for s in ins):
            out = [_IND] * len(eqn.outvars)
        else:
            out = _rule(eqn, name, ins, batch, entrywise)
        for v, s in zip(eqn.outvars, out):
            env[v] = s
    return [read(v) for v in jaxpr.outvars]


def _rule(eqn, name, ins, batch, entrywise) -> list:
    if name in ("scan", "while"):
        return _loop(eqn, ins, batch, entrywise)
    if name == "cond":
        if ins[0] != _IND:
            raise _NotRowwise("cond on a row")
        outs = [_walk(b.jaxpr, ins[1:], batch, entrywise) for b in eqn.params["branches"]]
        return [_ROW if _ROW in col else _IND for col in zip(*outs)]
    row_out = [_ROW] * len(eqn.outvars)
    for v in eqn.outvars:
        if _rows_of(v.aval) != batch:
            raise _NotRowwise(name)
    body = jx.call_body(eqn, remat=True, custom=True)
    if body is not None:
        res = _walk(body[0], ins, batch, entrywise)
        return res
    p = eqn.params
    in_avals = [v.aval for v in eqn.invars]
    if name in entrywise:
        # same-shaped operands (jnp inserts explicit broadcasts): an independent operand
        # is a broadcast (re-traced at k rows alike) or a constant of B rows (then the
        # re-trace at k rows fails its shape check: not separable, see _retraces)
        return row_out
    if name == "broadcast_in_dim":
        dims = p["broadcast_dimensions"]
        if not dims or dims[0] != 0 or in_avals[0].shape[0] != batch:
            raise _NotRowwise(name)
        return row_out
    if name in _REDUCE:
        if 0 in p["axes"]:
            raise _NotRowwise(name)
        return row_out
    if name in _CUMULATIVE:
        if p["axis"] == 0:
            raise _NotRowwise(name)
        return row_out
    if name == "transpose":
        if p["permutation"][0] != 0:
            raise _NotRowwise(name)
        return row_out
    if name in ("reshape", "squeeze"):
        if p.get("dimensions") not in (None, ()) and name == "reshape":
            raise _NotRowwise(name)
        if name == "squeeze" and 0 in p["dimensions"]:
            raise _NotRowwise(name)
        if in_avals[0].shape[0] != batch:
            raise _NotRowwise(name)
        return row_out
    if name == "dot_general":
        (lc, rc), (lb, rb) = p["dimension_numbers"]
        sl, sr = ins
        if sl == _ROW and sr == _IND and not lb and 0 not in lc:
            return row_out
        if sl == _ROW and sr == _ROW and lb and lb[0] == 0 and rb[0] == 0:
            return row_out
        raise _NotRowwise(name)
    if name == "conv_general_dilated":
        dn = p["dimension_numbers"]
        if (ins[0] == _ROW and ins[1] == _IND and dn.lhs_spec[0] == 0
                and dn.out_spec[0] == 0 and p["batch_group_count"] == 1):
            return row_out
        raise _NotRowwise(name)
    if name == "concatenate":
        if p["dimension"] == 0:
            raise _NotRowwise(name)
        if any(s == _IND and np.ndim(v.aval) for v, s in zip(eqn.invars, ins)):
            raise _NotRowwise(name)
        return row_out
    if name == "stack":
        if p["axis"] == 0 or any(s == _IND and np.ndim(v.aval)
                                 for v, s in zip(eqn.invars, ins)):
            raise _NotRowwise(name)
        return row_out
    if name == "slice":
        if (p["start_indices"][0] != 0 or p["limit_indices"][0] != batch
                or (p["strides"] and p["strides"][0] != 1)):
            raise _NotRowwise(name)
        return row_out
    if name == "pad":
        lo, hi, interior = p["padding_config"][0]
        if (lo, hi, interior) != (0, 0, 0) or ins[1] == _ROW:
            raise _NotRowwise(name)
        return row_out
    raise _NotRowwise(name)


def _loop(eqn, ins, batch, entrywise) -> list:
    """A ``scan``/``while``: the carries' tags at their fixed point (a carry becomes a
    row once a row reaches it), checking the carried rows keep their row axis."""
    p = eqn.params
    if eqn.primitive.name == "scan":
        nc, ncar = p["num_consts"], p["num_carry"]
        consts, carry, xs = ins[:nc], list(ins[nc:nc + ncar]), ins[nc + ncar:]
        if any(s != _IND for s in xs):
            raise _NotRowwise("scan over rows")
        body, head, avals = p["jaxpr"].jaxpr, list(consts), eqn.invars[nc:nc + ncar]
    else:
        cn, bn = p["cond_nconsts"], p["body_nconsts"]
        consts, carry, xs = ins[cn:cn + bn], list(ins[cn + bn:]), []
        body, head, avals = p["body_jaxpr"].jaxpr, list(consts), eqn.invars[cn + bn:]
    for _ in range(len(carry) + 1):
        for s, v in zip(carry, avals):
            if s == _ROW and _rows_of(v.aval) != batch:
                raise _NotRowwise("a carried row without its row axis")
        out = _walk(body, head + carry + [_IND] * len(xs), batch, entrywise)
        new = [_ROW if _ROW in (a, b) else _IND for a, b in zip(carry, out[:len(carry)])]
        if new == carry:
            break
        carry = new
    if eqn.primitive.name == "scan":
        if any(s != _IND for s in out[len(carry):]):
            raise _NotRowwise("scan stacking rows per step")
        return carry + out[len(carry):]
    cn = p["cond_nconsts"]
    (test,) = _walk(p["cond_jaxpr"].jaxpr, list(ins[:cn]) + carry, batch, entrywise)
    if test != _IND:
        raise _NotRowwise("while exit test on a row")
    return carry


def row_inputs(flat_fn: Callable, avals) -> tuple | None:
    """Which of the array inputs ``avals`` ``flat_fn(*arrays)`` (a list of arrays out)
    is row-separable in (a tuple of bools), or ``None``. Tries every input with the
    outputs' leading extent as a row input, then each alone (attention is separable in
    its queries, not in its keys of the same shape), then pairs."""
    try:
        closed = jax.make_jaxpr(flat_fn)(*avals)
    except Exception:       # noqa: BLE001 -- not analysable: not row-separable
        return None
    return row_inputs_jaxpr(closed, flat_fn, avals)


def row_inputs_jaxpr(closed, flat_fn: Callable, avals) -> tuple | None:
    """:func:`row_inputs` on the kernel's traced ``closed`` jaxpr (the one structure
    trace of :mod:`adaptprec._structure`); ``flat_fn`` is traced again only on the sampled
    rows, to confirm a candidate."""
    batches = {_rows_of(a) for a in closed.out_avals}
    if len(batches) != 1 or None in batches:
        return None
    (batch,) = batches
    if batch < MIN_BATCH:
        return None
    cand = [i for i, a in enumerate(avals) if _rows_of(a) == batch]
    entrywise = _entrywise_names()
    subsets = [tuple(cand)] + [(i,) for i in cand] + list(itertools.combinations(cand, 2))
    for subset in dict.fromkeys(subsets):
        if not subset:
            continue
        states = [_ROW if i in subset else _IND for i in range(len(avals))]
        try:
            outs = _walk(closed.jaxpr, states, batch, entrywise)
        except _NotRowwise:
            continue
        if all(s == _ROW for s in outs):
            mask = tuple(i in subset for i in range(len(avals)))
            if _retraces(flat_fn, avals, closed.out_avals, mask, batch):
                return mask
    return None


def _retraces(flat_fn, avals, full, mask, batch) -> bool:
    """The kernel traced on the sampled rows returns that many rows of the same shapes as
    its outputs ``full`` on all rows (the structure trace's output avals)."""
    k = rows_for(batch)
    small = [jax.ShapeDtypeStruct((k,) + tuple(a.shape[1:]), a.dtype) if m else a
             for a, m in zip(avals, mask)]
    try:
        part = jax.eval_shape(flat_fn, *small)
    except Exception:       # noqa: BLE001 -- shape-dependent code: not separable
        return False
    return all(tuple(p.shape) == (k,) + tuple(f.shape[1:]) and p.dtype == f.dtype
               for p, f in zip(jax.tree_util.tree_leaves(part), full))


def rows_for(batch: int) -> int:
    """How many of ``batch`` rows the check re-evaluates."""
    return min(ROWS, max(MIN_ROWS, batch // 256), batch)


def _row_scores(outs) -> jax.Array:
    """Per row, its largest entry relative to its leaf's largest entry: where a normwise
    error, ``max|e| / max|y|``, usually sits, since an entry's rounding error scales
    with its magnitude (the rows of a quadrature near its largest value; a sum's
    accumulator)."""
    s = None
    for y in outs:
        if not jnp.issubdtype(y.dtype, jnp.floating):
            continue
        a = nan_to_inf(jnp.abs(lax.stop_gradient(y).astype(jnp.float32)))
        a = a.reshape(a.shape[0], -1).max(axis=1) if a.ndim > 1 else a
        a = a / jnp.maximum(jnp.max(a), jnp.finfo(jnp.float32).tiny)
        s = a if s is None else jnp.maximum(s, a)
    return s


def sampled_rows_error(fn: Callable, inputs: tuple, mask: tuple, outs, dtypes, ref_dtype,
                       k: int | None = None, seed: int = 0,
                       floor: float = 0.0) -> jax.Array:
    """Normwise relative difference, on ``k`` rows (default :func:`rows_for`), between
    the rung's outputs ``outs`` (cast to ``dtypes``) and ``fn`` re-evaluated in
    ``ref_dtype`` from the user's ``inputs`` (``(args, kwargs)``), sliced to those rows
    where ``mask`` (over the dynamic leaves) says they are row inputs. ``inf`` when a
    discrete output differs.

    The rows: half of them evenly spaced (offset by ``seed``), half the rows of largest
    relative magnitude in the rung's outputs (:func:`_row_scores`): a 20,000-step
    quadrature's largest error sits at its largest values, which evenly spaced rows
    missed (the estimate was 0.07x the true error on benchmarks/calibrate_accuracy.py)."""
    leaves, treedef = jax.tree_util.tree_flatten(inputs)
    dyn = [i for i, x in enumerate(leaves) if _is_dynamic(x)]
    rows = {i for i, m in zip(dyn, mask) if m}
    batch = leaves[next(iter(rows))].shape[0]
    k = rows_for(batch) if k is None else min(k, batch)
    spaced = k - k // 2
    off = (seed * 0x9E3779B1) % max(batch // spaced, 1)
    spaced_idx = jnp.asarray((np.arange(spaced, dtype=np.int64) * batch) // spaced + off,
                             jnp.int32)

    def pick(*ys):
        scores = _row_scores(ys)
        idx = spaced_idx if scores is None or not k // 2 else jnp.concatenate(
            [spaced_idx, lax.top_k(scores, k // 2)[1].astype(jnp.int32)])
        return idx, [y[idx] for y in ys]

    # the rows chosen and read from the materialized outputs (a cond's operands, as
    # the sampled check of entries reads them): a reduction or gather fused into the
    # rung's producers splits their fusions
    idx, sampled = materialized(pick, *outs)

    def take(i, x):
        if not _is_dynamic(x):
            return x
        x = lax.stop_gradient(x)
        if i in rows:
            x = x[idx]
        return x.astype(ref_dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x

    a, kw = jax.tree_util.tree_unflatten(treedef, [take(i, x) for i, x in enumerate(leaves)])
    ref = jax.tree_util.tree_leaves(fn(*a, **kw))
    return error_of_samples([y.astype(dt) for y, dt in zip(sampled, dtypes)], ref, floor)
