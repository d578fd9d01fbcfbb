"""The figures of a fit report, from a solved fit on its free coordinates.

The solve ran on the free coordinates ``q`` (:mod:`adaptprec.modeling.parameters`); its
whitened Jacobian ``J`` (``(J^T J)^+`` the unscaled covariance: the weighted residuals'
for least squares, the Fisher-whitened model's for Poisson, a square root of the Hessian
for a user's likelihood) gives the identifiable-subspace covariance, the singular
values, the sloppy directions and the runs test on ``q`` (:func:`free_statistics`).
:func:`expand` then writes the table over every parameter: ``p = expand(q)``, the
covariance ``T C_q T^T`` (``T = dp/dq``; zero for a fixed parameter, propagated for a
tied one), the null space ``T N_q``.

Goodness of fit by likelihood: least squares reports ``chi2`` (sum of squared weighted
residuals), ``redchi = chi2 / dof`` and lmfit's ``AIC = nobs log(chi2/nobs) + 2 k``;
Poisson the deviance as ``chi2`` (its ``redchi`` is the deviance per degree of
freedom, about 1 for a good fit) and ``AIC = 2 nll + 2 k`` with the full negative
log-likelihood; a user's likelihood ``chi2 = 2 nll`` and the same AIC. ``k`` counts the
free coordinates; ``BIC`` replaces ``2 k`` by ``k log(nobs)``.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from .identifiability import describe_null_space, subspace_covariance
from .residual_tests import lag1_autocorrelation, runs_test

__all__ = ["Solved", "FreeStatistics", "free_statistics", "expand", "notes_for",
           "STRONG_CORRELATION", "SLOPPY_RELATIVE_ERROR", "RUNS_PVALUE"]

#: |correlation| above which a pair is flagged
STRONG_CORRELATION = 0.99
#: a direction whose log-parameter combination has a standard error above this (100 %)
#: is flagged as sloppy
SLOPPY_RELATIVE_ERROR = 1.0
#: one-sided runs-test p-value below which the residuals flag a misfit
RUNS_PVALUE = 0.01


class Solved(NamedTuple):
    """A solved fit on the free coordinates, as the statistics need it."""

    q: np.ndarray          # the free coordinates at the optimum
    solver: Any            # the solver's result (status, message, nfev, active_mask...)
    J: np.ndarray          # whitened Jacobian: (J^T J)^+ is the unscaled covariance
    r: np.ndarray          # weighted residuals (sum of squares: chi2 or deviance)
    f: np.ndarray          # the model at the data (complex for a complex model)
    chi2: float            # chi-square, deviance, or 2 nll
    nll: float | None      # the negative log-likelihood (None for least squares)
    nobs: int              # real observations (2 per complex value)
    scaled: bool           # covariance scaled by the reduced chi-square


@jax.jit
def _arrays(J, r, q, lb, ub, order):
    sub = subspace_covariance(J, q)
    rw = r[order]
    tol = 1e-8 * (1.0 + jnp.abs(q))
    at_bound = (jnp.isfinite(lb) & (q - lb <= tol)) | (jnp.isfinite(ub) & (ub - q <= tol))
    return sub, runs_test(rw), lag1_autocorrelation(rw), at_bound


class FreeStatistics(NamedTuple):
    sub: Any               # SubspaceCovariance on q
    runs: Any
    autocorrelation: float
    at_bound: np.ndarray   # (k,)
    rank: int
    dof: int
    redchi: float
    factor: float          # the covariance's scale (redchi or 1)
    cov: np.ndarray        # scaled identifiable-subspace covariance on q
    sloppy: np.ndarray     # relative standard error along each direction
    aic: float
    bic: float
    r2: float


def _r2(y, f) -> float:
    y, f = np.asarray(y), np.asarray(f)
    ss_res = float(np.sum(np.abs(y - f) ** 2))
    ss_tot = float(np.sum(np.abs(y - np.mean(y)) ** 2))
    return 1.0 - ss_res / ss_tot if ss_tot > 0 else math.nan


def free_statistics(solved: Solved, y, x, lower, upper) -> FreeStatistics:
    """The statistics on the free coordinates (module docstring)."""
    q = np.asarray(solved.q, np.float64)
    k = q.size
    J = np.asarray(solved.J, np.float64).reshape(-1, k)
    r = np.asarray(solved.r, np.float64).ravel()
    xs = np.asarray(x) if not isinstance(x, dict) else np.zeros(0)
    order = np.argsort(xs, kind="stable") if xs.ndim == 1 and xs.size == r.size else \
        np.arange(r.size)
    sub, runs, ac, at_bound = jax.tree.map(np.asarray, _arrays(J, r, q, lower, upper,
                                                               order))
    active = getattr(solved.solver, "active_mask", None)
    if active is not None:
        at_bound = at_bound | (np.asarray(active) != 0)
    rank = int(sub.rank)
    m = solved.nobs
    dof = m - rank
    redchi = solved.chi2 / dof if dof > 0 else math.inf
    factor = redchi if solved.scaled else 1.0
    s = np.asarray(sub.singular_values)
    with np.errstate(divide="ignore"):
        sloppy = np.where(np.asarray(sub.null), np.inf, math.sqrt(factor) / s)
    if solved.nll is None:
        logl = m * math.log(solved.chi2 / m) if solved.chi2 > 0 else -math.inf
    else:
        logl = 2.0 * solved.nll
    return FreeStatistics(sub, runs, float(ac), at_bound, rank, dof, redchi, factor,
                          np.asarray(sub.cov) * factor, sloppy, logl + 2 * k,
                          logl + math.log(m) * k, _r2(y, solved.f))


def expand(spec, fixed_values, q, free_cov, ident_q, null_q, at_bound_q):
    """The table over every parameter: ``(popt, cov_identifiable, pcov, stderr, correl,
    identifiable, null_space, at_bound)`` (module docstring)."""
    from ..modeling.parameters import propagate

    n = len(spec.names)
    p, cov_id, T = propagate(spec, q, fixed_values, free_cov)
    bad = np.zeros(q.size, bool) if np.all(ident_q) else ~np.asarray(ident_q)
    moves = np.any(T != 0, axis=1)
    touches = (np.abs(T) @ bad.astype(float)) > 0
    ident = ~touches
    pcov = cov_id.copy()
    pcov[np.ix_(touches, moves)] = np.inf
    pcov[np.ix_(moves, touches)] = np.inf
    stderr = np.sqrt(np.where(ident, np.maximum(np.diag(cov_id), 0.0), np.inf))
    both = np.outer(ident & moves, ident & moves)
    with np.errstate(invalid="ignore", divide="ignore"):
        correl = np.where(both, cov_id / np.outer(stderr, stderr), np.nan)
    null_space = T @ null_q if null_q.size else np.zeros((n, 0))
    at_bound = np.zeros(n, bool)
    for i, name in enumerate(spec.names):
        if name in spec.free:
            at_bound[i] = at_bound_q[spec.free.index(name)]
    for name, rule in spec.tied:       # a constraint held at its bound
        slack = getattr(rule, "slack", None)
        if slack is not None:
            at_bound[spec.names.index(name)] = at_bound_q[spec.free.index(slack)]
    return p, cov_id, pcov, stderr, correl, ident, null_space, at_bound


def notes_for(names, free_names, st: FreeStatistics, q, predict_q, correl, at_bound,
              popt, described) -> list[str]:
    """The report's diagnostics (sentences)."""
    V = np.asarray(st.sub.directions)
    null = np.asarray(st.sub.null)
    notes = describe_null_space(free_names, st.sub, q, predict_q, st.cov)
    for k in np.flatnonzero(~null & (st.sloppy > SLOPPY_RELATIVE_ERROR)):
        u = V[:, k]
        big = np.argsort(-np.abs(u))[:3]
        terms = " ".join(f"{u[i] / u[big[0]]:+.2g}·log {free_names[i]}" for i in big
                         if abs(u[i]) > 0.05 * abs(u[big[0]]))
        notes.append(f"sloppy direction: {terms} is determined only to "
                     f"±{st.sloppy[k]:.0%} (relative)")
    n = len(names)
    for i in range(n):
        for j in range(i + 1, n):
            if abs(correl[i, j]) > STRONG_CORRELATION and \
                    described[i] == described[j] == "free":
                notes.append(f"{names[i]} and {names[j]} are strongly correlated "
                             f"(rho = {correl[i, j]:+.4f})")
    for i in np.flatnonzero(at_bound):
        what = "its constraint is active" if described[i].startswith("constrained") \
            else "at a bound"
        notes.append(f"{names[i]} is {what} ({popt[i]:.6g}); its standard error and "
                     "Wald interval assume it is not")
    runs = st.runs
    if float(runs.pvalue) < RUNS_PVALUE:
        notes.append(f"residuals: {int(runs.runs)} runs of one sign where "
                     f"{float(runs.expected):.1f} are expected (p = "
                     f"{float(runs.pvalue):.2g}, lag-1 autocorrelation "
                     f"{st.autocorrelation:+.2f}): the model may miss a feature of the data")
    if st.dof <= 0:
        notes.append("no degrees of freedom left: the reduced chi-square and the scaled "
                     "covariance are undefined")
    return notes
