"""Fit errors a new user hit: each test fails on the code before its fix.

1. xdata and ydata of different lengths: the error names the data, not the model.
2. A model returning a scalar or a stacked ``(2, m)`` array is an error naming the shape
   (it used to fit silently, with at most an OptimizeWarning).
3. ``functools.partial(model, bottom=0.0)``: the partial's parameters are fitted by name.
4. ``adaptive`` on a kernel returning a string names the kernel, not adaptprec's file.
5. ``plot_fit`` draws the fitted curve on a fine grid, through the band's centre.
"""

import functools

import jax.numpy as jnp
import numpy as np
import pytest
import scipy.optimize as so

import adaptprec as ap

X = np.linspace(0.0, 2.0, 24)


def line(x, a, b):
    return a * x + b


# ------------------------------------------------------------------ 1. lengths

@pytest.mark.parametrize("entry", ["curve_fit", "fit"])
def test_length_mismatch_names_the_data(entry):
    with pytest.raises(ValueError) as e:
        getattr(ap, entry)(line, X, np.linspace(0.0, 1.0, 21))
    msg = str(e.value)
    assert "xdata has 24 points" in msg and "ydata has 21" in msg
    assert "model returned" in msg and "must return one value" not in msg


# ------------------------------------------------------------------ 2. shapes

@pytest.mark.parametrize("model, shape", [
    (lambda x, a, b: a + b, "()"),
    (lambda x, a, b: jnp.stack([a * x + b, a * x]), "(2, 24)"),
])
def test_model_shape_is_an_error(model, shape):
    with pytest.raises(ValueError, match=r"model returned shape " + shape.replace(
            "(", r"\(").replace(")", r"\)")):
        ap.curve_fit(model, X, 2.0 * X + 1.0)


def test_one_ydata_value_still_broadcasts():
    popt, _ = ap.curve_fit(lambda x, a: a * jnp.ones(3), np.arange(3.0), np.array([2.0]),
                           p0=[1.0])
    assert popt[0] == pytest.approx(2.0)


# ------------------------------------------------------------------ 3. partial

def decay(x, bottom, a, k):
    return a * jnp.exp(-k * x) + bottom


@pytest.mark.parametrize("p0", [None, [1.0, 1.0]])
def test_partial_fits_its_free_parameters(p0):
    y = 2.0 * np.exp(-1.3 * X) + 0.5 + 0.01 * np.cos(9 * X)
    popt, pcov = ap.curve_fit(functools.partial(decay, bottom=0.5), X, y, p0=p0)
    ref, rcov = so.curve_fit(lambda x, a, k: a * np.exp(-k * x) + 0.5, X, y, p0=[1.0, 1.0])
    np.testing.assert_allclose(popt, ref, rtol=1e-7)
    np.testing.assert_allclose(pcov, rcov, rtol=1e-5)
    res = ap.fit(functools.partial(decay, bottom=0.5), X, y)
    assert res.names == ("a", "k")
    np.testing.assert_allclose(res.popt, ref, rtol=1e-7)


# ------------------------------------------------------------------ 4. adaptive


def returns_text(a):
    return "done"


@pytest.mark.parametrize("options", [{}, {"rtol": 1e-3}])
def test_adaptive_string_names_the_kernel(options):
    with pytest.raises(TypeError) as e:
        ap.adaptive(returns_text, **options)(jnp.ones(3))
    msg = str(e.value)
    assert "returns_text" in msg and "_structure.py" not in msg


# ------------------------------------------------------------------ 5. plot_fit


@pytest.mark.slow
def test_plot_fit_curve_on_a_fine_grid():
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")

    def model(x, a, k):
        return a * jnp.exp(-k * x)

    x = np.linspace(0.0, 3.0, 7)
    y = 2.0 * np.exp(-1.1 * x) + 0.01 * np.cos(5 * x)
    popt, pcov = ap.curve_fit(model, x, y, p0=[1.0, 1.0])
    fig = ap.plot_fit((popt, pcov), model, x, y)
    line_ = [ln for ln in fig.axes[0].lines if ln.get_label().startswith("fit")][0]
    gx, gy = line_.get_data()
    assert len(gx) >= 100
    np.testing.assert_allclose(gy, np.asarray(model(gx, *popt)), rtol=1e-12)
    res = ap.fit(model, x, y, p0=[1.0, 1.0])
    fig = ap.plot_fit(res)
    line_ = [ln for ln in fig.axes[0].lines if ln.get_label().startswith("fit")][0]
    gx, gy = line_.get_data()
    band = res.band(gx)
    np.testing.assert_allclose(gy, np.asarray(band.fit), rtol=1e-12)
