"""Compaction of stragglers: regroup the fits still iterating into a smaller buffer.

Under an explicit batch axis every iteration costs the same whether 100% or 1% of the
fits are still active (inactive fits are masked, not skipped). When most fits have
converged, :func:`run_compacted` gathers the active ones into a fixed-size buffer
(capacity ``B // factor``), continues the iteration there, and scatters the buffer back.
Stages repeat down a static list of capacities, e.g. ``100000 -> 12500 -> 1562 -> 195``;
a stage ends when its active count fits into the next capacity, so nothing overflows.

All shapes are static (``jnp.nonzero(..., size=capacity)``), so everything stays inside one
compiled program with no host synchronisation. ``select``/``gather``/``scatter`` are the
runtime's (:mod:`adaptprec._compaction`), re-exported here. The saving is measured in
``benchmarks/bench_batch.py`` (compaction on/off); it helps when a long tail of slow fits
exists and costs a few gathers/scatters when it does not.

Example:
    >>> import jax.numpy as jnp
    >>> from adaptprec.batch.compaction import select, gather, scatter
    >>> idx, valid = select(jnp.array([False, True, False, True]), 3)
    >>> idx.tolist(), valid.tolist()
    ([1, 3, 4], [True, True, False])
    >>> tree = {"a": jnp.arange(4.0)}
    >>> buf = gather(tree, idx)
    >>> scatter(tree, idx, {"a": buf["a"] * 10})["a"].tolist()
    [0.0, 10.0, 2.0, 30.0]
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

# the runtime's compaction primitives (one implementation: adaptprec._compaction, also
# behind MixedPrecisionManager(batch="element") and linalg's fallback)
from .._compaction import gather, scatter, select
from .lm_batched import LMOptions, LMState, lm_init, lm_run, lm_step

__all__ = ["plan_capacities", "select", "gather", "scatter", "run_compacted", "empty_state",
           "run_streaming"]


def plan_capacities(size: int, factor: int = 8, min_size: int = 256) -> tuple[int, ...]:
    """Static buffer sizes ``(size, size//factor, ...)`` not going below ``min_size``.

    ``factor <= 1`` (or a ``size`` below ``factor * min_size``) disables compaction.

    Example:
        >>> from adaptprec.batch.compaction import plan_capacities
        >>> plan_capacities(100_000)
        (100000, 12500, 1562)
        >>> plan_capacities(1000)
        (1000,)
    """
    caps = [int(size)]
    if factor and factor > 1:
        while caps[-1] // factor >= min_size:
            caps.append(caps[-1] // factor)
    return tuple(caps)


def run_compacted(fj, s: LMState, bargs, sargs, opts: LMOptions,
                  capacities: tuple[int, ...]) -> LMState:
    """Run LM to completion, regrouping stragglers through ``capacities`` (static).

    ``capacities[0]`` must equal the batch size; ``(B,)`` alone means no compaction.
    Per-fit results equal the uncompacted run's: a fit's iterates never depend on which
    other fits share its buffer.

    Example:
        >>> import jax.numpy as jnp
        >>> from adaptprec.batch.lm_batched import LMOptions, lm_init, make_fj
        >>> from adaptprec.batch.compaction import run_compacted
        >>> fj = make_fj(lambda x, b, s: jnp.exp(x) - b[0], jnp.float64, jnp.float64)
        >>> o = LMOptions(1e-10, 1e-10, 1e-10, 50)
        >>> y = (jnp.linspace(1.5, 40.0, 8)[:, None],)
        >>> s = run_compacted(fj, lm_init(fj, jnp.zeros((8, 1)), y, (), o), y, (), o, (8, 2))
        >>> bool(jnp.allclose(jnp.exp(s.x), y[0]))
        True
    """
    if capacities[0] != s.x.shape[0]:
        raise ValueError(f"capacities[0] must equal the batch size {s.x.shape[0]}, "
                         f"got {capacities}")
    return _stage(fj, s, bargs, sargs, opts, capacities)


def _stage(fj, s, bargs, sargs, opts, caps):
    if len(caps) == 1:
        return lm_run(fj, s, bargs, sargs, opts, 0)
    nxt = caps[1]
    s = lm_run(fj, s, bargs, sargs, opts, nxt)
    idx, valid = select(s.active, nxt)
    sub = gather(s, idx)
    sub = sub._replace(active=sub.active & valid)
    sub = _stage(fj, sub, gather(bargs, idx), sargs, opts, caps[1:])
    return scatter(s, idx, sub)


def empty_state(size: int, n: int, dtype) -> LMState:
    """A full-size placeholder :class:`LMState` (status RUNNING, nothing active).

    Example:
        >>> import jax.numpy as jnp
        >>> from adaptprec.batch.compaction import empty_state
        >>> empty_state(3, 2, jnp.float32).jtj.shape
        (3, 2, 2)
    """
    from . import _status as st

    z = jnp.zeros((size,), dtype)
    i = jnp.zeros((size,), jnp.int32)
    return LMState(x=jnp.zeros((size, n), dtype), cost=z, jtj=jnp.zeros((size, n, n), dtype),
                   jtf=jnp.zeros((size, n), dtype), d2=jnp.ones((size, n), dtype), lam=z,
                   nu=z, active=jnp.zeros((size,), bool), status=i + st.RUNNING, nit=i,
                   nfev=i, njev=i, gn_rate=jnp.full((size, 3), jnp.inf, dtype))


def run_streaming(fj, x_start, bargs, sargs, opts: LMOptions, results: LMState, queue,
                  count, slots: int, refill: int) -> LMState:
    """Stream fits ``queue[:count]`` through ``slots`` lanes, refilling finished lanes.

    The working buffer has ``slots`` lanes (fits iterated in lockstep). Whenever at least
    ``refill`` lanes have finished (or fewer fits remain in the queue), up to ``refill``
    finished lanes are written back to ``results`` (rows = fit indices) and reloaded with
    the next fits from the queue, initialised from ``x_start`` on a ``refill``-sized
    buffer (no wasted residual evaluations). A converged fit therefore frees its lane for
    new work instead of idling until the slowest fit of its group is done; only the last
    ``slots`` fits drain in lockstep. One ``while_loop`` with one step body, so compile
    cost does not grow with the batch.

    ``queue`` is an ``(B,)`` int array of fit indices (entries past ``count`` are ignored),
    ``results`` a full-size state whose rows of unprocessed fits are returned unchanged.

    Example:
        >>> import jax.numpy as jnp
        >>> from adaptprec.batch.lm_batched import LMOptions, make_fj
        >>> from adaptprec.batch.compaction import empty_state, run_streaming
        >>> fj = make_fj(lambda x, b, s: jnp.exp(x) - b[0], jnp.float64, jnp.float64)
        >>> o = LMOptions(1e-10, 1e-10, 1e-10, 50)
        >>> y = (jnp.linspace(1.5, 40.0, 9)[:, None],)
        >>> res = run_streaming(fj, jnp.zeros((9, 1)), y, (), o, empty_state(9, 1, jnp.float64),
        ...                     jnp.arange(9), 9, slots=4, refill=2)
        >>> bool(jnp.allclose(jnp.exp(res.x), y[0])), res.status.tolist().count(99)
        (True, 0)
    """
    size = x_start.shape[0]
    slots = int(min(slots, size))
    refill = int(max(1, min(refill, slots)))
    acc = results.x.dtype
    count = jnp.asarray(count, jnp.int32)
    qpad = jnp.concatenate([queue.astype(jnp.int32), jnp.full((slots,), size, jnp.int32)])

    def load(start, k):
        r = jnp.arange(k, dtype=jnp.int32)
        take = start + r < count
        ids = jnp.where(take, jax.lax.dynamic_slice(qpad, (start,), (k,)), size)
        b = gather(bargs, ids)
        x = jnp.take(x_start, ids, axis=0, mode="clip").astype(acc)
        return ids, b, lm_init(fj, x, b, sargs, opts, active=take), jnp.sum(take, dtype=jnp.int32)

    ids, slot_b, slot, nxt = load(jnp.int32(0), slots)

    def do_refill(c):
        slot, slot_b, ids, nxt, res = c
        p, pvalid = select(~slot.active, refill)
        p = jnp.where(pvalid, p, slots)
        res = scatter(res, jnp.take(ids, p, mode="fill", fill_value=size), gather(slot, p))
        new_ids, new_b, new, took = load(nxt, refill)
        slot = scatter(slot, p, new)
        slot_b = scatter(slot_b, p, new_b)
        ids = ids.at[p].set(new_ids, mode="drop")
        return slot, slot_b, ids, nxt + took, res

    def cond(c):
        slot, _, _, nxt, _ = c
        return jnp.any(slot.active) | (nxt < count)

    def body(c):
        slot, slot_b, ids, nxt, res = c
        slot = lm_step(fj, slot, slot_b, sargs, opts)
        nfree = jnp.sum(~slot.active, dtype=jnp.int32)
        need = (nxt < count) & (nfree >= jnp.minimum(refill, count - nxt))
        return jax.lax.cond(need, do_refill, lambda c: c, (slot, slot_b, ids, nxt, res))

    slot, slot_b, ids, nxt, res = jax.lax.while_loop(
        cond, body, (slot, slot_b, ids, nxt, results))
    return scatter(res, ids, slot)
