"""Each guard fires when it should and stays quiet when it should (vs independent refs)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.linalg

from adaptprec import adaptive, guards
from adaptprec.guards import GuardResult
from adaptprec._accuracy import _leaf_error

H8 = jnp.asarray(scipy.linalg.hilbert(8))              # kappa_1 ~ 3.4e10
_rng = np.random.default_rng(0)
WELL = jnp.asarray(np.eye(8) * 4 + _rng.standard_normal((8, 8)) * 0.3)
RHS = jnp.asarray(_rng.standard_normal(8))


def seq_sum(x):
    """Sequential sum accumulating in x.dtype (stalls at 256 in bfloat16)."""
    return jax.lax.scan(lambda c, v: (c + v, None), jnp.zeros((), x.dtype), x)[0]


def test_finite():
    g = guards.finite()
    r = g.evaluate(jnp.exp, jnp.array([1.0, 100.0, 200.0]), dtype="f32")
    assert not bool(r.ok) and int(r.code) == guards.NONFINITE and float(r.value) == 2.0
    r = g.evaluate(jnp.exp, jnp.array([1.0, 100.0, 200.0]), dtype="f64")
    assert bool(r.ok) and int(r.code) == 0 and float(r.value) == 0.0
    # pytree outputs, ints ignored
    r = g.evaluate(lambda x: {"a": x, "n": jnp.arange(2), "b": jnp.log(x)},
                   jnp.array([0.0, 1.0]), dtype="f32")
    assert not bool(r.ok) and float(r.value) == 1.0


def test_headroom_overflow_and_flush():
    g = guards.headroom(0.5)
    f16_max = float(np.finfo(np.float16).max)
    x = jnp.array([100.0, -200.0])
    r = g.evaluate(lambda x: x * 200.0, x, dtype="f16")          # 40000 > 0.5 * 65504
    assert not bool(r.ok) and guards.code_name(r.code) == "overflow"
    np.testing.assert_allclose(float(r.value), 40000.0 / f16_max, rtol=1e-3)
    assert bool(g.evaluate(lambda x: x * 100.0, x, dtype="f16").ok)   # 20000 < 32752
    assert bool(g.evaluate(lambda x: x * 200.0, x, dtype="f32").ok)
    # flush to zero of nonzero inputs (zeros are not flushes)
    tiny = jnp.array([0.0, 1e-30, 3.0])
    r = g.evaluate(lambda x: x + 1, tiny, dtype="f16")
    assert not bool(r.ok) and int(r.code) == guards.UNDERFLOW and float(r.value) == 1.0
    assert bool(g.evaluate(lambda x: x + 1, tiny, dtype="f32").ok)
    assert bool(g.evaluate(lambda x: x + 1, jnp.array([0.0, 3.0]), dtype="f16").ok)
    with pytest.raises(ValueError, match="fraction"):
        guards.headroom(1.5)


@pytest.mark.slow
def test_condition_difference_matches_closed_form():
    # f(x, y) = x - y: componentwise relative condition (|x| + |y|) / |x - y|
    g = guards.condition(tol=1e-2, n_dirs=8)
    for x, y in [(1.0, 0.5), (1.0, 0.99), (3.0, -1.0), (10.0, 9.9)]:
        r = g.evaluate(lambda a, b: a - b, jnp.array(x), jnp.array(y), dtype="f64")
        exact = (abs(x) + abs(y)) / abs(x - y)
        np.testing.assert_allclose(float(r.value), exact, rtol=1e-6)
        # fires exactly when kappa * u > tol
        for dt, u in (("bf16", 2.0 ** -8), ("f32", 2.0 ** -24)):
            r = g.evaluate(lambda a, b: a - b, jnp.array(x), jnp.array(y), dtype=dt)
            jdt = {"bf16": jnp.bfloat16, "f32": jnp.float32}[dt]
            kap = (abs(x) + abs(y)) / abs(float(jnp.asarray(x, jdt)) - float(jnp.asarray(y, jdt)))
            assert bool(r.ok) == (kap * u <= 1e-2), (x, y, dt)


@functools.partial(jax.jit, static_argnums=(0, 3))
def _solve_guard(guard, a, b, dtype):
    return guard.evaluate(jnp.linalg.solve, a, b, dtype=dtype)


COND = guards.condition(tol=1e-2)
MCOND = guards.matrix_condition(tol=1e-2)


@pytest.mark.slow
def test_condition_hilbert_vs_well_conditioned():
    r_h32 = _solve_guard(COND, H8, RHS, "f32")
    r_h64 = _solve_guard(COND, H8, RHS, "f64")
    r_w32 = _solve_guard(COND, WELL, RHS, "f32")
    assert not bool(r_h32.ok) and bool(r_h64.ok) and bool(r_w32.ok)
    # the estimate is of the order of the true condition number (a lower estimate)
    kappa = np.linalg.cond(np.asarray(H8), 1)
    assert kappa / 1e3 < float(r_h64.value) < kappa * 10
    assert float(r_w32.value) < 10 * np.linalg.cond(np.asarray(WELL), 1)


def test_matrix_condition_vs_numpy():
    g, solve = MCOND, jnp.linalg.solve
    for a in (H8, WELL):
        exact = np.linalg.cond(np.asarray(a), 1)
        r = _solve_guard(g, a, RHS, "f64")
        assert exact / 3 <= float(r.value) <= exact * (1 + 1e-6)
        assert bool(r.ok)
    assert not bool(_solve_guard(g, H8, RHS, "f32").ok)
    assert bool(_solve_guard(g, WELL, RHS, "f32").ok)
    singular = jnp.ones((8, 8))
    r = _solve_guard(g, singular, RHS, "f64")
    assert not bool(r.ok) and float(r.value) == np.inf
    # keyword argument selection and a clear error for non-square input
    gk = guards.matrix_condition(tol=1e-2, arg="a")
    r = jax.jit(lambda a, b: gk.evaluate(lambda a, b: solve(a, b), a=a, b=b, dtype="f32"))(
        H8, RHS)
    assert not bool(r.ok)
    with pytest.raises(ValueError, match="square matrix"):
        g.evaluate(lambda v: v, jnp.ones(3))


def test_residual_catches_bf16_sum_stall():
    def rel_err(out, x):
        ref = jnp.sum(x.astype(jnp.float64))
        return jnp.abs(out.astype(jnp.float64) - ref) / jnp.abs(ref)

    g = guards.residual(rel_err, tol=1e-3)
    x = jnp.ones(1000)
    r = g.evaluate(seq_sum, x, dtype="bf16")
    assert float(seq_sum(x.astype(jnp.bfloat16))) == 256.0
    assert not bool(r.ok) and int(r.code) == guards.RESIDUAL
    np.testing.assert_allclose(float(r.value), (1000 - 256) / 1000, rtol=1e-6)
    assert bool(g.evaluate(seq_sum, x, dtype="f32").ok)


def test_backward_error_value_and_firing():
    g = guards.backward_error()
    a, b = np.asarray(WELL), np.asarray(RHS)
    x = np.linalg.solve(a, b) * (1 + 1e-3)        # a 1e-3 relative perturbation
    r = g.evaluate(lambda A, b: jnp.asarray(x), WELL, RHS, dtype="f64")
    eta = np.abs(b - a @ x).max() / (np.abs(a).sum(1).max() * np.abs(x).max()
                                     + np.abs(b).max())
    np.testing.assert_allclose(float(r.value), eta, rtol=1e-5)
    assert not bool(r.ok)
    assert bool(_solve_guard(g, WELL, RHS, "f32").ok)
    assert bool(_solve_guard(g, H8, RHS, "f64").ok)   # a backward-stable solve
    assert bool(guards.backward_error(tol=1e-2).evaluate(
        lambda A, b: jnp.asarray(x), WELL, RHS).ok)


def test_predicate_and_user_results():
    g = guards.predicate(lambda out, x: jnp.all(out >= 0))
    assert bool(g.evaluate(jnp.sqrt, jnp.array([4.0])).ok)
    assert not bool(g.evaluate(jnp.negative, jnp.array([4.0])).ok)
    gr = guards.as_guard(lambda out, x: GuardResult.make(out[0] < 1, 42, out[0]))
    r = gr.evaluate(lambda x: x * 2, jnp.array([3.0]))
    assert not bool(r.ok) and int(r.code) == 42 and float(r.value) == 6.0
    assert guards.code_name(42) == "code 42"


def test_bad_guard_results_are_type_errors():
    with pytest.raises(TypeError, match="scalar bool"):
        guards.predicate(lambda out, x: out > 0).evaluate(jnp.sin, jnp.ones(3))
    with pytest.raises(TypeError, match=r"float\d+ scalar"):
        guards.predicate(lambda out, x: jnp.sum(out)).evaluate(jnp.sin, jnp.ones(3))
    with pytest.raises(TypeError, match="str"):
        guards.predicate(lambda out, x: "yes").evaluate(jnp.sin, jnp.ones(3))
    with pytest.raises(TypeError, match="must be a Guard"):
        guards.as_guard(3)
    with pytest.raises(ValueError, match="tol"):
        guards.condition(tol=-1)
    with pytest.raises(TypeError, match="callable"):
        guards.residual(1.0, tol=1.0)


def test_guards_under_jit_and_vmap():
    @jax.jit
    @jax.vmap
    def checks(x):
        f = guards.finite().evaluate(jnp.exp, x, dtype="f32")
        h = guards.headroom(0.5).evaluate(jnp.exp, x, dtype="f32")
        return f.ok, h.ok, f.code

    xs = jnp.array([[1.0, 2.0], [1.0, 100.0], [60.0, 88.0]])
    f_ok, h_ok, code = checks(xs)
    np.testing.assert_array_equal(np.asarray(f_ok), [True, False, True])
    # e^88 = 1.65e38 > 0.5 * f32 max = 1.7e38? no: 1.65e38 < 1.7e38 -> ok; inf -> not
    ref = np.exp(np.asarray(xs).max(1)) <= 0.5 * np.finfo(np.float32).max
    np.testing.assert_array_equal(np.asarray(h_ok), ref)
    np.testing.assert_array_equal(np.asarray(code), [0, 1, 0])

    mc = jax.vmap(lambda a: _solve_guard(MCOND, a, RHS, "f64").value)(jnp.stack([H8, WELL]))
    np.testing.assert_allclose(np.asarray(mc), [np.linalg.cond(np.asarray(H8), 1),
                                                np.linalg.cond(np.asarray(WELL), 1)],
                               rtol=0.67)


# ---- the solvers' per-evaluation tests (issue 13: nlsq's step runs these) ----------------

def test_finite_values_is_the_finite_guard_test():
    vals = (jnp.array([1.0, jnp.nan, jnp.inf]), jnp.float32(2.0), jnp.arange(3))  # ints ignored
    r = guards.finite_values(vals)
    g = guards.finite()(guards.GuardContext(None, (), {}, ((), {}), vals, jnp.float32,
                                            2.0 ** -24))
    assert (bool(r.ok), int(r.code), float(r.value)) == (bool(g.ok), int(g.code),
                                                         float(g.value)) == (False, 1, 2.0)
    ok = jax.jit(jax.vmap(lambda x: guards.finite_values((x, x.sum())).ok))(
        jnp.array([[1.0, 2.0], [1.0, jnp.nan]]))
    assert ok.tolist() == [True, False]


def test_conditioned_fires_above_tol_not_on_nan():
    u = 2.0 ** -53
    kappa = jnp.array([1.0, 1e12, 1e14, jnp.inf, jnp.nan])
    r = jax.jit(jax.vmap(lambda k: guards.conditioned(k, u, 1e-3)))(kappa)
    assert r.ok.tolist() == [True, True, False, False, True]
    assert r.code.tolist() == [0, 0, guards.ILL_CONDITIONED, guards.ILL_CONDITIONED, 0]
    m = guards.conditioned(1e14, u, 1e-3, guards.MATRIX_ILL_CONDITIONED)
    assert int(m.code) == guards.MATRIX_ILL_CONDITIONED


def test_guard_names_from_labels():
    names = [guards.finite().name, guards.headroom(0.25).name, guards.condition(0.1).name,
             guards.matrix_condition(1e-3).name, guards.residual(jnp.linalg.norm, 1e-6).name,
             guards.predicate(jnp.all).name, guards.accuracy(1e-3).name,
             guards.spot_check(1e-2, sample=4).name]
    assert names == ["finite", "headroom(0.25)", "condition(0.1)", "matrix_condition(0.001)",
                     "residual(norm, 1e-06)", "predicate(all)", "accuracy(0.001)",
                     "spot_check(0.01, sample=4)"]


@pytest.mark.parametrize("dtype", ["bf16", "f32"])
def test_headroom_fires_on_every_format_under_jit(dtype):
    # newcomer audit 3: m * (1 / max) used a subnormal constant that XLA:CPU flushes to 0,
    # so headroom never fired except on float16
    g = guards.headroom(0.5)
    value = jax.jit(lambda x: g.evaluate(lambda x: x * 1e38, x, dtype=dtype).value)(
        jnp.array([3.0]))
    assert 0.85 < float(value) < 0.9
    f = adaptive(lambda x: x * 1e38, ladder="bf16,f32", guards=[guards.headroom(0.5)])
    _, rep = f.with_report(jnp.array([3.0]))
    assert not bool(rep.ok)


@pytest.mark.parametrize("n", [1000, 2 ** 12, pytest.param(2 ** 16 + 8, marks=pytest.mark.slow), pytest.param(2 ** 18, marks=pytest.mark.slow)])  # 4096: where max dropped NaN
def test_finite_catches_one_nan_or_inf_in_a_large_array(n):
    # isfinite(max|x|) passed these: XLA:CPU's vectorized max drops NaN from 4096
    # entries on (issue 31); the check must be exact at every size, also under jit/vmap
    for dtype in (jnp.float32, jnp.bfloat16):
        ones = jnp.ones(n, dtype)
        for bad in (jnp.nan, jnp.inf):
            x = ones.at[n // 2 + 1].set(bad)
            r = jax.jit(guards.finite_values)(x)
            assert not bool(r.ok) and float(r.value) == 1.0    # (1000: counted directly)
            assert not bool(jax.jit(jax.vmap(lambda v: guards.finite_values(v).ok))(
                jnp.stack([ones, x]))[1])
        both = ones.at[0].set(jnp.inf).at[-1].set(-jnp.inf)
        assert not bool(guards.finite_values(both).ok)
        # the largest finite values do not overflow the check
        assert bool(guards.finite_values(jnp.full(n, jnp.finfo(dtype).max, dtype)).ok)
    # the adaptive runtime's finite guard: a NaN output escalates and is reported
    y, rep = jax.jit(adaptive(jnp.log, ladder="bf16,f32").with_report)(
        jnp.ones(n, jnp.float32).at[5].set(-1.0))
    assert rep.rung_name == "f32" and not bool(rep.ok) and rep.reason_name == "nonfinite"


def test_error_estimates_see_a_nan_in_a_large_array():
    # a NaN error (a sample, a bound or a reference entry) must fail the check at every
    # size: a plain max dropped it from 4096 entries on under XLA:CPU (issue 31)
    from adaptprec._first_order import relative_bound
    from adaptprec._sampled import error_of_samples
    n = 2 ** 13
    y = jnp.ones(n)
    bad = y.at[n // 2 + 1].set(jnp.nan)
    for cw in (False, True):
        assert np.isinf(float(jax.jit(_leaf_error, static_argnums=2)(
            y, [y, bad], cw)))
        assert np.isinf(float(jax.jit(relative_bound, static_argnums=2)(
            [y], [bad * 1e-9], cw)))
    assert np.isinf(float(jax.jit(error_of_samples)([y], [bad])))
    assert float(jax.jit(error_of_samples)([y], [y])) == 0.0


def test_headroom_backward_error_and_output_error_fail_on_a_nan_in_5000_entries():
    # each took a plain max over the output, which XLA:CPU's jit drops a NaN from at
    # 4096+ entries: the NaN output passed headroom and backward_error, and compared
    # equal to a finite reference in output_error (issue 31)
    n = 5000
    bad = jnp.ones(n).at[7].set(jnp.nan)
    r = jax.jit(lambda x: guards.headroom(0.5).evaluate(lambda y: y * 2.0, x,
                                                         dtype="f32"))(bad)
    assert not bool(r.ok) and guards.code_name(r.code) == "overflow"
    assert np.isinf(float(jax.jit(guards.output_error)([bad], [jnp.ones(n)])))
    # backward_error: the NaN also spreads through the residual's matmul, and that fused
    # max kept it before the fix too; this checks the guard still fails it
    a = jnp.eye(50) * 2.0
    b = jnp.ones((50, 100))                     # x of 5000 entries, one NaN
    x_bad = (b / 2.0).at[3, 7].set(jnp.nan)
    r = jax.jit(lambda a, b: guards.backward_error().evaluate(
        lambda A, B: x_bad, a, b, dtype="f64"))(a, b)
    assert not bool(r.ok) and np.isinf(float(r.value))
    assert bool(jax.jit(lambda a, b: guards.backward_error().evaluate(
        lambda A, B: B / 2.0, a, b, dtype="f64"))(a, b).ok)
