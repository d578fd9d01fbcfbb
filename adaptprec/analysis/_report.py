"""The text report of a :class:`~adaptprec.FitResult` (``str(result)``), laid out as
lmfit's ``fit_report``: fit statistics, variables, correlations, then diagnostics."""

from __future__ import annotations

import numpy as np

__all__ = ["format_report"]

#: correlations below this are left out of the report (lmfit's default)
MIN_CORRELATION = 0.1


def _g(v, digits: int = 7) -> str:
    return f"{float(v):.{digits}g}"


def format_report(res, min_correl: float = MIN_CORRELATION) -> str:
    solver = res.solver
    lines = ["[[Fit Statistics]]",
             f"    # fitting method   = {res.method} (rung {res.rung}, "
             f"{int(solver.escalations)} escalation(s))",
             f"    # function evals   = {res.nfev}",
             f"    # data points      = {res.nobs}",
             f"    # variables        = {res.nparams}"
             + (f" (rank {res.rank})" if res.rank < res.nparams else ""),
             f"    # dof              = {res.dof}",
             f"    chi-square         = {_g(res.chi2)}",
             f"    reduced chi-square = {_g(res.redchi)}",
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
            if np.isfinite(c) and abs(c) >= min_correl:
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
