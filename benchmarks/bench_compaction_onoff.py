"""Straggler compaction on/off in ``solve_nlsq_batch``: the two adaptprec rows of
``bench_batch.py`` alone (Gpufit's 2-D Gaussian, adaptive f32 -> f64), alternated in
the same run so the shared machine's load hits both alike.

Reported per round: fits/s (best of ``--repeat`` runs), fits per CPU-second, and the
ratio compaction on / off. Used to check that moving batch's compaction onto the runtime's
``adaptprec._compaction`` costs nothing (issue 13).

Run:  python benchmarks/bench_compaction_onoff.py [--size 30000] [--rounds 2] [--repeat 3]
"""

from __future__ import annotations

import argparse
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.dirname(_HERE), _HERE]   # this checkout's adaptprec

import bench_batch as bb  # noqa: E402  (turns x64 on, as the full benchmark does)
import numpy as np  # noqa: E402


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--size", type=int, default=30_000)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args(argv)
    xy, data, _, x0 = bb.make_problem(args.size, seed=0)
    print(f"adaptprec from {os.path.dirname(bb.ap.__file__)}; {args.size:,} fits, load average "
          f"{os.getloadavg()[0]:.1f} at start")
    for r in range(args.rounds):
        rates = {}
        for label, kw in (("compaction (default)", {}), ("no compaction", {"compaction": None})):
            dt, _, _, res, _ = bb.bench_adaptprec(xy, data, x0, args.repeat, **kw)
            rates[label] = (args.size / dt, args.size / bb._timed.cpu)
            print(f"round {r}: {label:22s} {rates[label][0]:10,.0f} fits/s "
                  f"{rates[label][1]:10,.0f} fits/CPU-s  median nit "
                  f"{np.median(np.asarray(res.nit)):.0f}", flush=True)
        on, off = rates["compaction (default)"], rates["no compaction"]
        print(f"round {r}: on/off {on[0] / off[0]:.2f} (wall), {on[1] / off[1]:.2f} (CPU)")


if __name__ == "__main__":
    main()
