"""Realistic fits against scipy, in one run (issue 32).

Every problem of ``tests/real_models.py`` (dose-response, kinetics, binding, decays,
spectra, a 1e5-point damped sine, growth, isotherms, Arrhenius, Planck, Bateman, a 2-D PSF,
a geometric circle fit, ...) is fitted by ``scipy.optimize.curve_fit`` and by
``adaptprec.curve_fit`` (x64 left off, as a new user runs it), from the textbook start and
from scipy's default ``p0`` (``None``: ones, or the middle of finite bounds). A fit *solves*
a problem when its cost reaches the reference minimum's (``real_models.is_solved``); a
raised error is a failure, timed to the raise.

Columns: solved by each, the first call's time (adaptprec: compiles, or loads from its
disk cache), the repeat time (median of ``--repeats`` calls) and the ratios to scipy.
The summary counts solved, the problems where scipy solves and adaptprec does not
("behind"), and the slowest failure against a successful fit of the same problem.

Run:  python benchmarks/bench_real.py [--only NAME,...] [--repeats 5] [--starts auto]
      [--start textbook|default|both] [--overhead]

``--overhead``: what ``starts="auto"`` costs where the local fit succeeds (it runs that
fit first, and searches only when a test asks; see docs/nlsq.md).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import warnings

import numpy as np

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [_ROOT, os.path.join(_ROOT, "tests")]  # this checkout's adaptprec

from real_models import PROBLEMS, is_solved  # noqa: E402


_MODELS: dict = {}


def _model(problem, xp):
    """One model function per (problem, namespace), reused by every call: a new closure
    per call would make adaptprec's "repeat" retrace (its caches key on the function)."""
    key = (problem.name, xp.__name__)
    if key not in _MODELS:
        _MODELS[key] = problem.model(xp)
    return _MODELS[key]


def _fit(fit, problem, p0, xp, **kw):
    """(popt or None, seconds, error name or '')."""
    model = _model(problem, xp)
    t0 = time.perf_counter()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            popt, _ = fit(model, problem.xdata, problem.ydata, p0=p0,
                          sigma=problem.sigma, bounds=problem.bounds, **kw)
        popt = np.asarray(popt, dtype=np.float64)
        err = ""
    except Exception as e:  # noqa: BLE001 - a failed fit is a row, not a crash
        popt, err = None, type(e).__name__
    return popt, time.perf_counter() - t0, err


def _repeat(fit, problem, p0, xp, repeats, **kw):
    times = [_fit(fit, problem, p0, xp, **kw)[1] for _ in range(repeats)]
    return statistics.median(times)


def overhead(args):
    """What ``starts="auto"`` costs on fits that succeed locally: for every problem and
    start where the plain fit solves the problem, the median of ``--repeats``
    interleaved calls of each (after one warm-up call of each), and the ratio."""
    import jax.numpy as jnp

    import adaptprec as ap

    names = [n for n in args.only.split(",") if n] or list(PROBLEMS)
    starts = ("textbook", "default") if args.start == "both" else (args.start,)
    ratios, searched = [], []
    print(f"{'problem':20s} {'start':8s} | {'plain':>9s} {'auto':>9s} {'ratio':>6s} | "
          "search ran")
    for name in names:
        pr = PROBLEMS[name]
        for start in starts:
            p0 = pr.p0 if start == "textbook" else None
            popt, _, _ = _fit(ap.curve_fit, pr, p0, jnp)
            if not is_solved(pr, popt):
                continue
            model = _model(pr, jnp)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                info = ap.curve_fit(model, pr.xdata, pr.ydata, p0=p0, sigma=pr.sigma,
                                    bounds=pr.bounds, starts="auto", full_output=True)[2]
            ran = info["result"].starts_run
            plain, auto = [], []
            for _ in range(args.repeats):
                plain.append(_fit(ap.curve_fit, pr, p0, jnp)[1])
                auto.append(_fit(ap.curve_fit, pr, p0, jnp, starts="auto")[1])
            tp, ta = statistics.median(plain), statistics.median(auto)
            (searched if ran else ratios).append(ta / tp)
            print(f"{name:20s} {start:8s} | {tp * 1e3:7.2f}ms {ta * 1e3:7.2f}ms "
                  f"{ta / tp:6.2f} | {ran or '-'}", flush=True)
    print(f"\nauto / plain where no search ran ({len(ratios)} fits): median "
          f"{statistics.median(ratios):.2f}, max {max(ratios):.2f}")
    print(f"fits that succeed locally but searched (the noise test fired): "
          f"{len(searched)}")
    return ratios


def main(argv=None):
    ap_ = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap_.add_argument("--only", default="", help="comma-separated problem names")
    ap_.add_argument("--repeats", type=int, default=5)
    ap_.add_argument("--start", default="both", choices=("textbook", "default", "both"))
    ap_.add_argument("--starts", default=None,
                     help="adaptprec's starts= option (e.g. auto, 8); default: not passed")
    ap_.add_argument("--overhead", action="store_true",
                     help="instead: curve_fit with and without starts='auto' on every "
                          "fit that succeeds locally (interleaved repeats, one process)")
    args = ap_.parse_args(argv)
    if args.overhead:
        return overhead(args)

    import jax.numpy as jnp
    from scipy.optimize import curve_fit as scipy_fit

    import adaptprec as ap

    kw = {}
    if args.starts is not None:
        kw["starts"] = int(args.starts) if args.starts.isdigit() else args.starts
    names = [n for n in args.only.split(",") if n] or list(PROBLEMS)
    starts = ("textbook", "default") if args.start == "both" else (args.start,)
    rows = []
    print(f"{'problem':20s} {'start':8s} {'m':>6s} {'n':>2s} | {'scipy':>5s} "
          f"{'ours':>5s} | {'sp first':>8s} {'ap first':>8s} | {'sp rep':>8s} "
          f"{'ap rep':>8s} {'ratio':>6s} | error")
    for name in names:
        pr = PROBLEMS[name]
        for start in starts:
            p0 = pr.p0 if start == "textbook" else None
            sp_popt, sp_t, sp_err = _fit(scipy_fit, pr, p0, np)
            ap_popt, ap_t, ap_err = _fit(ap.curve_fit, pr, p0, jnp, **kw)
            sp_ok, ap_ok = is_solved(pr, sp_popt), is_solved(pr, ap_popt)
            sp_rep = _repeat(scipy_fit, pr, p0, np, args.repeats)
            ap_rep = _repeat(ap.curve_fit, pr, p0, jnp, args.repeats, **kw)
            rows.append(dict(name=name, start=start, sp_ok=sp_ok, ap_ok=ap_ok,
                             sp_first=sp_t, ap_first=ap_t, sp_rep=sp_rep, ap_rep=ap_rep,
                             ap_err=ap_err))
            print(f"{name:20s} {start:8s} {pr.m:6d} {pr.n:2d} | {str(sp_ok):>5s} "
                  f"{str(ap_ok):>5s} | {sp_t * 1e3:6.1f}ms {ap_t * 1e3:6.1f}ms | "
                  f"{sp_rep * 1e3:6.2f}ms {ap_rep * 1e3:6.2f}ms {ap_rep / sp_rep:6.2f} | "
                  f"{ap_err}", flush=True)

    total = len(rows)
    sp_solved = sum(r["sp_ok"] for r in rows)
    ap_solved = sum(r["ap_ok"] for r in rows)
    behind = [f"{r['name']}/{r['start']}" for r in rows if r["sp_ok"] and not r["ap_ok"]]
    ahead = [f"{r['name']}/{r['start']}" for r in rows if r["ap_ok"] and not r["sp_ok"]]
    ratios = [r["ap_rep"] / r["sp_rep"] for r in rows]
    print(f"\nsolved: adaptprec {ap_solved}/{total} ({100 * ap_solved / total:.0f}%), "
          f"scipy {sp_solved}/{total}")
    print(f"behind scipy ({len(behind)}): {', '.join(behind) or '-'}")
    print(f"ahead of scipy ({len(ahead)}): {', '.join(ahead) or '-'}")
    print(f"repeat time / scipy: median {statistics.median(ratios):.2f}, "
          f"max {max(ratios):.2f}")
    fails = [r for r in rows if not r["ap_ok"]]
    for r in fails:
        ok = [q for q in rows if q["name"] == r["name"] and q["ap_ok"]]
        ref = f", {r['ap_rep'] / ok[0]['ap_rep']:.1f}x its successful fit" if ok else ""
        print(f"  failing fit {r['name']}/{r['start']}: {r['ap_rep'] * 1e3:.1f} ms "
              f"(scipy {r['sp_rep'] * 1e3:.1f} ms{ref}) {r['ap_err']}")
    return rows


if __name__ == "__main__":
    main()
