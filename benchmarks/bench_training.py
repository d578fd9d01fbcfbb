"""Benchmark: cost of ap.train_step against a plain optax step, in the same run.

One compiled training step (MLP 256-512-512-512-1, batch 1024, Adam) per variant; median
wall time of ``STEPS`` calls after compilation (in 5 interleaved rounds, so changes in
machine load hit every variant alike), and the ratio to the plain float32 step:

* ``plain f32``            ``jax.value_and_grad`` + ``optax.adam`` + ``optax.apply_updates``
                           (the reference: what a user writes without adaptprec);
* ``train_step f32``       ``ap.train_step(loss, ap.skip_nonfinite(adam), "f32")``: the
                           helper's own overhead (finite check, select, loss-scale update);
* ``train_step c=bf16``    policy ``p=f32,c=bf16,o=f32``, no loss scaling;
* ``train_step c=f16``     policy ``p=f32,c=f16,o=f32`` with ``DynamicLossScale``;
* ``layered bf16/f32``     ``scopes={"block[01]": "bf16"}``: first two blocks bfloat16.

Expect the low-precision variants to be *slower* on CPUs without native bf16/f16
arithmetic (XLA:CPU upcasts elementwise work); this measures the helper's overhead and
the CPU picture, not a GPU speed-up.

Reproduce:
    python benchmarks/bench_training.py          # BENCH_STEPS=50 by default
"""

from __future__ import annotations

import os
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

import adaptprec as ap

STEPS = int(os.environ.get("BENCH_STEPS", "50"))
ROUNDS = 5
SIZES = (256, 512, 512, 512, 1)


def init(key):
    params = []
    for i, (m, n) in enumerate(zip(SIZES[:-1], SIZES[1:])):
        w = jax.random.normal(jax.random.fold_in(key, i), (m, n), jnp.float32) / np.sqrt(m)
        params.append({"w": w, "b": jnp.zeros((n,), jnp.float32)})
    return params


def loss(params, x, y):
    *blocks, head = params
    for i, p in enumerate(blocks):
        with jax.named_scope(f"block{i}"):
            x = jax.nn.gelu(x @ p["w"] + p["b"])
    with jax.named_scope("head"):
        return jnp.mean(((x @ head["w"] + head["b"])[:, 0] - y) ** 2)


def plain_step(tx):
    def step(params, state, x, y):
        val, grads = jax.value_and_grad(loss)(params, x, y)
        updates, state = tx.update(grads, state, params)
        return optax.apply_updates(params, updates), state, val
    return step


def compile_step(step, params, state, x, y):
    t0 = time.perf_counter()
    compiled = jax.jit(step).lower(params, state, x, y).compile()
    compile_s = time.perf_counter() - t0
    out = compiled(params, state, x, y)
    jax.block_until_ready(out)
    return compiled, compile_s, out


def timed(compiled, out, x, y, n):
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        out = compiled(*out[:2], x, y)
        jax.block_until_ready(out)
        times.append(time.perf_counter() - t0)
    return out, times


def main() -> None:
    key = jax.random.PRNGKey(0)
    params = init(key)
    x = jax.random.normal(jax.random.fold_in(key, 99), (1024, SIZES[0]), jnp.float32)
    y = jnp.sin(x[:, 0])
    adam = optax.adam(1e-3)
    variants = [
        ("plain f32", plain_step(adam), adam),
    ]
    for name, pol, ls, kw in [
        ("train_step f32", "f32", None, {}),
        ("train_step c=bf16", "p=f32,c=bf16,o=f32", None, {}),
        ("train_step c=f16", "p=f32,c=f16,o=f32", ap.DynamicLossScale(2.0 ** 15), {}),
        ("layered bf16/f32", "f32", None, {"scopes": {"block[01]": "bf16"}}),
    ]:
        tx = ap.skip_nonfinite(adam, ls)
        variants.append((name, ap.train_step(loss, tx, pol, **kw), tx))

    print(f"jax {jax.__version__}, {jax.devices()[0].platform}, MLP {SIZES}, batch "
          f"{x.shape[0]}, median of {STEPS} steps")
    print(f"{'variant':<22}{'compile s':>10}{'step ms':>10}{'/ plain':>9}")
    runs = []
    for name, step, tx in variants:
        compiled, c, out = compile_step(step, params, tx.init(params), x, y)
        runs.append([name, compiled, c, out, []])
    for _ in range(ROUNDS):  # interleaved, so drift in machine load hits every variant
        for r in runs:
            r[3], times = timed(r[1], r[3], x, y, max(1, STEPS // ROUNDS))
            r[4].extend(times)
    ref = statistics.median(runs[0][4])
    for name, _, c, _, times in runs:
        t = statistics.median(times)
        print(f"{name:<22}{c:>10.2f}{1e3 * t:>10.2f}{t / ref:>9.2f}")


if __name__ == "__main__":
    main()
