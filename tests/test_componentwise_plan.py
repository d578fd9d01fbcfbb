"""A componentwise rtol: the a-priori chance that a lower rung fails (some output entry
near a zero) prices the rung, and a kernel's eager calls still learn it."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import adaptprec as ap
from adaptprec import _outcomes, _plan


def trapezoid(p, steps=2000):
    """The integral of cos(p x) over [0, 1] (= sin(p) / p) by the trapezoid rule."""
    h = 1.0 / steps

    def body(i, acc):
        x = i * h
        return acc + 0.5 * h * (jnp.cos(p * x) + jnp.cos(p * (x + h)))

    return jax.lax.fori_loop(0, steps, body, jnp.zeros_like(p))


#: p in [0.1, 1]: integrals bounded away from 0 (float32 meets rtol 1e-3 per entry)
AWAY = jnp.linspace(0.1, 1.0, 256)
#: p in [0.1, 10] with one entry at pi + 1e-4, whose integral is ~3e-5: float32 fails
NEAR = np.linspace(0.1, 10.0, 256)
NEAR[np.argmin(np.abs(NEAR - np.pi))] = np.pi + 1e-4
NEAR = jnp.asarray(NEAR)


def test_componentwise_chance_grows_with_entries_and_accumulation():
    u = 2.0 ** -24
    small = _plan.componentwise_fail_chance(16, u, 1, 1e-3)
    assert small == pytest.approx(1 - np.exp(-16 * u / 1e-3)) and small < 1e-3
    assert _plan.componentwise_fail_chance(2 ** 16, u, 1, 1e-3) > 0.95
    assert (_plan.componentwise_fail_chance(256, u, 20_000, 1e-3)
            > _plan.componentwise_fail_chance(256, u, 1, 1e-3))


def test_a_componentwise_plan_prices_f32_out_where_normwise_tries_it():
    options = {"cw": dict(componentwise=True), "nw": {},
               "atol": dict(componentwise=True, atol=1e-6)}
    reps = {k: jax.jit(ap.adaptive(trapezoid, ladder="f32,f64", rtol=1e-3,
                                   **kw).with_report)(NEAR)[1] for k, kw in options.items()}
    # under jit, before any eager call: no attempt wasted on the entry near 0
    assert reps["cw"].checks[0] == "skipped", reps["cw"].plan
    assert "a priori: componentwise, 256 entries" in reps["cw"].plan[0]
    assert reps["cw"].rung_name == "f64" and bool(reps["cw"].ok)
    assert int(reps["cw"].escalations) == 0
    # normwise, or with an absolute floor (which spares the entries near 0): f32 tried
    assert reps["nw"].checks[0] != "skipped" and reps["nw"].rung_name == "f32"
    assert reps["atol"].checks[0] != "skipped", reps["atol"].plan


@pytest.mark.slow
def test_a_priced_out_rung_is_retried_and_learned(monkeypatch):
    monkeypatch.setattr(_outcomes, "RETRY_EVERY", 4)
    f = ap.adaptive(trapezoid, ladder="f32,f64", rtol=1e-3, componentwise=True)
    names = [f.with_report(AWAY)[1].rung_name for _ in range(8)]
    # skipped a priori, tried at the retry, passes there, and is then kept
    assert names[0] == "f64" and "f32" in names[:6] and names[-2:] == ["f32", "f32"], names
    # a plan traced under jit after those calls uses what they showed
    assert jax.jit(f.with_report)(AWAY)[1].rung_name == "f32"
    # where float32 fails on the data, each retry (every RETRY_EVERY-th call) costs one
    # attempt and the rung stays out between them
    g = ap.adaptive(trapezoid, ladder="f32,f64", rtol=1e-3, componentwise=True)
    reps = [g.with_report(NEAR)[1] for _ in range(8)]
    assert all(r.rung_name == "f64" and bool(r.ok) for r in reps)
    assert [int(r.escalations) for r in reps] == [0, 0, 0, 1, 0, 0, 0, 1], [
        r.checks for r in reps]
