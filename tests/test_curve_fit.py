"""curve_fit against scipy.optimize.curve_fit: popt and pcov (1-D sigma, covariance
sigma, absolute_sigma), a non-identifiable parameter (inf), nan_policy, full_output,
bounds, and bad input."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.optimize as so

import adaptprec as ap
from adaptprec.nlsq import OptimizeWarning

X = np.linspace(0.0, 4.0, 60)
_rng = np.random.default_rng(1)
SIG = 0.02 + 0.03 * _rng.random(X.size)
Y = 2.5 * np.exp(-1.3 * X) + 0.5 + SIG * _rng.standard_normal(X.size)
P0 = [1.0, 1.0, 0.0]


def model(x, a, b, c):
    return a * jnp.exp(-b * x) + c


def model_np(x, a, b, c):
    return a * np.exp(-b * x) + c


def _cov_matrix():
    # AR(1)-correlated noise covariance with the per-point sigmas
    rho = 0.4
    idx = np.arange(X.size)
    return np.outer(SIG, SIG) * rho ** np.abs(idx[:, None] - idx[None, :])


def _scipy(sigma=None, absolute_sigma=False, **kw):
    return so.curve_fit(model_np, X, Y, p0=P0, sigma=sigma, absolute_sigma=absolute_sigma,
                        ftol=1e-15, xtol=1e-15, gtol=1e-15, **kw)


def test_no_sigma_matches_scipy():
    popt, pcov = ap.curve_fit(model, X, Y, p0=P0)
    ref_p, ref_c = _scipy()
    np.testing.assert_allclose(np.asarray(popt), ref_p, rtol=1e-8)
    np.testing.assert_allclose(np.asarray(pcov), ref_c, rtol=1e-6)


@pytest.mark.parametrize("absolute_sigma", [False, True])
def test_sigma_1d_matches_scipy(absolute_sigma):
    popt, pcov = ap.curve_fit(model, X, Y, p0=P0, sigma=SIG, absolute_sigma=absolute_sigma)
    ref_p, ref_c = _scipy(SIG, absolute_sigma)
    np.testing.assert_allclose(np.asarray(popt), ref_p, rtol=1e-8)
    np.testing.assert_allclose(np.asarray(pcov), ref_c, rtol=1e-6)


def test_sigma_matrix_matches_scipy():
    C = _cov_matrix()
    popt, pcov = ap.curve_fit(model, X, Y, p0=P0, sigma=C, absolute_sigma=True)
    ref_p, ref_c = _scipy(C, True)
    np.testing.assert_allclose(np.asarray(popt), ref_p, rtol=1e-8)
    np.testing.assert_allclose(np.asarray(pcov), ref_c, rtol=1e-6)
    # a diagonal covariance is the same as 1-D sigma
    p2, c2 = ap.curve_fit(model, X, Y, p0=P0, sigma=np.diag(SIG ** 2), absolute_sigma=True)
    p1, c1 = _scipy(SIG, True)
    np.testing.assert_allclose(np.asarray(p2), p1, rtol=1e-8)
    np.testing.assert_allclose(np.asarray(c2), c1, rtol=1e-6)


def model4(x, a, b, c, d):  # d does not enter the model: not identifiable
    return a * jnp.exp(-b * x) + c + 0.0 * d


def test_non_identifiable_parameter_is_inf():
    # lm (the default without bounds) follows scipy's lm: all of pcov is inf
    with pytest.warns(OptimizeWarning):
        _, pcov_lm = ap.curve_fit(model4, X, Y, p0=[1.0, 1.0, 0.0, 0.3])
    assert np.all(np.isinf(np.asarray(pcov_lm)))
    with pytest.warns(so.OptimizeWarning):
        _, sc_lm = so.curve_fit(lambda x, a, b, c, d: model_np(x, a, b, c), X, Y,
                                p0=[1.0, 1.0, 0.0, 0.3])
    assert np.all(np.isinf(sc_lm))
    # trf: only the non-identifiable parameter's row and column are inf
    with pytest.warns(OptimizeWarning):
        popt, pcov = ap.curve_fit(model4, X, Y, p0=[1.0, 1.0, 0.0, 0.3], method="trf")
    pcov = np.asarray(pcov)
    assert np.all(np.isinf(pcov[3, :])) and np.all(np.isinf(pcov[:, 3]))
    # the identifiable block agrees with scipy's fit of the reduced model
    ref_p, ref_c = _scipy()
    np.testing.assert_allclose(np.asarray(popt)[:3], ref_p, rtol=1e-8)
    # scaled by the reduced chi-square with n = 4 parameters (scipy's convention: p0.size)
    m = X.size
    np.testing.assert_allclose(pcov[:3, :3], ref_c * (m - 3) / (m - 4), rtol=1e-6)
    assert float(popt[3]) == 0.3  # untouched
    # scipy's trf returns a finite (pseudo-inverse) variance 0 here, which is misleading
    _, sc = so.curve_fit(lambda x, a, b, c, d: model_np(x, a, b, c), X, Y,
                         p0=[1.0, 1.0, 0.0, 0.3], method="trf")
    assert np.isfinite(sc[3, 3])


@pytest.mark.parametrize("method", [None, "trf"])
def test_exact_fit_of_a_non_identifiable_model_is_inf_not_nan(method):
    # newcomer audit: y = 2x fitted by a * b * x has cost 0, and the reduced chi-square
    # scaling turned the inf pcov into NaN (inf * 0) with a RuntimeWarning and no
    # OptimizeWarning; scipy leaves an indeterminate pcov inf
    x = np.linspace(0.0, 4.0, 50)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        with pytest.warns(OptimizeWarning):
            popt, pcov = ap.curve_fit(lambda x, a, b: a * b * x, x, 2.0 * x, method=method)
    assert np.all(np.isinf(pcov))
    assert abs(popt[0] * popt[1] - 2.0) < 1e-8
    # an exact fit of an identifiable model: pcov 0, as scipy's
    _, pcov = ap.curve_fit(lambda x, a, b: a * x + b, x, 2.0 * x + 1.0, method=method)
    assert np.all(np.asarray(pcov) == 0.0)


@pytest.mark.parametrize("lm_rule", [False, True])
@pytest.mark.parametrize("absolute_sigma", [False, True])
def test_scale_pcov_rules_numpy_and_traced(lm_rule, absolute_sigma):
    """scipy's pcov rules: times ``2 cost / (m - n)`` unless absolute_sigma (inf for
    ``m <= n``); an inf entry stays inf, also at cost 0; lm: all inf when one is. NumPy
    and under jit with the same bits."""
    from adaptprec.nlsq.common import scale_pcov

    inf = np.inf
    finite = np.array([[2.0, -0.5], [-0.5, 1.0]])
    holed = np.array([[2.0, inf], [inf, 1.0]])
    every = np.full((2, 2), inf)
    # (cov, cost, m) -> (relative sigma, absolute sigma); n = 2, 2 * 0.75 / 8 = 0.1875
    cases = {(0, 0.75, 10): (finite * 0.1875, finite),
             (1, 0.75, 10): ([[0.375, inf], [inf, 0.1875]], holed),
             (1, 0.0, 10): ([[0.0, inf], [inf, 0.0]], holed),
             (0, 0.75, 2): (every, finite)}
    for (i, cost, m), wants in cases.items():
        cov = (finite, holed)[i]
        got = scale_pcov(cov, cost, m, 2, lm_rule=lm_rule, absolute_sigma=absolute_sigma)
        want = every if lm_rule and i == 1 else np.asarray(wants[absolute_sigma])
        assert np.array_equal(got, want), (i, cost, m)
        traced = jax.jit(scale_pcov, static_argnums=(2, 3), static_argnames=(
            "lm_rule", "absolute_sigma", "xnp"))(cov, cost, m, 2, lm_rule=lm_rule,
                                                 absolute_sigma=absolute_sigma, xnp=jnp)
        assert np.array_equal(np.asarray(traced), got)


def test_bounds_match_scipy():
    bounds = ([0.0, 0.0, 0.55], [10.0, 10.0, 1.0])
    p0 = [1.0, 1.0, 0.7]
    popt, pcov = ap.curve_fit(model, X, Y, p0=p0, bounds=bounds)
    ref_p, ref_c = so.curve_fit(model_np, X, Y, p0=p0, bounds=bounds, ftol=1e-15,
                                xtol=1e-15, gtol=1e-15)
    np.testing.assert_allclose(np.asarray(popt), ref_p, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(pcov), ref_c, rtol=1e-4)
    assert abs(float(popt[2]) - 0.55) < 1e-8  # at the bound


def test_nan_policy_and_full_output():
    Yn = Y.copy()
    Yn[[3, 17]] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        ap.curve_fit(model, X, Yn, p0=P0)
    with pytest.raises(ValueError, match="nan"):
        ap.curve_fit(model, X, Yn, p0=P0, nan_policy="raise")
    with pytest.raises(ValueError, match="propagate"):
        ap.curve_fit(model, X, Yn, p0=P0, nan_policy="propagate")
    keep = ~np.isnan(Yn)
    popt, pcov, info, mesg, ier = ap.curve_fit(model, X, Yn, p0=P0, sigma=SIG,
                                               nan_policy="omit", full_output=True)
    ref_p, ref_c = so.curve_fit(model_np, X[keep], Y[keep], p0=P0, sigma=SIG[keep],
                                ftol=1e-15, xtol=1e-15, gtol=1e-15)
    np.testing.assert_allclose(np.asarray(popt), ref_p, rtol=1e-8)
    np.testing.assert_allclose(np.asarray(pcov), ref_c, rtol=1e-6)
    assert int(ier) in (1, 2, 3, 4) and isinstance(mesg, str) and mesg
    assert info["fvec"].shape == (keep.sum(),) and int(info["nfev"]) > 0


def test_curve_fit_under_jit_and_p0_from_signature():
    @jax.jit
    def fit(y):
        return ap.curve_fit(model, jnp.asarray(X), y, p0=jnp.asarray(P0))[0]

    ref_p, _ = _scipy()
    np.testing.assert_allclose(np.asarray(fit(jnp.asarray(Y))), ref_p, rtol=1e-8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        popt, _ = ap.curve_fit(lambda x, a, b: a * x + b, X, 3 * X - 1)
    np.testing.assert_allclose(np.asarray(popt), [3.0, -1.0], rtol=1e-10)


def test_curve_fit_bad_input():
    with pytest.raises(ValueError, match="incorrect shape"):
        ap.curve_fit(model, X, Y, p0=P0, sigma=np.ones(7))
    with pytest.raises(ValueError, match="positive definite"):
        ap.curve_fit(model, X, Y, p0=P0, sigma=-np.eye(X.size))
    with pytest.raises(ValueError, match="args"):
        ap.curve_fit(model, X, Y, p0=P0, args=(1,))
    with pytest.raises(TypeError, match="must not exceed the number of data points"):
        ap.curve_fit(model, X[:2], Y[:2], p0=P0, method="lm")  # scipy's TypeError
    with pytest.raises(ValueError, match="empty"):
        ap.curve_fit(model, X[:0], Y[:0], p0=P0)


@pytest.mark.slow
def test_linear_model_under_vmap_and_grad():
    # newcomer audit: a model linear in its parameters has a Jacobian free of the traced
    # ydata, so the NumPy covariance route was taken with a traced cost (crash)
    t = jnp.arange(5.0)
    lin = lambda x, a, b: a * x + b  # noqa: E731
    ys = jnp.stack([2.0 * t - 1.0, -0.5 * t + 3.0])
    with jax.enable_x64(True):
        popt = jax.vmap(lambda y: ap.curve_fit(lin, t, y, p0=[1.0, 0.1])[0])(ys)
        np.testing.assert_allclose(np.asarray(popt), [[2.0, -1.0], [-0.5, 3.0]], atol=1e-9)
        g = jax.grad(lambda y: ap.curve_fit(lin, t, y, p0=[1.0, 0.1])[0][0])(ys[0])
        np.testing.assert_allclose(np.asarray(g), (np.arange(5.0) - 2.0) / 10.0, atol=1e-9)


@pytest.mark.slow
def test_failed_fit_under_jit_is_nan_not_an_answer():
    # newcomer audit: under jit nothing can raise, and popt looked like a real answer
    @jax.jit
    def fit(y):
        return ap.curve_fit(model, jnp.asarray(X), y, p0=jnp.asarray(P0), maxfev=2)

    with jax.enable_x64(True):
        popt, pcov = fit(jnp.asarray(Y))
        assert np.all(np.isnan(np.asarray(popt))) and np.all(np.isnan(np.asarray(pcov)))
        out = jax.jit(lambda y: ap.curve_fit(model, jnp.asarray(X), y, p0=jnp.asarray(P0),
                                             maxfev=2, full_output=True))(jnp.asarray(Y))
        assert int(out[4]) <= 0 and np.all(np.isfinite(np.asarray(out[0])))
        assert out[3] is None   # the message: unknown under a trace (a str cannot leave jit)
