"""Likelihood fits: Poisson (the deviance on the least-squares engine, Gpufit's MLE) and a
user's negative log-likelihood (the Newton solver), against scipy.optimize.minimize on
the same likelihood: parameters to 1e-6, errors against the inverse Fisher information
(Poisson) or the inverse Hessian (a user's likelihood)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.optimize as so
from scipy.special import gammaln

import adaptprec as ap
from adaptprec.analysis._newton import minimize_nll
from adaptprec.modeling.likelihood import deviance_residual

RNG = np.random.default_rng(5)
X = np.linspace(0.0, 10.0, 40)


def decay(x, a, k, b):
    return a * jnp.exp(-k * x) + b


Y = RNG.poisson(np.asarray(decay(X, 50.0, 0.4, 2.0))).astype(float)
Y[3] = 0.0  # a zero count (the deviance's y log(f/y) term vanishes there)
P0 = [30.0, 0.3, 1.0]


def _np(p, x=X):
    return p[0] * np.exp(-p[1] * x) + p[2]


def _grad_f(p, x=X):
    e = np.exp(-p[1] * x)
    return np.stack([e, -p[0] * x * e, np.ones_like(x)], axis=1)


def _nll(p):
    f = _np(p)
    with np.errstate(invalid="ignore", divide="ignore"):   # a simplex may leave f > 0
        return np.sum(f - Y * np.log(f))


@pytest.fixture(scope="module")
def reference():
    def grad(p):
        return _grad_f(p).T @ (1.0 - Y / _np(p))

    def hess(p):
        g = _grad_f(p)
        f = _np(p)
        e = np.exp(-p[1] * X)
        w = 1.0 - Y / f
        H = g.T @ (g * (Y / f ** 2)[:, None])
        H[0, 1] += np.sum(w * -X * e)
        H[1, 0] += np.sum(w * -X * e)
        H[1, 1] += np.sum(w * p[0] * X ** 2 * e)
        return H

    r = so.minimize(_nll, P0, jac=grad, hess=hess, method="trust-exact",
                    options=dict(gtol=1e-9))
    assert r.success and np.max(np.abs(grad(r.x))) < 1e-8
    g = _grad_f(r.x)
    fisher = g.T @ (g / _np(r.x)[:, None])
    return r.x, np.linalg.inv(fisher), np.linalg.inv(hess(r.x))


@pytest.fixture(scope="module")
def poisson_fit():
    return ap.fit(decay, X, Y, p0=P0, likelihood="poisson")


def test_deviance_residuals_square_to_the_deviance():
    f = np.array([0.5, 1.0, 3.0, 3.0 + 1e-9, 40.0])
    y = np.array([0.0, 2.0, 3.0, 3.0, 25.0])
    d = np.asarray(deviance_residual(f, y))
    with np.errstate(divide="ignore", invalid="ignore"):
        dev = 2 * (f - y - np.where(y > 0, y * np.log(f / np.where(y > 0, y, 1)), 0))
    np.testing.assert_allclose(d ** 2, dev, rtol=1e-6, atol=1e-18)
    assert np.all(np.sign(d) == np.sign(f - y))
    g = jax.grad(lambda f: jnp.sum(deviance_residual(f, jnp.asarray(y)) ** 2))(
        jnp.asarray(f))
    np.testing.assert_allclose(g, 2 * (1 - y / f), rtol=1e-6, atol=1e-9)
    assert np.isnan(np.asarray(deviance_residual(np.array([-1.0]), np.array([1.0]))))[0]


@pytest.mark.slow
def test_curve_fit_poisson_against_minimize(reference):
    popt, pcov, info, _, _ = ap.curve_fit(decay, X, Y, p0=P0, likelihood="poisson",
                                          full_output=True)
    p_ref, fisher_inv, _ = reference
    np.testing.assert_allclose(popt, p_ref, rtol=1e-6)
    np.testing.assert_allclose(pcov, fisher_inv, rtol=1e-6)
    f = _np(popt)
    dev = 2 * np.sum(f - Y - np.where(Y > 0, Y * np.log(f / np.where(Y > 0, Y, 1)), 0))
    assert info["deviance"] == pytest.approx(dev, rel=1e-10)


def test_fit_poisson_report(poisson_fit, reference):
    res = poisson_fit
    p_ref, fisher_inv, _ = reference
    np.testing.assert_allclose(res.popt, p_ref, rtol=1e-6)
    np.testing.assert_allclose(res.pcov, fisher_inv, rtol=1e-6)
    assert res.absolute_sigma and res.likelihood == "poisson"
    nll = float(np.sum(_np(res.popt) - Y * np.log(_np(res.popt)) + gammaln(Y + 1)))
    assert res.nll == pytest.approx(nll, rel=1e-10)
    assert res.aic == pytest.approx(2 * nll + 6, rel=1e-10)
    text = str(res)
    assert "Poisson maximum likelihood" in text and "deviance (Poisson)" in text
    wald = res.wald_intervals(0.95)
    np.testing.assert_allclose(wald[:, 1] - res.popt, 1.959964 * np.sqrt(np.diag(
        fisher_inv)), rtol=1e-5)


@pytest.mark.slow
def test_poisson_profile_against_a_direct_profile(poisson_fit):
    prof = poisson_fit.profile_intervals(0.95, params=["k"])
    lo, hi = prof.interval("k")

    def profile_dev(v):
        r = so.minimize(lambda q: _nll([q[0], v, q[1]]), [poisson_fit.popt[0],
                                                            poisson_fit.popt[2]],
                        method="Nelder-Mead", options=dict(xatol=1e-10, fatol=1e-12))
        return 2 * (r.fun - _nll(poisson_fit.popt)) - 3.841458820694124

    assert lo == pytest.approx(so.brentq(profile_dev, lo - 0.02, lo + 0.02), abs=1e-4)
    assert hi == pytest.approx(so.brentq(profile_dev, hi - 0.02, hi + 0.02), abs=1e-4)


def test_poisson_prediction_band_adds_the_count_variance(poisson_fit):
    xs = np.array([0.0, 5.0])
    conf = poisson_fit.band(xs)
    pred = poisson_fit.band(xs, kind="prediction")
    np.testing.assert_allclose(pred.stderr ** 2, conf.stderr ** 2 + conf.fit, rtol=1e-10)


@pytest.mark.slow
def test_user_likelihood_against_minimize(reference):
    res = ap.fit(decay, X, Y, p0=P0, likelihood=lambda y, f: f - y * jnp.log(f))
    p_ref, _, hess_inv = reference
    np.testing.assert_allclose(res.popt, p_ref, rtol=1e-6)
    np.testing.assert_allclose(res.pcov, hess_inv, rtol=1e-6)
    assert res.method == "newton" and res.chi2 == pytest.approx(2 * _nll(p_ref), rel=1e-10)
    prof = res.profile_intervals(0.95, params=["b"])
    assert np.isfinite(prof.interval("b")).all()


def test_newton_solver_under_jit_and_vmap():
    def rosen(p, s):
        return 100.0 * (p[1] - p[0] ** 2) ** 2 + (s - p[0]) ** 2

    inf = np.full(2, np.inf)
    solve = jax.jit(jax.vmap(lambda s: minimize_nll(rosen, jnp.array([-1.2, 1.0]), -inf,
                                                    inf, args=(s,)).x))
    out = solve(jnp.array([1.0, 2.0]))
    np.testing.assert_allclose(out, [[1.0, 1.0], [2.0, 4.0]], rtol=1e-8)


@pytest.mark.parametrize("kwargs, match", [
    (dict(likelihood="poisson", sigma=np.ones(40)), "takes no sigma"),
    (dict(likelihood="binomial"), "likelihood must be"),
    (dict(loss="poisson"), "likelihood='poisson'"),
])
def test_bad_likelihood_options(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ap.fit(decay, X, Y, p0=P0, **kwargs)


def test_poisson_data_and_start_are_checked():
    with pytest.raises(ValueError, match="non-negative counts"):
        ap.curve_fit(decay, X, -Y, p0=P0, likelihood="poisson")
    with pytest.raises(ValueError, match="must be positive"):
        ap.curve_fit(decay, X, Y, p0=[-30.0, 0.3, -1.0], likelihood="poisson")
