"""Plots: a fit (data, model, residuals, cost per iteration by rung), a batch of fits,
and a profile's time-against-digits chart.

Everything here needs matplotlib (``pip install adaptprec[plot]``), imported only when a
plot is drawn. Figures are built as ``matplotlib.figure.Figure`` objects, not through
``pyplot``, so plotting never touches global state or needs a display: save them with
``fig.savefig(path)``, or show them in a notebook.

To plot the cost per iteration, record the iterations with a :class:`FitTrace` (pass
``schedule=trace`` to :func:`~adaptprec.curve_fit` or :func:`~adaptprec.solve_nlsq`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = ["FitTrace", "plot_batch", "plot_fit", "plot_profile"]

_RUNG_COLORS = ("#d62728", "#ff7f0e", "#1f77b4", "#2ca02c", "#9467bd", "#8c564b")


def _figure(ncols: int, nrows: int = 1, width: float = 4.2, height: float = 3.3):
    try:
        from matplotlib.figure import Figure
    except ImportError as exc:      # pragma: no cover - depends on the environment
        raise ImportError("plotting needs matplotlib: pip install 'adaptprec[plot]'") \
            from exc
    fig = Figure(figsize=(width * ncols, height * nrows), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False)
    return fig, list(axes.ravel())


def _rung_color(k: int) -> str:
    return _RUNG_COLORS[int(k) % len(_RUNG_COLORS)]


# ------------------------------------------------------------------------ FitTrace

class FitTrace:
    """Records ``(iteration, cost, rung)`` of a solve for :func:`plot_fit`.

    Pass it as ``schedule=`` to :func:`~adaptprec.curve_fit` or
    :func:`~adaptprec.solve_nlsq`: it is the solver's default escalation schedule plus a
    host callback (``jax.debug.callback``) that records each step, so the solve itself is
    unchanged. One trace records one solve; :meth:`clear` empties it.

    Example:
        >>> import jax.numpy as jnp
        >>> import adaptprec as ap
        >>> trace = ap.FitTrace()
        >>> x = jnp.linspace(0.0, 1.0, 20)
        >>> popt, _ = ap.curve_fit(lambda x, a, k: a * jnp.exp(-k * x), x,
        ...                        2.0 * jnp.exp(-3.0 * x), p0=[1.0, 1.0], schedule=trace)
        >>> len(trace.cost) > 0, trace.cost[-1] < trace.cost[0]
        (True, True)
    """

    def __init__(self):
        self.steps: list[int] = []
        self.cost: list[float] = []
        self.rung: list[int] = []
        self._schedule = None

    def _record(self, stats, rung) -> None:
        self.steps.append(int(stats.step))
        self.cost.append(float(stats.value))
        self.rung.append(int(rung))

    def clear(self) -> None:
        """Forget the recorded steps."""
        self.steps.clear(), self.cost.clear(), self.rung.clear()

    def _get(self):
        if self._schedule is None:
            from .nlsq._step_schedule import default_schedule
            from .schedule import Callback, any_of

            self._schedule = any_of(default_schedule(), Callback(self._record))
        return self._schedule

    # a PrecisionSchedule duck type: solve_nlsq calls init/update on it
    def init(self, ladder):
        return self._get().init(ladder)

    def update(self, state, stats):
        return self._get().update(state, stats)

    def __getattr__(self, name):            # everything else of the schedule
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._get(), name)

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(steps, cost, rung)`` sorted by step."""
        order = np.argsort(np.asarray(self.steps, dtype=np.int64), kind="stable")
        return (np.asarray(self.steps)[order], np.asarray(self.cost)[order],
                np.asarray(self.rung)[order])


# ---------------------------------------------------------------------- plot_fit

def _unpack_fit(fit):
    """``(params, result_or_None)`` from popt, (popt, pcov[, infodict, ...]) or NLSQResult."""
    from .nlsq.result import NLSQResult

    if isinstance(fit, NLSQResult):
        return fit.x, fit
    if isinstance(fit, tuple) and len(fit) >= 2 and not np.isscalar(fit[0]):
        result = None
        if len(fit) >= 3 and isinstance(fit[2], dict):
            result = fit[2].get("result")
        return fit[0], result
    return fit, None


def _ladder_names(result) -> list[str] | None:
    if result is None or not getattr(result, "ladder", None):
        return None
    from .precision import dtype_name

    return [dtype_name(d) for d in result.ladder]


def plot_fit(fit: Any, model: Callable | None = None, xdata=None, ydata=None, *,
             sigma=None, trace: FitTrace | None = None):
    """Plot a fit: data and model, residuals, and the cost per iteration coloured by rung.

    Args:
        fit: ``popt``, ``curve_fit``'s ``(popt, pcov)`` or ``full_output`` tuple, an
            :class:`~adaptprec.NLSQResult`, a :class:`~adaptprec.BatchResult` (then
            :func:`plot_batch` draws it), or a :class:`~adaptprec.FitResult` (then its
            95 % confidence and prediction bands are drawn too; other levels:
            ``adaptprec._plot.plot_fit_result``).
        model, xdata, ydata: the ``curve_fit`` model ``model(xdata, *params)`` and the data.
            Needed for the data panel; without them an ``NLSQResult``'s residuals
            (``fit.fun``) are plotted against their index.
        sigma: 1-D standard deviations of ``ydata`` (error bars; residuals are divided by
            them, as ``curve_fit`` weighs them).
        trace: a :class:`FitTrace` that recorded the solve (adds the cost panel).

    Returns:
        a ``matplotlib.figure.Figure`` with one panel per available view.

    Example:
        >>> import jax.numpy as jnp
        >>> import adaptprec as ap
        >>> x = jnp.linspace(0.0, 1.0, 20)
        >>> model = lambda x, a, k: a * jnp.exp(-k * x)
        >>> trace = ap.FitTrace()
        >>> popt, pcov = ap.curve_fit(model, x, model(x, 2.0, 3.0), p0=[1.0, 1.0],
        ...                           schedule=trace)
        >>> fig = ap.plot_fit((popt, pcov), model, x, model(x, 2.0, 3.0), trace=trace)
        >>> [ax.get_title() for ax in fig.axes]
        ['data and fit', 'residuals', 'cost per iteration']
    """
    from .batch.result import BatchResult

    if isinstance(fit, BatchResult):
        return plot_batch(fit)
    from .analysis.result import FitResult

    if isinstance(fit, FitResult) and model is None:  # drawn with its bands
        return plot_fit_result(fit, trace=trace)
    params, result = _unpack_fit(fit)
    have_data = model is not None and xdata is not None and ydata is not None
    if (model is None) != (xdata is None) or (ydata is None) != (xdata is None):
        raise ValueError("pass model, xdata and ydata together (curve_fit's f, xdata, "
                         "ydata)")
    if not have_data and result is None:
        raise ValueError("plot_fit needs model, xdata and ydata to plot popt; or pass an "
                         "NLSQResult (its residuals fit.fun are plotted)")
    panels = ["data"] * have_data + ["residuals"] + ["cost"] * (trace is not None)
    fig, axes = _figure(len(panels))
    axes = dict(zip(panels, axes))
    names = _ladder_names(result)

    if have_data:
        x = np.asarray(xdata, dtype=np.float64)
        y = np.asarray(ydata, dtype=np.float64)
        p = [np.asarray(v) for v in np.atleast_1d(np.asarray(params, dtype=np.float64))]
        fitted = np.asarray(model(np.asarray(xdata), *p), dtype=np.float64)
        s = None if sigma is None else np.broadcast_to(
            np.asarray(sigma, dtype=np.float64), y.shape)
        residuals = (y - fitted) if s is None else (y - fitted) / s
        xs = x if x.ndim == 1 and x.shape == y.shape else np.arange(y.size)
        ax = axes["data"]
        if s is None:
            ax.plot(xs, y, "o", ms=3, color="0.35", label="data")
        else:
            ax.errorbar(xs, y, yerr=s, fmt="o", ms=3, color="0.35", label="data")
        order = np.argsort(xs, kind="stable")
        label = "fit" + (f" ({result.rung_name})" if result is not None else "")
        ax.plot(xs[order], fitted[order], "-", color=_rung_color(2), label=label)
        ax.set_title("data and fit")
        ax.set_xlabel("x")
        ax.legend(loc="best", fontsize="small")
        rx = xs
        rlabel = "residual / sigma" if s is not None else "residual"
    else:
        residuals = np.asarray(result.fun, dtype=np.float64).ravel()
        rx = np.arange(residuals.size)
        rlabel = "residual"
    ax = axes["residuals"]
    ax.axhline(0.0, color="0.6", lw=0.8)
    ax.plot(rx, residuals, "o", ms=3, color="0.2")
    ax.set_title("residuals")
    ax.set_ylabel(rlabel)
    ax.set_xlabel("x" if have_data else "index")

    if trace is not None:
        ax = axes["cost"]
        steps, cost, rung = trace.arrays()
        keep = np.isfinite(cost)          # the state before the first step has cost inf
        steps, cost, rung = steps[keep], cost[keep], rung[keep]
        for k in np.unique(rung):
            sel = rung == k
            name = names[k] if names and k < len(names) else f"rung {k}"
            ax.plot(steps[sel], cost[sel], "o-", ms=3, lw=1, color=_rung_color(k),
                    label=name)
        if cost.size and np.all(cost > 0):
            ax.set_yscale("log")
        ax.set_title("cost per iteration")
        ax.set_xlabel("iteration")
        ax.set_ylabel("cost")
        if cost.size:
            ax.legend(loc="best", fontsize="small", title="rung")
    return fig


# --------------------------------------------------------------------- plot_batch

def plot_batch(result, *, names: list[str] | None = None, max_params: int = 6, bins: int = 40):
    """Plot a :class:`~adaptprec.BatchResult`: status and rung histograms, and the
    distribution of each parameter over the successful fits.

    Args:
        result: the ``BatchResult``.
        names: parameter names (default ``p0, p1, ...``).
        max_params: at most this many parameter panels.
        bins: histogram bins.

    Example:
        >>> import jax.numpy as jnp
        >>> import adaptprec as ap
        >>> t = jnp.linspace(0.0, 1.0, 8)
        >>> y = 3.0 * jnp.exp(-jnp.linspace(0.5, 2.0, 16)[:, None] * t)
        >>> res = ap.solve_nlsq_batch(lambda p, t: p[0] * jnp.exp(-p[1] * t),
        ...                           jnp.ones((16, 2)), (t,), in_axes=None, ydata=y)
        >>> fig = ap.plot_batch(res, names=["a", "k"])
        >>> [ax.get_title() for ax in fig.axes]
        ['status', 'rung', 'a', 'k']
    """
    from .batch import _status as bst
    from .precision import dtype_name

    leaves = [np.asarray(v, dtype=np.float64) for v in _leaves(result.x)]
    cols = np.concatenate([v.reshape(v.shape[0], -1) for v in leaves], axis=1)
    n = min(cols.shape[1], int(max_params))
    fig, axes = _figure(2 + n, width=3.4)
    status = np.asarray(result.status)
    codes, counts = np.unique(status, return_counts=True)
    ax = axes[0]
    ax.bar([str(c) for c in codes], counts,
           color=["#2ca02c" if c > 0 else "#d62728" for c in codes])
    ax.set_title("status")
    ax.set_xlabel("status code")
    ax.set_ylabel("fits")
    for c, k in zip(codes, counts):
        ax.annotate(bst.message(int(c))[:28], (str(c), k), ha="center", va="bottom",
                    fontsize="x-small", rotation=0)
    rung = np.asarray(result.rung)
    ladder = [dtype_name(d) if not isinstance(d, str) else d for d in result.ladder]
    per = [int(np.sum(rung == k)) for k in range(len(ladder))]
    ax = axes[1]
    ax.bar(ladder, per, color=[_rung_color(k) for k in range(len(ladder))])
    ax.set_title("rung")
    ax.set_ylabel("fits")
    ok = np.asarray(result.success)
    labels = list(names or []) + [f"p{i}" for i in range(len(names or []), n)]
    for i in range(n):
        ax = axes[2 + i]
        v = cols[ok, i]
        v = v[np.isfinite(v)]
        ax.hist(v, bins=bins, range=_hist_range(v), color="0.4")
        ax.set_title(labels[i])
        ax.set_xlabel(f"value ({v.size} successful fits)")
    return fig


def _hist_range(v):
    """A histogram range for ``v`` that is never narrower than a few ulps of its values:
    fits of exact data agree to the last bits, and numpy refuses to split such a range
    into ``bins`` finite-sized bins ("Too many bins for data range")."""
    if v.size == 0:
        return None
    lo, hi = float(v.min()), float(v.max())
    half = max(hi - lo, 1e-9 * max(abs(lo), abs(hi), 1e-300)) / 2
    if hi - lo >= 2 * half:
        return None
    mid = (lo + hi) / 2
    return (mid - half, mid + half)


def _leaves(x):
    import jax

    return jax.tree_util.tree_leaves(x)


# ------------------------------------------------------------------- plot_profile

_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "h", "<", ">", "p")


def plot_profile(prof, ax=None):
    """Time against digits, one point per configuration; the Pareto front is joined.

    Each configuration has its own marker and colour, named in a legend beside the axes
    (``"config -> rung"`` where they differ): configurations with nearly the same time
    and digits (``f32`` and ``auto_mixed_bf16``) sit on top of each other, and labels
    written next to the points overlapped there. The title names the profiled function.
    Returns the ``Figure`` (``prof.plot()`` calls this).
    """
    if ax is None:
        fig, (ax,) = _figure(1, width=7.5, height=4.0)
    else:
        fig = ax.figure
    front = prof.pareto()
    for k, r in enumerate(prof.rows):
        on = r.config in front
        label = r.config if r.rung == r.config else f"{r.config} -> {r.rung}"
        ax.plot(r.time_s, r.digits, _MARKERS[k % len(_MARKERS)], ms=8 if on else 6,
                color=_rung_color(k), alpha=1.0 if on else 0.6, label=label,
                mec="black" if on else "none", mew=0.6)
    pts = sorted((prof[c].time_s, prof[c].digits) for c in front)
    if len(pts) > 1:
        ax.step([p[0] for p in pts], [p[1] for p in pts], where="post", color="0.5",
                lw=1, ls="--", label="Pareto front")
    ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), fontsize="small",
              title="config -> rung", title_fontsize="small", frameon=False)
    ax.set_xscale("log")
    ax.margins(x=0.3, y=0.12)
    ax.set_xlabel("run time per call (s)")
    ax.set_ylabel(f"correct digits (vs {prof.reference})")
    ax.set_title(f"profile of {prof.function}")
    return fig


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
