"""Cost of the fit reports (issue 33), as ratios against the solves they report on.

1. Batch: ``summarize_batch`` (per-fit standard errors, covariance, chi2, reduced chi2,
   R2, runs test, flags; one vmapped program) against the ``solve_nlsq_batch`` call it
   summarises, for Michaelis-Menten fits (10 points, 2 parameters) and the 4PL
   dose-response (24 points, 4 parameters), B = 1000 and 10000 fits.
2. The SVD behind the summaries: the one-sided Jacobi SVD of
   ``adaptprec.analysis.identifiability`` against ``jnp.linalg.svd`` (LAPACK gesdd per
   matrix), vmapped over 10000 matrices of 10x2 and 24x4.
3. One fit: ``ap.fit`` (curve_fit + the report) against ``ap.curve_fit`` alone, and
   ``profile_intervals`` (two levels, all parameters: one grid solve and two refinement
   solves on the batched engine) against one ``curve_fit``, repeat calls (compiled).

Timings after compilation: interleaved repeats in one process, the median. The machine
is shared: the load average is printed with the results.

Run:  python benchmarks/bench_fit_report.py            (about 2 minutes)
      python benchmarks/bench_fit_report.py --quick    (B = 1000 only, fewer repeats)
"""

from __future__ import annotations

import argparse
import os
import time

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import adaptprec as ap  # noqa: E402


def mm(p, s):
    return p[0] * s / (p[1] + s)


def four_pl(p, x):
    return p[0] + (p[1] - p[0]) / (1.0 + (x / p[2]) ** p[3])


def four_pl_args(x, bottom, top, ec50, hill):
    return bottom + (top - bottom) / (1.0 + (x / ec50) ** hill)


def problem(name, B, rng):
    if name == "mm":
        x = np.array([0.2, 0.4, 0.7, 1.0, 1.5, 2.5, 4.0, 6.0, 9.0, 14.0])
        truth = np.stack([rng.uniform(2, 4, B), rng.uniform(0.5, 3, B)], 1)
        Y = np.stack([mm(t, x) for t in truth]) + rng.normal(0, 0.05, (B, x.size))
        return mm, x, Y, np.ones((B, 2))
    x = np.logspace(-2, 2, 24)
    truth = np.stack([rng.uniform(0, .1, B), rng.uniform(.9, 1.1, B),
                      rng.uniform(.5, 3, B), rng.uniform(.8, 1.6, B)], 1)
    Y = np.stack([four_pl(t, x) for t in truth]) + rng.normal(0, 0.03, (B, x.size))
    return four_pl, x, Y, np.tile([0.0, 1.0, 1.0, 1.0], (B, 1))


def median_times(fns, repeat):
    times = {k: [] for k in fns}
    for _ in range(repeat):
        for k, f in fns.items():   # interleaved
            t = time.perf_counter()
            jax.block_until_ready(f())
            times[k].append(time.perf_counter() - t)
    return {k: float(np.median(v)) for k, v in times.items()}


def batch_rows(sizes, repeat):
    rng = np.random.default_rng(0)
    print(f"{'model':6} {'B':>6} {'solve ms':>10} {'summary ms':>11} {'us/fit':>8} {'ratio':>7}")
    for name in ("mm", "4pl"):
        for B in sizes:
            fun, x, Y, x0 = problem(name, B, rng)
            Yj, x0j = jnp.asarray(Y), jnp.asarray(x0)

            def solve():
                return ap.solve_nlsq_batch(fun, x0j, (x,), in_axes=None, ydata=Yj)

            res = solve()

            def summary():
                return ap.summarize_batch(res, fun, (x,), in_axes=None, ydata=Yj).stderr

            summary()
            t = median_times({"solve": lambda: solve().x, "summary": summary}, repeat)
            print(f"{name:6} {B:>6} {1e3 * t['solve']:>10.2f} {1e3 * t['summary']:>11.2f} "
                  f"{1e6 * t['summary'] / B:>8.2f} {t['summary'] / t['solve']:>7.3f}")


def svd_rows(repeat):
    from adaptprec.analysis.identifiability import _jacobi_svd

    rng = np.random.default_rng(2)
    print()
    for m, n in ((10, 2), (24, 4)):
        A = jnp.asarray(rng.normal(size=(10000, m, n)))
        jac = jax.jit(jax.vmap(_jacobi_svd))
        lap = jax.jit(jax.vmap(lambda a: jnp.linalg.svd(a, full_matrices=False)[1:]))
        jac(A), lap(A)
        t = median_times({"jacobi": lambda: jac(A), "lapack": lambda: lap(A)}, repeat)
        print(f"SVD of 10000 {m}x{n}: Jacobi {1e3 * t['jacobi']:.1f} ms, jnp.linalg.svd "
              f"{1e3 * t['lapack']:.1f} ms ({t['lapack'] / t['jacobi']:.1f}x)")


def single_rows(repeat):
    rng = np.random.default_rng(1)
    x = np.logspace(-2, 2, 24)
    y = four_pl_args(x, 0.05, 1.0, 1.5, 1.2) + rng.normal(0, 0.03, x.size)
    p0 = [0.0, 1.0, 1.0, 1.0]
    res = ap.fit(four_pl_args, x, y, p0=p0)
    res.profile_intervals([0.6827, 0.95])
    ap.curve_fit(four_pl_args, x, y, p0=p0)
    t = median_times({"curve_fit": lambda: ap.curve_fit(four_pl_args, x, y, p0=p0)[0],
                      "fit": lambda: ap.fit(four_pl_args, x, y, p0=p0).popt,
                      "profile": lambda: res.profile_intervals([0.6827, 0.95]).lower},
                     repeat)
    print(f"\none 4PL fit (24 points): curve_fit {1e3 * t['curve_fit']:.2f} ms, "
          f"fit {1e3 * t['fit']:.2f} ms ({t['fit'] / t['curve_fit']:.2f}x curve_fit), "
          f"profile_intervals {1e3 * t['profile']:.2f} ms "
          f"({t['profile'] / t['curve_fit']:.1f}x curve_fit)")


def main():
    ap_ = argparse.ArgumentParser()
    ap_.add_argument("--quick", action="store_true")
    args = ap_.parse_args()
    sizes = (1000,) if args.quick else (1000, 10000)
    repeat = 5 if args.quick else 9
    print(f"load average {os.getloadavg()[0]:.2f}; jax {jax.__version__}")
    batch_rows(sizes, repeat)
    svd_rows(repeat)
    single_rows(repeat)


if __name__ == "__main__":
    main()
