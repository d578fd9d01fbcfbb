"""`fit` and `FitResult`: a fitted model with its uncertainties and diagnostics, and a
report a scientist can read (lmfit's ``fit_report`` in spirit).

:func:`fit` runs :func:`adaptprec.curve_fit` (``full_output=True``; ``curve_fit``'s own
return stays scipy's) and computes, in float64 on the host side of the solve: the
parameter table (values, standard errors, relative errors, correlations) on the
identifiable subspace (:mod:`.identifiability`), χ², reduced χ², degrees of freedom,
R², AIC and BIC, the residuals and their runs test, and flags (undetermined
combinations, sloppy directions, |ρ| > 0.99, parameters at a bound). Intervals
(:meth:`FitResult.wald_intervals`, :meth:`FitResult.profile_intervals`) and bands
(:meth:`FitResult.band`) are computed from it on demand.

Example:
    >>> import numpy as np, jax.numpy as jnp
    >>> import adaptprec as ap
    >>> rng = np.random.default_rng(0)
    >>> x = np.linspace(0.0, 4.0, 40)
    >>> y = 2.5 * np.exp(-1.3 * x) + 0.5 + rng.normal(0.0, 0.02, x.size)
    >>> res = ap.fit(lambda x, a, k, c: a * jnp.exp(-k * x) + c, x, y, p0=[1.0, 1.0, 0.0])
    >>> res.names, [round(float(v), 2) for v in res.popt]
    (('a', 'k', 'c'), [2.51, 1.32, 0.5])
    >>> print(str(res).splitlines()[0])
    [[Fit Statistics]]
"""

from __future__ import annotations

import functools
import inspect
import math
import warnings
from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np

from .._pytree import Module, field
from .._user_fn import positional_model
from ..precision import x64_enabled
from .bands import Band, fit_band
from .identifiability import describe_null_space, subspace_covariance
from .residual_tests import lag1_autocorrelation, runs_test
from ._quantiles import two_sided_quantile

__all__ = ["FitResult", "fit", "parameter_names"]

#: |correlation| above which a pair is flagged
STRONG_CORRELATION = 0.99
#: a direction whose log-parameter combination has a standard error above this (100 %)
#: is flagged as sloppy
SLOPPY_RELATIVE_ERROR = 1.0
#: one-sided runs-test p-value below which the residuals flag a misfit
RUNS_PVALUE = 0.01


def parameter_names(model: Callable, n: int) -> tuple:
    """Names of ``model(x, p1, p2, ...)``'s parameters from its signature; ``p0, p1, ...``
    when the signature does not name ``n`` of them (``*params``, builtins).

    Example:
        >>> from adaptprec.analysis.result import parameter_names
        >>> parameter_names(lambda x, amp, k: amp * x, 2), parameter_names(lambda x, *p: x, 2)
        (('amp', 'k'), ('p0', 'p1'))
    """
    try:
        params = list(inspect.signature(model).parameters.values())
    except (TypeError, ValueError):
        params = []
    named = [p.name for p in params[1:]
             if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if len(named) >= n:
        return tuple(named[:n])
    return tuple(f"p{i}" for i in range(n))


class FitResult(Module):
    """A fitted model: parameters, uncertainties, goodness of fit and diagnostics.

    Arrays are NumPy float64 (the fit's working precision is float64 whatever
    ``jax_enable_x64`` says). Parameters: ``names``, ``popt``, ``stderr``
    (``inf`` for a parameter the data do not determine), ``relerr`` (``stderr / |popt|``),
    ``pcov`` (scaled as ``curve_fit``'s, but on the identifiable subspace: see
    :mod:`adaptprec.analysis.identifiability`), ``correl``, ``cov_identifiable`` (the
    finite pseudo-inverse behind ``pcov``, used for bands and combinations).

    Goodness of fit: ``chi2`` (sum of squared weighted residuals), ``dof``
    (``nobs - rank``; scipy's ``m - n`` when every parameter is identifiable), ``redchi``,
    ``r2`` (``1 - sum (y - f)^2 / sum (y - mean y)^2``, unweighted), ``aic``/``bic``
    (lmfit's ``nobs log(chi2 / nobs) + 2 n`` and ``+ log(nobs) n``), ``residuals``
    (``ydata - f``), ``weighted_residuals`` (what was minimised), ``runs``
    (:class:`~adaptprec.analysis.residual_tests.RunsTest`), ``autocorrelation`` (lag 1).

    Diagnostics: ``singular_values`` of the log-scaled Jacobian, ``rank``,
    ``identifiable`` ``(n,)``, ``null_space`` ``(n, k)``, ``sloppy_errors`` (the
    relative standard error along each direction), ``at_bound`` ``(n,)``, and
    :attr:`diagnostics` (sentences, empty for a healthy fit).

    Solver: ``status``, ``message``, ``success``, ``nfev``, ``nit``, ``rung``
    (``"f64"``), ``escalations``, ``method``; ``solver`` is the :class:`~adaptprec.NLSQResult`.

    ``str(result)`` is the report; :meth:`to_dict`, :meth:`to_dataframe` export it.
    """

    popt: Any
    stderr: Any
    pcov: Any
    cov_identifiable: Any
    correl: Any
    chi2: Any
    redchi: Any
    r2: Any
    aic: Any
    bic: Any
    residuals: Any
    weighted_residuals: Any
    runs: Any
    autocorrelation: Any
    singular_values: Any
    directions: Any
    identifiable: Any
    null_space: Any
    sloppy_errors: Any
    at_bound: Any
    lower_bounds: Any
    upper_bounds: Any
    xdata: Any
    ydata: Any
    sigma: Any
    p0: Any
    solver: Any
    names: tuple = field(static=True)
    model: Callable = field(static=True)
    dof: int = field(static=True)
    nobs: int = field(static=True)
    rank: int = field(static=True)
    absolute_sigma: bool = field(static=True)
    method: str = field(static=True)
    diagnostics: tuple = field(static=True)

    # ------------------------------------------------------------------ basics
    @property
    def nparams(self) -> int:
        return len(self.names)

    @property
    def relerr(self):
        """``stderr / |popt|`` (inf where ``popt`` is 0)."""
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.abs(np.asarray(self.stderr) / np.asarray(self.popt))

    @property
    def params(self) -> dict:
        """``{name: value}``."""
        return {k: float(v) for k, v in zip(self.names, np.asarray(self.popt))}

    @property
    def status(self) -> int:
        return int(self.solver.status)

    @property
    def success(self) -> bool:
        return int(self.solver.status) > 0

    @property
    def message(self) -> str:
        return self.solver.message

    @property
    def rung(self) -> str:
        """The precision that produced ``popt`` (``"f64"``)."""
        return self.solver.rung_name

    @property
    def nfev(self) -> int:
        return int(self.solver.nfev)

    def _quantile(self, level: float) -> float:
        dof = None if self.absolute_sigma else (self.dof if self.dof > 0 else math.nan)
        return float(two_sided_quantile(level, dof))

    def predict(self, x=None):
        """The fitted model at ``x`` (default: the data's ``x``)."""
        x = self.xdata if x is None else x
        p = jnp.asarray(self.popt)
        return self.model(x, *[p[i] for i in range(p.shape[0])])

    # ------------------------------------------------------------------ intervals
    def wald_intervals(self, level: float = 0.95) -> np.ndarray:
        """``(n, 2)`` Wald intervals ``popt ± q stderr``: ``q`` is Student's t with
        ``dof`` degrees of freedom (the variance estimated from the residuals) or, with
        ``absolute_sigma=True``, the normal quantile. ``±inf`` for a parameter that is
        not identifiable."""
        half = self._quantile(level) * np.asarray(self.stderr)
        p = np.asarray(self.popt)
        return np.stack([p - half, p + half], axis=1)

    def profile_intervals(self, level=0.95, **kwargs):
        """Profile-likelihood intervals: see :func:`adaptprec.profile_intervals`."""
        from .intervals import profile_intervals

        return profile_intervals(self, level, **kwargs)

    # ------------------------------------------------------------------ bands
    def band(self, x=None, level: float = 0.95, kind: str = "confidence",
             noise_sigma=None) -> Band:
        """Confidence or prediction band at ``x`` (default: the data's ``x``) by the delta
        method (:func:`adaptprec.fit_band`), in ``x``'s precision; jit/vmap/grad-safe.

        ``noise_sigma`` (prediction bands): a new observation's standard deviation on
        the scale of the fit's ``sigma`` (default 1, i.e. ``sigma=None`` fits); with
        ``absolute_sigma=False`` it is scaled by ``sqrt(redchi)`` as ``pcov`` is. A fit
        with ``sigma`` needs it given."""
        if x is None:
            x = self.xdata
        if kind == "prediction" and noise_sigma is None:
            if self.sigma is not None:
                raise ValueError("this fit has sigma: give the prediction band the "
                                 "noise_sigma of a new observation at x")
            noise_sigma = 1.0
        if noise_sigma is not None and not self.absolute_sigma:
            noise_sigma = jnp.asarray(noise_sigma) * jnp.sqrt(self.redchi)
        null = self.null_space if np.shape(self.null_space)[1] else None
        program = _band_program(self.model, kind, self.absolute_sigma)
        return program(x, self.popt, self.cov_identifiable, level, self.dof, noise_sigma,
                       null)

    # ------------------------------------------------------------------ export
    def to_dict(self) -> dict:
        """Plain Python: ``{"params": {name: {value, stderr, relerr, wald95}}, "chi2", ...}``."""
        wald = self.wald_intervals(0.95)
        params = {n: {"value": float(v), "stderr": float(s), "relerr": float(r),
                      "wald95": (float(lo), float(hi)), "at_bound": bool(b),
                      "identifiable": bool(i)}
                  for n, v, s, r, (lo, hi), b, i in zip(
                      self.names, np.asarray(self.popt), np.asarray(self.stderr),
                      self.relerr, wald, np.asarray(self.at_bound),
                      np.asarray(self.identifiable))}
        return {"params": params,
                "correl": np.asarray(self.correl).tolist(),
                "chi2": float(self.chi2), "redchi": float(self.redchi), "dof": self.dof,
                "nobs": self.nobs, "nparams": self.nparams, "rank": self.rank,
                "r2": float(self.r2), "aic": float(self.aic), "bic": float(self.bic),
                "runs_pvalue": float(self.runs.pvalue),
                "autocorrelation": float(self.autocorrelation),
                "status": self.status, "success": self.success, "message": self.message,
                "rung": self.rung, "nfev": self.nfev, "method": self.method,
                "diagnostics": list(self.diagnostics)}

    def to_dataframe(self):
        """The parameter table as a ``pandas.DataFrame`` (index: names; columns value,
        stderr, relerr, wald95_lower, wald95_upper, at_bound, identifiable)."""
        try:
            import pandas as pd
        except ImportError as exc:
            raise ImportError("FitResult.to_dataframe needs pandas (pip install pandas); "
                              "to_dict() gives the same table without it") from exc
        d = self.to_dict()["params"]
        rows = {n: {"value": v["value"], "stderr": v["stderr"], "relerr": v["relerr"],
                    "wald95_lower": v["wald95"][0], "wald95_upper": v["wald95"][1],
                    "at_bound": v["at_bound"], "identifiable": v["identifiable"]}
                for n, v in d.items()}
        return pd.DataFrame.from_dict(rows, orient="index")

    def __str__(self) -> str:
        from ._report import format_report

        return format_report(self)

    def __repr__(self) -> str:
        vals = ", ".join(f"{n}={float(v):.6g}" for n, v in zip(self.names,
                                                               np.asarray(self.popt)))
        return f"FitResult({vals}, redchi={float(self.redchi):.4g}, status={self.status})"


@functools.lru_cache(maxsize=64)
def _band_program(model, kind, absolute_sigma):
    """:func:`fit_band` compiled once per model and kind (an eager band would dispatch
    and compile its small operations one by one); level and dof are traced."""
    def band(x, popt, pcov, level, dof, noise_sigma, null):
        return fit_band(model, x, popt, pcov, level=level,
                        dof=None if absolute_sigma else dof, kind=kind,
                        noise_sigma=noise_sigma, null_space=null)
    return jax.jit(band)


# ---------------------------------------------------------------------- fit

def _bounds_arrays(bounds, n):
    lb, ub = bounds
    return (np.broadcast_to(np.asarray(lb, np.float64), (n,)).copy(),
            np.broadcast_to(np.asarray(ub, np.float64), (n,)).copy())


def _to_numpy(tree):
    return jax.tree.map(lambda a: np.asarray(a) if isinstance(a, jax.Array) else a, tree)


@jax.jit
def _summary_arrays(J, r, popt, y, f, lb, ub, order):
    """Everything array-valued of the report, in one compiled program per shape."""
    sub = subspace_covariance(J, popt)
    rw = r[order]
    runs = runs_test(rw)
    ac = lag1_autocorrelation(rw)
    ss_res = jnp.sum((y - f) ** 2)
    ss_tot = jnp.sum((y - jnp.mean(y)) ** 2)
    r2 = 1.0 - ss_res / jnp.where(ss_tot > 0, ss_tot, jnp.nan)
    tol = 1e-8 * (1.0 + jnp.abs(popt))
    at_bound = (jnp.isfinite(lb) & (popt - lb <= tol)) | (jnp.isfinite(ub) & (ub - popt <= tol))
    return sub, runs, ac, r2, at_bound


def fit(model: Callable, xdata, ydata, p0=None, sigma=None, absolute_sigma: bool = False,
        bounds=(-np.inf, np.inf), method: Optional[str] = None, *, names=None,
        **curve_fit_kwargs) -> FitResult:
    """Fit ``model(xdata, *params)`` to ``ydata`` and return a :class:`FitResult`.

    The arguments are :func:`adaptprec.curve_fit`'s (which runs the solve, with
    ``full_output=True``; ``curve_fit``'s own return is untouched). ``names`` overrides
    the parameter names read from ``model``'s signature. A fit that fails raises
    ``RuntimeError`` as ``curve_fit`` does. The statistics are least-squares ones, so
    ``loss`` must be ``"linear"``; points with NaN must be dropped first
    (``nan_policy`` is not taken).

    Why a separate entry instead of a sixth item of ``curve_fit(full_output=True)``:
    that tuple is scipy's contract (``popt, pcov, infodict, mesg, ier``) and code unpacks
    it by position; ``fit`` keeps ``curve_fit`` a drop-in and gives the report one
    obvious name.

    Example:
        >>> import numpy as np, jax.numpy as jnp
        >>> import adaptprec as ap
        >>> x = np.linspace(0.0, 1.0, 12)
        >>> y = 3.0 * x + 1.0 + np.array([1, -1] * 6) * 0.01
        >>> res = ap.fit(lambda x, slope, icpt: slope * x + icpt, x, y)
        >>> res.names, res.dof, [round(float(v), 4) for v in res.stderr]
        (('slope', 'icpt'), 10, [0.01, 0.0059])
    """
    from ..nlsq.curve_fit import OptimizeWarning, curve_fit

    for bad in ("full_output", "nan_policy"):
        if curve_fit_kwargs.get(bad) is not None:
            raise ValueError(f"fit does not take {bad}=; call curve_fit for it (fit always "
                             "asks curve_fit for its full output; drop NaN points first)")
    if curve_fit_kwargs.get("loss", "linear") != "linear":
        raise ValueError("fit reports least-squares statistics (chi-square, pcov): "
                         "loss must be 'linear'; use curve_fit for a robust loss")
    curve_fit_kwargs.pop("full_output", None)
    curve_fit_kwargs.pop("nan_policy", None)
    model = positional_model(model)
    with warnings.catch_warnings():
        # curve_fit warns about an inf pcov; the report names the cause instead
        warnings.simplefilter("ignore", OptimizeWarning)
        warnings.filterwarnings("ignore", "Covariance of the parameters could not")
        popt, _, info, _, _ = curve_fit(model, xdata, ydata, p0, sigma, absolute_sigma,
                                        bounds=bounds, method=method, full_output=True,
                                        **curve_fit_kwargs)
    solver = info["result"]
    if x64_enabled():
        return _build(model, xdata, ydata, p0, sigma, absolute_sigma, bounds, method,
                      names, popt, solver)
    from .._x64_scope import float64_scope

    with float64_scope():
        out = _build(model, xdata, ydata, p0, sigma, absolute_sigma, bounds, method,
                     names, popt, solver)
    return out


def _build(model, xdata, ydata, p0, sigma, absolute_sigma, bounds, method, names, popt,
           solver) -> FitResult:
    popt = np.asarray(popt, np.float64)
    n = popt.size
    names = tuple(names) if names is not None else parameter_names(model, n)
    if len(names) != n:
        raise ValueError(f"names has {len(names)} entries for {n} parameters")
    x = np.asarray(xdata) if not isinstance(xdata, jax.Array) else xdata
    y = np.asarray(ydata, np.float64).ravel()
    J = np.asarray(solver.jac, np.float64).reshape(-1, n)
    r = np.asarray(solver.fun, np.float64).ravel()
    m = r.size
    f = np.asarray(model(x, *[jnp.asarray(v) for v in popt]), np.float64).ravel()
    f = np.broadcast_to(f, y.shape)
    lb, ub = _bounds_arrays(bounds if not hasattr(bounds, "lb") else (bounds.lb, bounds.ub), n)
    xs = np.asarray(x)
    order = np.argsort(xs, kind="stable") if xs.ndim == 1 and xs.size == m else np.arange(m)
    sub, runs, ac, r2, at_bound = _to_numpy(_summary_arrays(
        J, r, popt, y, f, lb, ub, order))
    at_bound = at_bound | (np.asarray(solver.active_mask) != 0)
    rank = int(sub.rank)
    dof = m - rank
    chi2 = float(np.sum(r * r))
    redchi = chi2 / dof if dof > 0 else math.inf
    factor = 1.0 if absolute_sigma else redchi
    cov_id = np.asarray(sub.cov) * factor
    ident = np.asarray(sub.identifiable)
    both = np.outer(ident, ident)
    pcov = np.where(both, cov_id, np.inf)
    stderr = np.sqrt(np.where(ident, np.diag(cov_id), np.inf))
    with np.errstate(invalid="ignore", divide="ignore"):
        correl = np.where(both, cov_id / np.outer(stderr, stderr), np.nan)
    s = np.asarray(sub.singular_values)
    V = np.asarray(sub.directions)
    null = np.asarray(sub.null)
    null_space = (np.asarray(sub.scale)[:, None] * V)[:, null]
    with np.errstate(divide="ignore"):
        sloppy = np.where(null, np.inf, math.sqrt(factor) / s)
    logl = m * math.log(chi2 / m) if chi2 > 0 else -math.inf
    aic = logl + 2 * n
    bic = logl + math.log(m) * n

    def predict(p):
        return np.asarray(model(x, *[jnp.asarray(v) for v in p]), np.float64)

    notes = describe_null_space(names, sub, popt, predict, cov_id)
    for k in np.flatnonzero(~null & (sloppy > SLOPPY_RELATIVE_ERROR)):
        u = V[:, k]
        big = np.argsort(-np.abs(u))[:3]
        terms = " ".join(f"{u[i] / u[big[0]]:+.2g}·log {names[i]}" for i in big
                         if abs(u[i]) > 0.05 * abs(u[big[0]]))
        notes.append(f"sloppy direction: {terms} is determined only to ±{sloppy[k]:.0%} "
                     "(relative)")
    for i in range(n):
        for j in range(i + 1, n):
            if abs(correl[i, j]) > STRONG_CORRELATION:
                notes.append(f"{names[i]} and {names[j]} are strongly correlated "
                             f"(rho = {correl[i, j]:+.4f})")
    for i in np.flatnonzero(at_bound):
        notes.append(f"{names[i]} is at a bound ({popt[i]:.6g}); its standard error and "
                     "Wald interval assume it is not")
    if float(runs.pvalue) < RUNS_PVALUE:
        notes.append(f"residuals: {int(runs.runs)} runs of one sign where "
                     f"{float(runs.expected):.1f} are expected (p = {float(runs.pvalue):.2g}, "
                     f"lag-1 autocorrelation {float(ac):+.2f}): the model may miss a "
                     "feature of the data")
    if dof <= 0:
        notes.append("no degrees of freedom left: the reduced chi-square and the scaled "
                     "covariance are undefined")
    return FitResult(
        popt=popt, stderr=stderr, pcov=pcov, cov_identifiable=cov_id, correl=correl,
        chi2=chi2, redchi=redchi, r2=float(r2), aic=aic, bic=bic, residuals=y - f,
        weighted_residuals=r, runs=runs, autocorrelation=float(ac),
        singular_values=s, directions=V, identifiable=ident, null_space=null_space,
        sloppy_errors=sloppy, at_bound=np.asarray(at_bound), lower_bounds=lb,
        upper_bounds=ub, xdata=x, ydata=y,
        sigma=None if sigma is None else np.asarray(sigma, np.float64),
        p0=None if p0 is None else np.asarray(p0, np.float64), solver=solver,
        names=names, model=model, dof=dof, nobs=m, rank=rank,
        absolute_sigma=bool(absolute_sigma),
        method=method or ("lm" if np.all(np.isinf(lb)) and np.all(np.isinf(ub)) else "trf"),
        diagnostics=tuple(notes))
