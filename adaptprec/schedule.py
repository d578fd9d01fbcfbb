"""Precision schedules: when an iterative method should climb (or descend) the ladder.

A :class:`PrecisionSchedule` is a pytree (a frozen dataclass, ``adaptprec._pytree.Module``) with pure, ``jit``-safe
``init(ladder) -> state`` and ``update(state, stats) -> state``. ``state.rung`` is the index
of the ladder rung the *next* step should run at and ``state.escalations`` counts how often
the rung went up. ``stats`` is a :class:`ScheduleStats` that the iterative method reports
after each step.

Built-ins:

==========================  ==============================================================
``Fixed(rung)``             never moves
``StallEscalation(rate,     escalate when the relative decrease stays below ``rate`` (or
patience)``                 the step is rejected) for ``patience`` consecutive steps
``NoiseFloor(factor)``      escalate when an accepted step's decrease
                            ``previous - value < factor * u_rung * scale``: progress has
                            reached the rounding noise of the current rung
``Hysteresis(down_after)``  escalate when a guard fires; step back down one rung after
                            ``down_after`` clean steps (dynamic loss scaling over dtypes)
``any_of(*schedules)``      combine: climb if any child climbs, else descend if one does
``Callback(fn)``            host-side observer ``fn(stats, rung)`` via
                            ``jax.debug.callback``; never moves
==========================  ==============================================================

Every schedule except ``Fixed`` and ``Callback`` also escalates at once when
``stats.guard_failures > 0``. Rungs never go above the top or below the bottom rung.

:func:`iterate` drives a user step function with a schedule inside one
``lax.while_loop``, dispatching each step to its rung with ``lax.switch`` (so only the
scheduled rung runs; under ``vmap`` with per-element rungs the switch becomes a select, as
for any batched ``lax.switch``).

Solvers that own their loop consult a schedule instead of running :func:`iterate`:
``solve_nlsq(schedule=...)`` calls ``init`` once and ``update`` after each accepted step or
non-finite evaluation, and climbs when the schedule's rung goes up (``Reason.SCHEDULE``);
docs/architecture.md ("One solve", step 5) gives the exact statistics it reports.

Example:
    >>> import jax.numpy as jnp
    >>> import adaptprec as ap
    >>> from adaptprec.schedule import ScheduleStats, StallEscalation
    >>> sched = StallEscalation(rate=1e-3, patience=2)
    >>> st = sched.init("bf16,f32")
    >>> for dec in (0.5, 1e-5, 1e-5):
    ...     st = sched.update(st, ScheduleStats.make(1.0, rel_decrease=dec))
    >>> int(st.rung), int(st.escalations)
    (1, 1)
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ._pytree import Module, field
from ._rungs import is_rung_object, normalize_ladder
from ._policy import cast_floating

__all__ = [
    "ScheduleStats",
    "ScheduleState",
    "PrecisionSchedule",
    "Fixed",
    "StallEscalation",
    "NoiseFloor",
    "Hysteresis",
    "AnyOf",
    "any_of",
    "Callback",
    "IterateResult",
    "iterate",
]


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
        # climbs at once on it (NaN compared False everywhere, so a NaN
        # step never counted as a stall)
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


def _require_number(name: str, value, *, positive: bool) -> None:
    """A finite real ``value`` (> 0, or >= 0), checked when concrete (
    ``rate="x"`` failed later inside ``iterate``, ``NoiseFloor(factor=-1)`` never fired)."""
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


def _require_positive(name: str, value) -> None:
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


class _CountState(ScheduleState):
    count: jax.Array


class _Patient(PrecisionSchedule):
    """A schedule that counts steps against its ``patience`` field (an int >= 1) and
    watches values that start at ``+inf``."""

    def __check_init__(self):
        _require_positive("patience", self.patience)

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
        _require_number("rate", self.rate, positive=False)

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
        _require_number("factor", self.factor, positive=True)

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
        _require_positive("down_after", self.down_after)

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
        # its own counters when it climbs (StallEscalation kept its
        # stall count and best value, and the new rung got one step before the next climb)
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


# --------------------------------------------------------------------------------------
# iterate


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
