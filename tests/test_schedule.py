"""Precision schedules vs pure-Python reference models, and iterate() on real iterations."""

import collections
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import adaptprec as ap
from adaptprec.schedule import (
    Callback,
    Fixed,
    Hysteresis,
    NoiseFloor,
    ScheduleStats,
    StallEscalation,
    any_of,
    iterate,
)

LADDER = "bf16,f32,f64"
U = [2.0 ** -8, 2.0 ** -24, 2.0 ** -53]
TOP = 2

steps_strategy = st.lists(
    st.tuples(st.sampled_from([1.0, 0.3, 1e-3, 1e-7, 0.0, -0.1]),   # rel_decrease/decrease
              st.booleans(),                                        # accepted
              st.sampled_from([0, 0, 0, 0, 1])),                    # guard failures
    min_size=10, max_size=10)          # one length: one compilation per schedule


def _run(schedule, steps, values=None):
    """Feed a list of (rel_decrease, accepted, failures) through a jitted scan."""
    rungs, esc = _go_jit(schedule, jnp.array([s[0] for s in steps]),
                         jnp.array([s[1] for s in steps]),
                         jnp.array([s[2] for s in steps], jnp.int32),
                         jnp.ones(len(steps)) if values is None else jnp.asarray(values, float))
    return [int(r) for r in rungs], [int(e) for e in esc]


@functools.partial(jax.jit, static_argnums=0)
def _go_jit(schedule, rel, acc, fail, vals):
    def body(state, xs):
        r, a, f, v = xs
        state = schedule.update(state, ScheduleStats.make(v, rel_decrease=r, accepted=a,
                                                          guard_failures=f))
        return state, (state.rung, state.escalations)
    return jax.lax.scan(body, schedule.init(LADDER), (rel, acc, fail, vals))[1]


def _ref_stall(steps, values, rate, patience):
    rung, esc, count, best, out = 0, 0, 0, np.inf, []
    for (rel, acc, fail), v in zip(steps, values):
        no_new_best = v > best - rate * abs(best)
        count = count + 1 if (not acc or rel < rate or no_new_best) else 0
        best = min(best, v)
        if fail or count >= patience:
            count, best = 0, np.inf
            if rung < TOP:
                rung, esc = rung + 1, esc + 1
        out.append((rung, esc))
    return out


def _ref_hyst(steps, down_after):
    rung, esc, count, out = 0, 0, 0, []
    for _, _, fail in steps:
        count = 0 if fail else count + 1
        new = rung + (1 if fail else 0)
        if count >= down_after:
            new -= 1
            count = 0
        new = min(max(new, 0), TOP)
        esc += new > rung
        rung = new
        out.append((rung, esc))
    return out


@pytest.mark.slow
@settings(max_examples=25, deadline=None)
@given(steps_strategy, st.lists(st.sampled_from([1.0, 0.5, 0.9999, 2.0, 0.25]), min_size=10,
                                max_size=10))
def test_stall_escalation_matches_reference(steps, values):
    values = values[:len(steps)]
    rungs, esc = _run(StallEscalation(rate=1e-3, patience=2), steps, values)
    assert list(zip(rungs, esc)) == _ref_stall(steps, values, 1e-3, 2)


@pytest.mark.slow
@settings(max_examples=25, deadline=None)
@given(steps_strategy)
def test_hysteresis_matches_reference(steps):
    rungs, esc = _run(Hysteresis(down_after=3), steps)
    assert list(zip(rungs, esc)) == _ref_hyst(steps, 3)


def test_noise_floor_uses_rung_unit_roundoff():
    # values decrease by 1e-3 per step: above the bf16 floor? 10 * 2^-8 = 0.039 -> no,
    # so the first measured step escalates to f32, where 10 * 2^-24 = 6e-7 < 1e-3 (stays).
    values = [1.0 - 1e-3 * k for k in range(6)]
    steps = [(0.0, True, 0)] * 6
    rungs, esc = _run(NoiseFloor(factor=10.0), steps, values)
    assert rungs == [0, 1, 1, 1, 1, 1] and esc[-1] == 1
    # rejected steps neither count nor move `previous`
    steps = [(0.0, True, 0), (0.0, False, 0), (0.0, False, 0), (0.0, True, 0)]
    rungs, _ = _run(NoiseFloor(factor=1.0), steps, [1.0, 1.0, 1.0, 0.5])
    assert rungs == [0, 0, 0, 0]
    # the scale multiplies the floor: decrease 1e-3 vs 10 * 2^-24 * 1e5 = 0.06 -> climbs
    s = NoiseFloor(factor=10.0)
    st_ = s.update(s.init("f32,f64"), ScheduleStats.make(1.0, scale=1e5))
    st_ = s.update(st_, ScheduleStats.make(1.0 - 1e-3, scale=1e5))
    assert int(st_.rung) == 1


def test_fixed_and_any_of():
    assert _run(Fixed("f32"), [(0.0, False, 1)] * 3)[0] == [1, 1, 1]
    with pytest.raises(ValueError, match="outside"):
        Fixed(5).init(LADDER)
    with pytest.raises(ValueError, match="not a rung"):
        Fixed("f16").init(LADDER)
    # any_of: stall climbs, hysteresis steps back down after clean steps
    sched = any_of(StallEscalation(rate=1e-3, patience=1), Hysteresis(down_after=2))
    steps = [(0.0, True, 0), (1.0, True, 0), (1.0, True, 0), (1.0, True, 0), (1.0, True, 0)]
    rungs, esc = _run(sched, steps, [1.0, 0.5, 0.25, 0.125, 0.0625])
    assert rungs == [1, 1, 0, 0, 0] and esc[-1] == 1
    with pytest.raises(TypeError, match="PrecisionSchedule"):
        any_of("stall")


def test_stats_make():
    s = ScheduleStats.make(jnp.float32(0.5), previous=2.0)
    assert s.value.dtype == jnp.float32 and s.rel_decrease.dtype == jnp.float32
    assert float(s.rel_decrease) == 0.75
    s = ScheduleStats.make(jnp.bfloat16(1.0))
    assert s.value.dtype == jnp.float32 and np.isinf(float(s.rel_decrease))
    with pytest.raises(ValueError, match="patience"):
        StallEscalation(patience=0)


# ---- iterate ------------------------------------------------------------------------

_rng = np.random.default_rng(0)
_Q, _ = np.linalg.qr(_rng.standard_normal((6, 6)))
A_NP = _Q @ np.diag(np.linspace(0.6, 1.4, 6)) @ _Q.T          # SPD, Richardson converges
B_NP = _rng.standard_normal(6)
X_REF = np.linalg.solve(A_NP, B_NP)
A, B = jnp.asarray(A_NP), jnp.asarray(B_NP)
_calls = collections.Counter()


def _count(dtype_name):
    _calls[dtype_name] += 1


def richardson(x, dtype):
    a, b = A.astype(dtype), B.astype(dtype)
    r0 = jnp.linalg.norm((b - a @ x).astype(jnp.float32))
    x = x + 0.9 * (b - a @ x)
    r = jnp.linalg.norm((b - a @ x).astype(jnp.float32))
    jax.debug.callback(_count, np.dtype(dtype).name)
    return x, ScheduleStats.make(r, previous=r0)


@jax.jit
def _iterate_stall(x0):
    return iterate(richardson, x0, StallEscalation(rate=0.05, patience=3), LADDER,
                   max_steps=150)


def test_iterate_escalates_and_reaches_f64_accuracy():
    _calls.clear()
    res = _iterate_stall(jnp.zeros(6))
    jax.effects_barrier()
    x = np.asarray(res.state)
    assert x.dtype == np.float64
    np.testing.assert_allclose(x, X_REF, rtol=0, atol=1e-13)
    assert int(res.schedule_state.rung) == 2 and int(res.schedule_state.escalations) == 2
    trace = np.asarray(res.rung_trace)[: int(res.steps)]
    assert np.all(np.diff(trace) >= 0) and set(trace) == {0, 1, 2}
    # lax.switch runs only the scheduled rung: each rung's body ran once per step on it
    assert _calls == {"bfloat16": int((trace == 0).sum()), "float32": int((trace == 1).sum()),
                      "float64": int((trace == 2).sum())}


def test_iterate_fixed_bf16_stalls_at_bf16_accuracy():
    res = jax.jit(lambda x: iterate(richardson, x, Fixed(0), LADDER, 60))(jnp.zeros(6))
    err = np.max(np.abs(np.asarray(res.state) - X_REF)) / np.max(np.abs(X_REF))
    assert 1e-4 < err < 0.1      # stuck at bf16 rounding (u = 4e-3), not converged
    assert int(res.steps) == 60


def test_iterate_done_fn_and_callback():
    seen = []
    sched = any_of(Fixed("f64"), Callback(lambda s, r: seen.append((int(s.step), int(r)))))

    @jax.jit
    def run(x0):
        return iterate(richardson, x0, sched, LADDER, max_steps=500,
                       done_fn=lambda x: jnp.linalg.norm(B - A @ x) < 1e-8)

    res = run(jnp.zeros(6))
    jax.effects_barrier()
    n = int(res.steps)
    assert 5 < n < 500
    assert np.linalg.norm(B_NP - A_NP @ np.asarray(res.state)) < 1e-8
    assert sorted(seen) == [(k, 2) for k in range(n)]


def test_iterate_vmap_matches_loop():
    bs = jnp.stack([jnp.zeros(6), jnp.ones(6)])
    batched = jax.vmap(lambda x: _iterate_stall(x).state)(bs)
    np.testing.assert_allclose(np.asarray(batched[0]), np.asarray(_iterate_stall(bs[0]).state),
                               rtol=0, atol=1e-14)
    np.testing.assert_allclose(np.asarray(batched[1]), X_REF, atol=1e-13)


def test_iterate_with_rung_object():
    wrapped = []

    class Tagged:
        dtype = np.dtype(np.float32)

        def wrap(self, fn):
            wrapped.append(fn)
            return fn

    res = iterate(richardson, jnp.zeros(6), Fixed(0), [Tagged(), "f64"], max_steps=40)
    assert wrapped == [richardson]
    np.testing.assert_allclose(np.asarray(res.state), X_REF, atol=1e-5)


def test_iterate_bad_input():
    with pytest.raises(TypeError, match="ScheduleStats"):
        iterate(lambda x, d: x, jnp.zeros(2), Fixed(0), LADDER, 3)
    with pytest.raises(TypeError, match="same pytree structure"):
        iterate(lambda x, d: ((x, x), ScheduleStats.make(1.0)), jnp.zeros(2), Fixed(0),
                LADDER, 3)
    with pytest.raises(ValueError, match="max_steps"):
        iterate(richardson, jnp.zeros(6), Fixed(0), LADDER, 2.5)
    with pytest.raises(TypeError, match="PrecisionSchedule"):
        iterate(richardson, jnp.zeros(6), "stall", LADDER, 3)
    with pytest.raises(ValueError, match="strictly increasing"):
        iterate(richardson, jnp.zeros(6), Fixed(0), "f64,f32", 3)


@pytest.mark.parametrize("make", [lambda: StallEscalation(rate=1e-3, patience=3),
                                  lambda: NoiseFloor(factor=4.0)])
def test_a_nan_value_climbs_at_once_and_does_not_poison_the_state(make):
    # newcomer audit 3: every comparison with NaN is False, so a NaN objective never
    # counted as a stall, and a NaN best/previous switched the test off for good
    s = make()
    st = s.init("bf16,f32,f64")
    st = s.update(st, ScheduleStats.make(1.0))
    st = s.update(st, ScheduleStats.make(jnp.nan))
    assert int(st.rung) == 1
    for v in (0.5, 0.5, 0.5, 0.5):   # then no progress on f32: it still climbs
        st = s.update(st, ScheduleStats.make(v))
    assert int(st.rung) == 2


def test_schedule_parameters_are_validated():
    # newcomer audit 3: rate="x" failed later inside iterate; NoiseFloor(factor=-1) never fired
    for make in (lambda: StallEscalation(rate="x"), lambda: StallEscalation(rate=-1.0),
                 lambda: NoiseFloor(factor=-1.0), lambda: NoiseFloor(factor=float("nan"))):
        with pytest.raises(ValueError, match="must be a finite number"):
            make()
    # still a pytree whose leaves may be traced
    s = jax.jit(lambda r: StallEscalation(rate=r).rate)(1e-3)
    assert float(s) == pytest.approx(1e-3)


def test_any_of_restarts_the_children_that_did_not_climb():
    # newcomer audit 7: after NoiseFloor climbed, StallEscalation kept its stall count
    # (its docstring: it resets after each escalation), so the new rung got one step
    from adaptprec.schedule import NoiseFloor, ScheduleStats, StallEscalation, any_of

    s = any_of(NoiseFloor(factor=1.0), StallEscalation(rate=0.1, patience=3))
    st, prev, rungs = s.init("bf16,f32,f64"), None, []
    for v in (1.0, 0.95, 0.9495, 0.94):
        st = s.update(st, ScheduleStats.make(v, previous=prev))
        prev = v
        rungs.append(int(st.rung))
    assert rungs == [0, 0, 1, 1], rungs
    assert int(st.children[1].count) <= 1 and int(st.escalations) == 1
