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

The statistics, the state and the interface live in ``_schedule_state.py``, the built-in
schedules in ``_schedules.py``, :func:`iterate` in ``_schedule_loop.py``; this module is
the public namespace.

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

from ._schedule_loop import IterateResult, iterate
from ._schedule_state import PrecisionSchedule, ScheduleState, ScheduleStats
from ._schedules import (AnyOf, Callback, Fixed, Hysteresis, NoiseFloor, StallEscalation,
                         any_of)

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
