"""`FitResult`: a fitted model with its uncertainties and diagnostics, and a report a
scientist can read (lmfit's ``fit_report`` in spirit). :func:`adaptprec.fit` makes one
(:mod:`.fit`); intervals (:meth:`FitResult.wald_intervals`,
:meth:`FitResult.profile_intervals`) and bands (:meth:`FitResult.band`) are computed
from it on demand; :meth:`FitResult.to_json` / :meth:`FitResult.from_json` keep it.

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
import math
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from .._pytree import Module, field
from ._quantiles import two_sided_quantile
from .bands import Band, fit_band

__all__ = ["FitResult", "parameter_names"]


def parameter_names(model: Callable, n: int) -> tuple:
    """Names of ``model(x, p1, p2, ...)``'s parameters from its signature (a
    ``functools.partial``'s keyword-only ones included); ``p0, p1, ...`` when the
    signature does not name ``n`` of them (``*params``, builtins).

    Example:
        >>> from adaptprec.analysis.result import parameter_names
        >>> parameter_names(lambda x, amp, k: amp * x, 2), parameter_names(lambda x, *p: x, 2)
        (('amp', 'k'), ('p0', 'p1'))
    """
    from .._user_fn import fit_parameters

    named = fit_parameters(model) or ()
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

    Parameters held fixed, tied or constrained (:mod:`adaptprec.modeling.parameters`):
    ``parameters`` says which (``parameters.described``); the fit ran on the free
    coordinates ``parameters.free`` (``free_cov``, ``free_lower``/``free_upper``,
    ``free_identifiable``; ``singular_values``, ``directions`` and ``sloppy_errors``
    are theirs), and ``popt``/``pcov``/``stderr`` cover every parameter: 0 for a fixed
    one, propagated for a tied one. ``nfree`` counts the free coordinates (dof, AIC
    and BIC use it).

    Likelihood: ``likelihood`` (``"gaussian"``, ``"poisson"`` or the user's ``nll``);
    ``nll`` the negative log-likelihood at the optimum (NaN for least squares). For
    Poisson ``chi2`` is the deviance and ``pcov`` the inverse Fisher information; for a
    user's likelihood ``chi2 = 2 nll`` and ``pcov`` the inverse Hessian; both are
    unscaled (``absolute_sigma`` True). A complex model (``complex_points`` values)
    counts ``2 complex_points`` observations; its ``residuals`` are complex.

    Solver: ``status``, ``message``, ``success``, ``nfev``, ``nit``, ``rung``
    (``"f64"``), ``escalations``, ``method``; ``solver`` is the :class:`~adaptprec.NLSQResult`.

    ``str(result)`` is the report; :meth:`to_dict`, :meth:`to_dataframe` export it,
    :meth:`to_json` / :meth:`from_json` keep it.
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
    fixed_values: Any = None
    free_cov: Any = None
    free_lower: Any = None
    free_upper: Any = None
    free_identifiable: Any = None
    nll: Any = math.nan
    names: tuple = field(static=True, default=())
    model: Callable = field(static=True, default=None)
    dof: int = field(static=True, default=0)
    nobs: int = field(static=True, default=0)
    rank: int = field(static=True, default=0)
    absolute_sigma: bool = field(static=True, default=False)
    method: str = field(static=True, default="")
    diagnostics: tuple = field(static=True, default=())
    parameters: Any = field(static=True, default=None)
    likelihood: Any = field(static=True, default="gaussian")
    complex_points: int = field(static=True, default=0)

    # ------------------------------------------------------------------ basics
    @property
    def nparams(self) -> int:
        return len(self.names)

    @property
    def nfree(self) -> int:
        """The free coordinates the fit adjusted (parameters not fixed or tied, plus
        one slack per constraint)."""
        return len(self.parameters.free) if self.parameters is not None else \
            self.nparams

    @property
    def described(self) -> tuple:
        """Per parameter: ``"free"``, ``"fixed"``, ``"= expression"`` or
        ``"constrained: a <= b"``."""
        if self.parameters is None:
            return ("free",) * self.nparams
        return self.parameters.described

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
        self._needs_model("predict")
        x = self.xdata if x is None else x
        p = jnp.asarray(self.popt)
        return self.model(x, *[p[i] for i in range(p.shape[0])])

    def _needs_model(self, what: str):
        if self.model is None:
            raise ValueError(f"{what} needs the model: this result was read from JSON "
                             "without one; pass model= to FitResult.from_json")

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
        method (:func:`adaptprec.fit_band`) in ``x``'s precision (float64 for float64
        or integer ``x``, with ``jax_enable_x64`` off too); jit/vmap/grad-safe. Eager
        calls return NumPy arrays.

        ``noise_sigma`` (prediction bands): a new observation's standard deviation on
        the scale of the fit's ``sigma`` (default 1, i.e. ``sigma=None`` fits); with
        ``absolute_sigma=False`` it is scaled by ``sqrt(redchi)`` as ``pcov`` is. A fit
        with ``sigma`` needs it given; a Poisson fit's is ``sqrt(f)``. A complex model's
        band holds the real part's band in ``.real`` and the imaginary part's in
        ``.imag`` of each field."""
        from .._tracing import is_concrete
        from ..precision import x64_enabled

        self._needs_model("band")
        if x is None:
            x = self.xdata
        if kind == "prediction" and noise_sigma is None:
            if self.sigma is not None:
                raise ValueError("this fit has sigma: give the prediction band the "
                                 "noise_sigma of a new observation at x")
            if self.likelihood not in ("gaussian", "poisson"):
                raise ValueError("a prediction band of a user's likelihood needs the "
                                 "noise_sigma of a new observation at x")
            noise_sigma = None if self.likelihood == "poisson" else 1.0
        if noise_sigma is not None and not self.absolute_sigma:
            noise_sigma = jnp.asarray(noise_sigma) * jnp.sqrt(self.redchi)
        if not is_concrete(x, noise_sigma):
            return self._band(x, level, kind, noise_sigma)
        if x64_enabled():
            out = self._band(x, level, kind, noise_sigma)
        else:
            from .._x64_scope import float64_scope

            with float64_scope():
                out = self._band(x, level, kind, noise_sigma)
        low = np.asarray(x).dtype.kind == "f" and np.asarray(x).dtype.itemsize < 8
        real = np.asarray(x).dtype if low else np.float64
        return jax.tree.map(lambda a: np.asarray(a, real if not np.iscomplexobj(a)
                                                 else np.result_type(real, 1j)), out)

    def _band(self, x, level, kind, noise_sigma):
        from .._tracing import is_concrete

        concrete = is_concrete(x, noise_sigma)
        if concrete:
            x = np.asarray(x, np.float64) if np.asarray(x).dtype.kind in "iub" else x
        null = self.null_space if np.shape(self.null_space)[1] else None
        model = self.model
        if self.complex_points:
            from ..modeling.complex_model import real_model

            model = real_model(model)
        poisson = self.likelihood == "poisson" and kind == "prediction" and \
            noise_sigma is None
        program = _band_program(model, kind, self.absolute_sigma, poisson)
        out = program(x, self.popt, self.cov_identifiable, level, self.dof, noise_sigma,
                      null)
        if not self.complex_points:
            return out
        return jax.tree.map(lambda a: a if jnp.ndim(a) == 0 else
                            a.reshape(-1, 2)[:, 0] + 1j * a.reshape(-1, 2)[:, 1], out)

    # ------------------------------------------------------------------ export
    def to_dict(self) -> dict:
        """Plain Python: ``{"params": {name: {value, stderr, relerr, wald95}}, "chi2", ...}``."""
        wald = self.wald_intervals(0.95)
        params = {n: {"value": float(v), "stderr": float(s), "relerr": float(r),
                      "wald95": (float(lo), float(hi)), "at_bound": bool(b),
                      "identifiable": bool(i), "vary": d == "free",
                      "expr": None if d in ("free", "fixed") else d}
                  for n, v, s, r, (lo, hi), b, i, d in zip(
                      self.names, np.asarray(self.popt), np.asarray(self.stderr),
                      self.relerr, wald, np.asarray(self.at_bound),
                      np.asarray(self.identifiable), self.described)}
        return {"params": params,
                "correl": np.asarray(self.correl).tolist(),
                "chi2": float(self.chi2), "redchi": float(self.redchi), "dof": self.dof,
                "nobs": self.nobs, "nparams": self.nparams, "nfree": self.nfree,
                "rank": self.rank, "likelihood": self.likelihood if isinstance(
                    self.likelihood, str) else "callable", "nll": float(self.nll),
                "r2": float(self.r2), "aic": float(self.aic), "bic": float(self.bic),
                "runs_pvalue": float(self.runs.pvalue),
                "autocorrelation": float(self.autocorrelation),
                "status": self.status, "success": self.success, "message": self.message,
                "rung": self.rung, "nfev": self.nfev, "method": self.method,
                "diagnostics": list(self.diagnostics)}

    def to_json(self, **dumps_kwargs) -> str:
        """Every field as a JSON document (:mod:`._json`); the model is not kept."""
        from ._json import to_json

        return to_json(self, **dumps_kwargs)

    @classmethod
    def from_json(cls, text: str, model=None, expr=None) -> "FitResult":
        """The result of :meth:`to_json`; ``model`` (and ``expr`` for ties that were
        callables) to predict, draw bands and profile again."""
        from ._json import from_json

        return from_json(cls, text, model=model, expr=expr)

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
def _band_program(model, kind, absolute_sigma, poisson=False):
    """:func:`fit_band` compiled once per model and kind (an eager band would dispatch
    and compile its small operations one by one); level and dof are traced. A Poisson
    prediction band's noise is ``sqrt(f)``."""
    def band(x, popt, pcov, level, dof, noise_sigma, null):
        if poisson:
            f = model(x, *[popt[i] for i in range(popt.shape[0])])
            noise_sigma = jnp.sqrt(jnp.maximum(jnp.ravel(f), 0.0))
        return fit_band(model, x, popt, pcov, level=level,
                        dof=None if absolute_sigma else dof, kind=kind,
                        noise_sigma=noise_sigma, null_space=null)
    return jax.jit(band)
