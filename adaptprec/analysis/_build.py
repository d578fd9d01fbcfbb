"""A :class:`~adaptprec.FitResult` from a solved fit (:func:`build`): the statistics on
the free coordinates (:mod:`._statistics`), then the table over every parameter."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from ._statistics import Solved, expand, free_statistics, notes_for
from .result import FitResult

__all__ = ["build"]


def _method(method, likelihood, values) -> str:
    if callable(likelihood):
        return "newton"
    if method:
        return method
    unbounded = np.all(np.isinf(values.lower)) and np.all(np.isinf(values.upper))
    return "lm" if unbounded else "trf"


def build(model, g, spec, values, xdata, ydata, sigma, absolute_sigma, method, likelihood,
          solved: Solved) -> FitResult:
    """The report of a fit of ``model`` (reduced to ``g`` on ``spec``'s free coordinates)
    whose solve is ``solved`` (float64 scope)."""
    x = np.asarray(xdata) if not isinstance(xdata, jax.Array) else xdata
    y = np.asarray(ydata).ravel()
    y = y.astype(np.complex128 if np.iscomplexobj(y) else np.float64)
    q = np.asarray(solved.q, np.float64)
    st = free_statistics(solved, y, x, values.lower, values.upper)
    sub = st.sub
    null_q = (np.asarray(sub.scale)[:, None] * np.asarray(sub.directions))[
        :, np.asarray(sub.null)]
    popt, cov_id, pcov, stderr, correl, ident, null_space, at_bound = expand(
        spec, values.fixed, q, st.cov, np.asarray(sub.identifiable), null_q, st.at_bound)

    def predict_q(v):
        return np.asarray(g(x, *[jnp.asarray(c) for c in v]))

    notes = notes_for(spec.names, spec.free, st, q, predict_q, correl, at_bound, popt,
                      spec.described)
    f = np.asarray(solved.f)
    complex_points = int(y.size) if np.iscomplexobj(y) else 0
    return FitResult(
        popt=popt, stderr=stderr, pcov=pcov, cov_identifiable=cov_id, correl=correl,
        chi2=float(solved.chi2), redchi=float(st.redchi), r2=float(st.r2),
        aic=float(st.aic), bic=float(st.bic), residuals=y - f,
        weighted_residuals=np.asarray(solved.r, np.float64), runs=st.runs,
        autocorrelation=st.autocorrelation, singular_values=np.asarray(
            sub.singular_values), directions=np.asarray(sub.directions),
        identifiable=ident, null_space=null_space, sloppy_errors=st.sloppy,
        at_bound=at_bound, lower_bounds=values.p_lower, upper_bounds=values.p_upper,
        xdata=x, ydata=y, sigma=None if sigma is None else np.asarray(sigma),
        p0=np.asarray(spec.expand(values.q0, values.fixed), np.float64),
        solver=solved.solver, fixed_values=np.asarray(values.fixed, np.float64),
        free_cov=np.asarray(st.cov), free_lower=values.lower, free_upper=values.upper,
        free_identifiable=np.asarray(sub.identifiable),
        nll=np.nan if solved.nll is None else float(solved.nll),
        names=tuple(spec.names), model=model, dof=st.dof, nobs=solved.nobs,
        rank=st.rank, absolute_sigma=bool(absolute_sigma) or not solved.scaled,
        method=_method(method, likelihood, values), diagnostics=tuple(notes),
        parameters=spec, likelihood=likelihood if callable(likelihood) else (
            likelihood or "gaussian"), complex_points=complex_points)
