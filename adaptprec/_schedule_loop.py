"""The :func:`iterate` driver: a user's step function under a precision schedule, one
``lax.while_loop`` with a ``lax.switch`` over the rungs (re-exported by
:mod:`adaptprec.schedule`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ._policy import cast_floating
from ._rungs import is_rung_object, normalize_ladder
from ._schedule_state import PrecisionSchedule, ScheduleState, ScheduleStats

__all__ = ["IterateResult", "iterate"]


class IterateResult(NamedTuple):
    """What :func:`iterate` returns.

    Attributes:
        state: the user state after the last step.
        schedule_state: the schedule's final state (``.rung``, ``.escalations``).
        steps: number of steps taken.
        stats: the last step's :class:`ScheduleStats`.
        rung_trace: rung index each step ran at, ``-1`` after the last step
            (shape ``(max_steps,)``).

    Example:
        >>> import jax.numpy as jnp
        >>> from adaptprec.schedule import Fixed, ScheduleStats, iterate
        >>> halve = lambda x, dtype: (x / 2, ScheduleStats.make(jnp.abs(x / 2)))
        >>> res = iterate(halve, jnp.array(8.0), Fixed("f32"), "bf16,f32", max_steps=3)
        >>> float(res.state), int(res.steps), res.rung_trace.tolist()
        (1.0, 3, [1, 1, 1])
    """

    state: Any
    schedule_state: ScheduleState
    steps: jax.Array
    stats: ScheduleStats
    rung_trace: jax.Array


def _cast_like(new, old):
    def cast(n, o):
        n = jnp.asarray(n)
        o_dtype = jnp.result_type(o)
        return n.astype(o_dtype) if n.dtype != o_dtype else n

    return jax.tree_util.tree_map(cast, new, old)


def iterate(step_fn: Callable, state: Any, schedule: PrecisionSchedule, ladder,
            max_steps: int, done_fn: Callable | None = None, *,
            cast_state: bool = True) -> IterateResult:
    """Run ``step_fn`` under a precision schedule in one ``lax.while_loop``.

    ``step_fn(state, dtype) -> (state, ScheduleStats)`` performs one step at the rung
    dtype ``dtype`` (a NumPy dtype, static). With ``cast_state`` (default) the floating
    leaves of ``state`` are cast to ``dtype`` before the step and the returned state is
    cast back to the carried dtypes (those of the initial ``state``), so keep the initial
    state in the widest precision you want to accumulate in. Rungs that are ``Rung``
    objects run ``rung.wrap(step_fn)``. Each step dispatches with ``lax.switch`` on
    ``schedule_state.rung``, so only the scheduled rung executes; the schedule is updated
    with the step's stats (``stats.step`` is set to the loop counter). The loop stops
    after ``max_steps`` steps or when ``done_fn(state)`` is true.

    Works under ``jit``; ``max_steps`` must be a Python int.

    Example (Richardson iteration ``x <- x + (b - A x)``, escalating on stalls):
        >>> import jax.numpy as jnp
        >>> import adaptprec as ap
        >>> from adaptprec.schedule import ScheduleStats, StallEscalation, iterate
        >>> A = jnp.array([[1.0, 0.1], [0.1, 1.0]]); b = jnp.array([1.0, 2.0])
        >>> def step(x, dtype):
        ...     r0 = jnp.linalg.norm(b.astype(dtype) - A.astype(dtype) @ x)
        ...     x = x + (b.astype(dtype) - A.astype(dtype) @ x)
        ...     r = jnp.linalg.norm(b.astype(dtype) - A.astype(dtype) @ x)
        ...     return x, ScheduleStats.make(r, previous=r0)
        >>> res = iterate(step, jnp.zeros(2), StallEscalation(rate=0.5, patience=2),
        ...               "bf16,f32,f64", max_steps=60)
        >>> int(res.schedule_state.rung)  # ran out of progress on bf16 and f32
        2
        >>> bool(jnp.allclose(A @ res.state, b, rtol=0, atol=1e-12))  # needs x64
        True
    """
    rungs, lad = normalize_ladder(ladder)
    if isinstance(max_steps, bool) or not isinstance(max_steps, (int, np.integer)) \
            or max_steps < 0:
        raise ValueError(f"max_steps must be a non-negative Python int, got {max_steps!r}")
    if not isinstance(schedule, PrecisionSchedule):
        raise TypeError(f"schedule must be a PrecisionSchedule (e.g. StallEscalation(...)), "
                        f"got {schedule!r}")
    max_steps = int(max_steps)
    stat_dtype = np.dtype(jnp.promote_types(lad.top, jnp.float32))

    def make_branch(rung, dtype):
        call = rung.wrap(step_fn) if is_rung_object(rung) else step_fn

        def branch(st):
            x = cast_floating(st, dtype) if cast_state else st
            out = call(x, dtype)
            if not (isinstance(out, tuple) and len(out) == 2
                    and isinstance(out[1], ScheduleStats)):
                raise TypeError(
                    "step_fn(state, dtype) must return (new_state, ScheduleStats); got "
                    f"{type(out).__name__}. Build the stats with ScheduleStats.make(value, "
                    "previous=...)")
            new, stats = out
            if jax.tree_util.tree_structure(new) != jax.tree_util.tree_structure(st):
                raise TypeError(
                    "step_fn must return a state with the same pytree structure as the "
                    f"initial state: got {jax.tree_util.tree_structure(new)}, expected "
                    f"{jax.tree_util.tree_structure(st)}")
            return _cast_like(new, st), stats.astype(stat_dtype)

        return branch

    # Tracing the branches for lax.switch checks step_fn's outputs (TypeError above).
    branches = [make_branch(r, d) for r, d in zip(rungs, lad)]
    sched0 = schedule.init(rungs)

    def done(st):
        if done_fn is None:
            return jnp.asarray(False)
        d = jnp.asarray(done_fn(st))
        if d.shape != () or d.dtype != bool:
            raise TypeError(f"done_fn must return a scalar bool, got {d.dtype}{d.shape}")
        return d

    stats0 = ScheduleStats.make(jnp.asarray(jnp.inf, stat_dtype))
    trace0 = jnp.full((max_steps,), -1, jnp.int32)

    def cond(carry):
        k, _, _, _, _, is_done = carry
        return (k < max_steps) & (~is_done)

    def body(carry):
        k, st, sched, _, trace, _ = carry
        st, stats = lax.switch(sched.rung, branches, st)
        stats = stats._replace(step=k)
        trace = trace.at[k].set(sched.rung)
        sched = schedule.update(sched, stats)
        return k + 1, st, sched, stats, trace, done(st)

    carry0 = (jnp.asarray(0, jnp.int32), state, sched0, stats0, trace0, done(state))
    k, st, sched, stats, trace, _ = lax.while_loop(cond, body, carry0)
    return IterateResult(st, sched, k, stats, trace)
