"""The precision schedule inside the step: ``advance`` consults it (docs/architecture.md,
"One solve", step 5) with the step's statistics, moves its rung when the solver climbs
for another reason, and runs the default schedule when none is given.

Example:
    >>> from adaptprec.nlsq._step_schedule import default_schedule
    >>> default_schedule() is default_schedule()
    True
"""

from __future__ import annotations

import dataclasses
import functools

import jax.numpy as jnp

from ..schedule import NoiseFloor, ScheduleStats, StallEscalation, any_of

__all__ = ["default_schedule", "consult_schedule", "schedule_observes", "set_schedule_rung"]


def schedule_observes(schedule) -> bool:
    """Whether ``schedule`` has a host-side observer (:class:`~adaptprec.schedule.Callback`,
    possibly inside :func:`~adaptprec.schedule.any_of`)."""
    from ..schedule import AnyOf, Callback
    if isinstance(schedule, Callback):
        return True
    if callable(getattr(type(schedule), "_get", None)):   # FitTrace: a schedule duck type
        return schedule_observes(schedule._get())
    return isinstance(schedule, AnyOf) and any(schedule_observes(s) for s in schedule.schedules)


def consult_schedule(schedule, st, cost_t, actual, accepted, bad):
    """``schedule.update`` with the step's statistics: ``(new state, wants a higher
    rung)``."""
    value = jnp.where(accepted, cost_t, st.cost)
    rel = jnp.where(accepted, actual, 0.0) / jnp.maximum(jnp.abs(st.cost),
                                                         jnp.finfo(st.cost.dtype).tiny)
    stats = ScheduleStats.make(value, step=st.nit, rel_decrease=rel, accepted=accepted,
                               guard_failures=bad.astype(jnp.int32),
                               scale=jnp.maximum(jnp.abs(st.cost),
                                                 jnp.finfo(st.cost.dtype).tiny))
    new = schedule.update(st.sched, stats)
    return new, new.rung > st.rung


def set_schedule_rung(sched, rung):
    """``sched`` moved to ``rung`` (the solver climbed for another reason)."""
    if sched is None:
        return None
    return dataclasses.replace(sched, rung=jnp.asarray(rung, sched.rung.dtype))


@functools.cache
def default_schedule():
    """``any_of(NoiseFloor(10), StallEscalation(1e-6, 3))``: climb when accepted steps
    decrease the cost by less than ``10 u cost`` or progress stalls for 3 steps. One
    shared instance, so it is one entry of the compiled-solver cache key."""
    return any_of(NoiseFloor(factor=10.0), StallEscalation(rate=1e-6, patience=3))
