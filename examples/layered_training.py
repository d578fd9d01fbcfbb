"""Layered precision on a tiny transformer: matmuls in bfloat16, LayerNorm and softmax in
float32, trained with optax Adam; compared with float32 and the one-policy configurations.

The model is plain JAX (2 pre-LayerNorm blocks with causal attention and an MLP); its
layers run under ``jax.named_scope`` with the names Flax linen gives its modules
(``Block_0/attn/query``, ``Block_0/LayerNorm_0``, ``Block_0/mlp/Dense_0``...), so the
scope rules below apply unchanged to the Flax version in docs/training.md. The layered
rules read the way one would first write them:

* ``"attn/*": "bf16"``: the children of every ``attn`` scope (its query/key/value/out
  projections) in bfloat16, at any depth;
* ``"attn": "f32"``: what ``attn`` itself computes (``softmax(q k^T)`` and its weighted
  sum) in float32; a rule naming the children beats the one naming the parent, whatever
  the order;
* ``"mlp": "bf16"`` and ``"LayerNorm_*": "f32"``.

Printed: ``ap.explain`` per scope (the rule that decided each scope), then for each
configuration the final loss against float32, the skipped steps, compile time and the
median step time. ``ap.train_step`` takes a jmp policy (``"p=f32,c=bf16,o=f32"``) or an
autocast preset (``"auto_mixed_bf16"``) as its policy.

Run (well under a minute on a 2-core CPU):
    python examples/layered_training.py
"""

import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

import adaptprec as ap

STEPS = 150
FEATURES, WIDTH, HEADS, BLOCKS = 8, 32, 2, 2
SCOPES = {"attn": "f32", "attn/*": "bf16", "mlp": "bf16", "LayerNorm_*": "f32"}


def init(key, width=WIDTH, blocks=BLOCKS, features=FEATURES):
    """Parameters (float32): an embedding, ``blocks`` transformer blocks, a head."""
    keys = iter(jax.random.split(key, 8 * blocks + 4))

    def dense(m, n):
        return {"kernel": jax.random.normal(next(keys), (m, n), jnp.float32) / m ** 0.5,
                "bias": jnp.zeros((n,), jnp.float32)}

    def norm(n):
        return {"scale": jnp.ones((n,), jnp.float32), "bias": jnp.zeros((n,), jnp.float32)}

    return {"embed": dense(features, width),
            "blocks": [{"ln0": norm(width), "ln1": norm(width),
                        **{k: dense(width, width) for k in ("query", "key", "value", "out")},
                        "mlp0": dense(width, 4 * width), "mlp1": dense(4 * width, width)}
                       for _ in range(blocks)],
            "ln": norm(width), "head": dense(width, 1)}


def apply_dense(p, x):
    return x @ p["kernel"] + p["bias"]


def layer_norm(p, x):
    mu = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(x - mu), axis=-1, keepdims=True)
    return (x - mu) * jax.lax.rsqrt(var + 1e-6) * p["scale"] + p["bias"]


def attention(p, x, heads=HEADS):
    """Causal multi-head self-attention, in the scopes Flax's attention module uses."""
    b, t, d = x.shape

    def project(name):
        with jax.named_scope(name):
            return apply_dense(p[name], x).reshape(b, t, heads, d // heads)

    q, k, v = project("query"), project("key"), project("value")
    logits = jnp.einsum("bqhd,bkhd->bhqk", q, k) / (d // heads) ** 0.5
    causal = jnp.tril(jnp.ones((t, t), bool))
    weights = jax.nn.softmax(jnp.where(causal, logits, -1e9), axis=-1)
    mixed = jnp.einsum("bhqk,bkhd->bqhd", weights, v).reshape(b, t, d)
    with jax.named_scope("out"):
        return apply_dense(p["out"], mixed)


def model(params, x):
    with jax.named_scope("Dense_0"):
        h = apply_dense(params["embed"], x)
    for i, blk in enumerate(params["blocks"]):
        with jax.named_scope(f"Block_{i}"):
            with jax.named_scope("LayerNorm_0"):
                a = layer_norm(blk["ln0"], h)
            with jax.named_scope("attn"):
                h = h + attention(blk, a)
            with jax.named_scope("LayerNorm_1"):
                a = layer_norm(blk["ln1"], h)
            with jax.named_scope("mlp"):
                with jax.named_scope("Dense_0"):
                    a = jax.nn.gelu(apply_dense(blk["mlp0"], a))
                with jax.named_scope("Dense_1"):
                    h = h + apply_dense(blk["mlp1"], a)
    with jax.named_scope("LayerNorm_0"):
        h = layer_norm(params["ln"], h)
    with jax.named_scope("Dense_1"):
        return apply_dense(params["head"], h)[..., 0]


def loss(params, x, y):
    return jnp.mean((model(params, x) - y) ** 2)


def data(n=128, t=16, seed=0, features=FEATURES):
    """Sequences whose target at step t is the running mean of sin(x_s . a) over s <= t
    (the model needs its causal attention), plus label noise of variance 0.01."""
    kx, kn = jax.random.split(jax.random.PRNGKey(seed))
    a = jax.random.normal(jax.random.PRNGKey(42), (features,), jnp.float32) / 2
    x = jax.random.normal(kx, (n, t, features), jnp.float32)
    s = jnp.sin(x @ a)
    y = jnp.cumsum(s, axis=1) / jnp.arange(1, t + 1) + 0.1 * jax.random.normal(kn, (n, t))
    return x, y.astype(jnp.float32)


def configurations(adam):
    """(name, optimizer, train_step keyword arguments) of each configuration."""
    scaled = ap.skip_nonfinite(adam, ap.DynamicLossScale(2.0 ** 15, period=100))
    return [
        ("float32", ap.skip_nonfinite(adam), {"policy": "f32"}),
        ("bf16 policy p=f32,c=bf16,o=f32", ap.skip_nonfinite(adam),
         {"policy": "p=f32,c=bf16,o=f32"}),
        ("f16 policy + loss scaling", scaled, {"policy": "p=f32,c=f16,o=f32"}),
        ("auto_mixed_bf16", ap.skip_nonfinite(adam), {"policy": "auto_mixed_bf16"}),
        ("layered: matmuls bf16", ap.skip_nonfinite(adam),
         {"policy": "f32", "scopes": SCOPES}),
    ]


def run(name, optimizer, steps=STEPS, **kw):
    x, y = data()
    params = init(jax.random.PRNGKey(1))
    step = jax.jit(ap.train_step(loss, optimizer, **kw))
    state = optimizer.init(params)
    t0 = time.perf_counter()
    compiled = step.lower(params, state, x, y).compile()
    compile_s = time.perf_counter() - t0
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        params, state, info = compiled(params, state, x, y)
        jax.block_until_ready(params)
        times.append(time.perf_counter() - t0)
    return {"name": name, "final": float(loss(params, x, y)),   # evaluated in float32
            "held_out": float(loss(params, *data(seed=1))),
            "skipped": int(info.skipped), "compile": compile_s,
            "median_ms": 1e3 * float(np.median(times))}


def main() -> None:
    x, y = data()
    params = init(jax.random.PRNGKey(1))
    print("explain(loss, 'always_f32', scopes=SCOPES), the rule that decided each scope:")
    print(ap.explain(loss, "always_f32", scopes=SCOPES)(params, x, y))
    print()
    results = [run(name, tx, **kw) for name, tx, kw in configurations(optax.adam(3e-3))]
    ref, ref_h = results[0]["final"], results[0]["held_out"]
    print(f"{STEPS} Adam steps, full batch {x.shape[0]} x {x.shape[1]}; loss at step 0: "
          f"{float(loss(params, x, y)):.4f} (label noise variance 0.01)")
    print(f"{'configuration':<32}{'loss':>8}{'vs f32':>8}{'held-out':>10}{'vs f32':>8}"
          f"{'skipped':>8}{'compile s':>10}{'step ms':>9}")
    for r in results:
        print(f"{r['name']:<32}{r['final']:>8.4f}{100 * (r['final'] / ref - 1):>+7.1f}%"
              f"{r['held_out']:>10.4f}{100 * (r['held_out'] / ref_h - 1):>+7.1f}%"
              f"{r['skipped']:>8}{r['compile']:>10.2f}{r['median_ms']:>9.2f}")
    print("(loss: final training loss, in float32; held-out: 128 fresh sequences; step "
          "ms: median wall-clock time of one compiled step; benchmarks/bench_training.py "
          "measures step times with interleaved rounds)")


if __name__ == "__main__":
    main()
