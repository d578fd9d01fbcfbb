"""Inputs sharded over 8 host devices give the same answers as unsharded (subprocess)."""

import textwrap

import pytest
from _subprocess import run_python

SCRIPT = textwrap.dedent(r"""
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import NamedSharding, PartitionSpec as P
    import adaptprec as ap
    assert len(jax.devices()) == 8, jax.devices()
    assert ap.x64_enabled()
    from jax.sharding import AxisType
    mesh = jax.make_mesh((8,), ("b",))                       # explicit axes (0.10 default)
    shard = NamedSharding(mesh, P("b"))
    auto = NamedSharding(jax.make_mesh((8,), ("b",), axis_types=(AxisType.Auto,)), P("b"))

    def naive_lse(x):
        return jnp.log(jnp.sum(jnp.exp(x)))

    rng = np.random.default_rng(0)
    xs = rng.standard_normal((32, 4)).astype(np.float32)
    xs[[3, 17, 30], 0] = 100.0                       # overflow bf16 and f32
    for batch, cap, sharding in (("call", 0.05, shard), ("element", 4, shard),
                                 ("element", 2, auto)):
        xs_sh = jax.device_put(jnp.asarray(xs), sharding)
        assert len(xs_sh.sharding.device_set) == 8
        f = ap.adaptive(naive_lse, ladder="bf16,f32,f64", batch=batch, capacity=cap)
        run = jax.jit(jax.vmap(f.with_report))
        y0, r0 = run(jnp.asarray(xs))
        y1, r1 = run(xs_sh)
        np.testing.assert_array_equal(np.asarray(r0.rung), np.asarray(r1.rung))
        # XLA may keep bf16 intermediates in f32 differently per partitioning
        # (excess precision), so bf16-rung values agree to bf16 accuracy only
        low = np.asarray(r0.rung) == 0
        np.testing.assert_allclose(np.asarray(y0)[low], np.asarray(y1)[low], rtol=2e-2)
        np.testing.assert_allclose(np.asarray(y0)[~low], np.asarray(y1)[~low], rtol=1e-6)
        np.testing.assert_array_equal(np.asarray(r0.codes), np.asarray(r1.codes))
        assert np.asarray(r1.rung)[[3, 17, 30]].tolist() == [2, 2, 2]
        print(batch, cap, r1.summary())
    # a single call on one sharded vector (the guard reduces across devices)
    v = np.linspace(-1.0, 1.0, 64).astype(np.float32)
    v[40] = 100.0
    f = ap.adaptive(naive_lse, ladder="bf16,f32,f64")
    y0, r0 = jax.jit(f.with_report)(jnp.asarray(v))
    y1, r1 = jax.jit(f.with_report)(jax.device_put(jnp.asarray(v), shard))
    assert r0.rung_name == r1.rung_name == "f64"
    np.testing.assert_allclose(float(y0), float(y1), rtol=1e-6)
    # gradients through the chosen rung agree too
    g0 = jax.jit(jax.grad(f))(jnp.asarray(v, jnp.float64))
    g1 = jax.jit(jax.grad(f))(jax.device_put(jnp.asarray(v, jnp.float64), shard))
    np.testing.assert_allclose(np.asarray(g0), np.asarray(g1), rtol=1e-12)
    print("MULTIDEVICE OK")
""")


@pytest.mark.slow
@pytest.mark.multidevice
def test_sharded_inputs_match_unsharded():
    proc = run_python(SCRIPT, devices=8)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "MULTIDEVICE OK" in proc.stdout
