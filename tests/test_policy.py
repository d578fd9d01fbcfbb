"""adaptprec.policy: jmp grammar, casting rules, thread-local context, jit/grad."""

import dataclasses
import threading
from typing import NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import adaptprec as ap
from adaptprec import Policy

NAMES = {"bf16": ml_dtypes.bfloat16, "bfloat16": ml_dtypes.bfloat16, "f16": np.float16,
         "float16": np.float16, "f32": np.float32, "float32": np.float32, "full": np.float32,
         "single": np.float32, "f64": np.float64, "float64": np.float64,
         "double": np.float64}
KEYS = {"param": ["p", "params"], "compute": ["c", "compute"], "output": ["o", "output"]}


@pytest.mark.parametrize("spec,expected", [
    ("f32", ("f32", "f32", "f32")),
    ("bf16", ("bf16", "bf16", "bf16")),
    ("c=f16", ("f32", "f16", "f16")),
    ("p=f16,c=f16", ("f16", "f16", "f16")),
    ("p=f16,c=bf16", ("f16", "bf16", "bf16")),
    ("p=f32,c=bf16,o=f32", ("f32", "bf16", "f32")),
    ("params=float32,compute=bfloat16,output=float32", ("f32", "bf16", "f32")),
    ("o=f64", ("f32", "f32", "f64")),
    (" p = f32 , c = bf16 ", ("f32", "bf16", "bf16")),
    ("c=half", ("f32", "f16", "f16")),
])
def test_jmp_grammar_and_defaults(spec, expected):
    pol = Policy.parse(spec)
    assert (ap.dtype_name(pol.param), ap.dtype_name(pol.compute),
            ap.dtype_name(pol.output)) == expected
    # jmp attribute spellings
    assert (pol.param_dtype, pol.compute_dtype, pol.output_dtype) == \
        (pol.param, pol.compute, pol.output)


def test_matches_jmp_reference_semantics():
    """Our parser agrees with jmp's get_policy on every spec in jmp's grammar.

    jmp itself is not a dependency; this is its documented rule, restated: params default
    f32, compute follows params, output follows compute.
    """
    for p in [None, "f16", "bf16", "f32"]:
        for c in [None, "f16", "bf16", "f32"]:
            for o in [None, "f16", "f32"]:
                parts = [f"{k}={v}" for k, v in (("p", p), ("c", c), ("o", o)) if v]
                if not parts:
                    continue
                pol = Policy.parse(",".join(parts))
                ep = p or "f32"
                ec = c or ep
                eo = o or ec
                assert str(pol) == f"p={ep},c={ec},o={eo}"


@settings(max_examples=60, deadline=None)
@given(st.dictionaries(st.sampled_from(list(KEYS)), st.sampled_from(sorted(NAMES)),
                       min_size=1), st.data())
def test_round_trip(fields, data):
    parts = []
    for field, name in fields.items():
        key = data.draw(st.sampled_from(KEYS[field]))
        pad = data.draw(st.sampled_from(["", " "]))
        parts.append(f"{pad}{key}{pad}={pad}{name}{pad}")
    order = data.draw(st.permutations(parts))
    pol = Policy.parse(",".join(order))
    assert Policy.parse(str(pol)) == pol
    assert getattr(pol, "param") == np.dtype(NAMES.get(fields.get("param", "f32")))
    for field, name in fields.items():
        assert getattr(pol, field) == np.dtype(NAMES[name])


@settings(max_examples=60, deadline=None)
@given(st.text(alphabet="abcdefpqo0123456789=,_ ", max_size=12))
def test_invalid_strings_raise_valueerror_naming_aliases(text):
    try:
        pol = Policy.parse(text)
    except ValueError as e:
        msg = str(e)
        assert ("accepted" in msg or "expected" in msg or "keys" in msg), msg
    else:
        assert isinstance(pol, Policy) and Policy.parse(str(pol)) == pol


@pytest.mark.parametrize("bad,needle", [
    ("", "empty"),
    ("   ", "empty"),
    ("p=f32,p=bf16", "second time"),
    ("c=bf16,compute=f32", "second time"),
    ("x=f32", "unknown key"),
    ("c=f8", "unknown floating dtype alias"),
    ("c=int32", "unknown floating dtype alias"),
    ("c", "unknown floating dtype alias"),
    ("p=f32,,c=f32", "expected key=dtype"),
    ("p==f32", "expected key=dtype"),
])
def test_bad_policy_strings(bad, needle):
    with pytest.raises(ValueError, match=needle):
        Policy.parse(bad)


def test_unknown_alias_message_lists_valid_aliases():
    with pytest.raises(ValueError) as info:
        Policy.parse("c=f8")
    assert "'f8'" in str(info.value) and "bfloat16" in str(info.value)


def test_non_floating_dtype_object_rejected():
    with pytest.raises(ValueError, match="not a supported floating dtype"):
        Policy(jnp.int32)


class Pair(NamedTuple):
    a: jax.Array
    b: jax.Array


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Params:
    w: jax.Array
    n: jax.Array


class Layer(eqx.Module):
    w: jax.Array
    idx: jax.Array
    name: str = eqx.field(static=True, default="layer")


def _tree():
    return {
        "list": [jnp.ones(2, jnp.float32), jnp.arange(3), 1.5, "text", None],
        "tuple": (jnp.ones(1, jnp.float64), jnp.array([True, False])),
        "nt": Pair(jnp.ones(2, jnp.bfloat16), jnp.ones(2, jnp.int8)),
        "dc": Params(jnp.ones(2, jnp.float16), jnp.array(4, jnp.uint32)),
        "eqx": Layer(jnp.ones((2, 2), jnp.float32), jnp.arange(2)),
        "np": np.ones(3, np.float64),
        "cplx": jnp.ones(2, jnp.complex64),
    }


@pytest.mark.parametrize("target", ["bf16", "f16", "f32", "f64"])
def test_cast_rules_over_nested_pytrees(target):
    tree = _tree()
    out = ap.cast_floating(tree, target)
    want = ap.canonical_dtype(target)
    # floating leaves cast, float64 included
    for leaf in (out["list"][0], out["tuple"][0], out["nt"].a, out["dc"].w, out["eqx"].w,
                 out["np"]):
        assert leaf.dtype == want
    assert isinstance(out["np"], np.ndarray)  # numpy stays numpy
    # ints, bools, complex and non-arrays untouched (identity)
    assert out["list"][1] is tree["list"][1]
    assert out["list"][2] == 1.5 and out["list"][3] == "text" and out["list"][4] is None
    assert out["tuple"][1] is tree["tuple"][1]
    assert out["nt"].b is tree["nt"].b and out["dc"].n is tree["dc"].n
    assert out["eqx"].idx is tree["eqx"].idx and out["eqx"].name == "layer"
    assert out["cplx"] is tree["cplx"]
    assert isinstance(out["nt"], Pair) and isinstance(out["dc"], Params)
    assert isinstance(out["eqx"], Layer)


def test_policy_casts_param_compute_output():
    pol = Policy.parse("p=f32,c=bf16,o=f16")
    tree = {"x": jnp.ones(2, jnp.float64), "i": jnp.arange(2)}
    assert pol.cast_to_param(tree)["x"].dtype == jnp.float32
    assert pol.cast_to_compute(tree)["x"].dtype == jnp.bfloat16
    assert pol.cast_to_output(tree)["x"].dtype == jnp.float16
    assert pol.cast_to_compute(tree)["i"].dtype == tree["i"].dtype
    assert pol.with_output_dtype("f32").output == np.float32
    assert pol.replace(compute="f32").compute == np.float32


def test_semantic_dtypes_resolve_against_policy():
    tree = {"x": jnp.ones(2)}
    pol = "p=f16,c=bf16,o=f32"
    assert ap.cast_floating(tree, ap.SemanticDType.PARAM, pol)["x"].dtype == jnp.float16
    assert ap.cast_floating(tree, "compute", pol)["x"].dtype == jnp.bfloat16
    assert ap.cast_floating(tree, "output", Policy.parse(pol))["x"].dtype == jnp.float32
    assert ap.cast_floating(tree, "compute")["x"].dtype == jnp.float32  # default policy


def test_context_nesting_and_default():
    assert str(ap.current_policy()) == "p=f32,c=f32,o=f32"
    with ap.policy("c=bf16") as outer:
        assert ap.current_policy() is outer
        with ap.policy(Policy("f16")):
            assert str(ap.current_policy()) == "p=f16,c=f16,o=f16"
        assert ap.current_policy() is outer
    assert str(ap.current_policy()) == "p=f32,c=f32,o=f32"


def test_context_restored_after_exception():
    with pytest.raises(RuntimeError):
        with ap.policy("bf16"):
            raise RuntimeError("boom")
    assert str(ap.current_policy()) == "p=f32,c=f32,o=f32"


def test_context_is_thread_local():
    barrier = threading.Barrier(4)
    seen = {}

    def worker(spec):
        with ap.policy(spec):
            barrier.wait()   # all threads inside their own context at once
            seen[spec] = str(ap.current_policy())
            barrier.wait()
        seen[spec + ":after"] = str(ap.current_policy())

    specs = ["bf16", "f16", "c=bf16", "p=f16,c=f32"]
    threads = [threading.Thread(target=worker, args=(s,)) for s in specs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for s in specs:
        assert seen[s] == str(Policy.parse(s))
        assert seen[s + ":after"] == "p=f32,c=f32,o=f32"


def test_policy_is_static_under_jit():
    traces = []

    @jax.jit
    def f(x, pol):
        traces.append(pol)
        return pol.cast_to_compute(x)

    assert f(jnp.ones(2), Policy.parse("c=bf16")).dtype == jnp.bfloat16
    assert f(jnp.ones(2), Policy.parse("c=bf16")).dtype == jnp.bfloat16
    assert f(jnp.ones(2), Policy.parse("c=f16")).dtype == jnp.float16
    assert len(traces) == 2  # retraced only when the policy changed
    assert jax.tree_util.tree_leaves(Policy.parse("f32")) == []


def test_context_read_at_trace_time_under_jit():
    @jax.jit
    def g(x):
        return ap.cast_floating(x, "compute")

    with ap.policy("c=bf16"):
        assert g(jnp.ones(3)).dtype == jnp.bfloat16


def test_cast_under_grad_and_jit():
    pol = Policy.parse("p=f32,c=bf16,o=f32")

    def loss(params):
        cp = pol.cast_to_compute(params)
        y = jnp.sum(cp["w"] * cp["w"], dtype=jnp.float32)
        return pol.cast_to_output(y)

    params = {"w": jnp.arange(1.0, 4.0, dtype=jnp.float32), "n": jnp.array(2)}
    g = jax.jit(jax.grad(loss, allow_int=True))(params)
    assert g["w"].dtype == jnp.float32
    np.testing.assert_allclose(g["w"], 2 * np.arange(1.0, 4.0), rtol=1e-2)


def test_jmp_keyword_constructor_replace_and_autocast():
    # newcomer audit 5: jmp.Policy(param_dtype=..., ...) and dataclasses.replace(policy,
    # compute_dtype=...) raised TypeError; autocast refused a Policy at the top level
    import dataclasses

    pol = ap.Policy(param_dtype=jnp.float32, compute_dtype=jnp.bfloat16,
                    output_dtype=jnp.float32)
    assert pol == ap.Policy.parse("p=f32,c=bf16,o=f32")
    assert dataclasses.replace(pol, compute_dtype=jnp.float16).compute == jnp.float16
    assert dataclasses.replace(pol, compute="f32") == ap.Policy("f32")
    f = ap.autocast(lambda x: jnp.exp(x) * x, ap.Policy.parse("c=bf16"))
    jaxpr = jax.make_jaxpr(f)(jnp.ones(4, jnp.float32))
    assert any(e.outvars[0].aval.dtype == jnp.bfloat16 for e in jaxpr.eqns
               if e.primitive.name == "exp")
