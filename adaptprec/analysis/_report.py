"""The text report of a :class:`~adaptprec.FitResult` (``str(result)``), laid out as
lmfit's ``fit_report``: fit statistics, variables, correlations, then diagnostics."""

from __future__ import annotations

import numpy as np

__all__ = ["format_report"]

#: correlations below this are left out of the report (lmfit's default)
MIN_CORRELATION = 0.1


def _g(v, digits: int = 7) -> str:
    return f"{float(v):.{digits}g}"


def _likelihood_lines(res) -> tuple[str, list[str]]:
    """The method's suffix and the goodness-of-fit lines for the fit's likelihood."""
    if res.likelihood == "poisson":
        return " Poisson maximum likelihood,", [
            f"    deviance (Poisson) = {_g(res.chi2)}",
            f"    deviance / dof     = {_g(res.redchi)}",
            f"    -log likelihood    = {_g(res.nll)}"]
    if res.likelihood != "gaussian":
        return " user likelihood,", [f"    -2 log likelihood  = {_g(res.chi2)}"]
    return "", [f"    chi-square         = {_g(res.chi2)}",
                f"    reduced chi-square = {_g(res.redchi)}"]


def _counts(res) -> list[str]:
    points = f"    # data points      = {res.nobs}"
    if res.complex_points:
        points += (f" ({res.complex_points} complex values: real and imaginary parts "
                   "of the complex model)")
    variables = f"    # variables        = {res.nfree}" + (
        f" (rank {res.rank})" if res.rank < res.nfree else "")
    held = [d for d in res.described if d != "free"]
    if held:
        fixed = sum(d == "fixed" for d in held)
        parts = [f"{fixed} fixed"] * bool(fixed) + \
            [f"{len(held) - fixed} tied or constrained"] * bool(len(held) - fixed)
        variables += f" of {res.nparams} parameters ({', '.join(parts)})"
    return [points, variables]


def format_report(res, min_correl: float = MIN_CORRELATION) -> str:
    solver = res.solver
    suffix, goodness = _likelihood_lines(res)
    lines = ["[[Fit Statistics]]",
             f"    # fitting method   = {res.method} ({suffix.strip(' ,')}{', ' if suffix else ''}"
             f"rung {res.rung}, {int(solver.escalations)} escalation(s))",
             f"    # function evals   = {res.nfev}",
             *_counts(res),
             f"    # dof              = {res.dof}",
             *goodness,
             f"    Akaike info crit   = {_g(res.aic)}",
             f"    Bayesian info crit = {_g(res.bic)}",
             f"    R-squared          = {_g(res.r2)}",
             f"    status             = {res.status} ({'success' if res.success else 'FAILED'})"]
    level = 0.95
    wald = res.wald_intervals(level)
    width = max(len(n) for n in res.names)
    lines.append(f"[[Variables]]  (± 1 standard error; {level:.0%} Wald interval, "
                 + ("normal" if res.absolute_sigma else f"t with {res.dof} dof") + ")")
    for i, name in enumerate(res.names):
        v, s, r = float(res.popt[i]), float(res.stderr[i]), float(res.relerr[i])
        tag = "  (at bound)" if bool(res.at_bound[i]) else ""
        how = res.described[i]
        if how == "fixed":
            lines.append(f"    {name + ':':<{width + 1}} {_g(v):>13} (fixed)")
            continue
        if how != "free":
            tag = f"  {how}" + (" (active)" if bool(res.at_bound[i]) else "")
        if np.isfinite(s):
            rel = f"({r:.2%})" if np.isfinite(r) else "(n/a)"
            lines.append(f"    {name + ':':<{width + 1}} {_g(v):>13} +/- {_g(s, 5):<11} "
                         f"{rel:<10} [{_g(wald[i, 0], 6)}, {_g(wald[i, 1], 6)}]{tag}")
        else:
            lines.append(f"    {name + ':':<{width + 1}} {_g(v):>13} +/- inf  "
                         f"(not identifiable){tag}")
    pairs = []
    n = res.nparams
    for i in range(n):
        for j in range(i + 1, n):
            c = float(res.correl[i, j])
            if np.isfinite(c) and abs(c) >= min_correl and \
                    res.described[i] == res.described[j] == "free":   # as lmfit
                pairs.append((abs(c), res.names[i], res.names[j], c))
    if pairs:
        lines.append(f"[[Correlations]] (unreported correlations are < {min_correl:.3f})")
        for _, a, b, c in sorted(pairs, reverse=True):
            lines.append(f"    C({a}, {b}) = {c:+.4f}")
    runs = res.runs
    lines.append("[[Diagnostics]]")
    lines.append(f"    residual runs: {int(runs.runs)} ({float(runs.expected):.1f} expected, "
                 f"p = {float(runs.pvalue):.3g}); lag-1 autocorrelation "
                 f"{float(res.autocorrelation):+.3f}")
    s = np.asarray(res.singular_values)
    lines.append(f"    scaled Jacobian: singular values {s[0]:.3g} .. {s[-1]:.3g} "
                 f"(ratio {s[-1] / s[0]:.2g})" if s[0] > 0 else
                 "    scaled Jacobian: zero")
    if res.diagnostics:
        lines += [f"    ! {d}" for d in res.diagnostics]
    else:
        lines.append("    no problems found (identifiable, no sloppy direction, "
                     "|rho| <= 0.99, no bound active, residuals without runs)")
    return "\n".join(lines)
