"""Benchmark: autocast policies on a large MLP and an RK4 ODE integrator (one run).

For each workload and variant: compiled memory (XLA ``memory_analysis``: argument bytes and
temporary bytes), median wall time, and relative error against the float64 result, with
ratios to ``ALWAYS_F32``. Variants:

* ``f64``             the plain function on float64 inputs (the accuracy reference);
* ``ALWAYS_F32``      ``autocast(fn, ALWAYS_F32)`` on float32 inputs (= the plain f32 run);
* ``AUTO_MIXED_BF16`` ``autocast(fn, AUTO_MIXED_BF16)`` on float32 inputs (master weights
  stay float32, bfloat16 copies are made for the dots);
* ``AUTO_MIXED_BF16/bf16-in``  the same policy on inputs stored in bfloat16 — what an
  ``adaptive()`` ladder rung receives (inputs are cast to the rung dtype).

On CPU, bfloat16 elementwise work is not faster than float32 (XLA:CPU upcasts it), so the
dependable win is memory, and only when inputs are stored in bfloat16: with float32
master inputs the bfloat16 operand copies add temporaries. Large bf16 x bf16 -> f32 dots
can be faster on CPUs with AVX512_BF16 (measured on this machine: see the report).

Reproduce:
    JAX_ENABLE_X64=1 /work/venv/bin/python benchmarks/bench_autocast.py
"""

from __future__ import annotations

import os
import statistics
import sys
import time

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax import lax  # noqa: E402

import adaptprec as ap  # noqa: E402

REPEATS = int(os.environ.get("BENCH_REPEATS", "7"))


def mlp(params, x):
    h = x
    for w, b, g, beta in params["layers"]:
        h = h @ w + b
        mu = jnp.mean(h, axis=-1, keepdims=True)
        var = jnp.mean(jnp.square(h - mu), axis=-1, keepdims=True)
        h = jax.nn.gelu((h - mu) * lax.rsqrt(var + 1e-5) * g + beta)
    return jax.nn.softmax(h @ params["out"], axis=-1)


def make_mlp(width=1024, depth=4, n_in=1024, n_out=256, batch=512, seed=0):
    rng = np.random.default_rng(seed)
    layers, fan = [], n_in
    for _ in range(depth):
        layers.append((rng.standard_normal((fan, width)) / np.sqrt(fan),
                       0.1 * rng.standard_normal(width), np.ones(width), np.zeros(width)))
        fan = width
    params = {"layers": layers, "out": rng.standard_normal((width, n_out)) / np.sqrt(width)}
    return params, rng.standard_normal((batch, n_in))


def ode_rk4(y0, a, h, n: int = 200):
    def f(y):
        return a @ jnp.tanh(y) - 0.5 * y

    def step(y, _):
        k1 = f(y)
        k2 = f(y + 0.5 * h * k1)
        k3 = f(y + 0.5 * h * k2)
        k4 = f(y + h * k3)
        return y + (h / 6.0) * (k1 + 2.0 * k2 + 2.0 * k3 + k4), None

    return lax.scan(step, y0, None, length=n)[0]


def make_ode(n=1024, batch=64, seed=1):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((n, n)) / np.sqrt(n)
    y0 = rng.standard_normal((n, batch))
    return y0, a, 0.01


def cast(tree, dtype):
    return jax.tree_util.tree_map(
        lambda t: jnp.asarray(t, dtype) if isinstance(t, (np.ndarray, jax.Array, float))
        else t, tree)


def measure(fn, args, static=()):
    jitted = jax.jit(fn, static_argnums=static)
    compiled = jitted.lower(*args).compile()
    mem = compiled.memory_analysis()
    out = jax.block_until_ready(compiled(*[a for i, a in enumerate(args) if i not in static]))
    times = []
    for _ in range(REPEATS):
        t0 = time.perf_counter()
        jax.block_until_ready(compiled(*[a for i, a in enumerate(args) if i not in static]))
        times.append(time.perf_counter() - t0)
    return out, mem.argument_size_in_bytes, mem.temp_size_in_bytes, statistics.median(times)


def rel_err(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def run(name, fn, data):
    rows = []
    ref, *ref_stats = measure(fn, cast(data, jnp.float64))
    rows.append(("f64", 0.0, *ref_stats))
    variants = [
        ("ALWAYS_F32", ap.autocast(fn, ap.ALWAYS_F32), jnp.float32),
        ("AUTO_MIXED_BF16", ap.autocast(fn, ap.AUTO_MIXED_BF16), jnp.float32),
        ("AUTO_MIXED_BF16/bf16-in", ap.autocast(fn, ap.AUTO_MIXED_BF16), jnp.bfloat16),
        ("ALWAYS_BF16", ap.autocast(fn, ap.ALWAYS_BF16), jnp.float32),
    ]
    for label, f, dt in variants:
        out, *stats = measure(f, cast(data, dt))
        rows.append((label, rel_err(out, ref), *stats))
    base = next(r for r in rows if r[0] == "ALWAYS_F32")
    print(f"\n{name}")
    print(f"{'variant':<25}{'rel err vs f64':>15}{'args MB':>9}{'temp MB':>9}"
          f"{'total/f32':>10}{'time ms':>9}{'time/f32':>9}")
    for label, err, arg_b, tmp_b, t in rows:
        total = (arg_b + tmp_b) / (base[2] + base[3])
        print(f"{label:<25}{err:>15.2e}{arg_b / 2**20:>9.2f}{tmp_b / 2**20:>9.2f}"
              f"{total:>10.2f}{t * 1e3:>9.2f}{t / base[4]:>9.2f}")
    return rows


def main() -> None:
    print(f"jax {jax.__version__} on {jax.default_backend()} ({os.cpu_count()} cpus), "
          f"median of {REPEATS} runs")
    params, x = make_mlp()
    run("MLP 4x1024 (LayerNorm, GELU, softmax), batch 512", mlp, (params, x))
    y0, a, h = make_ode()
    run("RK4 ODE y' = A tanh(y) - y/2, n=1024, 64 trajectories, 200 steps (lax.scan)",
        lambda y0, a: ode_rk4(y0, a, h), (y0, a))
    print("\nreproduce: JAX_ENABLE_X64=1 /work/venv/bin/python benchmarks/bench_autocast.py")


if __name__ == "__main__":
    sys.exit(main())
