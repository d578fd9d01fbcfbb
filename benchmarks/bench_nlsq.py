"""Benchmark: adaptprec.solve_nlsq / curve_fit against optimistix (float64) and scipy.

(a) NIST StRD: every problem in tests/data/nist_strd (19 problems x 2 starts), wall time
    INCLUDING compilation (fresh process state per solver: each solver compiles what it
    needs), and the LRE (digits agreeing with the certified values) per solve.
(b) One fit of a 5-parameter double exponential to 1e6 points: adaptprec (adaptive
    f32 -> f64), optimistix LevenbergMarquardt float64, scipy curve_fit (method="lm",
    numpy model, MINPACK finite-difference Jacobian as scipy users run it). Reported with
    and without compilation; accuracy = max relative parameter difference to a tight
    float64 reference solve.

Run:  JAX_ENABLE_X64=1 python benchmarks/bench_nlsq.py [--quick]
"""

from __future__ import annotations

import argparse
import inspect
import os
import sys
import time
import warnings

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optimistix as optx  # noqa: E402
import scipy.optimize as so  # noqa: E402

import adaptprec as ap  # noqa: E402
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
import nist_problems as _nist  # noqa: E402
from nist_problems import load_all, lre  # noqa: E402


def _numpy_model(fn):
    """The same model source evaluated with numpy (so scipy is not charged JAX dispatch)."""
    src = inspect.getsource(fn)
    ns = {"jnp": np}
    exec(src, ns)  # noqa: S102 - our own module's source
    return ns[fn.__name__]


def _block(x):
    return jax.block_until_ready(x)


# ----------------------------------------------------------------------------- (a) NIST
def bench_nist(problems, optx_tol):
    rows = []
    totals = {"adaptprec": 0.0, "adaptprec-f64": 0.0, "optimistix": 0.0, "scipy": 0.0}
    lm = optx.LevenbergMarquardt(rtol=optx_tol, atol=optx_tol)
    for p in problems:
        x, y = jnp.asarray(p.x), jnp.asarray(p.y)
        model = p.model

        def optx_fn(b, args, model=model):
            xx, yy = args
            return model(b, xx) - yy

        np_model = _numpy_model(model)
        xn, yn = np.asarray(p.x), np.asarray(p.y)
        for k, s in enumerate(p.starts):
            row = {"problem": p.name, "start": k + 1}
            for label, prec in (("adaptprec", "adaptive"), ("adaptprec-f64", "f64")):
                t = time.perf_counter()
                r = ap.solve_nlsq(p.residual, jnp.asarray(s), args=(x, y), precision=prec)
                _block(r.x)
                dt = time.perf_counter() - t
                totals[label] += dt
                row[label] = lre(r.x, p.certified)
            t = time.perf_counter()
            sol = optx.least_squares(optx_fn, lm, jnp.asarray(s), args=(x, y),
                                     max_steps=2000, throw=False)
            _block(sol.value)
            totals["optimistix"] += time.perf_counter() - t
            row["optimistix"] = lre(sol.value, p.certified)
            t = time.perf_counter()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                rs = so.least_squares(lambda b: np_model(b, xn) - yn, s, method="lm")
            totals["scipy"] += time.perf_counter() - t
            row["scipy"] = lre(rs.x, p.certified)
            rows.append(row)
    return rows, totals


# ----------------------------------------------------------------------------- (b) big fit
def dexp(t, a1, k1, a2, k2, c):
    return a1 * jnp.exp(-k1 * t) + a2 * jnp.exp(-k2 * t) + c


def dexp_np(t, a1, k1, a2, k2, c):
    return a1 * np.exp(-k1 * t) + a2 * np.exp(-k2 * t) + c


def bench_big(m):
    rng = np.random.default_rng(0)
    t = np.linspace(0.0, 10.0, m)
    truth = np.array([3.0, 1.7, 1.2, 0.23, 0.4])
    y = dexp_np(t, *truth) + 0.01 * rng.standard_normal(m)
    p0 = np.array([2.0, 1.0, 1.0, 0.1, 0.0])
    tj, yj = jnp.asarray(t), jnp.asarray(y)

    ref = ap.solve_nlsq(lambda p, t, y: dexp(t, *p) - y, jnp.asarray(p0), args=(tj, yj),
                        precision="f64", ftol=1e-15, xtol=1e-15, gtol=1e-15).x
    ref = np.asarray(ref)

    def acc(p):
        return float(np.max(np.abs(np.asarray(p) - ref) / np.abs(ref)))

    out = {}
    # adaptprec: cold (compile) then warm
    for label, kw in (("adaptprec", {}), ("adaptprec-f64", {"precision": "f64"})):
        ap.nlsq.clear_cache()
        t0 = time.perf_counter()
        popt, _ = ap.curve_fit(dexp, tj, yj, p0=p0, **kw)
        _block(popt)
        cold = time.perf_counter() - t0
        t0 = time.perf_counter()
        popt, _ = ap.curve_fit(dexp, tj, yj * 1.0, p0=p0, **kw)
        _block(popt)
        out[label] = (cold, time.perf_counter() - t0, acc(popt))

    lm = optx.LevenbergMarquardt(rtol=1e-10, atol=1e-10)

    def fn(p, args):
        tt, yy = args
        return dexp(tt, *p) - yy

    t0 = time.perf_counter()
    sol = optx.least_squares(fn, lm, jnp.asarray(p0), args=(tj, yj), max_steps=500,
                             throw=False)
    _block(sol.value)
    cold = time.perf_counter() - t0
    t0 = time.perf_counter()
    sol = optx.least_squares(fn, lm, jnp.asarray(p0), args=(tj, yj * 1.0), max_steps=500,
                             throw=False)
    _block(sol.value)
    out["optimistix"] = (cold, time.perf_counter() - t0, acc(sol.value))

    t0 = time.perf_counter()
    ps, _ = so.curve_fit(dexp_np, t, y, p0=p0, method="lm")
    dt = time.perf_counter() - t0
    out["scipy"] = (dt, dt, acc(ps))
    return out


def main(argv=None):
    ap_ = argparse.ArgumentParser()
    ap_.add_argument("--quick", action="store_true", help="5 NIST problems, 1e5 points")
    ap_.add_argument("--optx-tol", type=float, default=1e-10)
    ap_.add_argument("--points", type=int, default=None)
    args = ap_.parse_args(argv)
    print(f"# jax {jax.__version__} on {jax.default_backend()}, "
          f"{len(jax.devices())} device(s); x64 on")
    print("# reproduce: JAX_ENABLE_X64=1 python benchmarks/bench_nlsq.py"
          + (" --quick" if args.quick else ""))

    problems = load_all()
    if args.quick:
        problems = problems[:5]
    rows, totals = bench_nist(problems, args.optx_tol)
    names = ["adaptprec", "adaptprec-f64", "optimistix", "scipy"]
    print(f"\n(a) NIST StRD, {len(rows)} solves, wall time including compilation")
    print(f"{'problem':10s} {'st':>2s} " + " ".join(f"{n:>13s}" for n in names) + "   (LRE)")
    for r in rows:
        print(f"{r['problem']:10s} {r['start']:2d} "
              + " ".join(f"{r[n]:13.2f}" for n in names))
    print(f"{'min LRE':13s} " + " ".join(f"{min(r[n] for r in rows):13.2f}" for n in names))
    print(f"{'#LRE>=6':13s} " + " ".join(f"{sum(r[n] >= 6 for r in rows):13d}"
                                         for n in names))
    print(f"{'time [s]':13s} " + " ".join(f"{totals[n]:13.2f}" for n in names))
    base = totals["optimistix"]
    print(f"{'vs optx':13s} " + " ".join(f"{totals[n] / base:13.3f}" for n in names)
          + "   (time ratio; target adaptprec <= 0.2)")

    m = args.points or (100_000 if args.quick else 1_000_000)
    big = bench_big(m)
    print(f"\n(b) double exponential, 5 parameters, m = {m:,}")
    print(f"{'solver':14s} {'cold [s]':>9s} {'warm [s]':>9s} {'max rel err':>12s}")
    for k, (cold, warm, err) in big.items():
        print(f"{k:14s} {cold:9.3f} {warm:9.3f} {err:12.2e}")
    a_cold, a_warm, _ = big["adaptprec"]
    print(f"speedup vs optimistix f64: cold {big['optimistix'][0] / a_cold:.2f}x, "
          f"warm {big['optimistix'][1] / a_warm:.2f}x   (target >= 3x)")
    print(f"speedup vs scipy curve_fit(lm): cold {big['scipy'][0] / a_cold:.2f}x, "
          f"warm {big['scipy'][1] / a_warm:.2f}x   (target >= 5x)")
    return 0


_ = _nist
if __name__ == "__main__":
    sys.exit(main())
