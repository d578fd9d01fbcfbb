"""Time to the first call of an adaptive kernel (plan + compile), in fresh processes.

For each of a few kernels of ``bench_value.py`` a fresh Python process (the library's
disk cache off, ``ADAPTPREC_CACHE_DIR=off``) times ``adaptive(fn, rtol)(*x)`` on float64
inputs: the first eager call (plan, its timings, compilation), then the first call of
``jax.jit(ad.with_report)`` on the same inputs; and counts how often the kernel's Python
body ran during each (its traces: structure analysis, plan, rungs, checks). With
``--modelled`` the plans come from the cost table (no timings), so the trace counts are
exact and do not move with load; measured plans may differ run to run under load, and
with them the programs traced.

Several source trees (``--tree``, default: this checkout) are measured interleaved round
by round, so their ratio is measured under the same load; report medians and the load.

Usage::

    python benchmarks/bench_first_call.py [--rounds 3] [--modelled] [--tree DIR ...]
        [--kernels mlp conv]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import numpy as np

_CHILD = r"""
import json, sys, time
sys.path.insert(0, "benchmarks")
import bench_value as B
import jax
import numpy as np

name = sys.argv[1]
if sys.argv[2] == "modelled":           # plans from the cost table alone: no timings
    from adaptprec import _cost
    _cost.MEASURE = False
fn, inputs, rtol, _ = B.kernels(np.random.default_rng(0))[name]
calls = [0]

def counted(*a, **k):
    calls[0] += 1
    return fn(*a, **k)

counted.__name__ = fn.__name__
x = tuple(jax.numpy.asarray(v) for v in inputs)
ad = B.ap.adaptive(counted, rtol=rtol)
t = time.perf_counter()
jax.block_until_ready(ad(*x))
first, traces = time.perf_counter() - t, calls[0]
t = time.perf_counter()
y, rep = jax.jit(ad.with_report)(*x)
jax.block_until_ready(y)
report = time.perf_counter() - t
print(json.dumps(dict(first=first, traces=traces, report=report,
                      report_traces=calls[0] - traces, checks=",".join(rep.checks))))
"""


def measure(tree: str, kernel: str, plans: str) -> dict:
    env = dict(os.environ, ADAPTPREC_CACHE_DIR="off")
    out = subprocess.run([sys.executable, "-c", _CHILD, kernel, plans], cwd=tree, env=env,
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--tree", action="append", default=None)
    p.add_argument("--kernels", nargs="+",
                   default=["mlp", "attention", "conv", "elementwise"])
    p.add_argument("--modelled", action="store_true",
                   help="plans from the cost table (no timings: trace counts exact)")
    a = p.parse_args()
    trees = a.tree or [os.getcwd()]
    res = {(t, k): [] for t in trees for k in a.kernels}
    for _ in range(a.rounds):
        for k in a.kernels:
            for t in trees:
                res[t, k].append(measure(t, k, "modelled" if a.modelled else "measured"))
    print(f"load average {os.getloadavg()[0]:.1f}; medians of {a.rounds} fresh processes; "
          f"plans {'modelled' if a.modelled else 'measured'}")
    print(f"{'kernel':12s} {'tree':30s} {'first s':>8s} {'traces':>6s} "
          f"{'report s':>8s} {'traces':>6s}  first/tree 1  checks per rung, first s (each round)")
    for k in a.kernels:
        base = float(np.median([r["first"] for r in res[trees[0], k]]))
        for t in trees:
            rs = res[t, k]
            f = float(np.median([r["first"] for r in rs]))
            print(f"{k:12s} {t[-30:]:30s} {f:8.2f} {rs[0]['traces']:6d} "
                  f"{float(np.median([r['report'] for r in rs])):8.2f} "
                  f"{rs[0]['report_traces']:6d}  {f / base:12.2f}  "
                  + " | ".join(f"{r['checks']} {r['first']:.2f}s" for r in rs))


if __name__ == "__main__":
    main()
