"""The ladder (``precision="f32,f64"``; the default "adaptive" runs float64 alone at
NIST's sizes on CPU) against float64-only ``solve_nlsq`` on the NIST robustness sweep
(issue 15, Deliver 1): 27 problems x (2 certified + K seeded perturbed starts), and the
two properties per row

- adaptive LRE >= float64-only LRE - 0.5,
- adaptive nfev <= 3 x float64-only nfev (nfev counts every evaluation on every rung).

Prints the rows that miss a property, per-row float32 evaluations and escalation reason,
and the total time of each configuration (including compilation). ``--json`` saves the
rows for comparing two versions.

Run:  python benchmarks/bench_ladder.py [--perturbed K] [--seed S] [--json out] [names...]
      python benchmarks/bench_ladder.py --seeds 1:40 [--restart-radius 1.0]   (a scan)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import warnings

import jax

jax.config.update("jax_enable_x64", True)

_ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path[:0] = [_ROOT, os.path.join(_ROOT, "tests")]  # this checkout's adaptprec
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import adaptprec as ap  # noqa: E402
from nist_problems import MODELS  # noqa: E402
from robust_sweep import problem_starts, residual_for, score  # noqa: E402


def solve(p, x0, **kw):
    t = time.perf_counter()
    res = ap.solve_nlsq(residual_for(p.name), jnp.asarray(x0),
                        args=(jnp.asarray(p.x), jnp.asarray(p.y)), **kw)
    x = np.asarray(res.x)
    dt = time.perf_counter() - t
    out = dict(lre=float(score(p, x, float(res.cost))), nfev=int(res.nfev),
               status=int(res.status), time=dt)
    rn = np.asarray(res.rung_nfev)
    out.update(f32_nfev=0, reason="-")  # (one rung: "adaptive" at a small size on CPU)
    if rn.size > 1:
        out.update(f32_nfev=int(rn[0]), reason=ap.reason_name(int(res.escalation_reason[1]))
                   if int(res.escalations) else "-")
    return out


def main(argv=None):
    a_ = argparse.ArgumentParser()
    a_.add_argument("names", nargs="*")
    a_.add_argument("--perturbed", type=int, default=3)
    a_.add_argument("--seed", type=int, default=0)
    a_.add_argument("--seeds", help="a range A:B of seeds, one process (the misses and a "
                    "summary line per seed)")
    a_.add_argument("--restart-radius", type=float, default=None,
                    help="the portfolio's _loop.RESTART_RADIUS (default: the library's)")
    a_.add_argument("--json")
    a_.add_argument("--all", action="store_true", help="print every row")
    a_.add_argument("--kw", default="{}",
                    help="extra solve_nlsq keywords (the ladder's solve), JSON")
    a = a_.parse_args(argv)
    warnings.simplefilter("ignore")
    if a.restart_radius is not None:  # (read when the step is traced: before any solve)
        from adaptprec.nlsq import _loop
        _loop.RESTART_RADIUS = a.restart_radius
        # the program cache's keys hold the source's hash, not a patched constant: a
        # cached step program would be the library's own
        os.environ["ADAPTPREC_CACHE_DIR"] = "off"
    if a.seeds:
        lo, hi = (int(v) for v in a.seeds.split(":"))
        return [run_seed(a, seed) for seed in range(lo, hi)]
    return run_seed(a, a.seed)


def run_seed(a, seed):
    # the ladder itself: "adaptive" runs float64 alone at NIST's sizes on CPU
    # (solve.SMALL_F64_MN); --kw '{"precision": "adaptive"}' measures the default
    kw = {"precision": "f32,f64", **json.loads(a.kw)}
    rows = []
    for name in a.names or list(MODELS):
        p, starts = problem_starts(name, a.perturbed, seed)
        for label, x0 in starts:
            ad = solve(p, x0, **kw)
            f64 = solve(p, x0, precision="f64")
            rows.append(dict(problem=name, start=label, ad=ad, f64=f64))
    lre_bad = [r for r in rows if r["ad"]["lre"] < r["f64"]["lre"] - 0.5]
    nfev_bad = [r for r in rows if r["ad"]["nfev"] > 3 * r["f64"]["nfev"]]
    print("| problem | start | LRE ad | LRE f64 | nfev ad (f32) | nfev f64 | reason | "
          "status ad/f64 |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        if a.all or r in lre_bad or r in nfev_bad:
            ad, f = r["ad"], r["f64"]
            flag = ("L" if r in lre_bad else "") + ("N" if r in nfev_bad else "")
            print(f"| {r['problem']} | {r['start']} | {ad['lre']:.2f} | {f['lre']:.2f} | "
                  f"{ad['nfev']} ({ad['f32_nfev']}) | {f['nfev']} | {ad['reason']} | "
                  f"{ad['status']}/{f['status']} {flag} |")
    n = len(rows)
    cert = [r for r in rows if r["start"] in ("s1", "s2")]
    print(f"\nseed {seed}: LRE property {n - len(lre_bad)}/{n}, nfev property "
          f"{n - len(nfev_bad)}/{n}; certified starts at LRE >= 6: adaptive "
          f"{sum(r['ad']['lre'] >= 6 for r in cert)}/{len(cert)}, f64 "
          f"{sum(r['f64']['lre'] >= 6 for r in cert)}/{len(cert)}; solved (LRE >= 6): "
          f"adaptive {sum(r['ad']['lre'] >= 6 for r in rows)}, f64 "
          f"{sum(r['f64']['lre'] >= 6 for r in rows)}")
    print(f"total nfev: adaptive {sum(r['ad']['nfev'] for r in rows)} (f32 "
          f"{sum(r['ad']['f32_nfev'] for r in rows)}), f64 {sum(r['f64']['nfev'] for r in rows)}"
          f"; time incl. compilation: adaptive {sum(r['ad']['time'] for r in rows):.1f} s, "
          f"f64 {sum(r['f64']['time'] for r in rows):.1f} s")
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(rows, fh, indent=0)
    return rows


if __name__ == "__main__":
    main()
