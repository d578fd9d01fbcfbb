"""PrecisionPolicy presets, string form, validation; the OpKind table against real jaxprs."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jax import lax

import adaptprec as ap
from adaptprec import PRESETS, PRIMITIVE_KINDS, OpKind, Rule, classify


# ----------------------------------------------------------------------------- presets
def test_presets_dtypes_and_rules():
    assert ap.ALWAYS_F32.dtype == np.float32 and ap.ALWAYS_F16.dtype == np.float16
    assert ap.ALWAYS_BF16.dtype == jnp.bfloat16 and ap.AUTO_MIXED_BF16.dtype == jnp.bfloat16
    assert ap.AUTO_MIXED.dtype == ap.AUTO_MIXED_CONSERVATIVE.dtype == np.float16
    for pol in (ap.ALWAYS_F32, ap.ALWAYS_F16, ap.ALWAYS_BF16):
        assert pol.preferred_element_type is None and not pol.cast_back
        for kind in OpKind:
            expected = Rule.INPUT if kind is OpKind.UNKNOWN else Rule.LOW
            assert pol.rule_for(kind) is expected
    for pol in (ap.AUTO_MIXED, ap.AUTO_MIXED_BF16, ap.AUTO_MIXED_CONSERVATIVE):
        assert pol.preferred_element_type == np.float32 and pol.accumulate == np.float32
        assert pol.rule_for("dot_general") is Rule.ACCUMULATE
        assert pol.rule_for("exp") is Rule.HIGH
        assert pol.rule_for("my_unknown_primitive") is Rule.INPUT
    assert ap.AUTO_MIXED.rule_for("reduce_sum") is Rule.ACCUMULATE
    assert ap.AUTO_MIXED_CONSERVATIVE.rule_for("reduce_sum") is Rule.HIGH
    assert ap.AUTO_MIXED_CONSERVATIVE.cast_back and not ap.AUTO_MIXED.cast_back
    assert ap.AUTO_MIXED.with_dtype("bf16") == ap.AUTO_MIXED_BF16


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_preset_string_form_roundtrips(name):
    pol = PRESETS[name]
    assert str(pol) == name and pol.name == name
    assert ap.PrecisionPolicy.parse(name) is pol or ap.PrecisionPolicy.parse(name) == pol
    assert ap.PrecisionPolicy.parse(name.upper()) == pol
    assert eval(repr(pol), {"PrecisionPolicy": ap.PrecisionPolicy}) == pol


def test_string_form_of_custom_policy():
    pol = ap.PrecisionPolicy.parse(
        "always_bf16, accumulate=f32, pet=f32, exp=high, reduction=accumulate, "
        "dot_precision=highest, output=f32")
    text = str(pol)
    assert text.startswith("always_bf16,")
    for piece in ("preferred_element_type=f32", "dot_precision=highest", "output=f32",
                  "reduction=accumulate", "exp=high"):
        assert piece in text
    assert ap.PrecisionPolicy.parse(text) == pol
    assert pol.rule_for("exp") is Rule.HIGH and pol.rule_for("log") is Rule.LOW
    assert pol.dot_precision is lax.Precision.HIGHEST and pol.output == np.float32
    # overrides without a preset apply to AUTO_MIXED_BF16
    assert ap.PrecisionPolicy.parse("exp=f64") == ap.AUTO_MIXED_BF16.replace(
        rules={"exp": "f64"})


_KEYS = [k.value for k in OpKind] + ["exp", "log", "dot_general", "reduce_sum",
                                     "scatter-add", "while", "convert_element_type"]
_RULES = st.one_of(st.sampled_from(list(Rule)),
                   st.sampled_from(["bf16", "f16", "f32", "f64"]).map(ap.canonical_dtype))
_DTYPES = st.sampled_from(["bf16", "f16", "f32", "f64"])


@settings(max_examples=40, deadline=None)
@given(dtype=_DTYPES, acc=_DTYPES, pet=st.one_of(st.none(), _DTYPES),
       prec=st.sampled_from([None, "default", "high", "highest"]),
       out=st.one_of(st.none(), _DTYPES), cast_back=st.booleans(),
       rules=st.dictionaries(st.sampled_from(_KEYS), _RULES, max_size=6))
def test_string_form_roundtrips_for_any_policy(dtype, acc, pet, prec, out, cast_back, rules):
    pol = ap.PrecisionPolicy(dtype, rules, accumulate=acc, preferred_element_type=pet,
                             dot_precision=prec, output=out, cast_back=cast_back)
    back = ap.PrecisionPolicy.parse(str(pol))
    assert back == pol and hash(back) == hash(pol)
    for key, rule in rules.items():
        assert pol.rule_for(key) == rule


def test_replace_merges_rules():
    pol = ap.AUTO_MIXED.replace(rules={"exp": "low"}).replace(rules={"log": "f32"})
    assert pol.rule_for("exp") is Rule.LOW and pol.rule_for("log") == np.float32
    assert pol.rule_for("tanh") is Rule.HIGH
    with pytest.raises(ValueError, match="unknown PrecisionPolicy fields"):
        ap.AUTO_MIXED.replace(compute="f32")


# ----------------------------------------------------------------------------- bad input
@pytest.mark.parametrize("make, error, pattern", [
    (lambda: ap.PrecisionPolicy.parse("auto_mixed, bogus=f32"), ValueError,
     "unknown op kind or primitive 'bogus'"),
    (lambda: ap.PrecisionPolicy("bf16", {"reductions": "high"}), ValueError,
     "unknown op kind or primitive 'reductions'"),
    (lambda: ap.PrecisionPolicy("bf16", {"reduction": "int32"}), ValueError,
     "rule for 'reduction' must be .* got 'int32'"),
    (lambda: ap.PrecisionPolicy("bf16", {"exp": jnp.int8}), ValueError,
     "rule for 'exp' must be .* floating dtype"),
    (lambda: ap.PrecisionPolicy("int8"), ValueError,
     "PrecisionPolicy dtype must be a floating dtype .* got 'int8'"),
    (lambda: ap.PrecisionPolicy(jnp.int32), ValueError,
     "PrecisionPolicy dtype must be a floating dtype"),
    (lambda: ap.PrecisionPolicy("bf16", accumulate="bool"), ValueError,
     "PrecisionPolicy accumulate must be a floating dtype .* got 'bool'"),
    (lambda: ap.PrecisionPolicy.parse("auto_mixed, output=int32"), ValueError,
     "output must be a floating dtype"),
    (lambda: ap.PrecisionPolicy.parse("fastest"), ValueError,
     "unknown precision policy preset 'fastest'"),
    (lambda: ap.PrecisionPolicy.parse("auto_mixed, exp"), ValueError,
     "cannot parse 'exp' .* expected key=value"),
    (lambda: ap.PrecisionPolicy.parse("auto_mixed,,exp=f32"), ValueError,
     "cannot parse precision policy"),
    (lambda: ap.PrecisionPolicy.parse("auto_mixed, cast_back=maybe"), ValueError,
     "cast_back must be true or false, got 'maybe'"),
    (lambda: ap.PrecisionPolicy.parse("auto_mixed, dot_precision=ultra"), ValueError,
     "dot_precision must be"),
    (lambda: ap.PrecisionPolicy.parse(3), TypeError, "got 3"),
    (lambda: ap.PrecisionPolicy("bf16", [("exp", "f32")]), TypeError,
     "rules must be a mapping"),
    (lambda: ap.PrecisionPolicy("bf16", {3: "f32"}), TypeError,
     "keyed by OpKind or primitive name, got 3"),
    (lambda: OpKind.parse("bogus"), ValueError, "unknown op kind 'bogus'"),
    (lambda: Rule.parse("medium"), ValueError, "unknown rule 'medium'"),
])
def test_bad_policies_get_clear_errors(make, error, pattern):
    with pytest.raises(error, match=pattern):
        make()


# ----------------------------------------------------------------------------- protocol
def test_policy_is_static_hashable_and_a_rung():
    assert hash(ap.PrecisionPolicy("bf16")) == hash(ap.AUTO_MIXED_BF16)
    assert jax.tree_util.tree_leaves(ap.AUTO_MIXED) == []  # static pytree node
    traces = []

    @jax.jit
    def f(x, pol):
        traces.append(pol)
        return pol.wrap(jnp.tanh)(x)

    x = jnp.ones(3, jnp.float32)
    f(x, ap.AUTO_MIXED)
    f(x, ap.PrecisionPolicy.parse("auto_mixed"))  # equal policy: no retrace
    assert len(traces) == 1
    runtime = pytest.importorskip("adaptprec.runtime")
    assert isinstance(ap.AUTO_MIXED_BF16, runtime.Rung)
    from adaptprec._rungs import normalize_ladder

    rungs, lad = normalize_ladder((ap.AUTO_MIXED_BF16, ap.ALWAYS_F32, "f64"))
    assert str(lad) == "bf16,f32,f64" and rungs[0] is ap.AUTO_MIXED_BF16


def test_dot_precision_and_preferred_element_type_reach_the_jaxpr():
    a = jnp.ones((3, 3), jnp.float32)
    pol = ap.PrecisionPolicy.parse("auto_mixed_bf16, dot_precision=highest")
    eqn = [e for e in jax.make_jaxpr(ap.autocast(jnp.matmul, pol))(a, a).eqns
           if e.primitive.name == "dot_general"][0]
    assert eqn.params["precision"] == (lax.Precision.HIGHEST, lax.Precision.HIGHEST)
    assert eqn.params["preferred_element_type"] == np.float32
    eqn = [e for e in jax.make_jaxpr(ap.autocast(jnp.matmul, ap.ALWAYS_BF16))(a, a).eqns
           if e.primitive.name == "dot_general"][0]
    assert eqn.params["preferred_element_type"] == jnp.bfloat16


# ----------------------------------------------------------------------------- op kinds
def test_classification_of_named_primitives():
    expected = {
        "dot_general": "COMPUTE", "conv_general_dilated": "COMPUTE",
        "reduce_sum": "REDUCTION", "reduce_max": "REDUCTION", "argmax": "REDUCTION",
        "cumsum": "REDUCTION", "add": "ELEMENTWISE", "select_n": "ELEMENTWISE",
        "exp": "TRANSCENDENTAL", "log1p": "TRANSCENDENTAL", "div": "TRANSCENDENTAL",
        "rsqrt": "TRANSCENDENTAL", "logistic": "TRANSCENDENTAL", "erf": "TRANSCENDENTAL",
        "pow": "TRANSCENDENTAL", "lu": "LINALG", "cholesky": "LINALG",
        "triangular_solve": "LINALG", "eigh": "LINALG", "svd": "LINALG",
        "reshape": "DATA_MOVEMENT", "gather": "DATA_MOVEMENT", "scatter-add": "DATA_MOVEMENT",
        "concatenate": "DATA_MOVEMENT", "pad": "DATA_MOVEMENT", "jit": "CONTROL",
        "scan": "CONTROL", "while": "CONTROL", "cond": "CONTROL",
        "custom_jvp_call": "CONTROL", "custom_vjp_call": "CONTROL",
    }
    assert {k: classify(k).name for k in expected} == expected
    assert classify("nonexistent_primitive") is OpKind.UNKNOWN
    assert all(isinstance(v, OpKind) for v in PRIMITIVE_KINDS.values())


def _primitive_names(closed) -> set[str]:
    from jax.extend.core import ClosedJaxpr, Jaxpr

    names: set[str] = set()

    def walk(j):
        j = j.jaxpr if isinstance(j, ClosedJaxpr) else j
        for e in j.eqns:
            names.add(e.primitive.name)
            for v in e.params.values():
                for s in (v if isinstance(v, (tuple, list)) else (v,)):
                    if isinstance(s, (Jaxpr, ClosedJaxpr)):
                        walk(s)

    walk(closed)
    return names


def test_table_covers_primitives_of_real_jax_programs():
    """Names as JAX 0.10 writes them in jaxprs (e.g. 'jit', not 'pjit')."""
    @jax.custom_vjp
    def cv(x):
        return jnp.sin(x)

    cv.defvjp(lambda x: (jnp.sin(x), x), lambda r, g: (g * jnp.cos(r),))

    def program(a, x, i):
        s = jnp.linalg.solve(a @ a.T + 3 * jnp.eye(3), x)
        c = jnp.linalg.cholesky(a @ a.T + 3 * jnp.eye(3))
        w, v = jnp.linalg.eigh(a + a.T)
        y = lax.scan(lambda c, t: (c + t, c * 2), 0.0, x)[0]
        z = lax.while_loop(lambda c: c[0] < 3, lambda c: (c[0] + 1, c[1] / 2), (0, x))[1]
        q = lax.cond(y > 0, jnp.exp, jnp.log1p, x)
        u = x.at[i].add(1.0).at[i].max(2.0)
        r = jnp.cumsum(jax.nn.relu(x)) + jnp.argmax(x) + jnp.sort(x) + jnp.tanh(x) ** 3
        return (s + c.sum() + w.sum() + v[0] + z + q + u + r + cv(x) + jnp.where(x > 0, x, 0)
                + jnp.concatenate([x, x])[:3] + jnp.pad(x, 1)[1:4] + jax.nn.logsumexp(x)
                + jax.scipy.special.erf(x) + jnp.clip(x, 0, 1) + x.reshape(3, 1).T[0]
                + jnp.max(x) * jnp.prod(x) + jnp.abs(x) ** 0.5)

    a = jnp.eye(3, dtype=jnp.float32) + 0.1
    x = jnp.ones(3, jnp.float32)
    names = _primitive_names(jax.make_jaxpr(program)(a, x, jnp.array([0, 2])))
    unknown = sorted(n for n in names if classify(n) is OpKind.UNKNOWN)
    assert unknown == []
    for n in ("jit", "scan", "while", "cond", "custom_jvp_call", "custom_vjp_call",
              "scatter-add", "dot_general", "reduce_sum"):
        assert n in names
    # and autocast runs the whole program, close to the float32 result
    both = jax.jit(lambda *args: (ap.autocast(program, ap.AUTO_MIXED_BF16)(*args),
                                  program(*args)))
    out, ref = both(a, x, jnp.array([0, 2]))
    np.testing.assert_allclose(out, ref, rtol=3e-2, atol=3e-2)


@pytest.mark.slow
def test_without_x64_float64_is_refused_and_autocast_still_works():
    import subprocess
    import sys

    code = """
import jax, jax.numpy as jnp
import adaptprec as ap
assert not jax.config.jax_enable_x64
for make in (lambda: ap.PrecisionPolicy("f64"), lambda: ap.PrecisionPolicy.parse("exp=f64")):
    try:
        make()
    except ValueError as exc:
        assert "jax_enable_x64" in str(exc), exc
    else:
        raise AssertionError("float64 accepted with x64 off")
f = lambda x: jax.nn.logsumexp(jnp.tanh(x @ x), axis=-1)
x = jnp.eye(4) * 0.5
y = ap.autocast(f, ap.AUTO_MIXED_BF16)(x)
assert y.dtype == jnp.float32 and float(jnp.max(jnp.abs(y - f(x)))) < 3e-2
print("ok")
"""
    env = {k: v for k, v in __import__("os").environ.items() if k != "JAX_ENABLE_X64"}
    env["JAX_ENABLE_X64"] = "0"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=env, timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]
