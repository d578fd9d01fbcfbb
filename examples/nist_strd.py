"""Solve the NIST StRD nonlinear regression problems (both starts) and score them.

LRE = -log10(|x - c| / |c|), the number of digits agreeing with the certified values,
minimum over parameters. Compares adaptive precision (f32 -> f64) with fixed float64.

Run:  python examples/nist_strd.py [Misra1a Kirby2 ...]
"""

import os
import sys
import time

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402

import adaptprec as ap  # noqa: E402
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
try:  # the NIST models and data live in the repository's tests/, not in the wheel
    from nist_problems import MODELS, load, lre  # noqa: E402
except ImportError:
    sys.exit("examples/nist_strd.py needs the repository checkout (tests/nist_problems.py "
             "and the NIST StRD data): run it from there, e.g. python examples/nist_strd.py")

names = sys.argv[1:] or list(MODELS)
print(f"{'problem':10s} {'start':>5s} {'LRE adaptive':>13s} {'f32 evals':>9s} "
      f"{'f64 evals':>9s} {'LRE f64':>8s} {'status':>6s}")
t0 = time.perf_counter()
for name in names:
    p = load(name)
    args = (jnp.asarray(p.x), jnp.asarray(p.y))
    for k, start in enumerate(p.starts):
        ra = ap.solve_nlsq(p.residual, jnp.asarray(start), args=args)
        rf = ap.solve_nlsq(p.residual, jnp.asarray(start), args=args, precision="f64")
        n32, n64 = (int(v) for v in ra.rung_nfev)
        print(f"{name:10s} {k + 1:5d} {lre(ra.x, p.certified):13.2f} {n32:9d} {n64:9d} "
              f"{lre(rf.x, p.certified):8.2f} {int(ra.status):6d}")
print(f"total {time.perf_counter() - t0:.1f} s (including compilation)")
