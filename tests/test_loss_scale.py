"""Loss scaling: float32 scale, pytree round trips, adjust dynamics, unscale order."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import adaptprec as ap


def test_scale_pinned_to_float32_whatever_the_input():
    for ls in (ap.StaticLossScale(jnp.float16(1024)), ap.DynamicLossScale(jnp.bfloat16(8)),
               ap.DynamicLossScale(2 ** 15, min_scale=jnp.float16(1))):
        assert ls.loss_scale.dtype == jnp.float32
    ls = ap.DynamicLossScale(2.0 ** 15, period=1)
    for _ in range(3):  # 2^18 is far past float16's max; the scale still represents it
        ls = ls.adjust(jnp.array(True))
    assert float(ls.loss_scale) == 2.0 ** 18 and ls.loss_scale.dtype == jnp.float32


def test_scale_unscale_preserves_leaf_dtypes_and_skips_ints():
    ls = ap.StaticLossScale(256.0)
    tree = {"h": jnp.array([1.5], jnp.float16), "f": jnp.array([2.0], jnp.float64),
            "i": jnp.array([3])}
    scaled = ls.scale(tree)
    assert scaled["h"].dtype == jnp.float16 and float(scaled["h"][0]) == 384.0
    assert scaled["i"] is tree["i"]
    back = ls.unscale(scaled)
    assert float(back["h"][0]) == 1.5 and float(back["f"][0]) == 2.0


def test_noop():
    ls = ap.NoOpLossScale()
    x = jnp.ones(2)
    assert ls.scale(x) is x and ls.unscale(x) is x and ls.adjust(False) is ls
    assert jax.tree_util.tree_leaves(ls) == []


def test_min_scale_survives_flatten_unflatten_and_jit():
    ls = ap.DynamicLossScale(8.0, period=5, factor=4, min_scale=2.0)
    leaves, treedef = jax.tree_util.tree_flatten(ls)
    back = jax.tree_util.tree_unflatten(treedef, leaves)
    assert float(back.min_scale) == 2.0 and back.period == 5 and back.factor == 4

    @jax.jit
    def shrink_many(ls):
        for _ in range(6):
            ls = ls.adjust(jnp.array(False))
        return ls

    out = shrink_many(ls)
    assert float(out.loss_scale) == 2.0  # 8 -> 2 (div by 4), then held at min_scale
    assert float(out.min_scale) == 2.0 and out.period == 5 and int(out.counter) == 0


def _reference_adjust(scale, counter, finite, period, factor, min_scale):
    if finite:
        counter += 1
        if counter >= period:
            return min(scale * factor, np.finfo(np.float32).max), 0
        return scale, counter
    return max(scale / factor, min_scale), 0


def test_many_adjust_steps_in_a_jitted_scan_match_reference():
    rng = np.random.default_rng(0)
    finite = rng.random(500) < 0.97
    ls0 = ap.DynamicLossScale(2.0 ** 10, period=7, factor=2, min_scale=0.5)

    @jax.jit
    def run(ls, flags):
        def body(ls, f):
            ls = ls.adjust(f)
            return ls, ls.loss_scale
        return jax.lax.scan(body, ls, flags)

    final, trace = run(ls0, jnp.asarray(finite))
    s, c = 2.0 ** 10, 0
    expected = []
    for f in finite:
        s, c = _reference_adjust(s, c, bool(f), 7, 2, 0.5)
        expected.append(s)
    np.testing.assert_array_equal(np.asarray(trace), np.asarray(expected, np.float32))
    assert int(final.counter) == c


def test_unscale_uses_the_scale_that_produced_the_gradients():
    ls = ap.DynamicLossScale(2.0 ** 10, period=1)  # adjust will double the scale
    w = jnp.array([1.0, -2.0, 3.0])

    def loss(w):
        return jnp.sum(w.astype(jnp.float16) ** 2)

    scaled_grads = jax.grad(lambda w: ls.scale(loss(w)))(w)
    grads, finite, new_ls = jax.jit(lambda ls, g: ls.unscale_and_adjust(g))(ls, scaled_grads)
    assert bool(finite) and float(new_ls.loss_scale) == 2.0 ** 11
    np.testing.assert_allclose(grads, 2 * w)


def test_overflow_is_detected_and_scale_shrinks():
    ls = ap.DynamicLossScale(2.0 ** 15)
    w = jnp.array([100.0, 200.0])
    g = jax.grad(lambda w: ls.scale(jnp.sum(w.astype(jnp.float16) ** 2)))(w)
    grads, finite, new_ls = ls.unscale_and_adjust(g)
    assert not bool(finite) and float(new_ls.loss_scale) == 2.0 ** 14


def test_all_finite_and_select_tree():
    assert bool(ap.all_finite({"a": jnp.ones(2), "i": jnp.arange(2)}))
    assert not bool(ap.all_finite([jnp.ones(2), jnp.array([jnp.nan])]))
    assert bool(ap.all_finite({}))
    a, b = {"x": jnp.ones(2)}, {"x": jnp.zeros(2)}
    out = jax.jit(ap.select_tree)(jnp.array(True), a, b)
    np.testing.assert_array_equal(out["x"], a["x"])
    with pytest.raises(ValueError, match="scalar boolean"):
        ap.select_tree(jnp.array([True, False]), a, b)


@pytest.mark.parametrize("kwargs,needle", [
    (dict(scale=0.0), "finite positive"), (dict(scale=float("inf")), "finite positive"),
    (dict(period=0), "period"), (dict(factor=1), "factor"),
])
def test_bad_dynamic_arguments(kwargs, needle):
    with pytest.raises(ValueError, match=needle):
        ap.DynamicLossScale(**kwargs)


def test_scales_are_validated_as_arrays_and_never_raised_by_an_overflow():
    # newcomer audit 2: array scales skipped validation (0 skipped every step forever),
    # and min_scale above scale made an overflow double the scale
    import adaptprec as ap
    for make in (lambda: ap.DynamicLossScale(jnp.array(-4.0)),
                 lambda: ap.StaticLossScale(jnp.array(0.0)),
                 lambda: ap.StaticLossScale(jnp.array([1.0, 2.0])),
                 lambda: ap.DynamicLossScale(4.0, min_scale=8.0)):
        with pytest.raises(ValueError):
            make()
    # traced, where it cannot be refused: the overflow still never raises the scale
    grow = jax.jit(lambda s, lo: ap.DynamicLossScale(s, min_scale=lo).adjust(
        jnp.array(False)).loss_scale)
    assert float(grow(jnp.float32(4.0), jnp.float32(8.0))) <= 4.0
