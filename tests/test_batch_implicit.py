"""Derivatives of batched solutions (implicit function theorem, custom_jvp): forward
mode (jvp/jacfwd) and reverse mode (grad/jacrev) agree with each other and with central
finite differences of the solver's answer."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import adaptprec as ap

T = jnp.linspace(0.0, 2.0, 10)
_rng = np.random.default_rng(1)
Y = jnp.asarray(np.stack([2.0 * np.exp(-0.7 * np.asarray(T)),
                          1.5 * np.exp(-1.3 * np.asarray(T))])
                + 0.01 * _rng.standard_normal((2, 10)))


def model(p, t):
    return p[0] * jnp.exp(-p[1] * t)


def fit(y, scale):
    return ap.solve_nlsq_batch(model, jnp.ones((2, 2)), (T * scale,), in_axes=None,
                               ydata=y, precision="f64", ftol=1e-14, xtol=1e-14,
                               gtol=1e-14).x


@pytest.mark.slow
def test_forward_and_reverse_mode_agree_with_finite_differences():
    jf = jax.jacfwd(fit, argnums=(0, 1))(Y, 1.0)
    jr = jax.jacrev(fit, argnums=(0, 1))(Y, 1.0)
    np.testing.assert_allclose(jf[0], jr[0], rtol=1e-8, atol=1e-12)
    np.testing.assert_allclose(jf[1], jr[1], rtol=1e-8, atol=1e-12)
    h = 1e-6
    fd_scale = (fit(Y, 1.0 + h) - fit(Y, 1.0 - h)) / (2 * h)
    np.testing.assert_allclose(jf[1], fd_scale, rtol=1e-5, atol=1e-8)
    dy = jnp.zeros_like(Y).at[1, 3].set(1.0)
    fd_y = (fit(Y + h * dy, 1.0) - fit(Y - h * dy, 1.0)) / (2 * h)
    _, tangent = jax.jvp(lambda y: fit(y, 1.0), (Y,), (dy,))
    np.testing.assert_allclose(tangent, fd_y, rtol=1e-5, atol=1e-8)
    # fits are independent: fit 0 does not move when fit 1's data do
    np.testing.assert_allclose(tangent[0], 0.0, atol=1e-14)
