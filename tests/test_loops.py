"""Adaptivity on kernels with loops (issue 44): the cost model counts iterations, checks
run through ``scan``/``while``/``cond``, loops separable in their rows or entries are
checked on samples, and ``componentwise=`` catches an entry the norm hides."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import adaptprec as ap
from adaptprec import _cost
from adaptprec._first_order import first_order, relative_bound
from adaptprec._norm_bound import norm_bound

from accuracy_kernels import (jacobi_sweeps, kepler, lorenz_rk4, reference, rel_error,
                              trapezoid)


def _while_kernel(x):
    return jax.lax.while_loop(lambda c: c[0] < 10,
                              lambda c: (c[0] + 1, c[1] * 1.01 + 0.1), (0, x))[1]


def _cond_kernel(x):
    return jax.lax.cond(x[0] > 0, lambda y: y * 2.0, lambda y: y - 1.0, x)


def _grid(n=32):
    u = np.zeros((n, n))
    u[0], u[:, 0] = 1.0, 0.5
    return u


_rng = np.random.default_rng(0)
LOOPS = {   # name: (fn, float64 inputs)
    "trapezoid": (lambda p: trapezoid(p, 500), (np.linspace(0.1, 10.0, 64),)),
    "jacobi": (lambda u, f: jacobi_sweeps(u, f, 20), (_grid(), _rng.normal(size=(32, 32)))),
    "kepler": (kepler, (_rng.uniform(0, 6, 256), np.full(256, 0.3))),
    "while": (_while_kernel, (_rng.normal(size=64),)),
    "cond": (_cond_kernel, (_rng.normal(size=64),)),
}


def _walk(fn, inputs, walk):
    x = tuple(jnp.asarray(v) for v in inputs)
    c = tuple(v.astype(jnp.float32) for v in x)

    @jax.jit
    def run(*c):
        if walk == "first_order":
            r = first_order(fn, c, {}, (x, {}), jnp.float32)
            return r.outs, relative_bound(r.outs, r.errs), r.unstable
        r = norm_bound(fn, c, {}, (x, {}), jnp.float32)
        return r.outs, r.relative(), r.unstable

    outs, est, unstable = run(*c)
    return x, c, outs, float(est), float(unstable)


@pytest.mark.parametrize("walk", ["first_order", "norm_bound"])
@pytest.mark.parametrize("name", sorted(LOOPS))
def test_bounds_through_loops_cover_the_true_error(name, walk):
    fn, inputs = LOOPS[name]
    x, c, outs, est, unstable = _walk(fn, inputs, walk)
    err = rel_error(np.asarray(outs[0], np.float64), reference(fn, inputs))
    assert unstable == 0 and err <= est < 1e-2, (name, walk, err, est)
    # the walk computes the rung's own values (the runtime returns them)
    np.testing.assert_array_equal(np.asarray(outs[0]), np.asarray(jax.jit(fn)(*c)))


def test_a_loop_exit_test_within_rounding_is_an_unstable_decision():
    # count steps of 0.1 until 1: in float32 the sum reaches 1 a step early or late
    def steps(x):
        return jax.lax.while_loop(lambda c: c[1] < 1.0, lambda c: (c[0] + 1.0, c[1] + x),
                                  (jnp.float32(0), jnp.float32(0)) if x.dtype == jnp.float32
                                  else (0.0 * x, 0.0 * x))[0]

    for walk in ("first_order", "norm_bound"):
        *_, unstable = _walk(steps, (np.float64(0.1),), walk)
        assert unstable > 0, walk


def test_the_normwise_bound_adds_the_roundings_of_iterations_in_quadrature():
    # a neutral loop (Jacobi averages, gain 1): the deterministic bound of the roundings
    # grew with the sweeps, the probabilistic one (1 - 1e-6) grows with their square root
    from adaptprec._norm_bound import FAILURE, confidence
    u0, f = _grid(), 1e-3 * np.random.default_rng(1).normal(size=(32, 32))
    est = {n: _walk(lambda u, f: jacobi_sweeps(u, f, n), (u0, f), "norm_bound")
           for n in (10, 160)}
    for n, (x, c, outs, e, unstable) in est.items():
        err = rel_error(np.asarray(outs[0], np.float64),
                        reference(lambda u, f: jacobi_sweeps(u, f, n), (u0, f)))
        assert unstable == 0 and err <= e, (n, err, e)
    assert 2.5 < est[160][3] / est[10][3] < 6.0, (est[10][3], est[160][3])
    assert FAILURE == 1e-6 and abs(confidence(1) - 5.39) < 0.01
    # a chaotic loop amplifies both parts: 600 Lorenz steps (float32 error ~3e-3) fail
    s0 = np.random.default_rng(1).normal(size=(64, 3)) * 5 + [0, 0, 25]
    assert _walk(lambda s: lorenz_rk4(s, 600), (s0,), "norm_bound")[3] > 1e-2


def test_the_cost_model_counts_iterations():
    def body(i, c):
        return c * 1.0001 + jnp.cos(c)

    aval = (jax.ShapeDtypeStruct((256,), jnp.float64),)
    table = _cost.throughput_for("cpu")
    one = _cost.program_cost(lambda x: jax.lax.fori_loop(0, 1, body, x), aval, table)
    many = _cost.program_cost(lambda x: jax.lax.fori_loop(0, 1000, body, x), aval, table)
    assert many.iterations == 1000 and many.elements == 1000 * one.elements
    assert many.seconds > 500 * one.seconds
    # a fori_loop with traced bounds of literal value: the while loop's trip count
    closed = jax.make_jaxpr(lambda x, n: jax.lax.fori_loop(0, n, body, x))(
        jnp.ones(3), 7)
    assert _cost.loop_trips(closed.jaxpr.eqns[-1]) is None      # n is traced
    closed = jax.make_jaxpr(lambda x: jax.lax.while_loop(
        lambda c: c[0] < 12, lambda c: (c[0] + 1, c[1] * 2.0), (3, x)))(jnp.ones(3))
    assert _cost.loop_trips(closed.jaxpr.eqns[-1]) == 9
    # the 20,000-step trapezoid rule is not a "small kernel"
    p = jnp.linspace(0.1, 10.0, 256)
    _, rep = jax.jit(ap.adaptive(trapezoid, rtol=1e-3).with_report)(p)
    assert "small kernel" not in rep.plan[0], rep.plan


def test_loops_separable_in_rows_or_entries_are_sampled():
    from adaptprec._rowwise import row_inputs
    from adaptprec._sampled import is_entrywise

    def rows(fn, *shapes):
        avals = [jax.ShapeDtypeStruct(s, jnp.float32) for s in shapes]
        return row_inputs(lambda *a: jax.tree_util.tree_leaves(fn(*a)), avals)

    def entrywise(fn, *shapes):
        avals = [jax.ShapeDtypeStruct(s, jnp.float32) for s in shapes]
        return is_entrywise(lambda *a: jax.tree_util.tree_leaves(fn(*a)), avals)

    assert rows(lorenz_rk4, (256, 3)) == (True,)
    assert entrywise(kepler, (256,), (256,)) and entrywise(trapezoid, (256,))
    assert not entrywise(lorenz_rk4, (256, 3))
    # rows mixed inside the loop, a loop stopping on a row's value, stacked steps
    assert rows(lambda x: jax.lax.fori_loop(0, 3, lambda i, y: y - y.mean(0), x),
                (256, 3)) is None
    assert rows(lambda x: jax.lax.while_loop(lambda y: jnp.all(y < 10), lambda y: y * 2,
                                             x), (256, 3)) is None
    assert not entrywise(lambda x: jax.lax.scan(lambda c, _: (c * 2, c), x, None,
                                                length=4)[1], (256,))


@pytest.mark.slow
def test_a_trajectory_sampled_plan_takes_float32_and_escalates_when_wrong():
    s0 = jnp.asarray(np.random.default_rng(1).normal(size=(4096, 3)) * 5 + [0, 0, 25])
    f = ap.adaptive(lorenz_rk4, rtol=1e-3)
    y, rep = jax.jit(f.with_report)(s0)
    assert rep.checks[1] == "sample_rows" and rep.rung_name == "f32", rep.summary()
    assert rel_error(y, reference(lorenz_rk4, (s0,))) <= 1e-3
    # 600 steps: the chaos amplifies float32's rounding past 1e-3 (the samples see it)
    long = ap.adaptive(lambda s: lorenz_rk4(s, 600), rtol=1e-3)
    y, rep = jax.jit(long.with_report)(s0)
    assert rep.rung_name == "f64", rep.summary()


@pytest.mark.slow
def test_componentwise_rtol_escalates_the_entry_the_norm_hides():
    p = np.linspace(0.1, 10.0, 64)
    p[np.argmin(np.abs(p - np.pi))] = np.pi + 1e-4      # the integral is ~3e-5 there
    p = jnp.asarray(p)
    fn = lambda p: trapezoid(p, 2000)                    # noqa: E731
    ref = reference(fn, (p,))
    y32 = np.asarray(jax.jit(fn)(p.astype(jnp.float32)), np.float64)
    assert np.max(np.abs(y32 - ref) / np.abs(ref)) > 1e-3 > rel_error(y32, ref)
    norm = ap.adaptive(fn, ladder="f32,f64", rtol=1e-3, plan="all")
    comp = ap.adaptive(fn, ladder="f32,f64", rtol=1e-3, componentwise=True, plan="all")
    _, rep = jax.jit(norm.with_report)(p)
    assert rep.rung_name == "f32" and "normwise" in rep.verified
    y, rep = jax.jit(comp.with_report)(p)
    assert rep.rung_name == "f64" and "componentwise" in rep.verified, rep.summary()
    assert np.max(np.abs(np.asarray(y) - ref) / np.abs(ref)) <= 1e-3
    # the planned check of a componentwise rtol sees every entry: never a sample
    _, rep = jax.jit(ap.adaptive(trapezoid, rtol=1e-3, componentwise=True)
                     .with_report)(jnp.linspace(0.1, 10.0, 256))
    assert not {"sample", "sample_rows", "probe"} & set(rep.checks), rep.checks


def test_componentwise_and_atol_are_validated_and_reported():
    with pytest.raises(ValueError, match="componentwise= and atol= qualify rtol="):
        ap.adaptive(jnp.sin, componentwise=True)
    with pytest.raises(ValueError, match="atol"):
        ap.adaptive(jnp.sin, rtol=1e-3, atol=-1.0)
    with pytest.raises(ValueError, match="componentwise must be True"):
        ap.adaptive(jnp.sin, rtol=1e-3, componentwise="yes")
    f = ap.adaptive(lambda x: x - 1.0, ladder="f32,f64", rtol=1e-3, componentwise=True,
                    atol=1e-6)
    y, rep = f.with_report(jnp.asarray([1.0, 2.0]))        # an exact 0: atol keeps it
    assert bool(rep.ok) and "componentwise, atol 1e-06" in rep.verified
    assert f.manager.guard_names[-1] == "accuracy(0.001, componentwise, atol 1e-06)"


@pytest.mark.slow
def test_loop_kernels_under_vmap_and_grad():
    fn, (p,) = LOOPS["trapezoid"]
    f = ap.adaptive(fn, ladder="f32,f64", rtol=1e-3)
    ps = jnp.stack([jnp.asarray(p), jnp.asarray(p) * 0.5])
    y, rep = jax.jit(jax.vmap(f.with_report))(ps)
    assert rep.batch_shape == (2,) and np.all(np.asarray(rep.ok))
    assert rel_error(y, np.asarray(jax.vmap(fn)(ps))) <= 1e-3
    g = jax.jit(jax.grad(lambda p: jnp.sum(f(p))))(jnp.asarray(p))
    g64 = jax.grad(lambda p: jnp.sum(fn(p)))(jnp.asarray(p))
    np.testing.assert_allclose(np.asarray(g), np.asarray(g64), rtol=1e-3, atol=1e-6)
