"""Accuracy guards (issue 12): a cheap result is either trustworthy or escalated.

The kernel suite (tests/accuracy_kernels.py) has known low-precision failures and benign
kernels; every answer of ``adaptive(fn, ladder="bf16,f32,f64", rtol=...)`` must be within
``rtol`` of the float64 reference, and no benign kernel may escalate.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import adaptprec as ap
from adaptprec import guards
from adaptprec._mca import mca_samples

from _subprocess import run_python
from accuracy_kernels import BENIGN, FAILING, gauss, reference, rel_error, softplus

RTOL = 1e-3           # failing suite: bf16 and f32 must prove 3 digits or escalate
BENIGN_RTOL = 3e-2    # benign suite: bf16 (u = 2^-8) meets it


def _run(fn, inputs, rtol, **kw):
    f = ap.adaptive(fn, ladder="bf16,f32,f64", rtol=rtol, **kw)
    return jax.jit(f.with_report)(*inputs)


# one kernel per failure mode in the default run, the rest of the suite in the slow one
@pytest.mark.parametrize("name", [pytest.param(k, marks=pytest.mark.slow)
                                  if k in ("naive_variance", "naive_sum", "ill_conditioned_solve", "quadratic")
                                  else k for k in FAILING])
def test_failing_kernels_escalate_to_an_accurate_answer(name):
    fn, make = FAILING[name]
    inputs = make(np.random.default_rng(0))
    y, rep = _run(fn, inputs, RTOL)
    ref = reference(fn, inputs)
    assert rel_error(y, ref) <= RTOL, (name, y, ref, rep.summary())
    assert bool(rep.ok) and int(rep.rung) > 0, rep.summary()
    # without the accuracy guard bf16 (or f32) returns a wrong answer and calls it finite
    if name not in ("overflow", "count", "argmax"):
        y0, rep0 = jax.jit(ap.adaptive(fn, ladder="bf16,f32,f64").with_report)(*inputs)
        assert rel_error(y0, ref) > RTOL and "finite only" in rep0.summary()


@pytest.mark.parametrize("name", [pytest.param(k, marks=pytest.mark.slow)
                                  if k in ("layernorm", "mlp") else k for k in BENIGN])
def test_benign_kernels_stay_on_bf16_and_are_accurate(name):
    fn, make = BENIGN[name]
    inputs = make(np.random.default_rng(1))
    y, rep = _run(fn, inputs, BENIGN_RTOL)
    assert int(rep.rung) == 0 and bool(rep.ok), rep.summary()
    assert rel_error(y, reference(fn, inputs)) <= BENIGN_RTOL
    assert "digits verified (rtol 0.03, normwise)" in rep.summary()


# one compiled guard for the property tests (shapes fixed, seed traced)
def _guard_fn(fn, rtol, dtype):
    g = guards.accuracy(rtol)

    @jax.jit
    def run(seed, x):
        cx = x.astype(dtype)
        out = fn(cx)
        ctx = guards.GuardContext(fn, (cx,), {}, ((x,), {}), out, np.dtype(dtype),
                                  ap.unit_roundoff(dtype))
        r = g.estimate(ctx, seed)
        return out, r.ok, r.value

    return run


_GAUSS = _guard_fn(gauss, BENIGN_RTOL, jnp.bfloat16)
_SOFTPLUS = _guard_fn(softplus, 1e-4, jnp.float32)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2 ** 31 - 1), scale=st.floats(0.1, 3.0))
def test_property_no_false_alarm_on_random_benign_inputs(seed, scale):
    rng = np.random.default_rng(seed)
    for run, fn, rtol in ((_GAUSS, gauss, BENIGN_RTOL), (_SOFTPLUS, softplus, 1e-4)):
        x = jnp.asarray(rng.normal(size=256) * scale, jnp.float32)
        y, ok, digits = run(jnp.uint32(seed), x)
        err = rel_error(y, reference(fn, (x,)))
        assert bool(ok), (fn.__name__, float(digits), err)
        assert 10.0 ** -float(digits) >= err    # the estimate bounds the true error


@pytest.mark.slow
def test_vmap_both_batch_modes():
    xs = jnp.asarray([10.0, 3.0, 1e-3, 7.0, 2e-3, 5.0, 4.0, 9.0], jnp.float32)
    fn = FAILING["cancellation"][0]
    ref = np.asarray(xs, np.float64)
    for batch in ("call", "element"):
        f = ap.adaptive(fn, ladder="bf16,f32,f64", rtol=1e-2, batch=batch, capacity=2)
        y, rep = jax.jit(jax.vmap(f.with_report))(xs)
        np.testing.assert_allclose(np.asarray(y), ref, rtol=1e-2)
        rungs = np.asarray(rep.rung)
        assert np.all(np.asarray(rep.ok))
        if batch == "element":       # only the cancelling elements escalate
            assert set(np.flatnonzero(rungs > 0)) == {2, 4}, rungs
        else:
            assert np.all(rungs == rungs[0]) and rungs[0] > 0
        assert "digits verified" in rep.summary()


@pytest.mark.slow
def test_grad_flows_through_the_chosen_rung_only():
    fn = lambda x: jnp.sum(jnp.exp(-x * x))            # noqa: E731 - benign
    f = ap.adaptive(fn, ladder="bf16,f32,f64", rtol=BENIGN_RTOL)
    x = jnp.linspace(-1.0, 1.0, 16, dtype=jnp.float32)
    g = jax.jit(jax.grad(f))(x)
    g_bf16 = jax.grad(lambda x: fn(x.astype(jnp.bfloat16)).astype(jnp.float32))(x)
    np.testing.assert_array_equal(np.asarray(g), np.asarray(g_bf16))
    # escalated: the derivative of the f32 rung, d/dx ((x + 1) - 1) = 1
    c = ap.adaptive(FAILING["cancellation"][0], ladder="bf16,f32,f64", rtol=RTOL)
    assert float(jax.jit(jax.grad(c))(jnp.float32(1e-3))) == 1.0
    # derivatives of vmapped calls, both batch modes (jax.grad of jax.vmap of an
    # adaptive function fails on main with any guard: JAX has no transpose for a
    # stop_gradient in the batched switch; vmap(grad) and jacfwd(vmap) work)
    for batch in ("call", "element"):
        h = ap.adaptive(FAILING["cancellation"][0], rtol=RTOL, batch=batch)
        xs = jnp.asarray([1e-3, 2.0, 3.0, 1e-3], jnp.float32)
        np.testing.assert_array_equal(np.asarray(jax.jit(jax.vmap(jax.grad(h)))(xs)), 1.0)
        jac = jax.jit(jax.jacfwd(jax.vmap(h)))(xs)
        np.testing.assert_array_equal(np.asarray(jac), np.eye(4))


def rump(a, b):
    return (333.75 * b ** 6 + a ** 2 * (11 * a ** 2 * b ** 2 - b ** 6 - 121 * b ** 4 - 2)
            + 5.5 * b ** 8 + a / (2 * b))


def muller(x0, x1, n=30):
    def body(i, c):
        a, b = c
        return b, 111.0 - 1130.0 / b + 3000.0 / (a * b)
    return jax.lax.fori_loop(0, n, body, (x0, x1))[1]


@pytest.mark.parametrize("fn,args,true", [
    pytest.param(rump, (77617.0, 33096.0), -0.827396059946821, marks=pytest.mark.slow),
    (muller, (2.0, -4.0), 6.0047028131881754),
])
def test_wrong_float64_answers_are_not_ok_on_the_top_rung(fn, args, true):
    args = tuple(jnp.float64(a) for a in args)
    y, rep = jax.jit(ap.adaptive(fn, ladder="f32,f64", rtol=RTOL).with_report)(*args)
    assert abs(float(y) - true) > 1.0          # float64 itself is wrong...
    assert rep.rung_name == "f64" and not bool(rep.ok)   # ...and says so
    assert "NOT OK" in rep.summary()
    y, rep = jax.jit(ap.adaptive(fn, ladder="f32,f64", rtol=RTOL,
                                 on_failure="nan").with_report)(*args)
    assert np.isnan(float(y))


def test_top_rung_passes_when_float64_is_right():
    y, rep = jax.jit(ap.adaptive(muller, ladder="f32,f64", rtol=RTOL).with_report)(
        jnp.float64(2.0), jnp.float64(-4.0), 5)
    assert rep.rung_name == "f64" and bool(rep.ok) and rep.digits > 8


def test_report_never_says_bare_ok():
    x = jnp.float32(1e-3)
    y, rep = ap.adaptive(FAILING["cancellation"][0], ladder="bf16,f32").with_report(x)
    assert rep.summary() == "bf16; finite only: accuracy not checked" and float(y) == 0.0
    assert np.isnan(rep.digits)
    y, rep = ap.adaptive(FAILING["cancellation"][0], ladder="bf16,f32",
                         rtol=1e-3).with_report(x)
    assert rep.summary().startswith("f32 after 1 escalation (bf16: accuracy(0.001) failed:"
                                    " cancellation")
    assert rep.summary().endswith("digits verified (rtol 0.001, normwise)") and 3 < rep.digits < 5
    _, rep = ap.adaptive(jnp.sin, ladder="bf16,f32",
                         guards=[guards.finite(), guards.backward_error(1.0, 0, 0)])\
        .with_report(jnp.ones((2, 2)))
    assert "accuracy not estimated" in rep.summary()


@pytest.mark.slow
def test_smoke_check_without_x64_is_honest():
    res = run_python("""
        import jax.numpy as jnp, adaptprec as ap
        f = lambda x: (x + 1.0) - 1.0
        y, rep = ap.adaptive(f, ladder="bf16,f32").with_report(jnp.float32(1e-3))
        print(float(y), rep.summary())
        y, rep = ap.adaptive(f, ladder="bf16,f32", rtol=1e-3).with_report(jnp.float32(1e-3))
        print(float(y), rep.summary())
    """, x64=False)
    assert res.returncode == 0, res.stderr
    first, second = res.stdout.strip().splitlines()
    assert first == "0.0 bf16; finite only: accuracy not checked"
    # f32 is the top rung without x64: checked by error-free transformations
    y2, summary = second.split(" ", 1)
    assert abs(float(y2) - 1e-3) <= 1e-3 * 1e-3
    assert summary.startswith("f32 after 1 escalation (bf16: accuracy(0.001) failed: "
                              "cancellation") and "digits verified (rtol 0.001, normwise)" in summary


def test_discrete_outputs_need_an_accuracy_guard():
    f = ap.adaptive(lambda x: jnp.sum(x > 1.0))
    with pytest.raises(TypeError, match=r"integer/bool output.*rtol="):
        f(jnp.ones(3))
    y = ap.adaptive(lambda x: jnp.sum(x > 1.0), rtol=1e-2)(jnp.full(100, 1.001))
    assert int(y) == 100


def test_argument_validation():
    with pytest.raises(ValueError, match="rtol"):
        guards.accuracy(0.0)
    with pytest.raises(ValueError, match="samples"):
        guards.accuracy(1e-3, samples=0)
    with pytest.raises(ValueError, match="either rtol= or an accuracy guard"):
        ap.adaptive(jnp.sin, guards=[guards.accuracy(1e-3)], rtol=1e-3)
    with pytest.raises(ValueError, match="sample"):
        guards.spot_check(1e-3, sample=0)
    mgr = ap.MixedPrecisionManager("bf16,f32", rtol=1e-3)
    assert mgr.guard_names == ("finite", "accuracy(0.001)")


def test_componentwise_catches_a_small_element_lost_in_the_norm():
    fn = lambda x: (x + 1.0) - 1.0                       # noqa: E731
    x = jnp.asarray([5.0, 1e-2], jnp.float32)             # 1e-2 loses its digits in bf16
    norm = guards.accuracy(5e-2).evaluate(fn, x, dtype="bf16")
    comp = guards.accuracy(5e-2, componentwise=True).evaluate(fn, x, dtype="bf16")
    assert not bool(comp.ok) and float(comp.value) < float(norm.value)


def test_samples_are_deterministic_and_stop_gradients():
    x = jnp.linspace(0.1, 1.0, 8, dtype=jnp.float32)
    f = jnp.tanh
    r1 = mca_samples(f, (x.astype(jnp.bfloat16),), {}, ((x,), {}), jnp.bfloat16, 2)
    r2 = mca_samples(f, (x.astype(jnp.bfloat16),), {}, ((x,), {}), jnp.bfloat16, 2)
    np.testing.assert_array_equal(np.asarray(r1.samples[0][0]),
                                  np.asarray(r2.samples[0][0]))
    assert not np.array_equal(np.asarray(r1.samples[0][0]), np.asarray(r1.samples[1][0]))
    g = jax.grad(lambda x: mca_samples(f, (x,), {}, ((x,), {}), jnp.float32, 2)
                 .samples[0][0].sum())(x)
    np.testing.assert_array_equal(np.asarray(g), 0.0)


@pytest.mark.slow
def test_spot_check_under_vmap():
    fn = lambda x: jnp.sum(x) - 1e4                      # noqa: E731 - accumulation
    f = ap.adaptive(fn, ladder="bf16,f32", batch="element",
                    guards=[guards.finite(), guards.spot_check(1e-2, sample=4)])
    bad = jnp.full((32, 1000), 10.0001, jnp.float32)
    y, rep = jax.jit(jax.vmap(f.with_report))(bad)
    assert np.all(np.asarray(rep.rung) == 1)             # the sample says: escalate all
    np.testing.assert_allclose(np.asarray(y), 0.1, rtol=0.1)
    ok_in = jnp.ones((32, 1000), jnp.float32) * 0.5        # bf16 sums this exactly
    g = ap.adaptive(lambda x: jnp.sum(x), ladder="bf16,f32", batch="element",
                    guards=[guards.finite(), guards.spot_check(1e-2, sample=4)])
    _, rep = jax.jit(jax.vmap(g.with_report))(ok_in)
    assert np.all(np.asarray(rep.rung) == 0)
    assert "spot-checked against the next rung (rtol 0.01)" in rep.summary()


@pytest.mark.slow
def test_softmax_shift_and_ties_are_not_cancellations():
    f = ap.adaptive(lambda x: jax.nn.softmax(x, axis=-1), ladder="f32,f64", rtol=1e-3)
    for x in (jnp.zeros((2, 4), jnp.float32),                        # exact ties
              jnp.asarray([[1.0, 1.0 + 1e-6, 1.0, 0.5]], jnp.float32)):  # near ties
        y, rep = jax.jit(f.with_report)(x)
        assert rep.rung_name == "f32" and bool(rep.ok), rep.summary()


@pytest.mark.parametrize("fn, x, truth", [
    (lambda x: x * 1.0, jnp.array([1.003]), 1.003),                  # input cast sticks
    (lambda x: jnp.sum(x), jnp.full((10000,), 1.0001), 10001.0),     # samples round alike
])
def test_a_rung_coarser_than_rtol_never_passes(fn, x, truth):
    # newcomer audit: every Monte Carlo sample rounded the same way, the estimate was 0
    # and bfloat16 (u = 2^-8) was "verified" at rtol=1e-4 with a true error of 2e-3
    y, rep = _run(fn, (x,), 1e-4)
    assert int(rep.rung) > 0, rep.summary()
    assert bool(rep.ok) and rel_error(y, np.asarray([truth])) <= 1e-4, rep.summary()
    # the guard alone: bfloat16 cannot carry 1e-4, whatever the samples say
    r = guards.accuracy(rtol=1e-4).evaluate(fn, x, dtype="bf16")
    assert not bool(r.ok)


@pytest.mark.slow
def test_a_top_rung_zero_from_cancellation_is_not_verified():
    # newcomer audit 7: with x64 off (float32 the top rung, nothing wider to round from),
    # a naive variance mean(x^2) - mean(x)^2 of 64 values around 8185 came back 0.0 (true
    # 1.04), "ok, ~7.2 digits verified"
    from _subprocess import run_python

    proc = run_python("""
    import jax, numpy as np, jax.numpy as jnp, adaptprec as ap
    rng = np.random.default_rng(0)
    means = np.concatenate([np.logspace(0, 4.5, 24)] * 2)
    x = (rng.standard_normal((48, 64)) + means[:, None]).astype(np.float32)[20]
    var = ap.adaptive(lambda x: jnp.mean(x * x) - jnp.mean(x) ** 2, ladder="bf16,f32",
                      rtol=1e-2)
    true = np.var(x.astype(np.float64))
    for data in (x, x - np.float32(8185.0)):   # the second is well conditioned
        y, rep = jax.jit(var.with_report)(jnp.asarray(data))
        print(float(y) == 0.0, bool(rep.ok), abs(float(y) - true) <= 1e-2 * true)
    """, x64=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    zero, well = (line.split() for line in proc.stdout.strip().splitlines())
    assert zero[0] == "True" and zero[1] == "False", zero     # 0.0: not verified
    assert well == ["False", "True", "True"], well


def test_guards_check_the_value_returned_not_the_rung_output():
    # newcomer audit 3: the guards checked the rung's output before its cast to the output
    # dtype: exp(100) escalated to float64, came back as float32 inf with ok=True; a float32
    # result "verified to 1e-6" was returned as bfloat16 with an error of 3e-3
    y, rep = jax.jit(ap.adaptive(jnp.exp, ladder="f32,f64", rtol=1e-3).with_report)(
        jnp.array([1.0, 100.0], jnp.float32))
    assert not np.all(np.isfinite(np.asarray(y))) and not bool(rep.ok), rep.summary()
    _, rep = ap.adaptive(lambda x: x * 1.001, ladder="f16,f32", rtol=1e-6).with_report(
        jnp.linspace(0.1, 1.0, 16).astype(jnp.bfloat16))
    assert not bool(rep.ok), rep.summary()


def test_no_cancellation_label_without_cancellation():
    # newcomer audit 3: every add carries u, so x + 1 at x = 1 was called a cancellation
    _, rep = ap.adaptive(lambda x: x + 1.0, ladder="bf16,f32", rtol=1e-3).with_report(
        jnp.float32(1.0))
    assert "cancellation" not in rep.summary() and bool(rep.ok)


def test_config_mistakes_are_named_before_the_x64_check():
    # newcomer audit 3: with x64 off the default ladder's float64 error hid the mistake;
    # an uncalled guard factory failed at call time with "takes 0 positional arguments"
    with jax.enable_x64(False):
        for kw, match in ((dict(batch="elem"), "batch"), (dict(capacity=0), "capacity"),
                          (dict(on_failure="warn"), "on_failure"),
                          (dict(guards="finite"), "guards must be")):
            with pytest.raises((ValueError, TypeError), match=match):
                ap.adaptive(jnp.exp, **kw)
        with pytest.raises(TypeError, match="adaptive wraps a callable"):
            ap.adaptive(3)
    with pytest.raises(TypeError, match=r"call it, e.g. guards.finite\(\)"):
        ap.adaptive(jnp.exp, ladder="bf16,f32", guards=[guards.finite])
