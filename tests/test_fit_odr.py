"""Orthogonal distance regression against scipy.odr's documented examples (ODRPACK's
reference results, as scipy's own tests pin them) and against scipy.odr itself."""

import warnings

import jax.numpy as jnp
import numpy as np
import pytest
import scipy.optimize as so

import adaptprec as ap

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)   # deprecated in scipy 1.17
    odr = pytest.importorskip("scipy.odr")

P_X = np.array([0., .9, 1.8, 2.6, 3.3, 4.4, 5.2, 6.1, 6.5, 7.4])
P_Y = np.array([5.9, 5.4, 4.4, 4.6, 3.5, 3.7, 2.8, 2.8, 2.4, 1.5])
P_SX = np.array([.03, .03, .04, .035, .07, .11, .13, .22, .74, 1.])
P_SY = np.array([1., .74, .5, .35, .22, .22, .12, .12, .1, .04])


def line(x, b0, b1):
    return b0 + b1 * x


@pytest.mark.parametrize("reverse", [False, True])
def test_pearson_york(reverse):
    """ODRPACK's uni-linear fit of Pearson's data with York's weights (scipy's
    test_pearson), both orientations. scipy starts at beta0 = [1, 1]; this objective
    has a second local minimum (sum of squares 234.18, positive-definite Hessian of the
    objective with the corrections eliminated) where the Levenberg-Marquardt path from
    [1, 1] ends, while ODRPACK's path from there reaches 12.07. From the ordinary
    least-squares line (a start any user has) the fit reaches ODRPACK's answer."""
    x, y, sx, sy = (P_Y, P_X, P_SY, P_SX) if reverse else (P_X, P_Y, P_SX, P_SY)
    start = np.polyfit(x, y, 1)[::-1]
    out = ap.fit_odr(line, x, y, p0=start, sigma_x=sx, sigma_y=sy)
    if not reverse:
        beta = [5.4767400299231674, -0.4796082367610305]
        sd = [0.3590121690702467, 0.0706291186037444]
        cov = [[0.0854275622946333, -0.0161807025443155],
               [-0.0161807025443155, 0.003306337993922]]
    else:
        beta = [11.4192022410781231, -2.0850374506165474]
        sd = [0.9820231665657161, 0.3070515616198911]
        cov = [[0.6391799462548782, -0.1955657291119177],
               [-0.1955657291119177, 0.0624888159223392]]
    # ODRPACK stops at its sum-of-squares tolerance, ~1e-6 from the optimum here
    np.testing.assert_allclose(out.beta, beta, rtol=2e-6)
    np.testing.assert_allclose(out.sd_beta, sd, rtol=1e-5)
    np.testing.assert_allclose(out.cov_beta, cov, rtol=1e-5)
    # the optimum itself: for a line the corrections eliminate in closed form,
    # r_i = (y_i - b0 - b1 x_i) / sqrt(sy_i^2 + b1^2 sx_i^2)
    exact = so.least_squares(
        lambda b: (y - b[0] - b[1] * x) / np.sqrt(sy ** 2 + b[1] ** 2 * sx ** 2), start,
        xtol=1e-15, ftol=1e-15, gtol=1e-15)
    np.testing.assert_allclose(out.beta, exact.x, rtol=1e-8)
    assert out.sum_square == pytest.approx(2 * exact.cost, rel=1e-12)
    assert out.success and out.dof == 8
    np.testing.assert_allclose(out.sd_beta, np.sqrt(np.diag(out.cov_beta) * out.res_var))


def lorentz(x, b0, b1, b2):
    return b0 * b1 * b2 / jnp.sqrt((x * x - b2 * b2) ** 2 + (b1 * x) ** 2)


@pytest.mark.slow
def test_lorentz_peak():
    """scipy's test_lorentz (a Lorentz peak, tiny x errors)."""
    sy = np.array([.29] * 18)
    sx = np.array([.000972971, .000948268, .000707632, .000706679, .000706074,
                   .000703918, .000698955, .000456856, .000455207, .000662717,
                   .000654619, .000652694, .000000859202, .00106589, .00106378,
                   .00125483, .00140818, .00241839])
    x = np.array([3.9094, 3.85945, 3.84976, 3.84716, 3.84551, 3.83964, 3.82608, 3.78847,
                  3.78163, 3.72558, 3.70274, 3.6973, 3.67373, 3.65982, 3.6562, 3.62498,
                  3.55525, 3.41886])
    y = np.array([652, 910.5, 984, 1000, 1007.5, 1053, 1160.5, 1409.5, 1430, 1122,
                  957.5, 920, 777.5, 709.5, 698, 578.5, 418.5, 275.5])
    out = ap.fit_odr(lorentz, x, y, p0=[1000., .1, 3.8], sigma_x=sx, sigma_y=sy)
    np.testing.assert_allclose(out.beta, [1.4306780846149925e+03, 1.3390509034538309e-01,
                                          3.7798193600109009e+00], rtol=2e-6)
    np.testing.assert_allclose(out.sd_beta, [7.3621186811330963e-01,
                                             3.5068899941471650e-04,
                                             2.4451209281408992e-04], rtol=1e-5)


def test_explicit_model_with_exact_x():
    """ODRPACK's explicit example (users' guide p. 39; scipy's test_explicit): three
    points with exact x."""
    x = np.array([0., 0., 5., 7., 7.5, 10., 16., 26., 30., 34., 34.5, 100.])
    y = np.array([1265., 1263.6, 1258., 1254., 1253., 1249.8, 1237., 1218., 1220.6,
                  1213.8, 1215.5, 1212.])
    fixed = np.array([1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1], bool)

    def model(x, b0, b1, b2):
        return b0 + b1 * (jnp.exp(b2 * x) - 1.0) ** 2

    out = ap.fit_odr(model, x, y, p0=[1500.0, -50.0, -0.1], fix_x=fixed)
    np.testing.assert_allclose(out.beta, [1.2646548050648876e+03, -5.4018409956678255e+01,
                                          -8.7849712165253724e-02], rtol=2e-6)
    np.testing.assert_allclose(out.sd_beta, [1.0349270280543437, 1.583997785262061,
                                             0.0063321988657267], rtol=1e-5)
    assert np.all(out.delta[fixed] == 0.0)


def test_against_scipy_odr_on_an_exponential():
    rng = np.random.default_rng(4)
    xt = np.linspace(0.0, 3.0, 25)
    x = xt + rng.normal(0, 0.05, xt.size)
    y = 2.0 * np.exp(-0.8 * xt) + 0.3 + rng.normal(0, 0.02, xt.size)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        ref = odr.ODR(odr.RealData(x, y, sx=0.05, sy=0.02),
                      odr.Model(lambda b, x: b[0] * np.exp(-b[1] * x) + b[2]),
                      beta0=[1.0, 1.0, 0.0], sstol=1e-14, partol=1e-14).run()
    out = ap.fit_odr(lambda x, a, k, c: a * jnp.exp(-k * x) + c, x, y, p0=[1.0, 1.0, 0.0],
                     sigma_x=0.05, sigma_y=0.02)
    np.testing.assert_allclose(out.beta, ref.beta, rtol=1e-7)
    np.testing.assert_allclose(out.sd_beta, ref.sd_beta, rtol=1e-5)   # ODRPACK: FD
    np.testing.assert_allclose(out.delta, ref.delta, rtol=1e-5, atol=1e-9)
    assert out.sum_square == pytest.approx(ref.sum_square, rel=1e-12)
    assert out.sum_square <= ref.sum_square * (1 + 1e-14)   # as low as ODRPACK's
    assert "Orthogonal distance regression" in str(out)
