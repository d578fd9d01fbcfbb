"""Benchmark: what the program cache's trust checks cost a warm-cache first fit.

The first ``curve_fit`` in a fresh process with a warm adaptprec cache loads its programs
from disk instead of compiling. Before anything is unpickled, every file is checked
(directory and file ownership and mode on open descriptors, then an HMAC-SHA256 tag over
its bytes: adaptprec/_cache_trust.py). This measures, in each fresh process, the first
fit (120 points, 3 parameters, x64 off, as a scipy user), the time spent in the cache's
reads (open, checks, read, tag) and in the tag alone, and the bytes read: the checks'
share of the first fit is a ratio within one process, so it holds under load.

``--against DIR`` also times the first fit of another adaptprec source tree (say
``git archive <commit> adaptprec | tar -x -C DIR``), each with its own warm cache, in
interleaved rounds of fresh processes (new, other, new, other, ...): the ratio of the
medians.

Run:  python benchmarks/bench_cache_load.py [--rounds 7] [--against DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

_CHILD = r"""
import json, os, sys, time
import numpy as np, jax.numpy as jnp
import adaptprec as ap

timed = {"read": 0.0, "tag": 0.0, "bytes": 0}
try:
    from adaptprec import _cache_files, _cache_trust
except ImportError:   # another version, without the checks
    _cache_files = None
if _cache_files is not None:
    read, unseal = _cache_files.read, _cache_trust.unseal

    def timed_read(*a):
        t0 = time.perf_counter()
        try:
            return read(*a)
        finally:
            timed["read"] += time.perf_counter() - t0

    def timed_unseal(secret, name, blob):
        t0 = time.perf_counter()
        try:
            return unseal(secret, name, blob)
        finally:
            timed["tag"] += time.perf_counter() - t0
            timed["bytes"] += len(blob)

    _cache_files.read, _cache_trust.unseal = timed_read, timed_unseal
t = np.linspace(0.0, 4.0, 120)
y = 2.5 * np.exp(-1.3 * t) + 0.5 + 0.01 * np.random.default_rng(0).standard_normal(120)
t0 = time.perf_counter()
popt, _ = ap.curve_fit(lambda t, a, k, c: a * jnp.exp(-k * t) + c, t, y, p0=[1.0, 1.0, 0.0])
first = time.perf_counter() - t0
from adaptprec import _disk_cache
print(json.dumps({"first": first, "hits": _disk_cache.stats()["disk_hits"],
                  "compiles": _disk_cache.stats()["compiles"], **timed}))
"""


def _child(source: str | None, cache: str, key: str) -> dict:
    env = dict(os.environ, JAX_ENABLE_X64="0", JAX_PLATFORMS="cpu",
               ADAPTPREC_CACHE_DIR=cache, ADAPTPREC_CACHE_KEY_FILE=key)
    if source is not None:
        env["PYTHONPATH"] = source + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run([sys.executable, "-c", _CHILD], env=env, capture_output=True,
                          text=True, timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr[-3000:])
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv=None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--against", metavar="DIR",
                        help="a directory holding another version's adaptprec/")
    args = parser.parse_args(argv)
    tmp = tempfile.mkdtemp(prefix="bench-cache-load-")
    key = os.path.join(tmp, "key", "cache-key")
    sources = {"this": None}
    if args.against:
        sources["other"] = os.path.abspath(args.against)
    caches = {name: os.path.join(tmp, name) for name in sources}
    for name, source in sources.items():   # fill each cache (a cold process)
        _child(source, caches[name], key)
    runs: dict = {name: [] for name in sources}
    for _ in range(args.rounds):   # interleaved fresh processes
        for name, source in sources.items():
            runs[name].append(_child(source, caches[name], key))
    this = runs["this"]
    assert all(r["compiles"] == 0 and r["hits"] > 0 for r in this), this
    first = statistics.median(r["first"] for r in this)
    print(f"warm first fit (median of {args.rounds}): {first * 1e3:.1f} ms")
    print(f"  cache reads (open, checks, read, tag): "
          f"{statistics.median(r['read'] for r in this) * 1e3:.2f} ms; tag alone "
          f"{statistics.median(r['tag'] for r in this) * 1e3:.2f} ms over "
          f"{this[0]['bytes'] / 2**20:.2f} MB")
    share = statistics.median(r["read"] / r["first"] for r in this)
    tag = statistics.median(r["tag"] / r["first"] for r in this)
    print(f"  share of the first fit: reads {share:.1%}, tag {tag:.1%}")
    if args.against:
        other = statistics.median(r["first"] for r in runs["other"])
        print(f"other version's warm first fit: {other * 1e3:.1f} ms; this / other "
              f"{first / other:.3f}")


if __name__ == "__main__":
    main()
