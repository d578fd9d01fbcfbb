"""solve_nlsq and solve_nlsq_batch are one engine to the user (issue 13): the same
defaults, the same status vocabulary, the same guarantee that a converged answer was
finished on the top rung, and the same answers."""

import inspect

import jax.numpy as jnp
import numpy as np
import pytest

import adaptprec as ap
from _subprocess import run_python

T = np.linspace(0.0, 3.0, 25)
TRUE = np.array([[2.0, 1.3], [0.7, 0.4], [5.0, 2.2]])
Y = TRUE[:, :1] * np.exp(-TRUE[:, 1:] * T) + 0.01 * np.sin(7 * T)


def decay(p, t):
    return p[0] * jnp.exp(-p[1] * t)


@pytest.fixture(scope="module")
def both():
    batch = ap.solve_nlsq_batch(decay, np.ones((3, 2)), (T,), in_axes=None, ydata=Y)
    single = [ap.solve_nlsq(lambda p, t, y: decay(p, t) - y, np.ones(2), args=(T, Y[k]))
              for k in range(3)]
    return batch, single


def test_same_default_tolerances_and_precision():
    a = inspect.signature(ap.solve_nlsq).parameters
    b = inspect.signature(ap.solve_nlsq_batch).parameters
    for name in ("ftol", "xtol", "gtol", "max_steps", "precision", "loss", "f_scale"):
        assert a[name].default == b[name].default, name


@pytest.mark.slow
def test_same_answers_statuses_and_top_rung(both):
    batch, single = both
    for k, res in enumerate(single):
        np.testing.assert_allclose(np.asarray(batch.x[k]), np.asarray(res.x), rtol=1e-7)
        assert bool(batch.success[k]) and bool(res.success)
        # one vocabulary: both codes are Status members with the same meaning
        assert ap.Status(int(batch.status[k])).success and ap.Status(int(res.status)).success
        # a converged answer was finished on the top rung in both engines
        assert int(batch.rung[k]) == len(batch.ladder) - 1
        assert res.rung_name == "f64"
        assert ap.Reason(int(batch.escalation_reason[k])) is ap.Reason.VERIFY


def test_same_error_for_adaptive_under_a_trace_with_x64_off():
    code = """
import jax, jax.numpy as jnp, numpy as np, adaptprec as ap
msgs = []
for call in (lambda x: ap.solve_nlsq(lambda p: p - 1.0, x).x,
             lambda x: ap.solve_nlsq_batch(lambda p: p - 1.0, x[None]).x):
    try:
        jax.jit(call)(jnp.ones(2))
    except Exception as e:
        msgs.append(str(e).split(':', 1)[-1].strip()[:60])
print(len(msgs), len(set(msgs)))
"""
    proc = run_python(code, x64=False, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["2", "1"], proc.stdout
