"""The NLSQ robustness sweep (issue 15): NIST StRD problems from both certified starts and
from seeded perturbations of start 1, solved by ``solve_nlsq`` (adaptive and float64),
optimistix's Levenberg–Marquardt (float64) and scipy's ``least_squares(method="lm")`` in the
same run, scored by LRE against the certified values.

A solve counts as *solved* at LRE >= 6. Equivalent minima count too: the same residual sum
of squares with permuted exponential / Gaussian / cyclic terms or the sign of a width that
enters squared (:func:`canonical`).

Used by ``tests/test_nlsq_robust.py`` (slow) and ``benchmarks/bench_nlsq_robust.py``
(prints the table for docs/nlsq.md).

Example:
    >>> import numpy as np
    >>> from robust_sweep import canonical, perturbed_starts
    >>> canonical("Lanczos1", np.array([1.0, 5.0, 2.0, 1.0, 3.0, 3.0])).tolist()
    [2.0, 1.0, 3.0, 3.0, 1.0, 5.0]
    >>> perturbed_starts(np.array([1.0, 2.0]), 2, seed=0).shape
    (2, 2)
"""

from __future__ import annotations

import functools
import time
import zlib

import jax
import jax.numpy as jnp
import numpy as np

from nist_problems import DIFFICULTY, MODELS, load, lre

__all__ = ["canonical", "score", "perturbed_starts", "residual_for", "run_ours",
           "run_optimistix", "run_scipy", "problem_starts", "sweep", "summarise"]


def _sort_terms(b, groups, key=0):
    terms = [b[list(g)] for g in groups]
    order = sorted(range(len(terms)), key=lambda i: terms[i][key])
    out = b.copy()
    for g, i in zip(groups, order):
        out[list(g)] = terms[i]
    return out


def canonical(name, b):
    """Parameters in a canonical order/sign (equivalent minima compare equal)."""
    b = np.asarray(b, np.float64).copy()
    if name.startswith("Lanczos"):  # a_i exp(-r_i x): sort terms by rate
        return _sort_terms(b, [(0, 1), (2, 3), (4, 5)], key=1)
    if name == "MGH17":  # b1 + b2 exp(-x b4) + b3 exp(-x b5)
        return _sort_terms(b, [(1, 3), (2, 4)], key=1)
    if name.startswith("Gauss"):  # widths enter squared; the two peaks commute
        b[4], b[7] = abs(b[4]), abs(b[7])
        return _sort_terms(b, [(2, 3, 4), (5, 6, 7)], key=1)
    if name == "ENSO":  # two cycles (period, cos, sin) commute
        return _sort_terms(b, [(3, 4, 5), (6, 7, 8)], key=0)
    return b


def score(p, x, cost):
    """LRE of ``x`` against the certified values, allowing equivalent minima (same RSS)."""
    direct = lre(x, p.certified)
    rss = 2.0 * float(cost)
    same_rss = np.isfinite(rss) and (lre(rss, p.certified_rss) >= 6.0
                                     or abs(rss - p.certified_rss) < 1e-20)
    if same_rss:
        return max(direct, lre(canonical(p.name, x), canonical(p.name, p.certified)))
    return direct


def perturbed_starts(x1, k, seed, spread=0.25):
    """``k`` starts: ``x1 * (1 + u)`` with ``u ~ U(-spread, spread)`` per parameter."""
    rng = np.random.default_rng(seed)
    return np.asarray(x1) * (1.0 + rng.uniform(-spread, spread, (k, np.size(x1))))


@functools.cache
def residual_for(name):
    """One residual function object per problem (so compiled solvers are reused)."""
    model = MODELS[name]

    def residual(b, x, y):
        return model(b, x) - y

    return residual


def run_ours(p, x0, **kw):
    import adaptprec as ap
    res = ap.solve_nlsq(residual_for(p.name), jnp.asarray(x0),
                        args=(jnp.asarray(p.x), jnp.asarray(p.y)), **kw)
    x = np.asarray(res.x)
    return dict(x=x, cost=float(res.cost), nfev=int(res.nfev), success=bool(res.success),
                status=int(res.status), rung=res.rung_name)


@functools.cache
def _optx_solver(name, tol, max_steps):
    import optimistix as optx
    model = MODELS[name]
    lm = optx.LevenbergMarquardt(rtol=tol, atol=tol)

    def fn(b, args):
        xx, yy = args
        return model(b, xx) - yy

    @jax.jit
    def solve(y0, xx, yy):
        sol = optx.least_squares(fn, lm, y0, args=(xx, yy), max_steps=max_steps,
                                 throw=False)
        r = fn(sol.value, (xx, yy))
        return sol.value, 0.5 * jnp.sum(r * r), sol.stats["num_steps"], sol.result

    return solve


def run_optimistix(p, x0, tol=1e-10, max_steps=10000):
    import optimistix as optx
    solve = _optx_solver(p.name, tol, max_steps)
    x, cost, steps, result = solve(jnp.asarray(x0, jnp.float64), jnp.asarray(p.x),
                                   jnp.asarray(p.y))
    return dict(x=np.asarray(x), cost=float(cost), nfev=int(steps),
                success=bool(result == optx.RESULTS.successful))


def run_scipy(p, x0, method="lm"):
    import scipy.optimize as so
    model = MODELS[p.name]
    xn, yn = np.asarray(p.x), np.asarray(p.y)
    f = jax.jit(lambda b: model(b, xn) - yn)
    J = jax.jit(jax.jacfwd(lambda b: model(b, xn) - yn))
    with np.errstate(all="ignore"):
        try:
            r = so.least_squares(lambda b: np.asarray(f(b)), np.asarray(x0, np.float64),
                                 jac=lambda b: np.asarray(J(b)), method=method,
                                 x_scale="jac", ftol=1e-15, xtol=1e-15, gtol=1e-15,
                                 max_nfev=10000)
            return dict(x=r.x, cost=float(r.cost), nfev=int(r.nfev),
                        success=bool(r.success))
        except Exception:  # noqa: BLE001 - scipy raising on non-finite residuals
            return dict(x=np.full(p.n, np.nan), cost=np.inf, nfev=0, success=False)


def problem_starts(name, perturbed=2, seed=0):
    """``[(label, x0), ...]``: the two certified starts and ``perturbed`` perturbations."""
    p = load(name)
    out = [("s1", p.starts[0]), ("s2", p.starts[1])]
    pert = perturbed_starts(p.starts[0], perturbed, seed=seed + zlib.crc32(name.encode()) % 1000)
    out += [(f"p{i + 1}", x) for i, x in enumerate(pert)]
    return p, out


def sweep(names=None, perturbed=2, seed=0, solvers=None):
    """Rows ``{problem, difficulty, start, <solver>: LRE, <solver>_nfev}``."""
    solvers = solvers or {
        "ours": lambda p, x0: run_ours(p, x0),
        "ours_f64": lambda p, x0: run_ours(p, x0, precision="f64"),
        "optimistix": run_optimistix,
        "scipy_lm": run_scipy,
    }
    rows = []
    for name in names or list(MODELS):
        p, starts = problem_starts(name, perturbed, seed)
        for label, x0 in starts:
            row = dict(problem=name, difficulty=DIFFICULTY[name], start=label)
            for sname, fn in solvers.items():
                t = time.perf_counter()
                r = fn(p, x0)
                row[sname] = score(p, r["x"], r["cost"])
                row[sname + "_nfev"] = r["nfev"]
                row[sname + "_success"] = r["success"]
                row[sname + "_time"] = time.perf_counter() - t
            rows.append(row)
    return rows


def summarise(rows, solvers, threshold=6.0):
    """``{difficulty: {solver: (solved, total)}}`` plus ``"all"``."""
    out = {}
    for d in ("lower", "average", "higher", "all"):
        sel = [r for r in rows if d == "all" or r["difficulty"] == d]
        out[d] = {s: (sum(r[s] >= threshold for r in sel), len(sel)) for s in solvers}
    return out
