"""What computing curve_fit's covariance in the host driver's ``final`` program costs the
first fit of a new (model, bucket): fresh processes alternating with it on and off (off:
pcov in NumPy after the solve, as before), adaptprec's program cache off, x64 off, the
3-parameter exponential at 120 points, then 157, 301 and 600 (each a new bucket).

Run:  python benchmarks/bench_covariance_compile.py [--runs 3]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
LENGTHS = (120, 157, 301, 600)


def _child(mode: str) -> None:
    import time

    import jax.numpy as jnp
    import numpy as np

    import adaptprec as ap
    from adaptprec.nlsq import _promote

    if mode == "off":
        _promote.wants_covariance = lambda: False

    def model(t, a, k, c):
        return a * jnp.exp(-k * t) + c

    times = []
    for m in LENGTHS:
        t = np.linspace(0, 4, m)
        y = 2.5 * np.exp(-1.3 * t) + 0.5
        t0 = time.perf_counter()
        ap.curve_fit(model, t, y, p0=[1.0, 1.0, 0.0])
        times.append((time.perf_counter() - t0) * 1e3)
    print(" ".join(f"{v:.1f}" for v in times))


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--child", default=None)
    a = p.parse_args(argv)
    if a.child:
        sys.path.insert(0, os.path.dirname(HERE))
        _child(a.child)
        return
    env = {**os.environ, "ADAPTPREC_CACHE_DIR": "off"}
    env.pop("JAX_ENABLE_X64", None)
    print("first fit of each length in ms:", ", ".join(map(str, LENGTHS)))
    for _ in range(a.runs):
        for mode in ("on", "off"):
            r = subprocess.run([sys.executable, __file__, "--child", mode], env=env,
                               capture_output=True, text=True, check=True)
            print(f"covariance in final {mode:3s}: {r.stdout.strip()}")


if __name__ == "__main__":
    main()
