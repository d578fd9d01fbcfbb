"""Overhead of adaptive execution, measured against direct baselines in the same run.

1. An un-escalated adaptive call vs the plain jitted kernel at rung 0 (target <= 1.05 for
   kernels of 1 ms or more).
2. An escalated call (rung 0 fails, the top rung runs) vs running the jitted kernel at
   rung 0 and then at the top rung directly (target <= 1.05).
3. ``batch="element"`` with 1% failing elements vs escalating the whole batch
   (``batch="call"``), under ``vmap``.
4. The accuracy guard (``rtol=``, ``samples=2``) on an MLP and an elementwise kernel, on
   a bf16 and an f32 first rung, un-escalated, vs the plain jitted kernel at that rung
   (target <= samples + 1.5 = 3.5).

Each figure is the median wall time over repeated calls of compiled functions
(``block_until_ready``), interleaving candidate and baseline to share machine noise.

Run:  python benchmarks/bench_adaptive.py [--n 512] [--repeats 30] [--only 1,2,3,4]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import adaptprec as ap  # noqa: E402


def _timed(fn, *args):
    t0 = time.perf_counter()
    jax.block_until_ready(fn(*args))
    return time.perf_counter() - t0


def compare(candidate, baseline, args, repeats):
    """Median times (s) of candidate and baseline, calls interleaved after warm-up.

    Also prints the ratio of the minima, which is less sensitive to other load on a shared
    machine.
    """
    for _ in range(3):
        jax.block_until_ready(candidate(*args))
        jax.block_until_ready(baseline(*args))
    tc, tb = [], []
    for _ in range(repeats):
        tc.append(_timed(candidate, *args))
        tb.append(_timed(baseline, *args))
    print(f"   (min {min(tc) * 1e3:.2f} ms vs {min(tb) * 1e3:.2f} ms: ratio of minima "
          f"{min(tc) / min(tb):.3f})")
    return statistics.median(tc), statistics.median(tb)


def kernel(a, b):
    """A ~ms matmul chain: (a @ b) @ b, accumulated at the input precision."""
    return (a @ b) @ b


def mlp(x, w1, w2, w3):
    h = jnp.tanh(x @ w1)
    h = jnp.tanh(h @ w2)
    return h @ w3


def elementwise(x):
    return jnp.exp(-x * x) * jnp.cos(3.0 * x) + jnp.log1p(x * x)


def accuracy_cost(rng, reps):
    """4. accuracy guard vs the plain rung (nothing escalates)."""
    f32 = lambda *s: jnp.asarray(rng.standard_normal(s), jnp.float32)  # noqa: E731
    cases = {
        "mlp 512x1024x1024x256": (mlp, (f32(512, 1024), f32(1024, 1024) / 32,
                                         f32(1024, 1024) / 32, f32(1024, 256) / 32)),
        "elementwise 2^20": (elementwise, (f32(1 << 20),)),
    }
    for name, (fn, xs) in cases.items():
        for ladder, rtol in (("bf16,f32", 3e-2), ("f32,f64", 1e-4)):
            rung = jnp.bfloat16 if ladder.startswith("bf16") else jnp.float32
            f = ap.adaptive(fn, ladder=ladder, rtol=rtol)
            _, rep = jax.jit(f.with_report)(*xs)
            assert int(rep.rung) == 0, rep.summary()
            guarded = jax.jit(f)
            plain = jax.jit(lambda *a, fn=fn, rung=rung: fn(*[x.astype(rung) for x in a])
                            .astype(jnp.float32))
            tc, tb = compare(guarded, plain, xs, reps)
            print(f"4. accuracy guard ({rep.summary().split('; ')[-1]}) on {name}, "
                  f"rung {ladder.split(',')[0]}: {tc * 1e3:8.2f} ms vs plain "
                  f"{tb * 1e3:8.2f} ms  ratio {tc / tb:.2f}  (target <= 3.5)")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=512, help="matrix size for 1 and 2")
    p.add_argument("--batch", type=int, default=2000, help="batch size for 3")
    p.add_argument("--repeats", type=int, default=30)
    p.add_argument("--only", default="1,2,3,4", help="sections to run, e.g. 4")
    args = p.parse_args(argv)
    only = {int(x) for x in args.only.split(",")}
    n, reps = args.n, args.repeats
    rng = np.random.default_rng(0)
    print(f"jax {jax.__version__}, backend {jax.default_backend()}, "
          f"{len(jax.devices())} device(s); n={n}, batch={args.batch}, repeats={reps}")
    print("command: python benchmarks/bench_adaptive.py " + " ".join(sys.argv[1:]))

    if 4 in only:
        accuracy_cost(rng, reps)
    if not only & {1, 2, 3}:
        return
    # 1. un-escalated: ladder f32 -> f64, inputs f32, rung 0 passes the finite guard
    a = jnp.asarray(rng.standard_normal((n, n)), jnp.float32)
    b = jnp.asarray(rng.standard_normal((n, n)) / np.sqrt(n), jnp.float32)
    adaptive = jax.jit(ap.adaptive(kernel, ladder="f32,f64", guards=[ap.guards.finite()]))
    plain = jax.jit(kernel)
    _, rep = ap.adaptive(kernel, ladder="f32,f64").with_report(a, b)
    assert rep.rung_name == "f32"
    tc, tb = compare(adaptive, plain, (a, b), reps)
    print(f"1. un-escalated adaptive vs plain f32 kernel: {tc * 1e3:8.2f} ms vs "
          f"{tb * 1e3:8.2f} ms  ratio {tc / tb:.3f}  (target <= 1.05)")

    # 2. escalated: a ~ 1e30, b ~ 1e10: (a @ b) @ b ~ 1e50 overflows f32, f64 is fine
    big64 = a.astype(jnp.float64) * 1e30
    b64 = b.astype(jnp.float64) * 1e10
    _, rep = ap.adaptive(kernel, ladder="f32,f64").with_report(big64, b64)
    assert rep.rung_name == "f64"

    rung0 = jax.jit(lambda x, y: kernel(x.astype(jnp.float32), y.astype(jnp.float32)))
    top = jax.jit(kernel)

    def rung0_plus_top(x, y):
        # run rung 0, then the top rung, one after the other (as escalation must); one
        # program holding both would let XLA:CPU overlap the two independent chains
        jax.block_until_ready(rung0(x, y))
        return top(x, y)

    tc, tb = compare(adaptive, rung0_plus_top, (big64, b64), reps)
    print(f"2. escalated adaptive vs rung0 + top directly: {tc * 1e3:8.2f} ms vs "
          f"{tb * 1e3:8.2f} ms  ratio {tc / tb:.3f}  (target <= 1.05)")

    # 3. element vs call batching with 1% failing elements
    m = 128
    mat = jnp.asarray(rng.standard_normal((m, m)) / np.sqrt(m))

    def per_element(x):
        y = x
        for _ in range(8):
            y = jnp.tanh(mat.astype(x.dtype) @ y)
        return jnp.log(jnp.sum(jnp.exp(y * x[0])))

    xs = rng.standard_normal((args.batch, m))
    n_fail = max(1, args.batch // 100)
    fail = rng.choice(args.batch, n_fail, replace=False)
    xs[fail, 0] = 200.0          # exp(200 * y) overflows f32, fine in f64
    xs = jnp.asarray(xs)
    ladder = "f32,f64"
    elem = jax.jit(jax.vmap(ap.adaptive(per_element, ladder=ladder, batch="element",
                                        capacity=0.02)))
    call = jax.jit(jax.vmap(ap.adaptive(per_element, ladder=ladder, batch="call")))
    ye, yc = elem(xs), call(xs)
    assert np.all(np.isfinite(np.asarray(ye))) and np.all(np.isfinite(np.asarray(yc)))
    tc, tb = compare(elem, call, (xs,), reps)
    print(f"3. batch='element' (1% = {n_fail} failing, capacity 2%) vs batch='call' "
          f"(whole batch escalates): {tc * 1e3:8.2f} ms vs {tb * 1e3:8.2f} ms  "
          f"ratio {tc / tb:.3f}  (speed-up {tb / tc:.2f}x)")


if __name__ == "__main__":
    main()
