"""Global fits: D exponential decays sharing one rate constant (each with its own
amplitude and offset), ``ap.fit_global`` against scipy's ``least_squares`` on the one
stacked residual with the sparse Jacobian written out by hand (``jac_sparsity``,
``tr_solver="lsmr"``: what scipy needs to fit this at all), the same data and starts.

Printed per D: the time of ``ap.fit_global`` (a repeat call: compiled; and the first
call, compiling), scipy's time, their ratio, and the agreement of the shared rate and
of its standard error. Timings: interleaved rounds in one process, the median; the
machine's load average is printed with them.

Run:  python benchmarks/bench_global.py                (D = 1000 and 10000)
      python benchmarks/bench_global.py --sizes 10000 --rounds 3
"""

from __future__ import annotations

import argparse
import os
import time

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import scipy.optimize as so  # noqa: E402
import scipy.sparse as sp  # noqa: E402

import adaptprec as ap  # noqa: E402

M = 40                 # points per decay
RATE = 0.7


def decay(t, a, k, b):
    return a * jnp.exp(-k * t) + b


def data(D: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    t = np.linspace(0.0, 5.0, M)
    a = rng.uniform(1.0, 5.0, D)
    b = rng.uniform(0.0, 1.0, D)
    y = a[:, None] * np.exp(-RATE * t) + b[:, None] + rng.normal(0.0, 0.02, (D, M))
    return t, y


def ours(t, y):
    return ap.fit_global(decay, t, y, shared=["k"], p0={"a": 2.0, "k": 1.0, "b": 0.5})


def scipy_sparse(t, y):
    D = y.shape[0]
    rows = np.arange(D * M)
    d = rows // M
    # columns: k, then a_1..a_D, then b_1..b_D
    pattern = sp.csr_matrix((np.ones(3 * D * M), (np.r_[rows, rows, rows],
                                                   np.r_[np.zeros(D * M, int), 1 + d,
                                                         1 + D + d])), shape=(D * M, 1 + 2 * D))

    def residual(q):
        k, a, b = q[0], q[1:1 + D], q[1 + D:]
        return (a[:, None] * np.exp(-k * t) + b[:, None] - y).ravel()

    x0 = np.r_[1.0, np.full(D, 2.0), np.full(D, 0.5)]
    r = so.least_squares(residual, x0, jac_sparsity=pattern, tr_solver="lsmr",
                         method="trf", x_scale="jac")
    return r


def scipy_rate_stderr(r, D):
    """The rate's standard error from scipy's sparse Jacobian: the Schur complement of
    its block structure (a dense inverse of 2D+1 columns would not fit)."""
    J = r.jac.tocsc()
    jk = J[:, 0].toarray().ravel().reshape(D, M)
    ja = np.asarray(J[:, 1:1 + D].sum(axis=1)).ravel().reshape(D, M)
    jb = np.asarray(J[:, 1 + D:].sum(axis=1)).ravel().reshape(D, M)
    S = np.sum(jk * jk)
    for d in range(D):
        Jl = np.stack([ja[d], jb[d]], 1)
        w = Jl.T @ jk[d]
        S -= w @ np.linalg.solve(Jl.T @ Jl, w)
    redchi = 2 * r.cost / (D * M - 1 - 2 * D)
    return float(np.sqrt(redchi / S))


def main():
    ap_ = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap_.add_argument("--sizes", default="1000,10000")
    ap_.add_argument("--rounds", type=int, default=5)
    args = ap_.parse_args()
    print(f"load average {os.getloadavg()[0]:.2f} ({os.cpu_count()} cores), "
          f"{M} points per decay")
    print(f"{'D':>6} {'first (s)':>10} {'ours (s)':>9} {'scipy (s)':>10} {'ratio':>7} "
          f"{'k ours':>12} {'k scipy':>12} {'se ours':>10} {'se scipy':>10}")
    for D in [int(s) for s in args.sizes.split(",")]:
        t, y = data(D)
        t0 = time.perf_counter()
        res = ours(t, y)
        first = time.perf_counter() - t0
        mine, theirs = [], []
        for _ in range(args.rounds):   # interleaved rounds
            t0 = time.perf_counter()
            res = ours(t, y)
            mine.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            ref = scipy_sparse(t, y)
            theirs.append(time.perf_counter() - t0)
        a, b = float(np.median(mine)), float(np.median(theirs))
        se_ref = scipy_rate_stderr(ref, D)
        print(f"{D:>6} {first:>10.2f} {a:>9.3f} {b:>10.3f} {b / a:>6.1f}x "
              f"{res.shared_values[0]:>12.8f} {ref.x[0]:>12.8f} "
              f"{res.shared_stderr[0]:>10.3g} {se_ref:>10.3g}")
    print(f"load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
