"""Residual identity (adaptprec/nlsq/_identity.py): what a jaxpr's text does not show.

A ``custom_jvp`` rule prints as ``jvp=<lambda>``: two residuals with the same primal and
differently written rules once shared one key, so the second solve reused the first's
compiled Jacobian (and an edited rule would have loaded the old program from disk)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import adaptprec as ap
from adaptprec._identity import trace_residual, user_callables
from adaptprec.nlsq._residual import traced_once


def _exp_with_rule(scale):
    @jax.custom_jvp
    def h(x):
        return jnp.exp(x)

    h.defjvp(lambda p, t: (h(p[0]), scale * jnp.exp(p[0]) * t[0]))
    return h


def test_custom_rules_key_the_computation():
    t = np.linspace(0.0, 1.0, 16)
    h1, h2 = _exp_with_rule(1.0), _exp_with_rule(0.5)
    x = jnp.zeros(1)
    a = trace_residual(lambda p, t: h1(p[0] * t), x, (t,))
    b = trace_residual(lambda p, t: h2(p[0] * t), x, (t,))
    assert a.key[0] == b.key[0]          # the same text...
    assert a.key != b.key                # ...but not the same computation
    # the same rule object (a fresh lambda calling it) still shares the key
    assert trace_residual(lambda p, t: h1(p[0] * t), x, (t,)).key == a.key
    # jax's own rules are part of the jax version, not the key
    assert user_callables(jax.make_jaxpr(lambda v: jax.nn.softplus(v))(1.0).jaxpr) == ()


def test_replayed_traces_keep_their_rules_in_the_key():
    # traced_once replays a recorded jaxpr: the replayed custom_jvp_call holds its rule
    # too deep for user_callables, so the wrapper lists the rules of its own trace
    t = np.linspace(0.0, 1.0, 16)
    h1, h2 = _exp_with_rule(1.0), _exp_with_rule(0.5)
    x = jnp.zeros(1)
    a = trace_residual(traced_once(lambda p, t: h1(p[0] * t)), x, (t,))
    b = trace_residual(traced_once(lambda p, t: h2(p[0] * t)), x, (t,))
    assert a.key[0] == b.key[0] and a.key != b.key
    assert a.key == trace_residual(lambda p, t: h1(p[0] * t), x, (t,)).key


@pytest.mark.slow
def test_solves_with_different_rules_use_their_own_jacobian():
    t = np.linspace(0.0, 1.0, 16)
    y = np.exp(0.7 * t)
    jacs = []
    for scale in (1.0, 0.5):
        h = _exp_with_rule(scale)
        res = ap.solve_nlsq(lambda p, t, y, h=h: h(p[0] * t) - y, np.zeros(1), args=(t, y))
        np.testing.assert_allclose(res.x, [0.7], rtol=1e-6)
        jacs.append(np.asarray(res.jac))
    np.testing.assert_allclose(jacs[1], 0.5 * jacs[0], rtol=1e-10)
