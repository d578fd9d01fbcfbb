"""vmap_last (batch axis kept last) agrees with jax.vmap(in_axes=-1, out_axes=-1)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from adaptprec.batch._fits_last import vmap_last
from adaptprec.batch.lm_batched import make_fj

B = 7
GRID = jnp.linspace(-1.0, 2.0, 6)


def _gauss(p, g):
    return p[0] * jnp.exp(-((g - p[1]) ** 2) / (2 * p[2] ** 2)) + p[3]


@jax.custom_jvp
def _softplus(x):
    return jnp.log1p(jnp.exp(x))


@_softplus.defjvp
def _softplus_jvp(primals, tangents):
    (x,), (t,) = primals, tangents
    return _softplus(x), jax.nn.sigmoid(x) * t


CASES = {
    # scalar parameters against a shared grid (the case the module exists for)
    "gauss": _gauss,
    # size-1 broadcasting, outer products, reshape/transpose/concatenate
    "outer": lambda p, g: (p[:2, None] * g[None, :]).ravel(),
    "reshape_transpose": lambda p, g: jnp.concatenate([p.reshape(2, 2).T.ravel(), g[:3] * p[0]]),
    # reductions and argmax
    "reductions": lambda p, g: jnp.stack([jnp.sum(p * g[:4]), jnp.max(p), jnp.argmax(p) * 1.0,
                                          jnp.prod(p[:2])]),
    # contractions (dot_general: handled by the per-primitive vmap fallback)
    "dot": lambda p, g: jnp.outer(g, g)[:, :4] @ p + jnp.dot(p, p),
    # gathers with traced indices, dynamic_slice
    "gather": lambda p, g: g[jnp.argmax(p)] * p + jax.lax.dynamic_slice(g, (jnp.argmin(p),), (4,)),
    # nested jit is inlined
    "nested_jit": lambda p, g: jax.jit(lambda a, b: jnp.sin(a[0] * b) + a[1])(p, g),
    # control flow: fori_loop, cond, scan (polyval)
    "fori": lambda p, g: jax.lax.fori_loop(0, 3, lambda i, y: y * p[0] + g, g),
    "cond": lambda p, g: jax.lax.cond(p[0] > 0.5, lambda: g * p[1], lambda: g - p[2]),
    "polyval": lambda p, g: jnp.polyval(p, g),
    # custom_jvp, where with a scalar predicate, clip (clamp with scalar bounds), iota
    "custom_jvp": lambda p, g: _softplus(p[0] * g),
    "where_scalar_pred": lambda p, g: jnp.where(p[0] > 0.5, g, -g) + p[1],
    "clip": lambda p, g: jnp.clip(p, 0.2, 0.8) * jnp.arange(4.0),
    # an output that does not depend on the batch at all
    "constant_part": lambda p, g: (g * 2.0, p[0] + 0.0 * p[1]),
    # forward-mode Jacobian inside (what the solver evaluates)
    "jacfwd": lambda p, g: jax.jacfwd(_gauss)(p, g),
    "integer_mix": lambda p, g: (jnp.floor(p * 4).astype(jnp.int32) % 3, p.astype(jnp.float32)),
}


def _inputs(seed=0):
    rng = np.random.default_rng(seed)
    return jnp.asarray(rng.uniform(0.1, 1.0, (4, B)))


@pytest.mark.parametrize("name", sorted(CASES))
def test_matches_vmap(name):
    fn = CASES[name]
    p = _inputs()
    got = vmap_last(fn)(p, GRID)
    want = jax.vmap(fn, in_axes=(-1, None), out_axes=-1)(p, GRID)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        assert a.shape == b.shape and a.dtype == b.dtype
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-13, atol=1e-13)


def test_pytree_batched_and_python_scalar_shared_under_jit():
    def fn(d, s):
        return d["a"] * s["scale"] + d["b"][0] * s["k"]

    batched = {"a": jnp.arange(3.0 * B).reshape(3, B), "b": jnp.ones((2, B))}
    shared = {"scale": jnp.array([1.0, 2.0, 3.0]), "k": 2.0}
    got = jax.jit(lambda b, s: vmap_last(fn)(b, s))(batched, shared)
    want = jax.vmap(fn, in_axes=(-1, None), out_axes=-1)(batched, shared)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    assert got.dtype == want.dtype


def test_float32_stays_float32_with_python_scalar():
    p = jnp.ones((2, B), jnp.float32)
    out = vmap_last(lambda q, s: q * s)(p, 2.0)
    assert out.dtype == jnp.float32


def test_rejects_ragged_batch():
    with pytest.raises(ValueError, match="batch size"):
        vmap_last(lambda d, s: d["a"] + d["b"])({"a": jnp.ones((2, 3)), "b": jnp.ones((2, 4))}, ())


def test_residual_jacobian_layouts_agree():
    fj = make_fj(lambda x, b, s: _gauss(x, s) - b[0], jnp.float64, jnp.float64)
    x = _inputs(1).T                                   # (B, 4)
    y = (jnp.asarray(np.random.default_rng(2).normal(size=(B, GRID.size))),)
    f, jt = fj(x, y, GRID)
    f_l, jt_l = fj.fits_last(x.T, (y[0].T,), GRID)
    np.testing.assert_allclose(np.asarray(f_l), np.asarray(f).T, rtol=1e-14, atol=1e-14)
    np.testing.assert_allclose(np.asarray(jt_l), np.moveaxis(np.asarray(jt), 0, -1),
                               rtol=1e-14, atol=1e-14)
