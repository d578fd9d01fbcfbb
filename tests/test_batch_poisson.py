"""likelihood="poisson" in solve_nlsq_batch (Gpufit's MLE estimator: zero counts allowed,
the deviance as its chi-square), against scipy.optimize.minimize of the same negative
log-likelihood per fit: parameters to 1e-6, pcov against the inverse Fisher information
at minimize's optimum. Uneven lengths (lists) in the same batch. The batch refused
`likelihood=` before.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.optimize as so

import adaptprec as ap

RNG = np.random.default_rng(7)
LENGTHS = [40, 40, 40, 26]
TS = [np.linspace(0.0, 10.0, 40)[:n] for n in LENGTHS]
TRUTH = np.array([[12.0, 0.5, 0.3], [30.0, 0.3, 0.8], [6.0, 0.8, 0.5], [20.0, 0.4, 0.2]])
YS = [RNG.poisson(a * np.exp(-k * t) + b).astype(float) for (a, k, b), t in zip(TRUTH, TS)]
X0 = TRUTH * 1.2


def decay(p, t):
    return p[0] * jnp.exp(-p[1] * t) + p[2]


@pytest.fixture(scope="module")
def poisson_fits():
    res = ap.solve_nlsq_batch(decay, X0, (TS,), ydata=YS, likelihood="poisson",
                              precision="f64", compaction=None, return_pcov=True)
    return jax.tree.map(np.asarray, res)


def _minimize(t, y, p0):
    """scipy's minimize of ``sum f - y log f`` (exact gradient and Hessian)."""
    def parts(p):
        a, k, b = p
        e = np.exp(-k * t)
        f = a * e + b
        g = np.stack([e, -a * t * e, np.ones_like(t)], axis=1)       # df/dp
        return f, g, e

    def nll(p):
        f, g, _ = parts(p)
        return np.sum(f - y * np.log(f)), g.T @ (1.0 - y / f)

    def hess(p):
        a, k, _ = p
        f, g, e = parts(p)
        w = 1.0 - y / f
        d2 = np.array([[0, -np.sum(w * t * e), 0], [-np.sum(w * t * e),
                       np.sum(w * a * t * t * e), 0], [0, 0, 0]])
        return g.T @ (g * (y / f ** 2)[:, None]) + d2

    r = so.minimize(nll, p0, jac=True, hess=hess, method="trust-exact",
                    options=dict(gtol=1e-12))
    f, g, _ = parts(r.x)
    return r.x, np.linalg.inv(g.T @ (g / f[:, None])), f


def test_poisson_matches_minimize_and_inverse_fisher(poisson_fits):
    res = poisson_fits
    assert any(np.any(y == 0) for y in YS)               # zero counts, as Gpufit allows
    assert bool(np.all(res.success))
    assert res.dof.tolist() == [n - 3 for n in LENGTHS]
    for i, (t, y) in enumerate(zip(TS, YS)):
        p, inv_fisher, f = _minimize(t, y, X0[i])
        np.testing.assert_allclose(res.x[i], p, rtol=1e-6)
        np.testing.assert_allclose(res.pcov[i], inv_fisher, rtol=1e-5)
        with np.errstate(divide="ignore", invalid="ignore"):
            deviance = 2 * np.sum(f - y + np.where(y > 0, y * np.log(y / f), 0.0))
        assert 2 * float(res.cost[i]) == pytest.approx(deviance, rel=1e-8)


@pytest.mark.parametrize("kw, match", [
    (dict(ydata=[-y for y in YS]), r"counts \(finite, >= 0\): fit 0"),
    (dict(ydata=YS, sigma=[np.ones(n) for n in LENGTHS]), "takes no sigma"),
    (dict(ydata=YS, loss="soft_l1"), "robust loss"),
    (dict(ydata=None), "needs the counts as ydata"),
])
def test_poisson_bad_input(kw, match):
    with pytest.raises(ValueError, match=match):
        ap.solve_nlsq_batch(decay, X0, (TS,), likelihood="poisson", **kw)


def test_poisson_summary_reports_deviance_and_fisher_errors(poisson_fits):
    s = ap.summarize_batch(poisson_fits, decay, (TS,), ydata=YS, likelihood="poisson")
    assert s.dof.tolist() == poisson_fits.dof.tolist()
    np.testing.assert_allclose(s.chi2, 2 * poisson_fits.cost, rtol=1e-9)
    np.testing.assert_allclose(
        s.stderr, np.sqrt(np.diagonal(poisson_fits.pcov, axis1=1, axis2=2)), rtol=1e-7)
