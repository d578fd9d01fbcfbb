"""Plots (headless: figures are matplotlib Figure objects rendered with Agg)."""

import jax.numpy as jnp
import numpy as np
import pytest

import adaptprec as ap
from adaptprec._profile import Profile, ProfileRow

from _subprocess import run_python

matplotlib = pytest.importorskip("matplotlib")
matplotlib.use("Agg")          # headless, as in CI (the figures never need pyplot anyway)

X = jnp.linspace(0.0, 4.0, 30)
SIGMA = jnp.full(30, 0.05)


def model(x, a, k, c):
    return a * jnp.exp(-k * x) + c


Y = model(X, 2.0, 1.3, 0.5) + 0.05 * jnp.asarray(np.random.default_rng(1).normal(size=30))


@pytest.fixture(scope="module")
def fitted():
    trace = ap.FitTrace()
    out = ap.curve_fit(model, X, Y, p0=[1.0, 1.0, 0.0], sigma=SIGMA, schedule=trace,
                       full_output=True)
    return out, trace


def _render(fig, tmp_path, name):
    path = tmp_path / name
    fig.savefig(path, dpi=40)
    assert path.stat().st_size > 1000
    assert type(fig.canvas).__name__ in ("FigureCanvasBase", "FigureCanvasAgg")


@pytest.mark.slow
def test_plot_fit_data_residuals_and_cost_by_rung(fitted, tmp_path):
    out, trace = fitted
    popt, result = out[0], out[2]["result"]
    fig = ap.plot_fit(out, model, X, Y, sigma=SIGMA, trace=trace)
    data, resid, cost = fig.axes
    assert [a.get_title() for a in fig.axes] == ["data and fit", "residuals",
                                                 "cost per iteration"]
    fit_line = data.get_lines()[-1]   # the model on a fine grid over the data's x
    xs = np.asarray(fit_line.get_xdata())
    assert xs.size > np.size(X) and xs.min() == np.min(X) and xs.max() == np.max(X)
    np.testing.assert_allclose(fit_line.get_ydata(), np.asarray(model(xs, *popt)),
                               rtol=1e-12)
    assert "fit (f64)" in [t.get_text() for t in data.get_legend().get_texts()]
    pts = resid.get_lines()[-1].get_ydata()
    np.testing.assert_allclose(pts, (np.asarray(Y) - np.asarray(model(X, *popt))) / 0.05,
                               rtol=1e-9)
    # one line per rung the solve used, named from the result's ladder
    steps, c, rungs = trace.arrays()
    used = sorted(set(rungs[np.isfinite(c)].tolist()))
    names = [t.get_text() for t in cost.get_legend().get_texts()]
    assert names == [("f32", "f64")[k] for k in used]
    assert len(cost.get_lines()) == len(used)
    assert cost.get_yscale() == "log"
    _render(fig, tmp_path, "fit.png")


def test_fit_trace_records_a_decreasing_cost(fitted):
    out, trace = fitted
    steps, cost, rung = trace.arrays()
    finite = cost[np.isfinite(cost)]
    assert finite.size >= 3 and finite[-1] <= finite[0]
    assert finite[-1] == pytest.approx(float(out[2]["result"].cost), rel=1e-6)
    assert np.all(np.diff(rung) >= 0)              # escalation only goes up


def test_plot_fit_popt_only_and_nlsq_result(fitted, tmp_path):
    out, _ = fitted
    fig = ap.plot_fit(out[0], model, X, Y)
    assert [a.get_title() for a in fig.axes] == ["data and fit", "residuals"]
    res = out[2]["result"]
    fig = ap.plot_fit(res)
    (ax,) = fig.axes
    np.testing.assert_allclose(ax.get_lines()[-1].get_ydata(), np.asarray(res.fun))
    _render(fig, tmp_path, "res.png")


def test_plot_fit_bad_input():
    with pytest.raises(ValueError, match="needs model, xdata and ydata"):
        ap.plot_fit(np.ones(3))
    with pytest.raises(ValueError, match="together"):
        ap.plot_fit(np.ones(3), model, X)


@pytest.mark.slow
def test_plot_batch(tmp_path):
    t = jnp.linspace(0.0, 1.0, 8)
    k = jnp.linspace(0.5, 2.0, 24)
    y = 3.0 * jnp.exp(-k[:, None] * t)
    res = ap.solve_nlsq_batch(lambda p, t: p[0] * jnp.exp(-p[1] * t), jnp.ones((24, 2)),
                              (t,), in_axes=None, ydata=y)
    fig = ap.plot_batch(res, names=["a"])
    assert [a.get_title() for a in fig.axes] == ["status", "rung", "a", "p1"]
    status_ax, rung_ax, a_ax, k_ax = fig.axes
    heights = [p.get_height() for p in status_ax.patches]
    assert sum(heights) == 24
    assert [p.get_height() for p in rung_ax.patches] == [
        int(np.sum(np.asarray(res.rung) == r)) for r in range(len(res.ladder))]
    assert sum(p.get_height() for p in k_ax.patches) == 24
    assert ap.plot_fit(res).axes[0].get_title() == "status"     # plot_fit dispatches
    _render(fig, tmp_path, "batch.png")


def test_profile_plot_is_a_pareto_chart(tmp_path):
    def row(name, t, digits):
        return ProfileRow(name, "dtype", name, 0.1, t, [t], 1, 1, 0, 10 ** -digits,
                          10 ** -digits, digits)

    prof = Profile("f", "f64", [row("bf16", 1e-4, 2.5), row("f32", 2e-4, 7.0),
                               row("f64", 4e-4, 16.0), row("slow", 5e-4, 3.0)])
    fig = prof.plot()
    (ax,) = fig.axes
    assert ax.get_xscale() == "log"
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels == ["bf16", "f32", "f64", "slow", "Pareto front"]
    front = [ln for ln in ax.get_lines() if ln.get_label() == "Pareto front"]
    assert len(front) == 1
    np.testing.assert_allclose(front[0].get_xdata(), [1e-4, 2e-4, 4e-4])
    _render(fig, tmp_path, "profile.png")


def test_real_profile_plot(tmp_path):
    prof = ap.profile(jnp.sin, jnp.linspace(0, 1, 256), configs=["bf16", "f32"],
                      repeats=1, min_time=1e-4)
    fig = prof.plot()
    assert [t.get_text() for t in fig.axes[0].get_legend().get_texts()][:2] == [
        "bf16", "f32"]
    assert fig.axes[0].get_title() == "profile of sin"
    _render(fig, tmp_path, "p.png")


def test_importing_adaptprec_does_not_import_matplotlib():
    out = run_python("import sys, adaptprec\n"
                     "assert 'matplotlib' not in sys.modules\nprint('OK')", timeout=120)
    assert out.returncode == 0 and "OK" in out.stdout, out.stderr
