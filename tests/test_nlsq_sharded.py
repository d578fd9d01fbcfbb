"""Sharded single fits (adaptprec.nlsq._sharded): data split over a mesh along the point
axis, per-device blocked sums reduced with one psum, the model replicated. With 8 host
devices (a subprocess) and with 2 processes x 2 devices (jax.distributed, gloo) the
results equal the single-device fit to rounding."""

import os

import pytest

from _subprocess import run_python

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

COMMON = """
    import numpy as np, jax, jax.numpy as jnp
    from jax.sharding import NamedSharding, PartitionSpec as P
    import adaptprec as ap

    M = 40_000
    rng = np.random.default_rng(1)
    t = np.linspace(0.0, 5.0, M)
    y = 2.5 * np.exp(-1.3 * t) + 0.5 + 0.01 * rng.standard_normal(M)

    def residual(p, t, y):
        return p[0] * jnp.exp(-p[1] * t) + p[2] - y

    def model(x, a, b, c):
        return a * jnp.exp(-b * x) + c

    X0 = np.array([1.0, 1.0, 0.0])
"""


@pytest.mark.slow  # ~20 s: a fresh 8-device process compiling four fits
def test_eight_devices_equal_single_device():
    code = COMMON + """
    assert jax.device_count() == 8
    ref = ap.solve_nlsq(residual, X0, args=(jnp.asarray(t), jnp.asarray(y)))
    mesh = jax.make_mesh((8,), ("d",))
    put = lambda a: jax.device_put(a, NamedSharding(mesh, P("d")))
    res = ap.solve_nlsq(residual, X0, args=(put(t), put(y)))
    assert res.fun is None and res.rung_name == "f64" and int(res.status) > 0
    assert int(res.escalations) == 1                  # the adaptive ladder, f32 first
    np.testing.assert_allclose(res.x, ref.x, rtol=1e-10)
    np.testing.assert_allclose(res.cost, ref.cost, rtol=1e-12)

    # a 2-D mesh with the points over both axes, a replicated table argument and
    # data with the points on axis 1 (2 x M)
    mesh2 = jax.make_mesh((2, 4), ("a", "b"))
    X = np.stack([t, np.ones(M)])
    def res2(p, X, y, c):
        return c[0] * p[0] * jnp.exp(-p[1] * X[0]) + p[2] * X[1] - y
    ref2 = ap.solve_nlsq(res2, X0, args=(jnp.asarray(X), jnp.asarray(y), jnp.ones(2)))
    Xs = jax.device_put(X, NamedSharding(mesh2, P(None, ("a", "b"))))
    ys = jax.device_put(y, NamedSharding(mesh2, P(("a", "b"))))
    out = ap.solve_nlsq(res2, X0, args=(Xs, ys, np.ones(2)))
    np.testing.assert_allclose(out.x, ref2.x, rtol=1e-10)

    # curve_fit on sharded data: popt and pcov as the in-memory fit
    p_ref, c_ref = ap.curve_fit(model, jnp.asarray(t), jnp.asarray(y), p0=X0)
    p, c = ap.curve_fit(model, put(t), put(y), p0=X0)
    np.testing.assert_allclose(p, p_ref, rtol=1e-10)
    # (issue 31.3) a large in-memory fit's pcov may be its loop's last model (the Jacobian
    # a thousandth of a standard error from the returned point: small off-diagonal entries
    # move by ~2e-7 of themselves): compared on the scale of sqrt(C_ii C_jj)
    def close(c, c_ref):
        scale = np.sqrt(np.outer(np.diag(c_ref), np.diag(c_ref)))
        np.testing.assert_array_less(np.abs(np.asarray(c) - np.asarray(c_ref)), 1e-7 * scale)
    close(c, c_ref)
    # a NumPy sigma next to sharded data is split like them
    sig = np.full(M, 0.02)
    p_ref, c_ref = ap.curve_fit(model, jnp.asarray(t), jnp.asarray(y), p0=X0,
                                sigma=jnp.asarray(sig))
    p, c = ap.curve_fit(model, put(t), put(y), p0=X0, sigma=sig)
    np.testing.assert_allclose(p, p_ref, rtol=1e-10)
    close(c, c_ref)

    print("ok")
    """
    out = run_python(code, devices=8)
    assert out.returncode == 0, out.stderr[-4000:]
    assert "ok" in out.stdout


_MP = COMMON + """
    from jax.experimental import multihost_utils
    assert jax.process_count() == 2 and jax.device_count() == 4
    mesh = jax.make_mesh((4,), ("d",))
    sh = NamedSharding(mesh, P("d"))
    # each process holds its half of the points
    half = M // 2
    lo = jax.process_index() * half
    ts = jax.make_array_from_process_local_data(sh, t[lo:lo + half], (M,))
    ys = jax.make_array_from_process_local_data(sh, y[lo:lo + half], (M,))
    res = ap.solve_nlsq(residual, X0, args=(ts, ys))
    # the same answer on both processes
    xs = multihost_utils.process_allgather(jnp.asarray(res.x))
    np.testing.assert_array_equal(xs[0], xs[1])
    print("RESULT", jax.process_index(), repr(np.asarray(res.x).tolist()),
          repr(float(res.cost)), int(res.status), res.rung_name)
"""


@pytest.mark.slow
def test_two_processes_equal_single_process():
    import sys
    sys.path.insert(0, HERE)
    try:
        from _multiprocess import run_processes
    except ImportError:
        pytest.skip("tests/_multiprocess.py (the multi-process launcher) is not here")
    outs = run_processes(_MP, n_processes=2, devices_per_process=2, timeout=600, cwd=ROOT)
    ref = run_python(COMMON + """
    res = ap.solve_nlsq(residual, X0, args=(jnp.asarray(t), jnp.asarray(y)))
    print("RESULT", repr(np.asarray(res.x).tolist()), repr(float(res.cost)))
    """)
    assert ref.returncode == 0, ref.stderr[-3000:]
    import ast
    import numpy as np
    x_ref = np.array(ast.literal_eval(ref.stdout.split("RESULT ")[1].split("] ")[0] + "]"))
    cost_ref = float(ref.stdout.split("] ")[1].split()[0])
    for out in outs:
        line = next(ln for ln in out.stdout.splitlines() if ln.startswith("RESULT"))
        parts = line.split(" ", 2)[2]
        x = np.array(ast.literal_eval(parts.split("] ")[0] + "]"))
        rest = parts.split("] ")[1].split()
        np.testing.assert_allclose(x, x_ref, rtol=1e-10)
        np.testing.assert_allclose(float(rest[0]), cost_ref, rtol=1e-12)
        assert int(rest[1]) > 0 and rest[2] == "f64"


@pytest.mark.slow
def test_one_device_mesh_in_process():
    """Data put on a one-device mesh with a partitioned spec (the default explicit axis
    types) take the sharded path, and agree with plain arrays."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import NamedSharding, PartitionSpec as P

    import adaptprec as ap

    mesh = jax.make_mesh((1,), ("d",))
    t = np.linspace(0.0, 5.0, 8192)
    y = 2.5 * np.exp(-1.3 * t) + 0.5 + 0.01 * np.sin(40 * t)
    sh = NamedSharding(mesh, P("d"))

    def residual(p, t, y):
        return p[0] * jnp.exp(-p[1] * t) + p[2] - y

    x0 = np.array([1.0, 1.0, 0.0])
    res = ap.solve_nlsq(residual, x0, args=(jax.device_put(t, sh), jax.device_put(y, sh)))
    ref = ap.solve_nlsq(residual, x0, args=(jnp.asarray(t), jnp.asarray(y)))
    assert res.fun is None and int(res.status) > 0
    np.testing.assert_allclose(res.x, ref.x, rtol=1e-10)
