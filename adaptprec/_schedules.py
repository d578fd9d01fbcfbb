"""The built-in precision schedules (:class:`Fixed`, :class:`StallEscalation`,
:class:`NoiseFloor`, :class:`Hysteresis`, :func:`any_of`, :class:`Callback`), each a
pure ``init``/``update`` pair; the table of what each does is in
:mod:`adaptprec.schedule`, which re-exports them."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ._pytree import field
from ._rungs import is_rung_object, normalize_ladder
from ._schedule_state import (PrecisionSchedule, ScheduleState, require_number,
                              require_positive)

__all__ = ["Fixed", "StallEscalation", "NoiseFloor", "Hysteresis", "AnyOf", "any_of",
           "Callback"]


class Fixed(PrecisionSchedule):
    """Always the same rung (an index, or a dtype/alias on the ladder).

    Example:
        >>> from adaptprec.schedule import Fixed, ScheduleStats
        >>> s = Fixed(-1)
        >>> st = s.update(s.init("bf16,f32,f64"), ScheduleStats.make(1.0, guard_failures=3))
        >>> int(st.rung)
        2
    """

    rung: Any = field(static=True)

    def init(self, ladder) -> ScheduleState:
        _, lad = normalize_ladder(ladder)
        n = len(lad)
        if isinstance(self.rung, (int, np.integer)) and not isinstance(self.rung, bool):
            idx = int(self.rung)
            if not -n <= idx < n:
                raise ValueError(f"Fixed({self.rung}) is outside a ladder of {n} rungs")
            idx %= n
        else:
            idx = lad.index(self.rung.dtype if is_rung_object(self.rung) else self.rung)
        return ScheduleState.initial(ladder, rung=idx)

    def update(self, state, stats):
        return state


class _Patient(PrecisionSchedule):
    """A schedule that counts steps against its ``patience`` field (an int >= 1) and
    watches values that start at ``+inf``."""

    def __check_init__(self):
        require_positive("patience", self.patience)

    @staticmethod
    def _start(state_cls, ladder, *watched: str):
        inf = jnp.asarray(jnp.inf, jnp.result_type(float))
        return state_cls.initial(ladder, count=jnp.asarray(0, jnp.int32),
                                 **dict.fromkeys(watched, inf))

    def _climb(self, state, stats, count, **changes):
        """``state`` one rung up when a guard failed or ``count`` reached ``patience`` (the
        count restarts), else with the new ``count``; a callable in ``changes`` gets
        ``up``."""
        up = (stats.guard_failures > 0) | (count >= self.patience)
        changes = {k: v(up) if callable(v) else v for k, v in changes.items()}
        return state.move(state.rung + up.astype(jnp.int32),
                          count=jnp.where(up, 0, count).astype(jnp.int32), **changes)


class _StallState(ScheduleState):
    count: jax.Array
    best: jax.Array


class StallEscalation(_Patient):
    """Escalate when progress stalls for ``patience`` consecutive steps.

    A step stalls when ``stats.rel_decrease < rate``, when it was rejected
    (``stats.accepted`` false), or when ``stats.value`` is not at least ``rate`` (relative)
    below the best value seen on this rung — so an iteration that oscillates at the rung's
    rounding floor (alternately up and down by more than ``rate``) counts as stalled too.
    For a monotonically decreasing ``value`` the last two tests coincide. Any guard
    failure escalates at once. The stall counter and the best value reset after each
    escalation.

    Example:
        >>> from adaptprec.schedule import StallEscalation, ScheduleStats
        >>> s = StallEscalation(rate=1e-6, patience=3)
        >>> st = s.init("f32,f64")
        >>> for _ in range(3):
        ...     st = s.update(st, ScheduleStats.make(1.0, rel_decrease=0.0))
        >>> int(st.rung)
        1
        >>> st = s.init("f32,f64")               # oscillating: +-8% per step, no progress
        >>> for v in (1.0, 0.92, 1.0, 0.92, 1.0):
        ...     st = s.update(st, ScheduleStats.make(v, rel_decrease=(1.0 - v) or -0.08))
        >>> int(st.rung)
        1
    """

    rate: float = 1e-6
    patience: int = field(default=3, static=True)

    def __check_init__(self):
        super().__check_init__()
        require_number("rate", self.rate, positive=False)

    def init(self, ladder):
        return self._start(_StallState, ladder, "best")

    def update(self, state, stats):
        value = stats.value.astype(state.best.dtype)
        no_new_best = value > state.best - self.rate * jnp.abs(state.best)
        stalled = (~stats.accepted) | (stats.rel_decrease < self.rate) | no_new_best
        count = jnp.where(stalled, state.count + 1, 0)
        # fmin: a NaN value must not poison the best (the check would stay off)
        return self._climb(state, stats, count, best=lambda up: jnp.where(
            up, jnp.inf, jnp.fmin(state.best, value)))


class _NoiseState(ScheduleState):
    count: jax.Array
    previous: jax.Array


class NoiseFloor(_Patient):
    """Escalate when progress reaches the rounding noise of the current rung.

    For each *accepted* step, the decrease ``previous - value`` (``previous``: the value
    after the last accepted step) is compared with ``factor * u_rung * stats.scale``; when
    it is smaller for ``patience`` consecutive accepted steps (default 1), the rung goes
    up. Rejected steps neither count nor reset. Any guard failure escalates at once.

    Example:
        >>> from adaptprec.schedule import NoiseFloor, ScheduleStats
        >>> s = NoiseFloor(factor=4.0)
        >>> st = s.init("bf16,f32")          # u_bf16 = 2**-8: noise floor 4 * 2**-8
        >>> st = s.update(st, ScheduleStats.make(1.0))
        >>> st = s.update(st, ScheduleStats.make(0.9))   # decrease 0.1: real progress
        >>> int(st.rung)
        0
        >>> st = s.update(st, ScheduleStats.make(0.899))  # decrease 1e-3 < 1.6e-2
        >>> int(st.rung)
        1
    """

    factor: float = 10.0
    patience: int = field(default=1, static=True)

    def __check_init__(self):
        super().__check_init__()
        require_number("factor", self.factor, positive=True)

    def init(self, ladder):
        return self._start(_NoiseState, ladder, "previous")

    def update(self, state, stats):
        value = stats.value.astype(state.previous.dtype)
        decrease = state.previous - value
        noise = self.factor * state.u.astype(value.dtype) * stats.scale.astype(value.dtype)
        at_floor = stats.accepted & (decrease < noise)
        count = jnp.where(at_floor, state.count + 1,
                          jnp.where(stats.accepted, 0, state.count))
        return self._climb(state, stats, count, previous=jnp.where(
            stats.accepted & ~jnp.isnan(value), value, state.previous))


class _HysteresisState(ScheduleState):
    count: jax.Array
    at_rung: jax.Array


class Hysteresis(PrecisionSchedule):
    """Climb when a guard fires; step back down after ``down_after`` clean steps.

    Dynamic loss scaling, but over dtypes: a step with ``guard_failures > 0`` moves one
    rung up; ``down_after`` consecutive clean steps move one rung down (never below the
    bottom rung) and restart the count. The count also restarts whenever the rung changes
    for another reason (e.g. a sibling in :func:`any_of` escalated).

    Example:
        >>> from adaptprec.schedule import Hysteresis, ScheduleStats
        >>> s = Hysteresis(down_after=2)
        >>> st = s.update(s.init("bf16,f32"), ScheduleStats.make(1.0, guard_failures=1))
        >>> int(st.rung)
        1
        >>> for _ in range(2):
        ...     st = s.update(st, ScheduleStats.make(1.0))
        >>> int(st.rung), int(st.escalations)
        (0, 1)
    """

    down_after: int = field(default=10, static=True)

    def __check_init__(self):
        require_positive("down_after", self.down_after)

    def init(self, ladder):
        zero = jnp.asarray(0, jnp.int32)
        return _HysteresisState.initial(ladder, count=zero, at_rung=zero)

    def update(self, state, stats):
        fail = stats.guard_failures > 0
        # clean steps count from the last rung change (also one made by an any_of sibling)
        count = jnp.where(fail | (state.rung != state.at_rung), 0, state.count) + (~fail)
        down = count >= self.down_after
        new = state.rung + fail.astype(jnp.int32) - down.astype(jnp.int32)
        new = jnp.clip(new, 0, state.n_rungs - 1)
        return state.move(new, count=jnp.where(down, 0, count).astype(jnp.int32),
                          at_rung=new.astype(jnp.int32))


class _AnyOfState(ScheduleState):
    children: tuple[ScheduleState, ...]
    fresh: tuple[ScheduleState, ...]   # each child's initial state (restarts come from it)


class AnyOf(PrecisionSchedule):
    """Combination of schedules (build it with :func:`any_of`).

    Each child is updated at the common rung. If any child proposes a higher rung the
    highest proposal wins; otherwise the lowest proposal (so a :class:`Hysteresis` child
    can step down when no other child wants to climb).

    Example:
        >>> from adaptprec.schedule import AnyOf, Fixed, Hysteresis
        >>> s = AnyOf((Fixed(1), Hysteresis(down_after=5)))
        >>> int(s.init("bf16,f32,f64").rung)
        1
    """

    schedules: tuple[PrecisionSchedule, ...]

    def init(self, ladder):
        kids = tuple(s.init(ladder) for s in self.schedules)
        rung = jnp.max(jnp.stack([k.rung for k in kids]))
        kids = tuple(dataclasses.replace(k, rung=rung) for k in kids)
        return _AnyOfState.initial(ladder, rung=rung, children=kids, fresh=kids)

    def update(self, state, stats):
        kids = tuple(s.update(dataclasses.replace(k, rung=state.rung), stats)
                     for s, k in zip(self.schedules, state.children))
        props = jnp.stack([k.rung for k in kids])
        hi, lo = jnp.max(props), jnp.min(props)
        new = jnp.where(hi > state.rung, hi, lo)
        # a climb restarts the children that did not climb themselves, as each resets
        # its own counters when it climbs: every child starts the new rung afresh
        climbed = new > state.rung
        kids = tuple(
            jax.tree.map(lambda f, k_: jnp.where(climbed & ~(k.rung > state.rung), f, k_),
                         dataclasses.replace(f, rung=k.rung, escalations=k.escalations), k)
            for f, k in zip(state.fresh, kids))
        kids = tuple(dataclasses.replace(k, rung=new.astype(jnp.int32)) for k in kids)
        return state.move(new, children=kids)


def any_of(*schedules: PrecisionSchedule) -> AnyOf:
    """Combine schedules: climb when any of them climbs.

    Example:
        >>> from adaptprec.schedule import any_of, StallEscalation, Hysteresis, ScheduleStats
        >>> s = any_of(StallEscalation(rate=1e-3, patience=5), Hysteresis(down_after=100))
        >>> st = s.update(s.init("bf16,f32,f64"), ScheduleStats.make(1.0, guard_failures=1))
        >>> int(st.rung)
        1
    """
    if not schedules:
        raise ValueError("any_of needs at least one schedule")
    for s in schedules:
        if not isinstance(s, PrecisionSchedule):
            raise TypeError(f"any_of takes PrecisionSchedule instances, got {s!r}")
    return AnyOf(tuple(schedules))


class Callback(PrecisionSchedule):
    """Opt-in host-side observer: calls ``fn(stats, rung)`` after every step.

    ``fn`` runs on the host through ``jax.debug.callback`` with NumPy values (use it for
    logging and progress bars); it never changes the rung. Combine it with other schedules
    through :func:`any_of`.

    Example:
        >>> import jax
        >>> from adaptprec.schedule import Callback, ScheduleStats
        >>> seen = []
        >>> s = Callback(lambda stats, rung: seen.append((float(stats.value), int(rung))))
        >>> st = jax.jit(s.update)(s.init("f32,f64"), ScheduleStats.make(0.25))
        >>> jax.effects_barrier(); seen
        [(0.25, 0)]
    """

    fn: Callable = field(static=True)

    def init(self, ladder):
        return ScheduleState.initial(ladder)

    def update(self, state, stats):
        jax.debug.callback(self.fn, stats, state.rung)
        return state
