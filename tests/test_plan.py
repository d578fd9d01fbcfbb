"""The cost model's plans (issue 31): cheaper checks, skipped rungs, unchanged trust.

Kernels here are big enough (2^16 entries) that the plan is chosen by cost, not the
"small kernel" rule that keeps every rung with Monte Carlo checks.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import adaptprec as ap
from adaptprec._first_order import Unsupported, first_order, relative_bound
from adaptprec._sampled import is_entrywise, sampled_error
from adaptprec._screen import cancellation_screen
from adaptprec.guards import finite_values

from accuracy_kernels import BENIGN, FAILING, reference, rel_error

N = 2 ** 16


def _bound(fn, inputs, dtype):
    cargs = tuple(x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x
                  for x in inputs)

    @jax.jit
    def run(*a):
        r = first_order(fn, a, {}, (inputs, {}), dtype)
        return r.outs, relative_bound(r.outs, r.errs), r.unstable

    return run(*cargs)


@pytest.mark.parametrize("name", ["gauss", "mlp", pytest.param("layernorm", marks=pytest.mark.slow), pytest.param("softplus", marks=pytest.mark.slow)])
def test_first_order_bound_covers_the_true_error(name):
    fn, make = BENIGN[name]
    inputs = make(np.random.default_rng(3))
    ref = reference(fn, inputs)
    for dtype in (jnp.bfloat16, jnp.float32):
        outs, est, unstable = _bound(fn, inputs, dtype)
        err = rel_error(np.asarray(outs[0], np.float64), ref)
        assert float(unstable) == 0
        assert err <= float(est), (name, dtype, err, float(est))


@pytest.mark.parametrize("name", ["cancellation", "naive_variance", "quadratic",
                                  "naive_sum"])
def test_first_order_bound_sees_the_failures(name):
    fn, make = FAILING[name]
    inputs = make(np.random.default_rng(0))
    ref = reference(fn, inputs)
    outs, est, _ = _bound(fn, inputs, jnp.bfloat16)
    err = rel_error(np.asarray(outs[0], np.float64), ref)
    assert err > 1e-3 and float(est) >= err, (name, err, float(est))


@pytest.mark.parametrize("name", ["count", "argmax"])
def test_first_order_flags_near_decisions(name):
    fn, make = FAILING[name]
    inputs = make(np.random.default_rng(0))
    _, _, unstable = _bound(fn, inputs, jnp.bfloat16)
    assert float(unstable) > 0


def test_cancellation_screen_and_entrywise_detection():
    x = jnp.full(8, 1e-3, jnp.float64)
    ratio, zero = jax.jit(lambda x: cancellation_screen(
        lambda x: (x + 1.0) - 1.0, (x,), {}, jnp.float64))(x)
    assert 1e-14 < float(ratio) < 1e-12 and not bool(zero)
    avals = (jax.ShapeDtypeStruct((8,), jnp.float32),)
    assert is_entrywise(lambda x: [jnp.exp(x) * 2.0], avals)
    assert not is_entrywise(lambda x: [jnp.cumsum(x)], avals)
    assert not is_entrywise(lambda x: [x - jnp.mean(x)], avals)


def test_sampled_error_measures_the_rung():
    x = jnp.linspace(1e-5, 2e-5, N, dtype=jnp.float64)
    fn = FAILING["cancellation"][0]
    y32 = fn(x.astype(jnp.float32))
    err = sampled_error(fn, (x.astype(jnp.float32),), {}, ((x,), {}), [y32],
                        [jnp.float64], jnp.float64)
    true = rel_error(y32.astype(jnp.float64), np.asarray(fn(x)))
    assert 0.1 * true <= float(err) <= true


def test_finite_values_by_max_still_counts():
    r = finite_values((jnp.array([1.0, jnp.inf, 2.0]), jnp.array([jnp.nan, -jnp.inf])))
    assert not bool(r.ok) and float(r.value) == 3.0
    r = finite_values(jnp.zeros((0,)))
    assert bool(r.ok)


def _big_elementwise(x):
    return jnp.exp(x) * jnp.cos(x) + jnp.log1p(x)


@pytest.mark.slow
def test_a_big_kernel_gets_a_costed_plan_and_says_so():
    x = jnp.asarray(np.random.default_rng(0).uniform(0.0, 2.0, N))
    f = ap.adaptive(_big_elementwise, rtol=1e-3)
    y, rep = jax.jit(f.with_report)(x)
    assert rel_error(y, np.asarray(_big_elementwise(x))) <= 1e-3
    assert bool(rep.ok)
    # bf16 (u = 2^-8 > rtol) is skipped a priori, and the report says so
    assert rep.checks[0] == "skipped" and "a-priori" in rep.plan[0]
    assert np.all(np.asarray(rep.codes)[0] == -1)
    assert "[plan:" in rep.summary() and len(rep.plan) == 3
    assert rep.checks[2] in ("mca", "first_order", "screen", "none")
    if rep.rung_name == "f32":
        assert rep.checks[1] in ("sample", "first_order", "mca")
        assert "verified" in rep.verified
    assert int(rep.escalations) <= int(rep.rung)
    # the thorough plan is still there
    _, rep_all = jax.jit(ap.adaptive(_big_elementwise, rtol=1e-3, plan="all").with_report)(x)
    assert rep_all.checks == ("mca", "mca", "mca") and "[plan:" not in rep_all.summary()


@pytest.mark.slow
def test_a_big_failing_kernel_still_escalates():
    # (x + 1) - 1 at x ~ 1e-5: float32 keeps ~2 digits, rtol asks for 3
    x = jnp.asarray(np.random.default_rng(1).uniform(1e-5, 2e-5, N))
    fn = FAILING["cancellation"][0]
    y, rep = jax.jit(ap.adaptive(fn, rtol=1e-3).with_report)(x)
    assert rel_error(y, np.asarray(x)) <= 1e-3, rep.summary()
    assert rep.rung_name == "f64"
    # a naive variance (not entrywise): the first-order bound sees the cancellation
    v = jnp.asarray(1000.0 + np.sin(np.arange(N)), jnp.float64)
    var = FAILING["naive_variance"][0]
    y, rep = jax.jit(ap.adaptive(var, rtol=1e-3).with_report)(v)
    assert rel_error(y, np.asarray(var(v))) <= 1e-3 and rep.rung_name == "f64"


def test_small_kernels_keep_every_rung_and_monte_carlo():
    fn, make = BENIGN["gauss"]
    _, rep = jax.jit(ap.adaptive(fn, rtol=3e-2).with_report)(*make(
        np.random.default_rng(0)))
    assert rep.checks == ("mca", "mca", "mca") and "small kernel" in rep.plan[0]


@pytest.mark.slow
def test_never_verified_when_float64_is_wrong_at_scale():
    # Rump's polynomial on many copies: float64 is wrong; the report must not call it
    # verified (not ok, or "accuracy not checked" when no check fits the budget)
    def rump(a, b):
        return (333.75 * b ** 6 + a ** 2 * (11 * a ** 2 * b ** 2 - b ** 6 - 121 * b ** 4
                                            - 2) + 5.5 * b ** 8 + a / (2 * b))
    a = jnp.full(N, 77617.0, jnp.float64)
    b = jnp.full(N, 33096.0, jnp.float64)
    y, rep = jax.jit(ap.adaptive(rump, ladder="f32,f64", rtol=1e-3).with_report)(a, b)
    assert abs(float(y[0]) + 0.827396059946821) > 1.0
    assert (not bool(rep.ok)) or "not checked" in rep.summary(), rep.summary()


@pytest.mark.slow
def test_plan_under_vmap_and_grad():
    x = jnp.asarray(np.random.default_rng(2).uniform(0.0, 2.0, (8, N // 8)))
    f = ap.adaptive(_big_elementwise, rtol=1e-3)
    y, rep = jax.jit(jax.vmap(f.with_report))(x)
    assert rel_error(y, np.asarray(_big_elementwise(x))) <= 1e-3
    assert rep.batch_shape == (8,) and np.all(np.asarray(rep.ok))
    # the derivative is the chosen rung's
    _, rep0 = jax.jit(f.with_report)(x[0])
    dt = {"f32": jnp.float32, "f64": jnp.float64}[rep0.rung_name]
    g = jax.jit(jax.grad(lambda x: jnp.sum(f(x))))(x[0])
    g_ref = jax.grad(lambda x: jnp.sum(_big_elementwise(x.astype(dt)).astype(x.dtype)))(
        x[0])
    np.testing.assert_allclose(np.asarray(g), np.asarray(g_ref), rtol=1e-5, atol=1e-6)


def test_plan_argument_is_validated():
    with pytest.raises(ValueError, match="plan must be"):
        ap.adaptive(jnp.sin, rtol=1e-3, plan="fast")


@pytest.mark.parametrize("spec, sa, sb", [
    ("bij,bjk->bik", (3, 16, 32), (3, 32, 8)), ("ij,kj->ik", (16, 32), (8, 32)),
    pytest.param("jb,bk->kj", (32, 4), (4, 16), marks=pytest.mark.slow),
    pytest.param("bji,bjk->bki", (2, 32, 5), (2, 32, 7), marks=pytest.mark.slow)])
def test_first_order_contraction_bound_per_entry(spec, sa, sb):
    # Cauchy-Schwarz per output entry, for any dimension numbers (batch, contracting
    # and free axes in any order): the bf16 product's error is below the bound entrywise
    rng = np.random.default_rng(0)
    a, b = jnp.asarray(rng.normal(size=sa)), jnp.asarray(rng.normal(size=sb))
    f = lambda a, b: jnp.einsum(spec, a, b)                # noqa: E731
    r = first_order(f, (a.astype(jnp.bfloat16), b.astype(jnp.bfloat16)), {},
                    ((a, b), {}), jnp.bfloat16)
    y, e = np.asarray(r.outs[0], np.float64), np.asarray(r.errs[0])
    assert e.shape == y.shape
    assert np.all(np.abs(y - np.asarray(f(a, b))) <= e)


def test_first_order_convolution_bound_per_entry():
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.normal(size=(2, 16, 16, 8)))
    k = jnp.asarray(rng.normal(size=(3, 3, 8, 4)) / 8)

    def f(x, k):
        return jax.lax.conv_general_dilated(x, k, (1, 1), "SAME",
                                            dimension_numbers=("NHWC", "HWIO", "NHWC"))

    r = first_order(f, (x.astype(jnp.bfloat16), k.astype(jnp.bfloat16)), {},
                    ((x, k), {}), jnp.bfloat16)
    y, e = np.asarray(r.outs[0], np.float64), np.asarray(r.errs[0])
    assert e.shape == y.shape and np.all(np.abs(y - np.asarray(f(x, k))) <= e)


# ------------------------------------------------------------- row-sampled check


def _attention(q, k, v):
    s = q @ k.T / 8.0
    return jax.nn.softmax(s, axis=-1) @ v


def test_row_separability_is_structural():
    from adaptprec._rowwise import row_inputs

    def rows(fn, *shapes):
        avals = [jax.ShapeDtypeStruct(s, jnp.float32) for s in shapes]
        return row_inputs(lambda *a: jax.tree_util.tree_leaves(fn(*a)), avals)

    b = 256
    # attention: separable in its queries only (keys have the same shape)
    assert rows(_attention, (b, 64), (b, 64), (b, 64)) == (True, False, False)
    assert rows(lambda x, w: jnp.tanh(x @ w + 1.0), (b, 32), (32, 16)) == (True, False)
    assert rows(lambda x: x - x.mean(axis=1, keepdims=True), (b, 8)) == (True,)
    # rows mixed: a sum over rows, a Gram matrix, a cumulative sum down the rows,
    # the row's position (iota), too few rows to sample
    assert rows(lambda x: x - x.mean(axis=0), (b, 8)) is None
    assert rows(lambda x: x.T @ x, (b, b)) is None
    assert rows(lambda x: jnp.cumsum(x, axis=0), (b, 8)) is None
    assert rows(lambda x: x * jnp.arange(b)[:, None], (b, 8)) is None
    assert rows(lambda x: x * 2.0, (8, 8)) is None


def _guard_on(fn, inputs, dtype, check):
    from adaptprec.guards import GuardContext
    from adaptprec.precision import unit_roundoff
    g = ap.guards.accuracy(1e-3)
    cargs = tuple(x.astype(dtype) for x in inputs)
    out = fn(*cargs)
    ctx = GuardContext(fn, cargs, {}, (inputs, {}), out, dtype, unit_roundoff(dtype), 0,
                       cast_out=(out.astype(jnp.float64),), check=check)
    return g(ctx)


def test_sampled_rows_check_passes_right_rows_and_fails_wrong_ones():
    rng = np.random.default_rng(4)
    q, k, v = (jnp.asarray(rng.normal(size=(256, 64))) for _ in range(3))
    r = jax.jit(lambda *a: _guard_on(_attention, a, jnp.float32, "sample_rows"))(q, k, v)
    assert bool(r.ok)
    # rows cancelled in float32: exp(x @ w) - 1 with x @ w ~ 1e-5 (XLA simplifies
    # (a + 1) - 1 to a)

    def cancel(x, w):
        return jnp.exp(x @ w) - 1.0
    x = jnp.asarray(rng.uniform(1e-6, 2e-6, (256, 8)))
    w = jnp.asarray(rng.uniform(1.0, 2.0, (8, 4)))
    r = jax.jit(lambda *a: _guard_on(cancel, a, jnp.float32, "sample_rows"))(x, w)
    assert not bool(r.ok)


@pytest.mark.slow
def test_a_row_sampled_plan_escalates_when_its_rung_is_wrong():
    rng = np.random.default_rng(5)

    def cancel(x, w):
        return jnp.exp(jnp.tanh(x @ w)) - 1.0
    x = jnp.asarray(rng.uniform(1e-6, 2e-6, (2048, 64)))
    w = jnp.asarray(rng.uniform(1.0, 2.0, (64, 64)))
    y, rep = jax.jit(ap.adaptive(cancel, rtol=1e-3).with_report)(x, w)
    assert rep.checks[1] == "sample_rows", rep.plan
    assert rep.rung_name == "f64" and rel_error(y, np.asarray(cancel(x, w))) <= 1e-3
    # a benign one is accepted on float32, and the report says "sampled rows"
    x = jnp.asarray(rng.normal(size=(2048, 256)))      # big enough for float32 to pay
    w = jnp.asarray(rng.uniform(1.0, 2.0, (256, 256)))
    y, rep = jax.jit(ap.adaptive(lambda x, w: jnp.tanh(x @ w), rtol=1e-3).with_report)(
        x, w / 64)
    assert rep.checks[1] == "sample_rows" and rep.rung_name == "f32", rep.summary()
    assert "sampled rows" in rep.verified


# ------------------------------------------------------- sampled convolution check


def _conv_nhwc(x, w):
    return jax.lax.conv_general_dilated(x, w, (1, 1), "SAME",
                                        dimension_numbers=("NHWC", "HWIO", "NHWC"))


def _diff_conv(x, w):      # a 1-D convolution whose kernel [1, -1] cancels on smooth x
    return jax.lax.conv_general_dilated(x, w, (1,), "VALID",
                                        dimension_numbers=("NWC", "WIO", "NWC"))


def test_convolution_structure_is_decided_on_the_jaxpr():
    from adaptprec._convsample import conv_kernel

    def conv_of(fn, *shapes):
        avals = [jax.ShapeDtypeStruct(s, jnp.float64) for s in shapes]
        return conv_kernel(lambda *a: jax.tree_util.tree_leaves(fn(*a)), avals)

    xs, ws = (2, 8, 8, 3), (3, 3, 3, 4)
    ck = conv_of(_conv_nhwc, xs, ws)
    assert ck is not None and (ck.lhs, ck.rhs) == (0, 1)
    assert conv_of(lambda w, x: _conv_nhwc(x, w), ws, xs)[:2] == (1, 0)
    assert conv_of(lambda x, w: _conv_nhwc(x.astype(jnp.float32), w.astype(jnp.float32)),
                   xs, ws) is not None
    # anything else around it, grouped convolutions, one input twice: not one convolution
    assert conv_of(lambda x, w: jnp.tanh(_conv_nhwc(x, w)), xs, ws) is None
    assert conv_of(lambda x, w: _conv_nhwc(x * 2.0, w), xs, ws) is None
    assert conv_of(lambda x: _conv_nhwc(x, x), (3, 3, 3, 3)) is None
    assert conv_of(lambda x, w: jax.lax.conv_general_dilated(
        x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"),
        feature_group_count=3), xs, (3, 3, 1, 3)) is None


def test_sampled_conv_check_passes_right_outputs_and_fails_wrong_ones():
    rng = np.random.default_rng(6)
    x = jnp.asarray(rng.normal(size=(4, 32, 32, 8)))
    w = jnp.asarray(rng.normal(size=(3, 3, 8, 8)) / 8)
    r = jax.jit(lambda *a: _guard_on(_conv_nhwc, a, jnp.float32, "sample_conv"))(x, w)
    assert bool(r.ok)
    # every position of x = 1e4 + 1e-3 noise cancels in float32 (its spacing at 1e4 is
    # 1e-3): the sampled positions see it
    x = jnp.asarray(1e4 + 1e-3 * rng.random((4, 4096, 1)))
    w = jnp.asarray(np.array([1.0, -1.0]).reshape(2, 1, 1))
    r = jax.jit(lambda *a: _guard_on(_diff_conv, a, jnp.float32, "sample_conv"))(x, w)
    assert not bool(r.ok)


def test_a_conv_sampled_plan_escalates_when_its_rung_is_wrong():
    rng = np.random.default_rng(7)
    m = rng.normal(size=(128, 128)) / 11   # (enough channels for the f32 rung to pay)
    w = jnp.asarray(np.stack([m, -m]))               # sum_c m (x[t] - x[t+1]): cancels
    x = jnp.asarray(1e4 + 1e-3 * rng.random((2, 4096, 128)))
    f = ap.adaptive(_diff_conv, rtol=1e-3)
    y, rep = jax.jit(f.with_report)(x, w)
    assert rep.checks[1] == "sample_conv", rep.plan
    assert rep.rung_name == "f64" and rel_error(y, np.asarray(_diff_conv(x, w))) <= 1e-3
    # a benign one is accepted on float32, and the report says "sampled"
    x = jnp.asarray(rng.normal(size=(2, 4096, 128)))
    y, rep = jax.jit(f.with_report)(x, w)
    assert rep.checks[1] == "sample_conv" and rep.rung_name == "f32", rep.summary()
    assert "sampled output positions" in rep.verified
    assert rel_error(y, np.asarray(_diff_conv(x, w))) <= 1e-3


# ------------------------------------------------------------- products: probes


def _matpow8(a):
    a2 = a @ a
    a4 = a2 @ a2
    return a4 @ a4


def test_matrix_product_structure_is_decided_on_the_jaxpr():
    from adaptprec._probe import product_jaxpr

    def product(fn, *shapes):
        return product_jaxpr(jax.make_jaxpr(fn)(*[jnp.ones(s) for s in shapes]))

    assert product(_matpow8, (8, 8))
    assert product(lambda a, b, c: a @ b.T * 2.0 - c, (8, 4), (6, 4), (8, 6))
    assert product(lambda a, x: a @ (a @ x), (8, 8), (8,))
    assert not product(lambda a: jnp.tanh(a) @ a, (8, 8))          # not a product
    assert not product(lambda a: a @ a + 1.0, (8, 8))              # a constant added
    assert not product(lambda a: (a @ a) * a, (8, 8))              # entrywise product
    assert not product(lambda a: jnp.einsum("bij,bjk->bik", a, a), (2, 8, 8))


@pytest.mark.slow
def test_probe_check_measures_a_chained_product():
    # A^8 with ||A||_2 = 1: float32 is right to ~1e-6, the first-order bound says ~1e-3;
    # the probes see the actual error (within a few times) and bfloat16's failure
    a = np.random.default_rng(8).normal(size=(256, 256))
    a = jnp.asarray(a / np.linalg.norm(a, 2))
    truth = {}
    for dt in (jnp.float32, jnp.bfloat16):
        y = np.asarray(jax.jit(_matpow8)(a.astype(dt)), np.float64)
        truth[dt] = rel_error(y, np.asarray(_matpow8(a)))
        r = jax.jit(lambda a: _guard_on(_matpow8, (a,), dt, "probe"))(a)
        est = 10.0 ** -float(r.value)
        assert bool(r.ok) == (dt == jnp.float32), (dt, est, truth[dt])
        assert truth[dt] / 3 <= est <= 10 * truth[dt], (dt, est, truth[dt])
    y, rep = jax.jit(ap.adaptive(_matpow8, rtol=1e-3).with_report)(a)
    assert rep.rung_name == "f32" and rep.checks[1] == "probe", rep.summary()
    assert "random probes" in rep.verified and rel_error(y, np.asarray(_matpow8(a))) < 1e-3


# ------------------------------------------------------------ the plan: no timings


def test_the_plan_reads_no_clock():
    # same inputs, same bits: the plan is a function of kernel, shapes, backend and the
    # cost table (the subprocess test below runs it beside a busy process)
    import inspect

    from adaptprec import _cost, _outcomes, _plan, _program, runtime
    for module in (_cost, _plan, _program, _outcomes, runtime):
        source = inspect.getsource(module)
        assert "perf_counter" not in source and "import time" not in source, module
    x = jnp.asarray(np.random.default_rng(0).uniform(0.0, 2.0, N))
    _, rep = jax.jit(ap.adaptive(_big_elementwise, rtol=1e-3).with_report)(x)
    assert "modelled" in rep.plan[2] and "measured" not in " ".join(rep.plan)


def test_a_lower_rung_is_priced_with_its_chance_of_failing():
    from adaptprec import _plan

    def plan(p_fail):
        from adaptprec._program import _Program
        x = (jax.ShapeDtypeStruct((N,), jnp.float64),)
        f = ap.adaptive(_big_elementwise, rtol=1e-3)
        _, tree = jax.tree_util.tree_flatten(((x[0],), {}))
        p = _Program(f.manager, _big_elementwise, tree, (0,), (), 1)
        return _plan.choose_plan(3, tuple(f.manager.ladder), 1e-3, p._rung_fn,
                                 p._check_fn, x, p_fail=p_fail)

    tried = plan(None)
    assert tried.attempt[1] and "a priori" not in tried.note[1], tried.note
    skipped = plan((0.0, 0.95, 0.0))
    assert not skipped.attempt[1] and "95% chance of failing" in skipped.note[1]
    assert "learned from this kernel's eager calls" in skipped.note[1]


@pytest.mark.slow
def test_same_bits_with_a_busy_process_beside():
    # issue 46 item 6: a quiet and a loaded run of the same program give the same bits
    from _subprocess import run_python
    code = """
        import hashlib, sys
        import jax, jax.numpy as jnp, numpy as np
        sys.path.insert(0, "tests")
        import adaptprec as ap
        import accuracy_kernels as K
        rng = np.random.default_rng(0)
        runs = [(K.sin_mean, (rng.normal(size=2 ** 18),), 1e-3),
                (K.layernorm, (rng.normal(size=(1024, 256)),), 1e-3),
                (K.gauss, (rng.uniform(-2, 2, 2 ** 18),), 1e-3)]
        h = hashlib.sha256()
        for fn, xs, rtol in runs:
            x = [jnp.asarray(v) for v in xs]
            y, rep = jax.jit(ap.adaptive(fn, rtol=rtol).with_report)(*x)
            h.update(np.asarray(y).tobytes()); h.update(str(rep.checks).encode())
        print(h.hexdigest())
    """
    quiet = run_python(code)
    import subprocess
    import sys
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        loaded = run_python(code)
    finally:
        for b in busy:
            b.kill()
            b.wait()
    assert quiet.returncode == 0 and loaded.returncode == 0, quiet.stderr + loaded.stderr
    assert quiet.stdout.split()[-1] == loaded.stdout.split()[-1]
