"""Per-element recomputation with compaction: gather the failing rows, redo only them.

Under ``vmap`` a ``lax.cond`` with a batched predicate becomes a ``select`` that runs both
branches for every element. When only a few elements of a batch need an expensive second
attempt (a higher rung, a working-precision factorization), :func:`recompute_rows` gathers
them into a fixed-capacity buffer, runs the expensive function on the buffer only, and
scatters the results back. The choice between "nothing", "the buffer" and "the whole batch"
(more failures than slots) is one ``lax.switch`` on an *unbatched* count, so only the chosen
branch executes.

This is the mechanism the runtime's ``batch="element"`` mode describes; linalg uses it for
the fallback factorization of a batch of systems.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

__all__ = ["capacity_for", "select", "gather", "scatter", "by_count", "recompute_rows"]


def capacity_for(capacity: int | float, size: int) -> int:
    """Buffer slots for a batch of ``size``: an int is used as is, a float in (0, 1] is a
    fraction of the batch (rounded up, at least 1).

    Example:
        >>> from adaptprec._compaction import capacity_for
        >>> capacity_for(0.125, 64), capacity_for(3, 64), capacity_for(0.5, 1)
        (8, 3, 1)
    """
    if isinstance(capacity, bool) or not isinstance(capacity, (int, float, np.integer,
                                                              np.floating)):
        raise ValueError(f"capacity must be an int >= 1 or a float in (0, 1], got "
                         f"{capacity!r}")
    if isinstance(capacity, (float, np.floating)):
        if not 0.0 < capacity <= 1.0:
            raise ValueError(f"a fractional capacity must be in (0, 1], got {capacity!r}")
        return max(1, math.ceil(float(capacity) * size))
    if capacity < 1:
        raise ValueError(f"capacity must be an int >= 1 or a float in (0, 1], got "
                         f"{capacity!r}")
    return int(capacity)


def _bcast(mask, x):
    return mask.reshape(mask.shape + (1,) * (x.ndim - 1))


def _take(x, idx):
    return jnp.take(x, idx, axis=0, mode="clip")


def _put(full, idx, sub):
    return full.at[idx].set(sub, mode="drop")


def select(mask: jax.Array, capacity: int) -> tuple[jax.Array, jax.Array]:
    """Indices of the first ``capacity`` true entries of ``mask`` (padded with ``len(mask)``).

    Returns ``(idx, valid)`` (``int32``, ``bool``); padded slots have ``valid`` false and the
    out-of-range index ``len(mask)``, which :func:`scatter` drops.

    Example:
        >>> import jax.numpy as jnp
        >>> from adaptprec._compaction import select
        >>> idx, valid = select(jnp.array([False, True, False, True]), 3)
        >>> idx.tolist(), valid.tolist()
        ([1, 3, 4], [True, True, False])
    """
    size = mask.shape[0]
    (idx,) = jnp.nonzero(mask, size=capacity, fill_value=size)
    return idx.astype(jnp.int32), idx < size


def gather(tree: Any, idx: jax.Array, take: Callable = _take) -> Any:
    """Rows ``idx`` of every leaf (``take(leaf, idx)``; by default out-of-range rows are
    clipped, callers mask them).

    Example:
        >>> import jax.numpy as jnp
        >>> from adaptprec._compaction import gather
        >>> gather({"a": jnp.arange(3.0)}, jnp.array([2, 0]))["a"].tolist()
        [2.0, 0.0]
    """
    return jax.tree_util.tree_map(lambda x: take(x, idx), tree)


def scatter(tree: Any, idx: jax.Array, rows: Any, put: Callable = _put) -> Any:
    """Write ``rows`` back to rows ``idx`` of every leaf (``put(leaf, idx, rows)``; by
    default out-of-range rows are dropped).

    Example:
        >>> import jax.numpy as jnp
        >>> from adaptprec._compaction import scatter
        >>> scatter(jnp.zeros(3), jnp.array([1, 3]), jnp.array([5.0, 7.0])).tolist()
        [0.0, 5.0, 0.0]
    """
    return jax.tree_util.tree_map(lambda full, sub: put(full, idx, sub), tree, rows)


# the tree functions under names recompute_rows' per-leaf hook arguments do not shadow
_gather_tree, _scatter_tree = gather, scatter


def by_count(need: jax.Array, capacity: int, nothing: Callable, compact: Callable,
             whole: Callable, operand: Any) -> Any:
    """``nothing``, ``compact`` or ``whole`` applied to ``operand``, as no row, at most
    ``capacity`` rows or more rows of ``need`` are set: one ``lax.switch`` on an unbatched
    count, so only the chosen branch executes (also under ``vmap`` of the caller's caller).
    """
    n_need = jnp.sum(need, dtype=jnp.int32)
    branch = jnp.where(n_need == 0, 0, jnp.where(n_need <= capacity, 1, 2))
    return lax.switch(branch, [nothing, compact, whole], operand)


def recompute_rows(need: jax.Array, fn: Callable[[Any], Any], operands: Any, current: Any,
                   *, capacity: int, gather: Callable = _take, scatter: Callable = _put,
                   prepare_mask: Callable | None = None) -> Any:
    """Replace the rows of ``current`` where ``need`` is True by ``fn(operands)``'s rows.

    Args:
        need: ``(size,)`` bool, which rows need recomputing (a traced value is fine).
        fn: maps a pytree of row-batched operands (leading axis = rows) to a pytree with
            the structure of ``current`` and the same number of rows. It must treat rows
            independently (row ``i`` of the output depends only on row ``i`` of the input).
        operands: pytree of arrays with leading axis ``size``.
        current: pytree of arrays with leading axis ``size`` (the cheap results).
        capacity: buffer slots (static int, see :func:`capacity_for`).
        gather, scatter, prepare_mask: per-leaf hooks for sharded batches (the runtime
            passes versions that keep the small buffer replicated on an explicit mesh):
            ``gather(x, idx) -> rows``, ``scatter(full, idx, rows) -> full`` (indices equal
            to the batch size must be dropped), ``prepare_mask(need) -> need`` before the
            indices are computed. Defaults: plain indexing.

    Returns:
        ``current`` with the needed rows replaced. Executed work: nothing when no row needs
        it; ``fn`` on ``capacity`` gathered rows when at most ``capacity`` do; ``fn`` on the
        whole batch otherwise (then only the needed rows take its values).

    Example:
        >>> import jax.numpy as jnp
        >>> from adaptprec._compaction import recompute_rows
        >>> x = jnp.arange(8.0)
        >>> recompute_rows(x > 5, lambda v: -v, x, x, capacity=2).tolist()
        [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, -6.0, -7.0]
    """
    size = need.shape[0]
    take, put = gather, scatter

    def whole(cur):
        new = fn(operands)
        return jax.tree_util.tree_map(lambda n, o: jnp.where(_bcast(need, n), n, o),
                                      new, cur)

    def nothing(cur):
        return cur

    if capacity >= size:
        return lax.cond(jnp.any(need), whole, nothing, current)

    def compact(cur):
        idx, valid = select(need if prepare_mask is None else prepare_mask(need), capacity)
        safe = jnp.where(valid, idx, 0)
        # unused slots carry index `size`: out of bounds, dropped by the scatter
        return _scatter_tree(cur, idx, fn(_gather_tree(operands, safe, take)), put)

    return by_count(need, capacity, nothing, compact, whole, current)
