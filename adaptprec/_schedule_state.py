"""What every precision schedule shares: the statistics a step reports
(:class:`ScheduleStats`), the state a schedule carries (:class:`ScheduleState`: the rung
index and the escalation count) and the interface (:class:`PrecisionSchedule`). The
public names are re-exported by :mod:`adaptprec.schedule`."""

from __future__ import annotations

import abc
import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ._pytree import Module, field
from ._rungs import normalize_ladder

__all__ = ["ScheduleStats", "ScheduleState", "PrecisionSchedule", "require_number",
           "require_positive"]


def _stats_dtype(value) -> np.dtype:
    return np.dtype(jnp.promote_types(jnp.result_type(value), jnp.float32))


class ScheduleStats(NamedTuple):
    """What an iterative method reports after each step (all JAX scalars).

    Build it with :meth:`make`, which converts and fills defaults.

    Attributes:
        step: step number.
        value: objective or residual norm after this step.
        rel_decrease: ``(previous - value) / max(|previous|, tiny)``.
        accepted: whether the step was accepted (trust-region methods).
        guard_failures: number of guards that fired this step (NaN/Inf, conditioning...).
        scale: typical magnitude of ``value`` for :class:`NoiseFloor` (default 1).

    Example:
        >>> from adaptprec.schedule import ScheduleStats
        >>> s = ScheduleStats.make(0.5, previous=2.0)
        >>> float(s.rel_decrease), bool(s.accepted), int(s.guard_failures)
        (0.75, True, 0)
    """

    step: jax.Array
    value: jax.Array
    rel_decrease: jax.Array
    accepted: jax.Array
    guard_failures: jax.Array
    scale: jax.Array

    @classmethod
    def make(cls, value, *, step=0, previous=None, rel_decrease=None, accepted=True,
             guard_failures=0, scale=1.0) -> ScheduleStats:
        """Build stats; ``rel_decrease`` is computed from ``previous`` if not given.

        Floating fields share one dtype: ``value``'s, promoted to at least float32.
        With neither ``previous`` nor ``rel_decrease``, ``rel_decrease`` is ``inf``
        (an unknown decrease never counts as a stall).
        """
        dtype = _stats_dtype(value)
        value = jnp.asarray(value, dtype)
        if rel_decrease is None:
            if previous is None:
                rel_decrease = jnp.asarray(jnp.inf, dtype)
            else:
                previous = jnp.asarray(previous, dtype)
                tiny = jnp.finfo(dtype).tiny
                rel_decrease = (previous - value) / jnp.maximum(jnp.abs(previous), tiny)
        # a NaN/Inf objective is a failed check: every schedule but Fixed and Callback
        # climbs at once on it (a NaN compares False, so no stall test would see it)
        nonfinite = jnp.sum(~jnp.isfinite(value), dtype=jnp.int32)
        return cls(
            step=jnp.asarray(step, jnp.int32),
            value=value,
            rel_decrease=jnp.asarray(rel_decrease, dtype),
            accepted=jnp.asarray(accepted, bool),
            guard_failures=jnp.asarray(guard_failures, jnp.int32) + nonfinite,
            scale=jnp.asarray(scale, dtype),
        )

    def astype(self, dtype) -> ScheduleStats:
        """The same stats with floating fields cast to ``dtype``."""
        return self._replace(value=jnp.asarray(self.value, dtype),
                             rel_decrease=jnp.asarray(self.rel_decrease, dtype),
                             scale=jnp.asarray(self.scale, dtype))


class ScheduleState(Module):
    """State every schedule carries: the current ``rung`` index and ``escalations``.

    ``unit_roundoffs`` (static) holds the ladder's unit roundoffs, so ``update`` knows the
    ladder without being passed it. Schedules subclass this to add their own fields.

    Example:
        >>> from adaptprec.schedule import Fixed
        >>> st = Fixed("f32").init("bf16,f32")
        >>> int(st.rung), int(st.escalations), st.n_rungs
        (1, 0, 2)
    """

    rung: jax.Array
    escalations: jax.Array
    unit_roundoffs: tuple[float, ...] = field(static=True)

    @property
    def n_rungs(self) -> int:
        """Number of rungs on the ladder."""
        return len(self.unit_roundoffs)

    @property
    def u(self) -> jax.Array:
        """Unit roundoff of the current rung."""
        return jnp.asarray(self.unit_roundoffs)[self.rung]

    @classmethod
    def initial(cls, ladder, rung: int = 0, **fields):
        """A fresh state on ``ladder`` at ``rung`` with no escalations (plus ``fields``)."""
        _, lad = normalize_ladder(ladder)
        return cls(rung=jnp.asarray(rung, jnp.int32), escalations=jnp.asarray(0, jnp.int32),
                   unit_roundoffs=lad.unit_roundoffs, **fields)

    def move(self, new_rung, **changes):
        """This state moved to ``new_rung`` (clipped to the ladder), counting escalations,
        with other fields replaced by ``changes``."""
        new_rung = jnp.clip(jnp.asarray(new_rung, jnp.int32), 0, self.n_rungs - 1)
        escalations = self.escalations + (new_rung > self.rung).astype(jnp.int32)
        return dataclasses.replace(self, rung=new_rung, escalations=escalations, **changes)


def require_number(name: str, value, *, positive: bool) -> None:
    """A finite real ``value`` (> 0, or >= 0), checked when concrete: a schedule's tuned
    number is validated when the schedule is built, not when ``iterate`` traces it."""
    from ._tracing import is_traced
    if is_traced(value):
        return
    try:
        v = float(value)
    except (TypeError, ValueError):
        v = float("nan")
    if isinstance(value, bool) or not np.isfinite(v) or (v <= 0 if positive else v < 0):
        raise ValueError(f"{name} must be a finite number {'> 0' if positive else '>= 0'}, "
                         f"got {value!r}")


def require_positive(name: str, value) -> None:
    """An int ``value >= 1`` (a count: ``patience``, ``down_after``)."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}")


class PrecisionSchedule(Module):
    """Abstract precision schedule: ``init(ladder) -> state``, ``update(state, stats)``.

    Subclass it with a state class derived from :class:`ScheduleState`. Both methods must
    be pure and ``jit``-safe (no Python branches on traced values).

    Example:
        >>> import jax.numpy as jnp
        >>> from adaptprec.schedule import PrecisionSchedule, ScheduleState
        >>> class EveryStep(PrecisionSchedule):
        ...     def init(self, ladder):
        ...         return ScheduleState.initial(ladder)
        ...     def update(self, state, stats):
        ...         return state.move(state.rung + 1)
        >>> s = EveryStep()
        >>> int(s.update(s.init("bf16,f32,f64"), None).rung)
        1
    """

    @abc.abstractmethod
    def init(self, ladder) -> ScheduleState:
        """Initial state for ``ladder`` (a string, ``Ladder`` or sequence of rungs)."""

    @abc.abstractmethod
    def update(self, state: ScheduleState, stats: ScheduleStats) -> ScheduleState:
        """The state after one step that reported ``stats``."""
