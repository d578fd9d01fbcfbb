"""Masks, uneven lengths and nan_policy="omit" in solve_nlsq_batch, against per-fit scipy
curve_fit on each fit's real points: parameters, pcov, cost and dof (on the code before
`mask=` existed, the batch took no mask, refused uneven lists, and its pcov was scaled by
the padded length's degrees of freedom).

One compiled program (per-fit t, ydata (4, 30), float64) serves every fit of this file.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.optimize as so

import adaptprec as ap

LENGTHS = [18, 30, 24, 9]
M = max(LENGTHS)
RNG = np.random.default_rng(0)
TS = [np.sort(RNG.uniform(0.0, 3.0, n)) for n in LENGTHS]
YS = [2.0 * np.exp(-1.1 * t) + 0.1 + RNG.normal(0, 0.02, t.size) for t in TS]
X0 = np.tile([1.0, 1.0, 0.0], (len(LENGTHS), 1))
F64 = dict(precision="f64", compaction=None, return_pcov=True)
TIGHT = dict(ftol=1e-14, xtol=1e-14, gtol=1e-14)


def decay(p, t):
    return p[0] * jnp.exp(-p[1] * t) + p[2]


def _padded(rows, fill):
    out = np.full((len(rows), M), fill)
    for i, r in enumerate(rows):
        out[i, :r.size] = r
    return out


def _scipy(t, y):
    p, c = so.curve_fit(lambda t, a, k, b: a * np.exp(-k * t) + b, t, y, p0=[1.0, 1.0, 0.0],
                        **TIGHT)
    return p, c, 0.5 * float(np.sum((p[0] * np.exp(-p[1] * t) + p[2] - y) ** 2))


@pytest.fixture(scope="module")
def uneven():
    """Uneven data as lists of per-fit arrays (padded for the user)."""
    return ap.solve_nlsq_batch(decay, X0, (TS,), ydata=YS, **F64)


def _check_against_scipy(res, ts, ys):
    assert bool(np.all(res.success))
    assert res.dof.tolist() == [t.size - 3 for t in ts]
    for i, (t, y) in enumerate(zip(ts, ys)):
        p, c, cost = _scipy(t, y)
        np.testing.assert_allclose(res.x[i], p, rtol=1e-6)
        np.testing.assert_allclose(res.pcov[i], c, rtol=2e-5, atol=1e-12)
        assert float(res.cost[i]) == pytest.approx(cost, rel=1e-9)


def test_uneven_lists_match_per_fit_scipy(uneven):
    _check_against_scipy(uneven, TS, YS)


def test_mask_with_nan_padding_matches_the_lists(uneven):
    # padded entries of ydata and of the per-fit t are NaN: the select keeps them out
    mask = _padded([np.ones(n, bool) for n in LENGTHS], False)
    res = ap.solve_nlsq_batch(decay, X0, (_padded(TS, np.nan),), ydata=_padded(YS, np.nan),
                              mask=mask, **F64)
    for f in ("x", "pcov", "cost", "dof", "status"):
        np.testing.assert_array_equal(getattr(res, f), getattr(uneven, f), err_msg=f)


def test_nan_policy_omit_matches_scipy_omit():
    t = _padded([np.linspace(0.0, 3.0, M)] * 4, 0.0)
    y = 2.0 * np.exp(-1.1 * t) + 0.1 + RNG.normal(0, 0.02, t.shape)
    y[0, [2, 7, 8]] = np.nan
    y[2, -5:] = np.nan
    res = ap.solve_nlsq_batch(decay, X0, (t,), ydata=y, nan_policy="omit", **F64)
    keep = [np.isfinite(row) for row in y]
    _check_against_scipy(res, [t[i][k] for i, k in enumerate(keep)],
                         [y[i][k] for i, k in enumerate(keep)])
    with pytest.raises(ValueError, match="nan_policy='omit'"):   # the message's option works
        ap.solve_nlsq_batch(decay, X0, (t,), ydata=y, nan_policy="raise")
    y[3, 2:] = np.nan        # 2 points left for 3 parameters: improper, as scipy's m < n
    few = ap.solve_nlsq_batch(decay, X0, (t,), ydata=y, nan_policy="omit", **F64)
    assert few.status.tolist() == res.status.tolist()[:3] + [-1]
    assert int(few.dof[3]) == -1 and "Improper input" in few.message(3)


@pytest.mark.parametrize("kw, match", [
    (dict(ydata=_padded(YS, 0.0), mask=np.ones((4, M))), "mask must be bool"),
    (dict(ydata=_padded(YS, 0.0), mask=np.ones((4, 7), bool)), r"mask must have shape"),
    (dict(ydata=YS, mask=np.ones((4, M), bool)), "not both"),
    (dict(ydata=YS, args=([t[:-1] for t in TS],)), r"args\[0\] is a list"),
    (dict(ydata=None, args=(_padded(TS, 0.0),), nan_policy="omit"), "without ydata"),
])
def test_bad_masks_are_named(kw, match):
    kw = dict(dict(args=(TS,)), **kw)
    with pytest.raises(ValueError, match=match):
        ap.solve_nlsq_batch(decay, X0, kw.pop("args"), **kw)


@pytest.mark.slow
def test_adaptive_and_vmap_agree_with_float64(uneven):
    res = ap.solve_nlsq_batch(decay, X0, (TS,), ydata=YS, return_pcov=True)
    se = np.sqrt(np.diagonal(uneven.pcov, axis1=1, axis2=2))
    assert np.all(np.abs(res.x - uneven.x) <= 1e-3 * se)
    assert res.dof.tolist() == uneven.dof.tolist()
    t, y = _padded(TS, 0.0), _padded(YS, 0.0)
    mask = _padded([np.ones(n, bool) for n in LENGTHS], False)

    def solve(t, y, k):
        return ap.solve_nlsq_batch(decay, X0[:2], (t,), ydata=y, mask=k, **F64).x

    x = jax.vmap(solve)(t.reshape(2, 2, M), y.reshape(2, 2, M), mask.reshape(2, 2, M))
    np.testing.assert_allclose(np.asarray(x).reshape(4, 3), uneven.x, rtol=1e-10)


@pytest.mark.slow
def test_summary_of_uneven_lists_counts_each_fits_points(uneven):
    s = ap.summarize_batch(uneven, decay, (TS,), ydata=YS)
    assert s.dof.tolist() == uneven.dof.tolist()
    np.testing.assert_allclose(
        s.stderr, np.sqrt(np.diagonal(uneven.pcov, axis1=1, axis2=2)), rtol=1e-6)
    np.testing.assert_allclose(s.chi2, 2 * uneven.cost, rtol=1e-9)
