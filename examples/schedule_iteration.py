"""A user iteration driven by a precision schedule with ``adaptprec.iterate``.

Richardson iteration ``x <- x + omega (b - A x)`` for an SPD system. Every step runs at
the rung the schedule picks (``lax.switch`` over bf16, f32, f64 inside one
``lax.while_loop``); the carried ``x`` stays in float64. ``StallEscalation`` climbs when
the residual stops shrinking (the iterate has reached the rung's rounding floor), so the
cheap rungs do the early work and float64 only polishes.

Run:  python examples/schedule_iteration.py
"""

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import adaptprec as ap  # noqa: E402
from adaptprec.schedule import (  # noqa: E402
    Callback,
    Fixed,
    ScheduleStats,
    StallEscalation,
    any_of,
)

rng = np.random.default_rng(0)
Q, _ = np.linalg.qr(rng.standard_normal((50, 50)))
A = jnp.asarray(Q @ np.diag(np.linspace(1.0, 3.0, 50)) @ Q.T)   # SPD, kappa = 3
b = jnp.asarray(rng.standard_normal(50))
OMEGA = 2.0 / (1.0 + 3.0)


def richardson_step(x, dtype):
    a, rhs = A.astype(dtype), b.astype(dtype)
    r0 = jnp.linalg.norm((rhs - a @ x).astype(jnp.float32))
    x = x + OMEGA * (rhs - a @ x)
    r = jnp.linalg.norm((rhs - a @ x).astype(jnp.float32))
    return x, ScheduleStats.make(r, previous=r0)


def main():
    x_ref = np.linalg.solve(np.asarray(A), np.asarray(b))
    trace = []
    schedule = any_of(StallEscalation(rate=0.05, patience=2),
                      Callback(lambda s, rung: trace.append((int(s.step), int(rung),
                                                             float(s.value)))))

    @jax.jit
    def solve(x0):
        return ap.iterate(richardson_step, x0, schedule, "bf16,f32,f64", max_steps=200,
                          done_fn=lambda x: jnp.linalg.norm(b - A @ x) < 1e-12)

    res = solve(jnp.zeros(50))
    jax.effects_barrier()
    err = np.linalg.norm(np.asarray(res.state) - x_ref) / np.linalg.norm(x_ref)
    rungs = np.asarray(res.rung_trace)[: int(res.steps)]
    names = ["bf16", "f32", "f64"]
    print(f"scheduled: {int(res.steps)} steps, {int(res.schedule_state.escalations)} "
          f"escalations, relative error {err:.1e}")
    print("  steps per rung: " + ", ".join(f"{names[k]} {int((rungs == k).sum())}"
                                           for k in range(3)))
    first = {}
    for step, rung, value in trace:
        first.setdefault(rung, (step, value))
    for rung, (step, value) in sorted(first.items()):
        print(f"  step {step:3d}: now on {names[rung]}, residual {value:.2e}")

    for k, name in enumerate(names):
        r = jax.jit(lambda x0, k=k: ap.iterate(richardson_step, x0, Fixed(k), "bf16,f32,f64",
                                               max_steps=200))(jnp.zeros(50))
        e = np.linalg.norm(np.asarray(r.state) - x_ref) / np.linalg.norm(x_ref)
        print(f"fixed {name}: 200 steps, relative error {e:.1e}")


if __name__ == "__main__":
    main()
