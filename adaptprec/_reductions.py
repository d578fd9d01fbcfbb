"""Reductions for checks: on materialized operands, and with NaN counted.

XLA:CPU fuses an elementwise producer into a reduction and then runs it ~10x slower
than the producer as a loop plus a separate reduction, and its vectorized max drops NaN
on large arrays: the checks reduce through these helpers.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax import lax

__all__ = ["materialized", "nan_to_inf", "nan_max_abs", "count_where"]


def materialized(reduce: Callable, *xs):
    """``reduce(*xs)`` on materialized operands.

    XLA:CPU fuses the elementwise producer of a reduction into the reduction and then
    runs it ~10x slower than the same producer as a loop plus a separate reduction (a
    max over an 80-op error chain on 2^20 entries: 15 ms against 1.6 + 0.4 ms). The
    operands of a ``cond`` must be materialized, so the reduction runs in one whose
    predicate XLA cannot fold (a barrier on ``True``; unbatched, so under ``vmap`` it
    stays a ``cond``) and whose branches are the same function.
    """
    pred = lax.optimization_barrier(jnp.asarray(True))
    return lax.cond(pred, reduce, reduce, *xs)


def nan_to_inf(x):
    """NaN entries as ``inf``, applied before a max that must see them: XLA:CPU's
    vectorized max drops NaN on arrays of 4096 entries or more, so a max of an
    error array would pass a NaN error there while failing it on a small array."""
    return jnp.where(jnp.isnan(x), jnp.inf, x)


def nan_max_abs(x, axis=None):
    """``max |x|`` (over ``axis``) in which a NaN entry counts as ``inf``: the inf-norm
    for a finite, headroom or backward-error test that a NaN must fail.

    A plain ``jnp.max`` under jit on XLA:CPU (JAX 0.10.2) drops NaN once the reduced
    operand has 4096 entries or more (whatever the axis; an all-NaN operand gives
    ``-inf``), and returns NaN below that. Known upstream as XLA:CPU max/min NaN
    semantics: openxla/xla#21461 (reduce max of a NaN parameter returns the finite
    value) and tensorflow/tensorflow#116992 (CPU XLA drops NaN in reduce_max).
    """
    return jnp.max(jnp.where(jnp.isnan(x), jnp.inf, jnp.abs(x)), axis=axis)


def count_where(flags: Callable, *xs) -> jax.Array:
    """How many entries ``flags(*xs)`` sets (float32), as a materialized float sum
    (boolean reductions are slow on XLA:CPU). ``None`` operands pass through."""
    idx = [i for i, x in enumerate(xs) if x is not None]

    def run(*vals):
        full = list(xs)
        for i, v in zip(idx, vals):
            full[i] = v
        return jnp.sum(jnp.where(flags(*full), 1.0, 0.0).astype(jnp.float32))

    return materialized(run, *[xs[i] for i in idx])
