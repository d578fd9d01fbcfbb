"""Padded batches (uneven lengths, padded by sigma=inf, NaN ydata or a mask): the batch
summaries count only the real points, against per-fit scipy fits, dof included (on the
code before this change every fit got the padded length's dof)."""

import jax.numpy as jnp
import numpy as np
import pytest
import scipy.optimize as so

import adaptprec as ap
from adaptprec.analysis.residual_tests import runs_test

LENGTHS = [18, 30, 24]
M = 30
T = np.linspace(0.0, 3.0, M)
RNG = np.random.default_rng(0)
Y = np.full((3, M), np.nan)
for i, n in enumerate(LENGTHS):
    Y[i, :n] = 2.0 * np.exp(-1.1 * T[:n]) + RNG.normal(0, 0.02, n)
MASK = np.isfinite(Y)


def model(p, t):
    return p[0] * jnp.exp(-p[1] * t)


@pytest.fixture(scope="module")
def solved():
    sigma = np.where(MASK, 0.02, np.inf)
    y = np.where(MASK, Y, 0.0)
    return ap.solve_nlsq_batch(model, np.ones((3, 2)), (T,), in_axes=None, ydata=y,
                               sigma=sigma), y, sigma


@pytest.mark.parametrize("padding", ["sigma_inf", "nan_ydata", "mask"])
def test_padded_summaries_match_per_fit_scipy(solved, padding):
    res, y, sigma = solved
    kw = {"sigma_inf": dict(ydata=y, sigma=sigma),
          "nan_ydata": dict(ydata=Y, sigma=np.full((3, M), 0.02)),
          "mask": dict(ydata=y, sigma=np.full((3, M), 0.02), mask=MASK)}[padding]
    s = ap.summarize_batch(res, model, (T,), in_axes=None, **kw)
    assert [int(d) for d in s.dof] == [n - 2 for n in LENGTHS]
    for i, n in enumerate(LENGTHS):
        p, c = so.curve_fit(lambda t, a, k: a * np.exp(-k * t), T[:n], Y[i, :n],
                            p0=[1.0, 1.0], sigma=np.full(n, 0.02))
        np.testing.assert_allclose(res.x[i], p, rtol=1e-6)
        np.testing.assert_allclose(s.stderr[i], np.sqrt(np.diag(c)), rtol=1e-5)
        chi2 = float(np.sum(((Y[i, :n] - p[0] * np.exp(-p[1] * T[:n])) / 0.02) ** 2))
        assert float(s.chi2[i]) == pytest.approx(chi2, rel=1e-6)


def test_masked_runs_test_skips_the_padding():
    r = jnp.array([1.0, -1.0, 1.0, -1.0, 0.0, 0.0])
    full = runs_test(r[:4])
    masked = runs_test(r, jnp.array([1, 1, 1, 1, 0, 0], bool))
    assert int(masked.runs) == int(full.runs) == 4
    assert float(masked.expected) == pytest.approx(float(full.expected))
