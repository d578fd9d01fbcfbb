"""Size of the compiled fused NLSQ solve (optimized HLO instructions and fusions) on NIST
problems, and its run time: a check that a change to the step (here: the guards' tests
replacing inline checks, issue 13) does not grow the compiled program. Run it on two
checkouts and compare; equal sizes mean XLA compiled the same work.

Run:  python benchmarks/nlsq_step_hlo.py     (from the checkout's root)
"""

from __future__ import annotations

import os
import sys
import time

import jax

jax.config.update("jax_enable_x64", True)
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [_ROOT, os.path.join(_ROOT, "tests")]   # this checkout's adaptprec

import numpy as np  # noqa: E402

import adaptprec as ap  # noqa: E402
import nist_problems as nist  # noqa: E402


def main():
    print(f"adaptprec from {os.path.dirname(ap.__file__)}, load {os.getloadavg()[0]:.1f}")
    for name in ("Misra1a", "Thurber", "Gauss1"):
        p = nist.load(name)
        b0 = np.asarray(p.starts[0], float)
        f = jax.jit(lambda b, p=p: ap.solve_nlsq(p.residual, b, args=(p.x, p.y)).x)
        compiled = f.lower(b0).compile()
        ins = [ln for ln in compiled.as_text().splitlines() if " = " in ln]
        best = np.inf
        for _ in range(15):
            t = time.perf_counter()
            jax.block_until_ready(compiled(b0))
            best = min(best, time.perf_counter() - t)
        print(f"{name:8s} optimized HLO instructions {len(ins):5d}, fusions "
              f"{sum('fusion(' in ln for ln in ins):4d}, best solve {1e3 * best:7.2f} ms")


if __name__ == "__main__":
    main()
