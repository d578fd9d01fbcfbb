"""Benchmark: one training step per precision configuration, ratios in the same run.

The tiny transformer of ``examples/layered_training.py`` (2 pre-LayerNorm blocks, causal
attention, MLP; width ``BENCH_WIDTH``, batch ``BENCH_BATCH`` sequences of ``BENCH_LEN``
tokens), Adam, one compiled step per variant; median and best wall time of
``BENCH_STEPS`` calls after compilation, in ``ROUNDS`` interleaved rounds (a change in
machine load hits every variant alike; on a shared machine the best time is the less
disturbed one), the median CPU time of the process per step (``time.process_time``, all
threads: the work done, which other processes' load disturbs least), ratios to the plain
float32 step, and XLA's temporary bytes (``memory_analysis``):

* ``plain f32``: ``jax.value_and_grad`` + ``optax.adam`` + ``optax.apply_updates`` (what a
  user writes without adaptprec; the reference);
* ``train_step f32``: ``ap.train_step(loss, ap.skip_nonfinite(adam), "f32")``, the
  helper's own cost (finite check, skip select, scale update);
* ``p=f32,c=bf16,o=f32``: the jmp bf16 policy (parameters and inputs cast to bfloat16 at
  the boundary, every op in bfloat16), no loss scaling;
* ``p=f32,c=f16,o=f32 + scale``: float16 with ``DynamicLossScale(2**15)``;
* each autocast preset as ``train_step``'s policy (``"always_f32"`` ... ``"auto_mixed_bf16"``;
  the float16 ones with the dynamic loss scale);
* ``layered``: ``scopes=examples.layered_training.SCOPES`` (matmuls bf16, LayerNorm and
  softmax f32).

Reproduce (prints the table and the load):
    python benchmarks/bench_training.py      # BENCH_STEPS=40 BENCH_WIDTH=64 by default
"""

from __future__ import annotations

import os
import pathlib
import statistics
import sys
import time

import jax
import optax

import adaptprec as ap

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "examples"))
import layered_training  # noqa: E402  (the model, data and scope rules of the example)

STEPS = int(os.environ.get("BENCH_STEPS", "40"))
WIDTH = int(os.environ.get("BENCH_WIDTH", "64"))
BATCH = int(os.environ.get("BENCH_BATCH", "64"))
LENGTH = int(os.environ.get("BENCH_LEN", "32"))
ROUNDS = 5
F16_PRESETS = ("always_f16", "auto_mixed_conservative", "auto_mixed")


def plain_step(loss, tx):
    def step(params, state, x, y):
        val, grads = jax.value_and_grad(loss)(params, x, y)
        updates, state = tx.update(grads, state, params)
        return optax.apply_updates(params, updates), state, val
    return step


def variants(ex, adam):
    """(name, step function, optimizer) of every configuration."""
    def scaled():
        return ap.skip_nonfinite(adam, ap.DynamicLossScale(2.0 ** 15))

    out = [("plain f32", plain_step(ex.loss, adam), adam)]
    for name, policy, tx, kw in [
        ("train_step f32", "f32", ap.skip_nonfinite(adam), {}),
        ("p=f32,c=bf16,o=f32", "p=f32,c=bf16,o=f32", ap.skip_nonfinite(adam), {}),
        ("p=f32,c=f16,o=f32 + scale", "p=f32,c=f16,o=f32", scaled(), {}),
        *[(preset + (" + scale" if preset in F16_PRESETS else ""), preset,
           scaled() if preset in F16_PRESETS else ap.skip_nonfinite(adam), {})
          for preset in ap.PRESETS],
        ("layered (matmuls bf16)", "f32", ap.skip_nonfinite(adam), {"scopes": ex.SCOPES}),
    ]:
        out.append((name, ap.train_step(ex.loss, tx, policy, **kw), tx))
    return out


def main() -> None:
    ex = layered_training
    params = ex.init(jax.random.PRNGKey(1), width=WIDTH)
    x, y = ex.data(n=BATCH, t=LENGTH)
    runs = []
    for name, step, tx in variants(ex, optax.adam(1e-3)):
        state = tx.init(params)
        t0 = time.perf_counter()
        compiled = jax.jit(step).lower(params, state, x, y).compile()
        compile_s = time.perf_counter() - t0
        temp = compiled.memory_analysis().temp_size_in_bytes
        out = compiled(params, state, x, y)
        jax.block_until_ready(out)
        runs.append({"name": name, "compiled": compiled, "compile": compile_s,
                     "temp": temp, "out": out, "times": [], "cpu": []})
    for _ in range(ROUNDS):   # interleaved rounds
        for r in runs:
            for _ in range(max(1, STEPS // ROUNDS)):
                t0, c0 = time.perf_counter(), time.process_time()
                r["out"] = r["compiled"](*r["out"][:2], x, y)
                jax.block_until_ready(r["out"])
                r["times"].append(time.perf_counter() - t0)
                r["cpu"].append(time.process_time() - c0)
    ref = statistics.median(runs[0]["times"])
    ref_cpu = statistics.median(runs[0]["cpu"])
    print(f"jax {jax.__version__}, {jax.devices()[0].device_kind}, load "
          f"{os.getloadavg()[0]:.1f}; transformer width {WIDTH}, {len(params['blocks'])} "
          f"blocks, batch {BATCH} x {LENGTH} tokens, Adam; median of {len(runs[0]['times'])}"
          f" steps in {ROUNDS} interleaved rounds")
    best = min(runs[0]["times"])
    print(f"{'variant':<32}{'compile s':>10}{'step ms':>9}{'/ plain':>8}{'best ms':>9}"
          f"{'/ plain':>8}{'cpu ms':>8}{'/ plain':>8}{'temp MiB':>9}")
    for r in runs:
        t, b, c = statistics.median(r["times"]), min(r["times"]), statistics.median(r["cpu"])
        print(f"{r['name']:<32}{r['compile']:>10.2f}{1e3 * t:>9.2f}{t / ref:>8.2f}"
              f"{1e3 * b:>9.2f}{b / best:>8.2f}{1e3 * c:>8.2f}{c / ref_cpu:>8.2f}"
              f"{r['temp'] / 2 ** 20:>9.2f}")


if __name__ == "__main__":
    main()
