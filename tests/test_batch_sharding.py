"""solve_nlsq_batch split over 8 host devices equals the one-device run (subprocess)."""

import textwrap

import pytest
from _subprocess import run_python

SCRIPT = textwrap.dedent(r"""
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    import adaptprec as ap
    from adaptprec._demos.batch import gauss2d, make_problem
    assert len(jax.devices()) == 8 and ap.x64_enabled()

    FIELDS = ("x", "cost", "status", "rung", "nit", "nfev", "success")

    def same(a, b):
        for f in FIELDS:
            np.testing.assert_array_equal(np.asarray(getattr(a, f)), np.asarray(getattr(b, f)),
                                          err_msg=f)

    # Gaussian spots, adaptive ladder, one fit with NaN data and one that must escalate
    xy, data, truth, x0 = make_problem(64, seed=2)
    data[3, 0] = np.nan
    data[40] *= 1e20                      # float32 cost overflows: escalates on its device
    x0[40, [0, 4]] *= 1e20
    kw = dict(args=(xy,), in_axes=None, ydata=data, compaction=None)   # fewer loops to compile
    one = ap.solve_nlsq_batch(gauss2d, x0, **kw)
    assert int(one.status[3]) == -3 and int(one.rung[40]) == 1, (one.status, one.rung)
    mesh = jax.make_mesh((8,), ("fits",))
    many = ap.solve_nlsq_batch(gauss2d, x0, mesh=mesh, **kw)
    assert len(many.x.sharding.device_set) == 8
    same(one, many)
    pre = jax.device_put(jnp.asarray(x0), NamedSharding(mesh, P("fits")))
    ydata = jax.device_put(jnp.asarray(data), NamedSharding(mesh, P("fits")))
    inferred = ap.solve_nlsq_batch(gauss2d, pre, args=(xy,), in_axes=None, ydata=ydata,
                                   compaction=None)
    assert len(inferred.x.sharding.device_set) == 8
    same(one, inferred)

    # a batch that does not divide the device count (padded, then trimmed)
    t = np.linspace(0, 2, 15)
    rng = np.random.default_rng(0)
    y = 2.0 * np.exp(-rng.uniform(0.5, 2, (13, 1)) * t) + 0.01 * rng.normal(size=(13, 15))
    dec = lambda p, t: p[0] * jnp.exp(-p[1] * t)
    kw = dict(args=(t,), in_axes=None, ydata=y, precision="f64")
    a = ap.solve_nlsq_batch(dec, np.ones((13, 2)), **kw)
    b = ap.solve_nlsq_batch(dec, np.ones((13, 2)), mesh=Mesh(np.array(jax.devices()), ("d",)),
                            **kw)
    assert b.x.shape == (13, 2)
    same(a, b)

    # per-fit box constraints travel with the fits (rates above 1.2 end on the bound)
    box = (np.zeros((13, 2)), np.tile([np.inf, 1.2], (13, 1)))
    a = ap.solve_nlsq_batch(dec, np.ones((13, 2)), bounds=box, **kw)
    b = ap.solve_nlsq_batch(dec, np.ones((13, 2)), bounds=box,
                            mesh=Mesh(np.array(jax.devices()), ("d",)), **kw)
    assert (np.asarray(a.x[:, 1]) >= 1.2).sum() >= 2, a.x
    same(a, b)
    print("OK")
""")


@pytest.mark.multidevice
@pytest.mark.slow  # ~17 s: a fresh 8-device process (the 2-process tests cover sharding too)
def test_sharded_over_8_devices_equals_one_device():
    proc = run_python(SCRIPT, devices=8)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert proc.stdout.strip().endswith("OK")


@pytest.mark.slow
def test_one_device_explicit_mesh_input_is_solved_in_its_sharding():
    # jax.make_mesh's axes are Explicit: such inputs carry the sharding in their type
    # (the plain path's gathers reject them), so even one device goes through shard_map
    import jax
    import numpy as np
    from jax.sharding import NamedSharding, PartitionSpec as P

    import adaptprec as ap

    mesh = jax.make_mesh((1,), ("fits",))
    sh = NamedSharding(mesh, P("fits"))
    t = np.linspace(0.0, 1.0, 5)
    y = np.stack([1.0 + 2.0 * t, 3.0 - t, 0.5 * t])
    x0 = jax.make_array_from_process_local_data(sh, np.zeros((3, 2)))
    assert "@fits" in str(jax.typeof(x0))
    res = ap.solve_nlsq_batch(lambda p, t: p[0] + p[1] * t, x0, args=(t,), in_axes=None,
                              ydata=jax.make_array_from_process_local_data(sh, y),
                              compaction=None)   # adaptive: the escalation gathers
    assert res.x.sharding.is_equivalent_to(sh, 2)
    np.testing.assert_allclose(np.asarray(res.x), [[1, 2], [3, -1], [0, 0.5]], atol=1e-10)
