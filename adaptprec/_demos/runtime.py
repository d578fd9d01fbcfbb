"""Demo: adaptive kernels escalate only when a guard fires; schedules drive iterations."""

ORDER = 10
TITLE = "runtime: guards, adaptive(), vmap batching, monitor, precision schedules"


def run() -> None:
    import jax
    import jax.numpy as jnp
    import numpy as np

    import adaptprec as ap
    from adaptprec import guards
    from adaptprec.schedule import ScheduleStats, StallEscalation

    @ap.adaptive(ladder="bf16,f32,f64", guards=[guards.finite()])
    def naive_lse(x):
        return jnp.log(jnp.sum(jnp.exp(x)))

    for x in ([1.0, 2.0, 3.0], [100.0, 99.0, 1.0]):
        y, rep = jax.jit(naive_lse.with_report)(jnp.asarray(x, jnp.float32))
        print(f"naive logsumexp{tuple(x)} = {float(y):.4f}   [{rep.summary()}]")

    xs = np.tile(np.float32([1.0, 2.0, 3.0]), (64, 1))
    xs[[5, 40], 0] = 100.0
    for batch in ("call", "element"):
        f = ap.adaptive(naive_lse.__wrapped__, ladder="bf16,f32,f64", batch=batch,
                        capacity=4)
        _, rep = jax.jit(jax.vmap(f.with_report))(jnp.asarray(xs))
        print(f"vmap over 64, 2 overflow, batch={batch!r:9}: {rep.summary()}")

    solve = ap.adaptive(jnp.linalg.solve, ladder="f32,f64",
                        guards=[guards.matrix_condition(tol=1e-3)])
    n = 8
    hilbert = 1.0 / (np.arange(n)[:, None] + np.arange(n)[None, :] + 1.0)
    with ap.monitor() as log:
        jax.jit(solve)(jnp.asarray(hilbert), jnp.ones(n))
        jax.jit(solve)(jnp.eye(n) * 2.0, jnp.ones(n))
    print("monitor log of two solves:")
    for line in log.summary().splitlines():
        print("   ", line)

    a = jnp.array([[2.0, 0.5], [0.5, 1.0]])
    b = jnp.array([1.0, 1.0])

    def step(x, dtype):
        ad, bd = a.astype(dtype), b.astype(dtype)
        r0 = jnp.linalg.norm((bd - ad @ x).astype(jnp.float32))
        x = x + 0.5 * (bd - ad @ x)
        return x, ScheduleStats.make(jnp.linalg.norm((bd - ad @ x).astype(jnp.float32)),
                                     previous=r0)

    res = jax.jit(lambda x0: ap.iterate(step, x0, StallEscalation(rate=0.05, patience=2),
                                        "bf16,f32,f64", max_steps=120,
                                        done_fn=lambda x: jnp.linalg.norm(b - a @ x) < 1e-14)
                   )(jnp.zeros(2))
    trace = np.asarray(res.rung_trace)[: int(res.steps)]
    err = np.abs(np.asarray(res.state) - np.linalg.solve(a, b)).max()
    print(f"Richardson under StallEscalation: steps on bf16/f32/f64 = "
          f"{[int((trace == k).sum()) for k in range(3)]}, final error {err:.1e}")
