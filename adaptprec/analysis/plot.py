"""Drawing a :class:`~adaptprec.FitResult`: :func:`adaptprec.plot_fit`'s data, fit and
residual panels plus the confidence and prediction bands (matplotlib, imported on use)."""

from __future__ import annotations

import numpy as np

__all__ = ["plot_fit_result"]


def plot_fit_result(res, *, level: float = 0.95, prediction: bool = True, trace=None,
                    points: int = 200):
    """``plot_fit`` for a fit result, with its ``level`` confidence band (and, with
    ``prediction=True`` for a fit without ``sigma``, the prediction band) shaded on the
    data panel. A positive ``x`` spanning more than two decades is drawn on a log axis.

    Example:
        >>> import numpy as np, jax.numpy as jnp
        >>> import adaptprec as ap
        >>> x = np.linspace(0.0, 2.0, 15)
        >>> res = ap.fit(lambda x, a, k: a * jnp.exp(-k * x), x,
        ...              np.exp(-x) + 0.01 * np.cos(9 * x))
        >>> fig = ap.plot_fit(res)
        >>> [c.get_label() for c in fig.axes[0].collections][-2:]
        ['95% prediction band', '95% confidence band']
    """
    from .._plot import plot_fit

    fig = plot_fit(res.popt, res.model, res.xdata, res.ydata, sigma=res.sigma, trace=trace)
    x = np.asarray(res.xdata, np.float64)
    if x.ndim != 1 or x.size != res.nobs:
        return fig   # bands need a 1-D x
    lo, hi = float(x.min()), float(x.max())
    log = lo > 0 and hi / lo > 100.0
    grid = np.geomspace(lo, hi, points) if log else np.linspace(lo, hi, points)
    ax = fig.axes[0]
    conf = res.band(grid, level=level)
    if prediction and res.sigma is None:
        pred = res.band(grid, level=level, kind="prediction")
        ax.fill_between(grid, np.asarray(pred.lower), np.asarray(pred.upper),
                        color="tab:blue", alpha=0.12, lw=0,
                        label=f"{level:.0%} prediction band")
    ax.fill_between(grid, np.asarray(conf.lower), np.asarray(conf.upper), color="tab:orange",
                    alpha=0.35, lw=0, label=f"{level:.0%} confidence band")
    ax.plot(grid, np.asarray(conf.fit), "-", color="tab:orange", lw=1.2)
    if log:
        for a in fig.axes[:2]:
            a.set_xscale("log")
    ax.legend(loc="best", fontsize="small")
    return fig
