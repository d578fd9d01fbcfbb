"""See what a precision policy does to a function before running it, then run it.

A two-layer MLP with LayerNorm and softmax is explained under three policies (ops, dtypes
and casts per op kind), run under each, and compared with the float64 result.

Run:
    python examples/autocast_explain.py
"""

import jax

jax.config.update("jax_enable_x64", True)  # only for the float64 reference

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax import lax  # noqa: E402

import adaptprec as ap  # noqa: E402


def layernorm(h):
    mu = jnp.mean(h, axis=-1, keepdims=True)
    return (h - mu) * lax.rsqrt(jnp.var(h, axis=-1, keepdims=True) + 1e-5)


def mlp(w1, w2, x):
    return jax.nn.softmax(jax.nn.gelu(layernorm(x @ w1)) @ w2, axis=-1)


def main() -> None:
    rng = np.random.default_rng(0)
    w1 = jnp.asarray(rng.standard_normal((64, 128)) / 8, jnp.float32)
    w2 = jnp.asarray(rng.standard_normal((128, 10)) / 11, jnp.float32)
    x = jnp.asarray(rng.standard_normal((32, 64)), jnp.float32)
    ref = mlp(*(t.astype(jnp.float64) for t in (w1, w2, x)))

    for policy in (ap.AUTO_MIXED_CONSERVATIVE, ap.AUTO_MIXED, ap.AUTO_MIXED_BF16,
                   ap.ALWAYS_BF16):
        print(ap.explain(mlp, policy)(w1, w2, x))
        out = jax.jit(ap.autocast(mlp, policy))(w1, w2, x)
        err = float(jnp.max(jnp.abs(out - ref)))
        print(f"max |error| vs float64: {err:.2e}   (output dtype {out.dtype})\n")

    custom = ap.PrecisionPolicy.parse("auto_mixed_bf16, transcendental=bf16, exp=f32")
    print(f"a custom policy: {custom}")
    print(ap.explain(mlp, custom)(w1, w2, x))


if __name__ == "__main__":
    main()
