"""adaptprec._structure: one trace of a kernel per shapes, shared by plan and guards."""

import gc
import weakref

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from adaptprec._structure import kernel_structure, structure_of_inputs


def _counting(fn):
    calls = []

    def kernel(*a, **k):
        calls.append(1)
        return fn(*a, **k)

    return kernel, calls


def _avals(*xs):
    return tuple(jax.ShapeDtypeStruct(x.shape, x.dtype) for x in xs)


def test_one_trace_per_kernel_and_shapes_shared_by_plan_and_guard():
    kernel, calls = _counting(lambda x, w: jnp.tanh(x @ w))
    x, w = jnp.ones((64, 8)), jnp.ones((8, 4))
    td = jax.tree_util.tree_structure(((x, w), {}))
    st = kernel_structure(kernel, td, [None, None], (0, 1), _avals(x, w))
    assert st.rows == (True, False) and not st.entrywise and st.conv is None
    first = len(calls)          # the structure trace, plus the rows' confirmation
    assert first == 2
    # the guard's lookup on the user's (concrete) inputs: the same entry, no trace
    assert structure_of_inputs(kernel, ((x, w), {})) is st
    assert kernel_structure(kernel, td, [None, None], (0, 1), _avals(x, w)) is st
    assert len(calls) == first
    # other shapes: a new trace
    x2 = jnp.ones((128, 8))
    assert structure_of_inputs(kernel, ((x2, w), {})).rows == (True, False)
    assert len(calls) > first


def test_static_leaves_are_part_of_the_key():
    kernel, calls = _counting(lambda x, mode: jnp.cumsum(x) if mode == "scan" else x * 2)
    x = jnp.ones(10)            # below _rowwise.MIN_BATCH: no second (rows) trace
    assert not structure_of_inputs(kernel, ((x, "scan"), {})).entrywise
    assert structure_of_inputs(kernel, ((x, "scale"), {})).entrywise
    assert not structure_of_inputs(kernel, ((x, "scan"), {})).entrywise
    assert len(calls) == 2


def test_convolution_parameters_for_the_guard():
    def conv(x, w):
        return jax.lax.conv_general_dilated(x, w, (1, 1), "SAME",
                                            dimension_numbers=("NHWC", "HWIO", "NHWC"))
    x, w = jnp.ones((2, 8, 8, 3)), jnp.ones((3, 3, 3, 4))
    st = structure_of_inputs(conv, ((x, w), {}))
    assert st.conv is not None and (st.conv.lhs, st.conv.rhs) == (0, 1)
    assert st.conv.params["window_strides"] == (1, 1)
    assert st.rows is None and not st.entrywise


def test_unhashable_static_traced_every_time():
    kernel, calls = _counting(lambda x, opts: x * opts["scale"])
    x = jnp.ones(10)
    for _ in range(2):
        assert structure_of_inputs(kernel, ((x, {"scale": 2.0}), {})).entrywise
    assert len(calls) == 1      # 2.0 is a hashable static leaf: memoized
    kernel2, calls2 = _counting(lambda x, s: x * float(np.sum(s.a)))

    class Unhashable:
        __hash__ = None
        a = [1.0]

    for _ in range(2):
        assert structure_of_inputs(kernel2, ((x, Unhashable()), {})).entrywise
    assert len(calls2) == 2


def test_a_failed_trace_raises_on_entrywise_and_is_not_kept():
    def bad(x):
        raise ValueError("not traceable")

    st = structure_of_inputs(bad, ((jnp.ones(3),), {}))
    assert st.rows is None and st.conv is None
    with pytest.raises(ValueError, match="not traceable"):
        st.entrywise
    assert structure_of_inputs(bad, ((jnp.ones(3),), {})) is not st


def test_entries_go_with_the_kernel():
    from adaptprec import _structure

    kernel, _ = _counting(lambda x: x + 1)
    structure_of_inputs(kernel, ((jnp.ones(3),), {}))
    assert kernel in _structure._memo
    alive = weakref.ref(kernel)
    del kernel
    gc.collect()
    assert alive() is None      # the memo does not keep a kernel alive
