"""Results that last: FitResult through JSON and back; bands and batch summaries as
float64 NumPy with x64 off (no truncation warning); ap.fit's nan_policy='omit'."""

import json

import jax.numpy as jnp
import numpy as np
import pytest

import adaptprec as ap

from _subprocess import run_python

X = np.linspace(0.0, 4.0, 30)


def decay(x, a, k, c):
    return a * jnp.exp(-k * x) + c


Y = np.asarray(decay(X, 2.0, 1.2, 0.5)) + 0.01 * np.cos(7 * X)


@pytest.mark.parametrize("options", [{}, {"fixed": {"c": 0.5}},
                                     {"likelihood": "poisson", "y_scale": 100.0}])
def test_fit_result_json_round_trip(options):
    options = dict(options)
    y = Y * options.pop("y_scale", 1.0)
    res = ap.fit(decay, X, np.round(y) if "likelihood" in options else y, **options)
    text = res.to_json()
    json.loads(text)               # strict JSON: no NaN/Infinity literals
    assert "NaN" not in text and "Infinity" not in text
    back = ap.FitResult.from_json(text, model=decay)
    assert str(back) == str(res)
    for name in ("popt", "pcov", "stderr", "correl", "residuals", "null_space"):
        np.testing.assert_array_equal(getattr(back, name), getattr(res, name))
    assert repr(back.to_dict()) == repr(res.to_dict())   # (nan != nan)
    np.testing.assert_array_equal(back.band(X[:3]).upper, res.band(X[:3]).upper)
    with pytest.raises(ValueError, match="pass model="):
        ap.FitResult.from_json(text).band()


@pytest.mark.slow
def test_json_of_a_callable_tie_asks_for_it_back():
    res = ap.fit(decay, X, Y, expr={"c": lambda p: 0.25 * p["a"]})
    back = ap.FitResult.from_json(res.to_json(), model=decay,
                                  expr={"c": lambda p: 0.25 * p["a"]})
    np.testing.assert_array_equal(back.popt, res.popt)
    assert np.isfinite(back.profile_intervals(params=["a"]).interval("a")).all()


def test_fit_omits_nan_points():
    y = Y.copy()
    y[[3, 17]] = np.nan
    res = ap.fit(decay, X, y, nan_policy="omit")
    keep = np.isfinite(y)
    ref = ap.fit(decay, X[keep], y[keep])
    np.testing.assert_allclose(res.popt, ref.popt, rtol=1e-12)
    assert res.nobs == 28 and res.dof == 25
    with pytest.raises(ValueError, match="nan_policy='omit'"):
        ap.fit(decay, X, y)


@pytest.mark.slow
def test_bands_and_batch_summaries_are_float64_numpy_with_x64_off():
    out = run_python("""
        import warnings
        warnings.simplefilter("error")
        import numpy as np, jax.numpy as jnp
        import adaptprec as ap
        x = np.linspace(0.0, 1.0, 8)
        y = 3.0 * np.exp(-np.array([0.5, 1.0])[:, None] * x) + np.array([1, -1] * 4) * 1e-3
        res = ap.fit(lambda x, a, k: a * jnp.exp(-k * x), x, y[0])
        b = res.band()
        model = lambda p, t: p[0] * jnp.exp(-p[1] * t)
        br = ap.solve_nlsq_batch(model, np.ones((2, 2)), (x,), in_axes=None, ydata=y)
        s = ap.summarize_batch(br, model, (x,), in_axes=None, ydata=y)
        w = s.wald_intervals()
        print(type(b.upper).__name__, b.upper.dtype, type(s.stderr).__name__,
              s.stderr.dtype, w.dtype)
    """, x64=False)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["ndarray", "float64", "ndarray", "float64", "float64"]
