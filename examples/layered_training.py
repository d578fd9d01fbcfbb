"""Layered precision: train a network whose early layers run in bfloat16 (or float16 with
dynamic loss scaling) and whose late layers run in float32, and compare with float32.

The model is an ordinary JAX function; its layers are marked with ``jax.named_scope``.
``ap.train_step(loss, optimizer, policy, scopes={...})`` runs the loss under
``ap.autocast`` with per-scope rules, scales the loss, unscales and checks the gradients,
and ``ap.skip_nonfinite`` skips non-finite updates and adjusts the loss scale. Parameters
and optimizer state stay float32.

Printed: ``ap.explain`` of the loss per scope, then for each configuration the final loss
against float32, the skipped steps and the profile of the step (compile time and median
step time, measured here with ``time.perf_counter``).

Run (well under a minute on a 2-core CPU):
    python examples/layered_training.py
"""

import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

import adaptprec as ap

STEPS = 300
WIDTH = 32
SCOPES_BF16 = {"block[01]": "bf16"}   # early layers in bfloat16; the rest as the base
SCOPES_F16 = {"block[01]": "f16"}     # the same with float16 (needs loss scaling)


def init(key, sizes=(16, WIDTH, WIDTH, WIDTH, WIDTH, 1)):
    params = []
    for i, (m, n) in enumerate(zip(sizes[:-1], sizes[1:])):
        w = jax.random.normal(jax.random.fold_in(key, i), (m, n), jnp.float32)
        params.append({"w": w / np.sqrt(m), "b": jnp.zeros((n,), jnp.float32)})
    return params


def model(params, x):
    *blocks, head = params
    for i, p in enumerate(blocks):
        with jax.named_scope(f"block{i}"):
            x = jax.nn.gelu(x @ p["w"] + p["b"])
    with jax.named_scope("head"):
        return (x @ head["w"] + head["b"])[:, 0]


def loss(params, x, y):
    with jax.named_scope("loss"):
        return jnp.mean((model(params, x) - y) ** 2)


def data(n=4096, seed=0):
    """Noisy regression data (noise variance 0.01); ``seed=1`` is the held-out set."""
    kx, kn = jax.random.split(jax.random.PRNGKey(seed))
    a = jax.random.normal(jax.random.PRNGKey(42), (16,), jnp.float32) / 2
    x = jax.random.normal(kx, (n, 16), jnp.float32)
    y = jnp.sin(x @ a) * jnp.cos(x[:, 0]) + 0.1 * jax.random.normal(kn, (n,))
    return x, y.astype(jnp.float32)


def run(name, optimizer, **kw):
    x, y = data()
    params = init(jax.random.PRNGKey(1))
    step = jax.jit(ap.train_step(loss, optimizer, "f32", **kw))
    state = optimizer.init(params)
    t0 = time.perf_counter()
    compiled = step.lower(params, state, x, y).compile()
    compile_s = time.perf_counter() - t0
    times = []
    for _ in range(STEPS):
        t0 = time.perf_counter()
        params, state, info = compiled(params, state, x, y)
        jax.block_until_ready(params)
        times.append(time.perf_counter() - t0)
    final = float(loss(params, x, y))  # evaluated in float32
    held_out = float(loss(params, *data(1024, seed=1)))
    dtypes = {leaf.dtype.name for leaf in jax.tree_util.tree_leaves(params)}
    return {"name": name, "final": final, "held_out": held_out,
            "skipped": int(info.skipped),
            "scale": float(info.loss_scale), "compile": compile_s,
            "median_ms": 1e3 * float(np.median(times)), "param_dtypes": dtypes}


def main() -> None:
    x, y = data()
    params = init(jax.random.PRNGKey(1))
    print("explain(loss, 'always_f32', scopes=SCOPES_BF16), per scope:")
    print(ap.explain(loss, "always_f32", scopes=SCOPES_BF16)(params, x, y))
    print()

    adam = optax.adam(3e-3)
    results = [
        run("float32", ap.skip_nonfinite(adam)),
        run("early bf16 / late f32", ap.skip_nonfinite(adam), scopes=SCOPES_BF16),
        run("early f16 / late f32 + dyn. scale",
            ap.skip_nonfinite(adam, ap.DynamicLossScale(2.0 ** 15, period=100)),
            scopes=SCOPES_F16),
    ]
    ref, ref_h = results[0]["final"], results[0]["held_out"]
    print(f"{STEPS} Adam steps, full batch {x.shape[0]}; loss at step 0: "
          f"{float(loss(params, x, y)):.4f} (label noise variance 0.01)")
    print(f"{'configuration':<34}{'loss':>8}{'vs f32':>8}{'held-out':>10}{'vs f32':>8}"
          f"{'skipped':>8}{'scale':>8}{'compile s':>10}{'step ms':>9}  params")
    for r in results:
        print(f"{r['name']:<34}{r['final']:>8.4f}{100 * (r['final'] / ref - 1):>+7.1f}%"
              f"{r['held_out']:>10.4f}{100 * (r['held_out'] / ref_h - 1):>+7.1f}%"
              f"{r['skipped']:>8}{r['scale']:>8.0f}{r['compile']:>10.2f}"
              f"{r['median_ms']:>9.2f}  {','.join(sorted(r['param_dtypes']))}")
    print("(loss: final training loss; held-out: 1024 fresh samples; step ms: median "
          "wall-clock time of one compiled step)")
    print("bf16/f16 elementwise work is not faster than f32 on CPU (XLA upcasts it): the "
          "step-time and memory wins of low precision need bf16/f16 hardware.")


if __name__ == "__main__":
    main()
