"""One compaction for the runtime, linalg and batch (adaptprec/_compaction.py; issue 13)."""

import jax
import jax.numpy as jnp
import numpy as np

import adaptprec as ap
from adaptprec import _compaction as C
from adaptprec.batch import compaction as batch_compaction


def test_batch_uses_the_runtime_compaction():
    assert batch_compaction.select is C.select
    assert batch_compaction.gather is C.gather
    assert batch_compaction.scatter is C.scatter


def test_select_gather_scatter_round_trip_under_jit():
    @jax.jit
    def negate_marked(tree, mask):
        idx, valid = C.select(mask, 3)
        rows = C.gather(tree, idx)
        rows = jax.tree.map(lambda r: jnp.where(valid.reshape((-1,) + (1,) * (r.ndim - 1)),
                                                -r, r), rows)
        return C.scatter(tree, idx, rows)

    tree = {"a": jnp.arange(5.0), "b": jnp.arange(10.0).reshape(5, 2)}
    out = negate_marked(tree, jnp.array([False, True, False, True, False]))
    assert out["a"].tolist() == [0.0, -1.0, 2.0, -3.0, 4.0]
    assert out["b"][1].tolist() == [-2.0, -3.0] and out["b"][0].tolist() == [0.0, 1.0]


def test_by_count_picks_one_branch():
    f = jax.jit(lambda need: C.by_count(need, 2, lambda x: x, lambda x: x + 1,
                                        lambda x: x + 2, jnp.int32(0)))
    assert [int(f(jnp.array(m))) for m in ([0, 0, 0], [1, 0, 1], [1, 1, 1])] == [0, 1, 2]


def test_runtime_capacity_is_capacity_for():
    mgr = ap.MixedPrecisionManager("f32,f64", batch="element", capacity=0.25)
    assert mgr._capacity(64) == C.capacity_for(0.25, 64) == 16
    for bad in (0, 1.5, True, "x"):
        try:
            ap.MixedPrecisionManager("f32,f64", capacity=bad)
        except ValueError as e:
            assert "capacity" in str(e)
        else:
            raise AssertionError(f"capacity={bad!r} accepted")


def test_element_escalation_compacts_like_before():
    # 2 of 64 elements overflow in f16: only they climb (through the compacted buffer)
    f = ap.adaptive(lambda x: jnp.exp(x), ladder="f16,f32", batch="element", capacity=4)
    x = jnp.linspace(0.0, 5.0, 64).at[3].set(20.0).at[40].set(30.0)
    y, rep = jax.jit(jax.vmap(f.with_report))(x)
    rungs = np.asarray(rep.rung)
    assert sorted(np.nonzero(rungs)[0].tolist()) == [3, 40]
    np.testing.assert_allclose(y, jnp.exp(x), rtol=5e-3)                 # f16 elements
    np.testing.assert_allclose(y[jnp.array([3, 40])], jnp.exp(jnp.array([20.0, 30.0])),
                               rtol=1e-6)                                 # f32 ones
