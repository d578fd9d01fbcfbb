"""Check: a change leaves the NIST StRD results bit for bit as they were.

Solves every NIST problem with a model, both starts, with ``precision="adaptive"`` and
``"f32,f64"`` (x64 on, the default eager driver) and writes each result's ``x`` (hex of
its bytes), ``nfev`` and status to a JSON file; ``--compare`` reports the solves that
differ from an earlier file. Run it on the tree before and after a change that should not
change arithmetic (compiler options, scheduling, refactors).

Run:  python benchmarks/nist_bits.py OUT.json [--compare BEFORE.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.dirname(HERE), os.path.join(os.path.dirname(HERE), "tests")]


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--compare", default=None)
    a = p.parse_args(argv)
    os.environ.setdefault("ADAPTPREC_CACHE_DIR", "off")
    import jax

    jax.config.update("jax_enable_x64", True)
    import numpy as np

    import adaptprec as ap
    from nist_problems import load_all

    out = {}
    for prob in load_all():
        for i, start in enumerate(prob.starts):
            for precision in ("adaptive", "f32,f64"):
                r = ap.solve_nlsq(prob.residual, np.asarray(start, float),
                                  args=(prob.x, prob.y), precision=precision)
                out[f"{prob.name}/start{i + 1}/{precision}"] = [
                    np.asarray(r.x).tobytes().hex(), int(r.nfev), int(r.status)]
    with open(a.out, "w") as fh:
        json.dump(out, fh, indent=0)
    print(f"{len(out)} solves written to {a.out}")
    if a.compare:
        with open(a.compare) as fh:
            before = json.load(fh)
        differ = [k for k in out if before.get(k) != out[k]]
        print(f"{len(differ)} of {len(out)} differ from {a.compare}: {differ[:10]}")


if __name__ == "__main__":
    main()
