"""autocast: accuracy against float32/float64 references, the transformed jaxpr's dtypes
and casts, control flow, custom derivatives, grad/vmap/jit, adaptive() rungs."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.extend.core import ClosedJaxpr, Jaxpr

import adaptprec as ap
from adaptprec import OpKind

BF16_TOL = 3e-2  # a few bfloat16 unit roundoffs (u = 2^-8 ~ 3.9e-3) times the depth
F16_TOL = 5e-3


# ----------------------------------------------------------------------------- helpers
def all_eqns(jaxpr):
    """Every equation of a (closed) jaxpr, recursing into sub-jaxprs of any parameter."""
    jaxpr = jaxpr.jaxpr if isinstance(jaxpr, ClosedJaxpr) else jaxpr
    out = []

    def subs(v):
        if isinstance(v, (Jaxpr, ClosedJaxpr)):
            yield v
        elif isinstance(v, (tuple, list)):
            for x in v:
                yield from subs(x)

    for eqn in jaxpr.eqns:
        out.append(eqn)
        for v in eqn.params.values():
            for sub in subs(v):
                out.extend(all_eqns(sub))
    return out


def n_converts(closed) -> int:
    return sum(e.primitive.name == "convert_element_type" for e in all_eqns(closed))


def rel_err(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


# ----------------------------------------------------------------------------- models
def layernorm(h, g, b):
    mu = jnp.mean(h, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(h - mu), axis=-1, keepdims=True)
    return (h - mu) * lax.rsqrt(var + 1e-5) * g + b


def mlp(params, x):
    h = x
    for w, b, g, beta in params["layers"]:
        h = jax.nn.gelu(layernorm(h @ w + b, g, beta))
    return jax.nn.softmax(h @ params["out"], axis=-1)


def mlp_loss(params, x, labels):
    p = mlp(params, x)
    return -jnp.mean(jnp.log(jnp.take_along_axis(p, labels[:, None], axis=1)))


def make_mlp(seed, dtype=np.float32, width=32, depth=2, n_in=16, n_out=10, batch=8):
    rng = np.random.default_rng(seed)
    layers, fan = [], n_in
    for _ in range(depth):
        w = rng.standard_normal((fan, width)) / np.sqrt(fan)
        b = 0.1 * rng.standard_normal(width)
        layers.append(tuple(jnp.asarray(t, dtype) for t in
                            (w, b, np.ones(width), np.zeros(width))))
        fan = width
    out = jnp.asarray(rng.standard_normal((width, n_out)) / np.sqrt(width), dtype)
    x = jnp.asarray(rng.standard_normal((batch, n_in)), dtype)
    labels = jnp.asarray(rng.integers(0, n_out, batch), jnp.int32)
    return {"layers": layers, "out": out}, x, labels


def ode_rk4(y0, a, h, n: int = 100):
    """y' = A tanh(y) - y/2, classical RK4 with a lax.scan over n steps."""
    def f(y):
        return a @ jnp.tanh(y) - 0.5 * y

    def step(y, _):
        k1 = f(y)
        k2 = f(y + 0.5 * h * k1)
        k3 = f(y + 0.5 * h * k2)
        k4 = f(y + h * k3)
        return y + (h / 6.0) * (k1 + 2.0 * k2 + 2.0 * k3 + k4), None

    return lax.scan(step, y0, None, length=n)[0]


def fixed_point(a, b, tol=1e-6, max_iter=100):
    """x = cos(A x) / 2 + b (a contraction) by a lax.while_loop; returns (x, iterations)."""
    def cond(c):
        k, _, dx = c
        return (k < max_iter) & (dx > tol)

    def body(c):
        k, x, _ = c
        x_new = 0.5 * jnp.cos(a @ x) + b
        return k + 1, x_new, jnp.max(jnp.abs(x_new - x))

    k, x, _ = lax.while_loop(cond, body, (0, jnp.zeros_like(b), jnp.array(jnp.inf, b.dtype)))
    return x, k


@pytest.fixture(scope="module")
def mlp_data():
    return make_mlp(0)


@pytest.fixture(scope="module")
def ode_data():
    rng = np.random.default_rng(1)
    a = jnp.asarray(rng.standard_normal((8, 8)) / np.sqrt(8), jnp.float32)
    return jnp.asarray(rng.standard_normal(8), jnp.float32), a


@pytest.fixture(scope="module")
def fp_data():
    rng = np.random.default_rng(2)
    a = jnp.asarray(0.5 * rng.standard_normal((8, 8)) / np.sqrt(8), jnp.float32)
    return a, jnp.asarray(rng.standard_normal(8), jnp.float32)


_mlp_ref = jax.jit(mlp)
_mlp_auto = jax.jit(ap.autocast(mlp, ap.AUTO_MIXED_BF16))


# ----------------------------------------------------------------------------- accuracy
def test_mlp_layernorm_softmax_agrees_with_float32_within_bf16_tolerance(mlp_data):
    params, x, _ = mlp_data
    ref = _mlp_ref(params, x)
    got = _mlp_auto(params, x)
    assert got.dtype == jnp.float32
    err = rel_err(got, ref)
    assert 0 < err < BF16_TOL  # not bit-identical: the dots really ran in bf16
    # float16 operands (AUTO_MIXED) are ~8x more precise than bfloat16
    err16 = rel_err(jax.jit(ap.autocast(mlp, ap.AUTO_MIXED))(params, x), ref)
    assert err16 < F16_TOL and err16 < err
    # float64 reference: the mixed result is as close to it as to the float32 one
    p64 = jax.tree_util.tree_map(lambda t: t.astype(jnp.float64), params)
    assert rel_err(got, _mlp_ref(p64, x.astype(jnp.float64))) < BF16_TOL


def test_scan_ode_integrator_within_bf16_tolerance(ode_data):
    y0, a = ode_data
    h = jnp.float32(0.02)
    ref = ode_rk4(y0.astype(jnp.float64), a.astype(jnp.float64), 0.02)
    run = jax.jit(lambda pol_fn, *args: pol_fn(*args), static_argnums=0)
    auto = run(ap.autocast(ode_rk4, ap.AUTO_MIXED_BF16), y0, a, h)
    pure = run(ap.autocast(ode_rk4, ap.ALWAYS_BF16), y0, a, h)
    f32 = run(ap.autocast(ode_rk4, ap.ALWAYS_F32), y0, a, h)
    assert rel_err(f32, ref) < 1e-5
    assert rel_err(auto, ref) < BF16_TOL
    # pure bf16 state stagnates (y + h k rounds back to y): the f32 carry is what helps
    assert rel_err(auto, ref) < rel_err(pure, ref) / 3
    # the scan carry is float32 and the dots read bfloat16 operands
    closed = jax.make_jaxpr(ap.autocast(ode_rk4, ap.AUTO_MIXED_BF16))(y0, a, h)
    scan = [e for e in all_eqns(closed) if e.primitive.name == "scan"]
    assert [v.aval.dtype for v in scan[0].outvars] == [jnp.float32]
    dots = [e for e in all_eqns(closed) if e.primitive.name == "dot_general"]
    assert dots and all(v.aval.dtype == jnp.bfloat16 for e in dots for v in e.invars)


def test_while_fixed_point_within_bf16_tolerance(fp_data):
    a, b = fp_data
    x64, _ = fixed_point(a.astype(jnp.float64), b.astype(jnp.float64), tol=1e-13)
    # bf16 operands of A @ x leave ~u|A||x| noise, so ask for bf16-level convergence
    x, k = jax.jit(ap.autocast(fixed_point, ap.AUTO_MIXED_BF16), static_argnums=2)(a, b, 1e-2)
    assert x.dtype == jnp.float32 and k.dtype == jnp.dtype(int)
    assert rel_err(x, x64) < BF16_TOL
    assert 0 < int(k) < 100
    # the integer counter is left alone: integer dtypes in == integer dtypes out
    closed = jax.make_jaxpr(ap.autocast(fixed_point, ap.AUTO_MIXED_BF16))(a, b)
    loop = [e for e in all_eqns(closed) if e.primitive.name == "while"][0]
    assert [v.aval.dtype.name for v in loop.outvars] == [
        jnp.dtype(k.dtype).name, "float32", "float32"]


def test_cond_branches_are_transformed_and_merged():
    def f(x, flag):
        return lax.cond(flag, lambda v: jnp.exp(v) @ v, lambda v: jnp.sum(v) * v, x)

    x = jnp.eye(2, dtype=jnp.float32) + 0.1
    g = ap.autocast(f, ap.AUTO_MIXED_BF16)
    for flag in (True, False):
        assert rel_err(g(x, flag), f(x, flag)) < BF16_TOL
    closed = jax.make_jaxpr(g)(x, True)
    exps = [e for e in all_eqns(closed) if e.primitive.name == "exp"]
    assert exps and exps[0].outvars[0].aval.dtype == jnp.float32


# ----------------------------------------------------------------------------- jaxpr
@pytest.mark.parametrize("policy", [ap.AUTO_MIXED, ap.AUTO_MIXED_BF16,
                                    ap.AUTO_MIXED_CONSERVATIVE])
def test_sums_exp_log_run_in_float32_under_auto_presets(mlp_data, policy):
    params, x, labels = mlp_data
    closed = jax.make_jaxpr(ap.autocast(mlp_loss, policy))(params, x, labels)
    eqns = all_eqns(closed)
    checked = [e for e in eqns if e.primitive.name in ("reduce_sum", "exp", "log", "rsqrt")]
    assert {e.primitive.name for e in checked} == {"reduce_sum", "exp", "log", "rsqrt"}
    for e in checked:
        dts = {v.aval.dtype for v in [*e.invars, *e.outvars] if hasattr(v.aval, "dtype")}
        assert dts == {jnp.dtype(jnp.float32)}, (e.primitive.name, dts)
    dots = [e for e in eqns if e.primitive.name == "dot_general"]
    assert all(v.aval.dtype == policy.dtype for e in dots for v in e.invars)
    assert all(e.params["preferred_element_type"] == jnp.float32 for e in dots)


def test_always_bf16_really_computes_in_bf16(mlp_data):
    params, x, labels = mlp_data
    closed = jax.make_jaxpr(ap.autocast(mlp_loss, ap.ALWAYS_BF16))(params, x, labels)
    names = {"reduce_sum", "exp", "log", "dot_general"}
    for e in all_eqns(closed):
        if e.primitive.name in names:
            assert e.outvars[0].aval.dtype == jnp.bfloat16, e.primitive.name


def test_auto_mixed_inserts_fewer_casts_than_conservative(mlp_data):
    params, x, labels = mlp_data
    counts = {}
    for pol in (ap.AUTO_MIXED, ap.AUTO_MIXED_CONSERVATIVE):
        closed = jax.make_jaxpr(ap.autocast(mlp_loss, pol))(params, x, labels)
        ex = ap.explain(mlp_loss, pol)(params, x, labels)
        # explain counts exactly the converts that are in the transformed program
        assert ex.casts + ex.retained_converts == n_converts(closed)
        counts[pol.name] = ex.casts
    assert counts["auto_mixed"] < counts["auto_mixed_conservative"]
    assert counts["auto_mixed"] > 0


def test_explain_table(mlp_data):
    params, x, labels = mlp_data
    ex = ap.explain(mlp_loss, ap.AUTO_MIXED_BF16)(params, x, labels)
    assert ex.row(OpKind.COMPUTE).ops == 3 and ex.row("compute").casts >= 3
    assert ex.row("transcendental").dtypes == ("float32",)
    assert ex.unknown_primitives == ()
    text = str(ex)
    assert "compute" in text and "total" in text and str(ex.casts) in text
    # ShapeDtypeStruct arguments work: nothing is computed
    spec = jax.tree_util.tree_map(lambda t: jax.ShapeDtypeStruct(t.shape, t.dtype),
                                  (params, x, labels))
    assert ap.explain(mlp_loss, ap.AUTO_MIXED_BF16)(*spec).casts == ex.casts


# ----------------------------------------------------------------------------- transforms
@pytest.mark.slow  # default run: tests/test_autocast_scopes.py::test_jit_grad_vmap
def test_grad_of_autocast_matches_reference(mlp_data):
    params, x, labels = mlp_data
    ref = jax.jit(jax.grad(mlp_loss))(params, x, labels)
    exact = jax.jit(jax.grad(ap.autocast(mlp_loss, ap.ALWAYS_F32)))(params, x, labels)
    mixed = jax.jit(jax.grad(ap.autocast(mlp_loss, ap.AUTO_MIXED_BF16)))(params, x, labels)
    for r, e, m in zip(jax.tree_util.tree_leaves(ref), jax.tree_util.tree_leaves(exact),
                       jax.tree_util.tree_leaves(mixed)):
        assert e.dtype == m.dtype == r.dtype
        assert rel_err(e, r) < 1e-5
        assert rel_err(m, r) < 0.1  # gradients of bf16 dots: a few bf16 roundoffs
    # directional derivative against central finite differences in float64
    p64 = jax.tree_util.tree_map(lambda t: t.astype(jnp.float64), params)
    d = jax.tree_util.tree_map(jnp.ones_like, p64)
    eps = 1e-6
    shift = lambda s: jax.tree_util.tree_map(lambda p, v: p + s * v, p64, d)  # noqa: E731
    loss64 = jax.jit(mlp_loss)
    fd = (loss64(shift(eps), x, labels) - loss64(shift(-eps), x, labels)) / (2 * eps)
    dd = sum(jnp.sum(t) for t in jax.tree_util.tree_leaves(exact))
    assert abs(float(dd) - float(fd)) < 1e-3 * max(1.0, abs(float(fd)))


def test_always_f32_on_float32_is_bit_identical_and_backward_pass_can_be_autocast(mlp_data):
    params, x, labels = mlp_data
    np.testing.assert_array_equal(jax.jit(ap.autocast(mlp, ap.ALWAYS_F32))(params, x),
                                  _mlp_ref(params, x))
    # autocast of a gradient function: the backward pass itself runs under the policy
    g = jax.grad(mlp_loss)
    ref = jax.jit(g)(params, x, labels)
    got = jax.jit(ap.autocast(g, ap.AUTO_MIXED_BF16))(params, x, labels)
    closed = jax.make_jaxpr(ap.autocast(g, ap.AUTO_MIXED_BF16))(params, x, labels)
    dots = [e for e in all_eqns(closed) if e.primitive.name == "dot_general"]
    assert len(dots) > 3 and all(v.aval.dtype == jnp.bfloat16 for e in dots for v in e.invars)
    for r, m in zip(jax.tree_util.tree_leaves(ref), jax.tree_util.tree_leaves(got)):
        assert m.dtype == r.dtype and rel_err(m, r) < 0.1


def test_vmap_equals_loop_and_jit(mlp_data):
    params, _, _ = mlp_data
    xs = jnp.asarray(np.random.default_rng(5).standard_normal((3, 8, 16)), jnp.float32)
    f = ap.autocast(mlp, ap.AUTO_MIXED_BF16)
    batched = jax.jit(jax.vmap(f, in_axes=(None, 0)))(params, xs)
    looped = jnp.stack([_mlp_auto(params, xi) for xi in xs])
    np.testing.assert_allclose(batched, looped, rtol=1e-5, atol=1e-6)
    assert rel_err(batched, jnp.stack([_mlp_ref(params, xi) for xi in xs])) < BF16_TOL


def test_grad_of_scan_ode(ode_data):
    y0, a = ode_data
    loss = lambda y0, a: jnp.sum(ode_rk4(y0, a, 0.02, 50) ** 2)  # noqa: E731
    ref = jax.grad(loss)(y0.astype(jnp.float64), a.astype(jnp.float64))
    got = jax.jit(jax.grad(ap.autocast(loss, ap.AUTO_MIXED_BF16)))(y0, a)
    assert got.dtype == jnp.float32 and rel_err(got, ref) < BF16_TOL


def test_checkpoint_and_nested_jit_are_recursed_into():
    @jax.checkpoint
    def block(x):
        return jnp.exp(jax.jit(jnp.tanh)(x) @ x)

    x = jnp.eye(3, dtype=jnp.float32) * 0.5
    f = lambda x: jnp.sum(block(x))  # noqa: E731
    g = ap.autocast(f, ap.AUTO_MIXED_BF16)
    assert rel_err(g(x), f(x)) < BF16_TOL
    assert rel_err(jax.grad(g)(x), jax.grad(f)(x)) < BF16_TOL
    eqns = all_eqns(jax.make_jaxpr(g)(x))
    assert any(e.primitive.name == "remat2" for e in eqns)
    dots = [e for e in eqns if e.primitive.name == "dot_general"]
    assert all(v.aval.dtype == jnp.bfloat16 for e in dots for v in e.invars)


# ----------------------------------------------------------------------------- custom rules
@jax.custom_vjp
def _scaled_sin(x):
    return jnp.sin(x)


_scaled_sin.defvjp(lambda x: (jnp.sin(x), jnp.cos(x)), lambda c, g: (3.0 * c * g,))


@jax.custom_jvp
def _fake_exp(x):
    return jnp.exp(x)


_fake_exp.defjvp(lambda p, t: (jnp.exp(p[0]), 7.0 * t[0]))

_CUSTOM = {
    "softmax": lambda x: jnp.sum(jax.nn.softmax(x) * jnp.arange(4.0)),
    "gelu": lambda x: jnp.sum(jax.nn.gelu(x)),
    "logsumexp": lambda x: jax.nn.logsumexp(3.0 * x),
    "relu": lambda x: jnp.sum(jax.nn.relu(x) ** 2),
    "softplus": lambda x: jnp.sum(jax.nn.softplus(x)),
    "logaddexp": lambda x: jnp.sum(jnp.logaddexp(x, 0.5)),
    # rules that differ from the true derivative: they must be the ones used
    "custom_vjp": lambda x: jnp.sum(_scaled_sin(2.0 * x)),
    "custom_jvp": lambda x: jnp.sum(_fake_exp(x)),
}


@pytest.mark.parametrize("name", sorted(_CUSTOM))
def test_custom_derivative_functions_still_differentiate(name):
    fn = _CUSTOM[name]
    x = jnp.linspace(-1.5, 1.5, 12, dtype=jnp.float32).reshape(3, 4)
    grads = jax.jit(lambda x: (jax.grad(fn)(x),
                               jax.grad(ap.autocast(fn, ap.ALWAYS_F32))(x),
                               jax.grad(ap.autocast(fn, ap.AUTO_MIXED_BF16))(x),
                               jax.grad(ap.autocast(fn, ap.ALWAYS_BF16))(x)))
    ref, exact, auto, low = grads(x)
    np.testing.assert_allclose(exact, ref, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(auto, ref, rtol=1e-6, atol=1e-6)
    assert low.dtype == jnp.float32 and rel_err(low, ref) < BF16_TOL


def test_custom_rules_are_the_ones_used():
    x = jnp.linspace(-1.0, 1.0, 5, dtype=jnp.float32)
    g = jax.grad(ap.autocast(_CUSTOM["custom_vjp"], ap.AUTO_MIXED_BF16))(x)
    np.testing.assert_allclose(g, 6.0 * jnp.cos(2.0 * x), rtol=1e-6)  # not 2 cos(2x)
    g = jax.grad(ap.autocast(_CUSTOM["custom_jvp"], ap.AUTO_MIXED_BF16))(x)
    np.testing.assert_allclose(g, 7.0 * jnp.ones_like(x))


# ----------------------------------------------------------------------------- dtypes
def test_integers_and_bools_are_untouched():
    def f(x, idx, mask):
        y = jnp.where(mask, x[idx] * 2, 0.0)
        return (y, idx + 1, jnp.argmax(y), mask & (y > 0),
                mask.astype(jnp.int32) + idx.astype(jnp.int16), (y > 1).astype(jnp.int8))

    x = jnp.arange(6.0, dtype=jnp.float32)
    idx = jnp.array([1, 3, 5], jnp.int32)
    mask = jnp.array([True, False, True])
    for pol in (ap.ALWAYS_BF16, ap.AUTO_MIXED_BF16):
        outs = ap.autocast(f, pol)(x, idx, mask)
        refs = f(x, idx, mask)
        assert [o.dtype for o in outs] == [r.dtype for r in refs]
        for o, r in zip(outs[1:], refs[1:]):
            np.testing.assert_array_equal(o, r)
        # the non-floating conversions are exactly those of fn: autocast adds none
        def int_converts(closed):
            return sorted((e.invars[0].aval.dtype.name, e.params["new_dtype"].name)
                          for e in all_eqns(closed) if e.primitive.name == "convert_element_type"
                          and not jnp.issubdtype(e.invars[0].aval.dtype, jnp.floating)
                          and not jnp.issubdtype(e.params["new_dtype"], jnp.floating))

        expected = int_converts(jax.make_jaxpr(f)(x, idx, mask))
        assert len(expected) >= 2
        assert int_converts(jax.make_jaxpr(ap.autocast(f, pol))(x, idx, mask)) == expected


def test_outputs_follow_policy_output_and_inputs_follow_boundary():
    x = jnp.linspace(0.0, 1.0, 4, dtype=jnp.float32)
    f = lambda x: (jnp.exp(x), jnp.sum(x))  # noqa: E731
    a, b = ap.autocast(f, ap.AUTO_MIXED_BF16.replace(output="bf16"))(x)
    assert a.dtype == b.dtype == jnp.bfloat16
    # float64 inputs under an AUTO preset are computed in at most float32
    closed = jax.make_jaxpr(ap.autocast(f, ap.AUTO_MIXED_BF16))(x.astype(jnp.float64))
    exps = [e for e in all_eqns(closed) if e.primitive.name == "exp"]
    assert exps[0].invars[0].aval.dtype == jnp.float32
    out = ap.autocast(f, ap.AUTO_MIXED_BF16)(x.astype(jnp.float64))
    assert out[0].dtype == jnp.float64  # returned in the dtype fn returns


def test_decorator_form():
    @ap.autocast(policy="always_bf16")
    def f(x):
        return jnp.exp(x) * 3.0

    x = jnp.linspace(0.0, 1.0, 5, dtype=jnp.float32)
    assert f.policy == ap.ALWAYS_BF16 and f.__name__ == "f"
    np.testing.assert_allclose(f(x), 3.0 * jnp.exp(x), rtol=2e-2)
    assert not np.array_equal(f(x), 3.0 * jnp.exp(x))


def test_per_primitive_override():
    x = jnp.linspace(0.0, 1.0, 4, dtype=jnp.float32)
    f = lambda x: jnp.exp(x) + jnp.log1p(x)  # noqa: E731
    pol = ap.PrecisionPolicy.parse("always_bf16,exp=f32")
    eqns = all_eqns(jax.make_jaxpr(ap.autocast(f, pol))(x))
    by = {e.primitive.name: e.outvars[0].aval.dtype for e in eqns}
    assert by["exp"] == jnp.float32 and by["log1p"] == jnp.bfloat16


def _my_double_primitive():
    from jax.extend.core import Primitive
    from jax.interpreters import mlir

    prim = Primitive("my_double")
    prim.def_impl(lambda x: x * 2)
    prim.def_abstract_eval(lambda x: jax.core.ShapedArray(x.shape, x.dtype))
    mlir.register_lowering(prim, mlir.lower_fun(lambda x: x * 2, multiple_results=False))
    return prim


_MY_DOUBLE = _my_double_primitive()


def test_unknown_primitive_runs_at_input_dtype_and_is_listed():
    f = lambda x: jnp.exp(_MY_DOUBLE.bind(x.astype(jnp.float32) * 3.0))  # noqa: E731
    x = jnp.linspace(0.0, 1.0, 4, dtype=jnp.float32)
    ex = ap.explain(f, ap.ALWAYS_BF16)(x)
    assert ex.unknown_primitives == ("my_double",)
    assert "my_double" in str(ex)
    eqn = [e for e in all_eqns(ex.jaxpr) if e.primitive.name == "my_double"][0]
    assert eqn.invars[0].aval.dtype == jnp.bfloat16  # the dtype its input arrived in
    np.testing.assert_allclose(ap.autocast(f, ap.ALWAYS_F32)(x), f(x), rtol=1e-6)


# ----------------------------------------------------------------------------- bad input
def test_bad_functions_get_clear_errors():
    with pytest.raises(TypeError, match="autocast needs a callable, got 3"):
        ap.autocast(3, ap.AUTO_MIXED)

    def branchy(x):
        if x.sum() > 0:  # Python control flow on a traced value
            return x
        return -x

    with pytest.raises(TypeError, match=r"autocast could not trace .*branchy\(float32\[3\]\)"):
        ap.autocast(branchy, ap.AUTO_MIXED)(jnp.ones(3, jnp.float32))
    with pytest.raises(ValueError, match="unknown op kind or primitive 'expp'"):
        ap.autocast(jnp.exp, "auto_mixed,expp=f32")
    with pytest.raises(TypeError, match="explain needs a callable"):
        ap.explain("exp", ap.AUTO_MIXED)


# ----------------------------------------------------------------------------- adaptive
@pytest.mark.slow
def test_policy_rungs_in_adaptive_ladder():
    runtime = pytest.importorskip("adaptprec.runtime")
    if not hasattr(runtime, "adaptive"):
        pytest.skip("runtime.adaptive not available")

    def kernel(x, w):
        return jnp.sum(jax.nn.softmax(x @ w) * x @ w, axis=-1)

    x = jnp.linspace(-1.0, 1.0, 12, dtype=jnp.float64).reshape(3, 4)
    w = jnp.eye(4, dtype=jnp.float64)
    fn = ap.adaptive(kernel, ladder=(ap.AUTO_MIXED, ap.ALWAYS_F32, "f64"),
                     guards=[ap.guards.finite()])
    out, rep = jax.jit(fn.with_report)(x, w)
    assert int(rep.rung) == 0 and bool(rep.ok)
    assert rel_err(out, kernel(x, w)) < F16_TOL
    # the rung-0 result is the autocast result on the rung-dtype inputs
    expect = ap.autocast(kernel, ap.AUTO_MIXED)(x.astype(jnp.float16), w.astype(jnp.float16))
    np.testing.assert_allclose(out, expect.astype(out.dtype), rtol=1e-3)
    # 1e5 overflows float16 (max 65504) but not float32: one escalation, to ALWAYS_F32
    out, rep = jax.jit(fn.with_report)(x * 1e5, w)
    assert int(rep.rung) == 1 and bool(rep.ok)
    assert rel_err(out, kernel(x * 1e5, w)) < 1e-5
    # the ladder of the design: a bfloat16 autocast rung, then float32, then float64.
    # x = 1 + 2^-10 rounds to 1 in bfloat16, so (x - 1) * 1024 is 0 there and 1 above.
    exact = ap.adaptive(lambda x: jnp.sum((x - 1.0) * 1024.0 * jnp.exp(x - x)),
                        ladder=(ap.AUTO_MIXED_BF16, ap.ALWAYS_F32, "f64"),
                        guards=[ap.guards.finite(), ap.guards.predicate(lambda out, x: out > 0.5)])
    x = jnp.full(4, 1.0 + 2.0 ** -10, jnp.float64)
    out, rep = jax.jit(exact.with_report)(x)
    assert int(rep.rung) == 1 and bool(rep.ok) and float(out) == 4.0
