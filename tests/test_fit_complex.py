"""Complex-valued models: real and imaginary parts as residuals, against scipy's
curve_fit of the split model (the stacked parts), in curve_fit and ap.fit (report,
intervals, bands)."""

import jax.numpy as jnp
import numpy as np
import pytest
import scipy.optimize as so

import adaptprec as ap

RNG = np.random.default_rng(3)
W = np.logspace(-2, 2, 30)


def debye(w, eps_inf, deps, tau):
    return eps_inf + deps / (1.0 + 1j * w * tau)


Y = (np.asarray(debye(W, 2.0, 5.0, 0.3)) + RNG.normal(0, 0.02, W.size)
     + 1j * RNG.normal(0, 0.02, W.size))
SIGMA = np.linspace(0.01, 0.03, W.size)
P0 = [1.0, 4.0, 0.5]


def split(_, a, b, c):
    f = a + b / (1.0 + 1j * W * c)
    return np.concatenate([f.real, f.imag])


@pytest.fixture(scope="module")
def reference():
    return so.curve_fit(split, W, np.concatenate([Y.real, Y.imag]), p0=P0,
                        sigma=np.concatenate([SIGMA, SIGMA]))


def test_curve_fit_complex_against_the_split_model(reference):
    popt, pcov = ap.curve_fit(debye, W, Y, p0=P0, sigma=SIGMA)
    np.testing.assert_allclose(popt, reference[0], rtol=1e-7)
    np.testing.assert_allclose(pcov, reference[1], rtol=1e-5)


@pytest.mark.slow
def test_fit_complex_report(reference):
    res = ap.fit(debye, W, Y, p0=P0, sigma=SIGMA)
    np.testing.assert_allclose(res.popt, reference[0], rtol=1e-7)
    np.testing.assert_allclose(res.pcov, reference[1], rtol=1e-5)
    assert res.nobs == 60 and res.dof == 57 and res.complex_points == 30
    assert np.iscomplexobj(res.residuals)
    assert "30 complex values" in str(res)
    band = res.band(np.array([0.1, 1.0]))
    f = np.asarray(debye(np.array([0.1, 1.0]), *res.popt))
    np.testing.assert_allclose(band.fit, f, rtol=1e-12)
    assert np.all(band.stderr.real > 0) and np.all(band.stderr.imag > 0)
    prof = res.profile_intervals(0.95, params=["tau"])
    wald = res.wald_intervals()[2]
    np.testing.assert_allclose(prof.interval("tau"), wald, rtol=1e-3)


def test_complex_model_with_real_data_is_an_error():
    with pytest.raises(ValueError, match="model returns complex values but ydata is real"):
        ap.curve_fit(debye, W, Y.real, p0=P0)
