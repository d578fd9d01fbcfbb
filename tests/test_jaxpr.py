"""The one jaxpr walker (adaptprec/_jaxpr.py) and the one primitive table (opkind) that
autocast, the pointwise analysis and the fits-last evaluator share (issue 13, item 4)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from adaptprec import _jaxpr as jx
from adaptprec import _opkind as opkind
from adaptprec.batch._fits_last import vmap_last
from adaptprec._pointwise import point_axes


@jax.custom_vjp
def _square(x):
    return x * x


_square.defvjp(lambda x: (x * x, x), lambda x, g: (2.0 * x * g,))


def _nested(x):
    y = jax.jit(jnp.sin)(x)
    y = jax.checkpoint(jnp.cos)(y)
    y = lax.cond(y[0] > 0, lambda a: a * 2.0, lambda a: -a, y)
    y = lax.scan(lambda c, a: (c + a, a * 3.0), 0.0, y)[1]
    return jax.nn.relu(y) + _square(y)


def test_iter_eqns_reaches_every_nested_body():
    closed = jax.make_jaxpr(_nested)(jnp.ones(3))
    top = {e.primitive.name for e in jx.iter_eqns(closed, recursive=False)}
    every = {e.primitive.name for e in jx.iter_eqns(closed)}
    assert {"jit", "remat2", "cond", "scan", "custom_jvp_call", "custom_vjp_call"} <= top
    # sin (in jit), cos (in remat), the branch and scan bodies' muls, relu's max
    assert {"sin", "cos", "mul", "max"} <= every and "sin" not in top
    assert all(jx.has_sub_jaxpr(e) == bool(jx.sub_jaxprs(e)) for e in jx.iter_eqns(closed))


def test_call_body_kinds():
    eqns = {e.primitive.name: e for e in jax.make_jaxpr(_nested)(jnp.ones(3)).eqns}
    for name in ("jit", "remat2", "custom_jvp_call", "custom_vjp_call"):
        body, consts = jx.call_body(eqns[name])
        assert hasattr(body, "eqns") and len(body.invars) == len(eqns[name].invars)
    assert jx.call_body(eqns["custom_jvp_call"], custom=False) is None
    assert jx.call_body(eqns["remat2"], remat=False) is None
    assert jx.call_body(eqns["cond"]) is None and jx.call_body(eqns["scan"]) is None


def test_eval_jaxpr_rebinding_reproduces_the_function_with_literals():
    seen = []

    def lit(v):
        seen.append(v.val)
        return v.val

    x = jnp.linspace(-1.0, 1.0, 3)
    closed = jax.make_jaxpr(_nested)(x)
    out = jx.eval_jaxpr(closed.jaxpr, closed.consts, [x], jx.bind, literal=lit)
    np.testing.assert_allclose(out[0], _nested(x), rtol=1e-6)
    assert seen  # the jaxpr has literal operands (0.0 of relu, ...)


def test_eval_jaxpr_is_jit_and_vmap_safe():
    def run(x):
        closed = jax.make_jaxpr(_nested)(x)
        return jx.eval_jaxpr(closed.jaxpr, closed.consts, [x], jx.bind)[0]

    xs = jnp.linspace(0.1, 1.0, 6).reshape(2, 3)
    np.testing.assert_allclose(jax.jit(jax.vmap(run))(xs), jax.vmap(_nested)(xs), rtol=1e-6)


def test_one_table_for_the_shape_analyses():
    # every entrywise primitive is ELEMENTWISE/TRANSCENDENTAL or a value-preserving cast
    casts = {"convert_element_type", "reduce_precision", "copy", "copy_p"}
    for name in opkind.ENTRYWISE - casts:
        assert opkind.classify(name) in (opkind.OpKind.ELEMENTWISE,
                                         opkind.OpKind.TRANSCENDENTAL), name
    assert "random_gamma" not in opkind.ENTRYWISE
    assert all(opkind.classify(n) is opkind.OpKind.REDUCTION for n in opkind.AXIS_REDUCTIONS)
    assert all(opkind.classify(n) is opkind.OpKind.CONTROL for n in opkind.CALLS)
    # the pointwise analysis and fits-last keep no table of their own: opkind's sets only
    import adaptprec.batch._fits_last as fl
    import adaptprec._pointwise as pw
    shared = {id(v) for v in vars(opkind).values() if isinstance(v, frozenset)}
    for mod in (fl, pw):
        own = [k for k, v in vars(mod).items()
               if isinstance(v, frozenset) and id(v) not in shared]
        assert not own, (mod.__name__, own)


def test_pointwise_sees_through_custom_vjp_and_stop_gradient():
    t, y = jnp.linspace(0, 1, 40), jnp.zeros(40)
    res = lambda p, t, y: p[0] * _square(t) + lax.stop_gradient(p[1] * t) - y
    assert point_axes(res, jnp.ones(2), (t, y), 40) == (0, 0)
    not_pw = lambda p, t, y: p[0] * _square(t) - jnp.cumsum(y)
    assert point_axes(not_pw, jnp.ones(2), (t, y), 40) is None


@pytest.mark.parametrize("fn", [
    lambda p, g: jax.jit(lambda a, b: a[0] * jnp.exp(-a[1] * b))(p, g),     # inlined call
    lambda p, g: lax.stop_gradient(p[0]) * jnp.sin(g) + p[1] ** 2,           # entrywise
    lambda p, g: jax.nn.softplus(p[0] * g) + jnp.sum(p) * g,                 # custom_jvp
])
def test_fits_last_matches_vmap(fn):
    p = jnp.array([[1.0, 2.0, 0.5], [0.3, 0.1, 2.0]])
    g = jnp.linspace(0.0, 1.0, 4)
    np.testing.assert_allclose(vmap_last(fn)(p, g), jax.vmap(fn, (-1, None), -1)(p, g),
                               rtol=1e-6)
