"""adaptprec.precision: aliases, constants, Ladder, x64 guard."""


import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import adaptprec as ap
from _subprocess import run_python

EXPECTED = {
    "bf16": ml_dtypes.bfloat16, "bfloat16": ml_dtypes.bfloat16,
    "f16": np.float16, "float16": np.float16,
    "f32": np.float32, "float32": np.float32, "single": np.float32, "full": np.float32,
    "f64": np.float64, "float64": np.float64, "double": np.float64,
}


@pytest.mark.parametrize("alias,dtype", sorted(EXPECTED.items()))
def test_aliases(alias, dtype):
    assert ap.canonical_dtype(alias) == np.dtype(dtype)
    assert ap.canonical_dtype(f"  {alias.upper()} ") == np.dtype(dtype)


def test_half_follows_backend_like_jmp():
    # jmp: bfloat16 on TPU, float16 elsewhere. This machine has no TPU.
    assert ap.half_dtype() == np.dtype(np.float16)
    assert ap.canonical_dtype("half") == ap.half_dtype()


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16, jnp.float32, jnp.float64,
                                   np.dtype("float32"), "float32"])
def test_dtype_objects_accepted(dtype):
    assert ap.canonical_dtype(dtype) == np.dtype(dtype)


@pytest.mark.parametrize("bad", ["f8", "quad", "", "float", "int32"])
def test_unknown_alias_names_the_accepted_ones(bad):
    with pytest.raises(ValueError) as info:
        ap.canonical_dtype(bad)
    assert repr(bad) in str(info.value)
    assert "bf16" in str(info.value) and "double" in str(info.value)


@pytest.mark.parametrize("bad", [jnp.int32, np.bool_, jnp.complex64, object])
def test_non_floating_dtype_rejected(bad):
    with pytest.raises(ValueError, match="floating"):
        ap.canonical_dtype(bad)


def test_constants_match_finfo():
    for d in ap.FLOATING_DTYPES:
        fi = ml_dtypes.finfo(d)
        assert ap.unit_roundoff(d) == float(fi.eps) / 2
        assert ap.max_value(d) == float(fi.max)
        assert ap.smallest_normal(d) == float(fi.smallest_normal)
    assert ap.unit_roundoff("bf16") == 2.0 ** -8
    assert ap.unit_roundoff("f16") == 2.0 ** -11
    assert ap.unit_roundoff("f32") == 2.0 ** -24
    assert ap.unit_roundoff("f64") == 2.0 ** -53
    assert ap.max_value("f16") == 65504.0


def test_ladder_parse_forms_agree():
    a = ap.Ladder.parse("bf16,f32,f64")
    b = ap.Ladder.parse("bf16 > f32 > f64")
    c = ap.Ladder(["bfloat16", jnp.float32, np.float64])
    assert a == b == c and hash(a) == hash(c)
    assert str(a) == "bf16,f32,f64" and ap.Ladder.parse(str(a)) == a
    assert len(a) == 3 and a.bottom == np.dtype(ml_dtypes.bfloat16)
    assert a.top == np.dtype(np.float64) and a.index("single") == 1
    assert a.unit_roundoffs == (2.0 ** -8, 2.0 ** -24, 2.0 ** -53)
    assert a[1:] == ap.Ladder("f32,f64")
    assert ap.Ladder.parse(a) is a


@pytest.mark.parametrize("bad", ["f32,bf16", "f32,f32", "f64>f32", "bf16,,f32", "", " , ",
                                 "bf16,f64,f32", "f32,int8"])
def test_ladder_not_strictly_increasing_or_malformed(bad):
    with pytest.raises(ValueError) as info:
        ap.Ladder.parse(bad)
    msg = str(info.value)
    assert ("strictly increasing" in msg or "cannot parse" in msg or "alias" in msg
            or "at least one" in msg)


def test_ladder_index_of_missing_rung():
    with pytest.raises(ValueError, match="not a rung"):
        ap.Ladder("bf16,f32").index("f16")


def test_ladder_is_static_under_jit():
    import jax

    lad = ap.Ladder("bf16,f32")

    @jax.jit
    def f(x, lad=lad):
        return x.astype(lad.bottom)

    assert f(jnp.ones(2)).dtype == jnp.bfloat16
    assert jax.jit(lambda x, l: x.astype(l.top), static_argnums=1)(jnp.ones(1), lad).dtype \
        == jnp.float32


@settings(max_examples=40, deadline=None)
@given(st.lists(st.sampled_from(sorted(EXPECTED)), min_size=1, max_size=4),
       st.sampled_from([",", ">", " , ", " > "]))
def test_ladder_accepts_exactly_the_strictly_increasing_lists(names, sep):
    dtypes = [np.dtype(EXPECTED[n]) for n in names]
    u = [ap.unit_roundoff(d) for d in dtypes]
    increasing = all(b < a for a, b in zip(u, u[1:]))
    spec = sep.join(names)
    if increasing:
        lad = ap.Ladder.parse(spec)
        assert list(lad) == dtypes and ap.Ladder.parse(str(lad)) == lad
    else:
        with pytest.raises(ValueError, match="strictly increasing"):
            ap.Ladder.parse(spec)


def test_float64_without_x64_raises_with_instructions_and_config_untouched():
    proc = run_python(x64=False, code="""
        import jax, adaptprec as ap
        assert not jax.config.read("jax_enable_x64")
        for attempt in (lambda: ap.canonical_dtype("f64"), lambda: ap.Ladder("f32,f64"),
                        lambda: ap.Policy.parse("p=f64"), lambda: ap.require_x64("double")):
            try:
                attempt()
            except ValueError as e:
                assert "jax_enable_x64" in str(e) and "JAX_ENABLE_X64=1" in str(e), e
            else:
                raise SystemExit("no error")
        ap.Ladder("bf16,f32")           # fine without x64
        ap.Ladder("f32,f64", check_x64=False)
        assert not jax.config.read("jax_enable_x64"), "library flipped global config"
        print("OK")
    """)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().endswith("OK")
