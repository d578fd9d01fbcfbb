"""Parameters held fixed, tied by an expression or a callable, or constrained by an
inequality, in curve_fit and ap.fit (report, intervals, bands): each against the model
rewritten by hand and fitted by scipy."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.optimize as so

import adaptprec as ap
from adaptprec.modeling.parameters import parameter_spec, propagate

RNG = np.random.default_rng(11)
X = np.linspace(0.0, 10.0, 80)


def two_peaks(x, a1, m1, w1, a2, m2, w2, c):
    return (a1 * jnp.exp(-0.5 * ((x - m1) / w1) ** 2)
            + a2 * jnp.exp(-0.5 * ((x - m2) / w2) ** 2) + c)


Y = np.asarray(two_peaks(X, 2.0, 3.0, 0.8, 1.5, 6.5, 0.8, 0.3)) + RNG.normal(0, 0.05, X.size)
P0 = [1.5, 2.8, 1.0, 1.0, 6.8, 1.0, 0.2]


def _np_peaks(x, a1, m1, w1, a2, m2, w2, c):
    return (a1 * np.exp(-0.5 * ((x - m1) / w1) ** 2)
            + a2 * np.exp(-0.5 * ((x - m2) / w2) ** 2) + c)


def rewritten(x, a1, m1, w1, a2, m2):
    """w2 = w1 and c = 0.3, by hand."""
    return _np_peaks(x, a1, m1, w1, a2, m2, w1, 0.3)


@pytest.fixture(scope="module")
def reference():
    popt, pcov = so.curve_fit(rewritten, X, Y, p0=P0[:5])
    return popt, pcov


@pytest.fixture(scope="module")
def tied_fit():
    return ap.fit(two_peaks, X, Y, p0=P0, expr={"w2": "w1"}, fixed={"c": 0.3})


def _full(free, pcov5):
    """The rewritten fit as the full table: w2 = w1 (its row a copy), c fixed."""
    T = np.zeros((7, 5))
    T[[0, 1, 2, 3, 4], [0, 1, 2, 3, 4]] = 1.0
    T[5, 2] = 1.0
    return np.r_[free, free[2], 0.3], T @ pcov5 @ T.T


@pytest.mark.parametrize("how", ["string", "callable"])
def test_curve_fit_fixed_and_tied_match_the_rewritten_model(reference, how):
    tie = "w1" if how == "string" else (lambda p: p["w1"])
    popt, pcov = ap.curve_fit(two_peaks, X, Y, p0=P0, expr={"w2": tie}, fixed={"c": 0.3})
    p_ref, c_ref = _full(*reference)
    np.testing.assert_allclose(popt, p_ref, rtol=1e-6)
    np.testing.assert_allclose(pcov, c_ref, rtol=1e-4, atol=1e-12)
    assert pcov[6].tolist() == [0.0] * 7


def test_fit_report_of_fixed_and_tied(tied_fit, reference):
    res = tied_fit
    p_ref, c_ref = _full(*reference)
    np.testing.assert_allclose(res.popt, p_ref, rtol=1e-6)
    np.testing.assert_allclose(res.stderr, np.sqrt(np.diag(c_ref)), rtol=1e-4)
    assert res.nfree == 5 and res.dof == X.size - 5 and res.nparams == 7
    assert res.described == ("free",) * 5 + ("= w1", "fixed")
    chi2 = float(np.sum((Y - rewritten(X, *reference[0])) ** 2))
    assert res.chi2 == pytest.approx(chi2, rel=1e-8)
    assert res.aic == pytest.approx(X.size * np.log(chi2 / X.size) + 2 * 5, rel=1e-8)
    text = str(res)
    assert "5 of 7 parameters (1 fixed, 1 tied or constrained)" in text
    assert "(fixed)" in text and "= w1" in text and "C(w1, w2)" not in text
    wald = res.wald_intervals()
    assert wald[6].tolist() == [0.3, 0.3]


@pytest.mark.slow
def test_profile_intervals_on_the_free_coordinates(tied_fit):
    prof = tied_fit.profile_intervals(0.95, params=["a1", "m2", "w2", "c"])
    lo, hi = prof.interval("a1")
    wald = tied_fit.wald_intervals()[0]
    assert lo == pytest.approx(wald[0], rel=2e-3) and hi == pytest.approx(wald[1], rel=2e-3)
    assert prof.interval("c") == (0.3, 0.3)
    assert np.isnan(prof.interval("w2")[0]) and prof.lower_open[5, 0]


def test_band_propagates_the_tie(tied_fit, reference):
    xs = np.linspace(0.0, 10.0, 7)
    band = tied_fit.band(xs)
    assert isinstance(band.fit, np.ndarray) and band.fit.dtype == np.float64
    f = lambda q: rewritten(xs, *q)  # noqa: E731
    eps = 1e-6
    q = reference[0]
    G = np.stack([(f(q + eps * e) - f(q - eps * e)) / (2 * eps) for e in np.eye(5)], 1)
    se = np.sqrt(np.einsum("ki,ij,kj->k", G, reference[1], G))
    np.testing.assert_allclose(band.stderr, se, rtol=1e-4)


@pytest.mark.slow
def test_constraint_matches_the_slack_model():
    # data where the unconstrained optimum breaks k1 < k2: the constraint is active
    t = np.linspace(0.0, 5.0, 50)
    y = 1.0 * np.exp(-1.0 * t) + 1.0 * np.exp(-0.6 * t) + RNG.normal(0, 0.01, t.size)

    def model(t, a1, k1, a2, k2):
        return a1 * jnp.exp(-k1 * t) + a2 * jnp.exp(-k2 * t)

    res = ap.fit(model, t, y, p0=[1.0, 0.5, 1.0, 1.5], constraints="k1 < k2")

    def slack(t, a1, k1, a2, d):
        return a1 * np.exp(-k1 * t) + a2 * np.exp(-(k1 + d) * t)

    ref, rcov = so.curve_fit(slack, t, y, p0=[1.0, 0.5, 1.0, 1.0],
                             bounds=([-np.inf, -np.inf, -np.inf, 0], np.inf))
    expect = np.r_[ref[:3], ref[1] + ref[3]]
    np.testing.assert_allclose(res.popt, expect, rtol=1e-5, atol=1e-8)
    assert res.popt[1] <= res.popt[3] + 1e-12
    popt, _ = ap.curve_fit(model, t, y, p0=[1.0, 0.5, 1.0, 1.5], constraints=["k1 < k2"])
    np.testing.assert_allclose(popt, expect, rtol=1e-5, atol=1e-8)


@pytest.mark.slow
def test_bounds_and_p0_by_name():
    x = np.linspace(0, 4, 30)
    y = 2.0 * np.exp(-1.2 * x) + 0.5 + 0.01 * np.cos(7 * x)

    def model(x, a, k, c):
        return a * jnp.exp(-k * x) + c

    res = ap.fit(model, x, y, p0={"a": 1.0}, bounds={"k": (0, 1.0)})
    ref, _ = so.curve_fit(lambda x, a, k, c: a * np.exp(-k * x) + c, x, y,
                          p0=[1.0, 0.5, 1.0], bounds=([-np.inf, 0, -np.inf],
                                                      [np.inf, 1.0, np.inf]))
    np.testing.assert_allclose(res.popt, ref, rtol=1e-6)
    assert res.at_bound[1] and res.upper_bounds[1] == 1.0


def decay(x, a, k, c):
    return a * jnp.exp(-k * x) + c


XD = np.linspace(0, 4, 30)
YD = np.asarray(decay(XD, 2.0, 1.2, 0.5)) + 0.01 * np.cos(7 * XD)


@pytest.fixture(scope="module")
def jitted_fixed():
    return jax.jit(lambda y: ap.curve_fit(decay, XD, y, p0=[1.0, 1.0, 0.5],
                                          fixed={"c": 0.5})[0])


@pytest.mark.slow
def test_curve_fit_with_parameters_under_jit(jitted_fixed):
    eager = ap.curve_fit(decay, XD, YD, p0=[1.0, 1.0, 0.5], fixed={"c": 0.5})[0]
    np.testing.assert_allclose(jitted_fixed(jnp.asarray(YD)), eager, rtol=1e-8)


@pytest.mark.slow
def test_curve_fit_with_parameters_under_vmap_grad(jitted_fixed):
    x, y, model, fitted = XD, YD, decay, jitted_fixed
    eager = ap.curve_fit(model, x, y, p0=[1.0, 1.0, 0.5], fixed={"c": 0.5})[0]
    both = jax.vmap(fitted)(jnp.stack([y, 1.1 * y]))
    np.testing.assert_allclose(both[0], eager, rtol=1e-8)
    g = jax.grad(lambda y: fitted(y)[1])(jnp.asarray(y))
    eps = 1e-6
    e = np.zeros(x.size)
    e[3] = eps
    fd = (ap.curve_fit(model, x, y + e, p0=[1.0, 1.0, 0.5], fixed={"c": 0.5})[0][1]
          - ap.curve_fit(model, x, y - e, p0=[1.0, 1.0, 0.5], fixed={"c": 0.5})[0][1]) / (
        2 * eps)
    assert float(g[3]) == pytest.approx(fd, rel=1e-4)


def test_propagation_of_a_nonlinear_tie():
    spec, values = parameter_spec(("a", "b", "c"), p0=[1.0, 2.0, 0.0],
                                  expr={"c": "a * exp(b)"})
    q = np.array([1.5, 0.5])
    C = np.array([[0.04, 0.01], [0.01, 0.09]])
    p, P, T = propagate(spec, q, values.fixed, C)
    g = np.array([np.exp(0.5), 1.5 * np.exp(0.5)])
    assert p[2] == pytest.approx(1.5 * np.exp(0.5))
    assert P[2, 2] == pytest.approx(g @ C @ g)


@pytest.mark.parametrize("kwargs, match", [
    (dict(fixed={"d": 1.0}), "does not take"),
    (dict(fixed={"a": 1.0}, expr={"a": "b"}), "both fixed and tied"),
    (dict(expr={"a": "b", "b": "a"}), "cycle"),
    (dict(expr={"a": "__import__('os')"}), "calls __import__"),
    (dict(expr={"a": "b.real"}), "Attribute"),
    (dict(expr={"a": "2*zz"}), "names \\['zz'\\]"),
    (dict(constraints=["a < b < c"]), "one inequality"),
    (dict(constraints=["a + b < 1"]), "single free parameter"),
    (dict(fixed={"a": 1.0, "b": 1.0, "c": 1.0}), "nothing is left to fit"),
    (dict(fixed={"a": np.nan}), "finite number"),
    (dict(p0=[1.0, 2.0]), "2 values for the model's 3"),
])
def test_bad_parameter_options(kwargs, match):
    with pytest.raises(ValueError, match=match):
        parameter_spec(("a", "b", "c"), **kwargs)


def test_constraint_start_outside_is_refused():
    with pytest.raises(ValueError, match="p0 breaks the constraint"):
        parameter_spec(("a", "b"), p0=[2.0, 1.0], constraints="a < b")


def test_fit_names_the_option_for_an_unknown_parameter():
    with pytest.raises(ValueError, match=r"its parameters are \['a1', 'm1'"):
        ap.fit(two_peaks, X, Y, p0=P0, fixed={"bottom": 0.0})
