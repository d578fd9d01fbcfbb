"""Compaction of stragglers: regroup the fits still iterating into a smaller buffer.

Under an explicit batch axis every iteration costs the same whether 100% or 1% of the
fits are still active (inactive fits are masked, not skipped). When most fits have
converged, :func:`run_compacted` gathers the active ones into a fixed-size buffer
(capacity ``B // factor``), continues the iteration there, and scatters the buffer back.
Stages repeat down a static list of capacities, e.g. ``100000 -> 12500 -> 1562 -> 195``;
a stage ends when its active count fits into the next capacity, so nothing overflows.

All shapes are static (``jnp.nonzero(..., size=capacity)``), so everything stays inside one
compiled program with no host synchronisation. The saving is measured in
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

from .lm_batched import LMOptions, LMState, lm_run

__all__ = ["plan_capacities", "select", "gather", "scatter", "run_compacted"]


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


def select(mask: jax.Array, capacity: int) -> tuple[jax.Array, jax.Array]:
    """Indices of the first ``capacity`` true entries of ``mask`` (padded with ``len(mask)``).

    Returns ``(idx, valid)``; padded slots have ``valid`` false and an out-of-range index,
    which :func:`scatter` drops. See the module example.
    """
    size = mask.shape[0]
    (idx,) = jnp.nonzero(mask, size=capacity, fill_value=size)
    return idx.astype(jnp.int32), idx < size


def gather(tree, idx: jax.Array):
    """Rows ``idx`` of every leaf (out-of-range rows clipped; callers mask them)."""
    return jax.tree.map(lambda a: jnp.take(a, idx, axis=0, mode="clip"), tree)


def scatter(tree, idx: jax.Array, buf):
    """Write buffer rows back to rows ``idx`` of every leaf; out-of-range rows dropped."""
    return jax.tree.map(lambda a, b: a.at[idx].set(b, mode="drop"), tree, buf)


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
