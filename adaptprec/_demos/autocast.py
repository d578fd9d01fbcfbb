"""Demo: explain and run an MLP under autocast precision policies."""

ORDER = 60
TITLE = "autocast: op-level precision policies for any JAX function"


def run() -> None:
    import jax
    import jax.numpy as jnp
    import numpy as np

    import adaptprec as ap

    def mlp(w1, w2, x):
        h = x @ w1
        h = (h - h.mean(-1, keepdims=True)) * jax.lax.rsqrt(h.var(-1, keepdims=True) + 1e-5)
        return jax.nn.softmax(jax.nn.gelu(h) @ w2, axis=-1)

    rng = np.random.default_rng(0)
    w1 = jnp.asarray(rng.standard_normal((32, 64)) / 6, jnp.float32)
    w2 = jnp.asarray(rng.standard_normal((64, 8)) / 8, jnp.float32)
    x = jnp.asarray(rng.standard_normal((16, 32)), jnp.float32)
    pols = (ap.AUTO_MIXED_CONSERVATIVE, ap.AUTO_MIXED, ap.AUTO_MIXED_BF16, ap.ALWAYS_BF16)

    @jax.jit
    def everything(w1, w2, x):  # one compilation for all policies and the gradient
        outs = [ap.autocast(mlp, pol)(w1, w2, x) for pol in pols]
        loss = lambda w: ap.autocast(mlp, ap.AUTO_MIXED_BF16)(w, w2, x)[:, 0].sum()  # noqa: E731
        return mlp(w1, w2, x), outs, jax.grad(loss)(w1)

    ref, outs, g = everything(w1, w2, x)
    print(ap.explain(mlp, ap.AUTO_MIXED_BF16)(w1, w2, x))
    print(f"{'policy':<26}{'casts':>6}{'max |err| vs f32':>18}")
    for pol, out in zip(pols, outs):
        casts = ap.explain(mlp, pol)(w1, w2, x).casts
        print(f"{str(pol):<26}{casts:>6}{float(jnp.max(jnp.abs(out - ref))):>18.2e}")
    print(f"grad through autocast(AUTO_MIXED_BF16): shape {g.shape}, dtype {g.dtype}")
