"""Check: the promoted whole-solve program (adaptprec/nlsq/_promote.py) gives the host
loop's bits on every NIST StRD problem with a model, both starts (x64 on).

For each start, one solve runs the host loop and promotes the model (synchronously), the
next runs the promoted program; every field of the two results is compared bit for bit.
``--optimise`` compiles the promoted program with LLVM optimisation instead (it then
rounds differently; the count of differing solves and of changed ``nfev`` is printed).

Run:  python benchmarks/promote_bits.py [--optimise] [--limit N]
"""

from __future__ import annotations

import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.dirname(HERE), os.path.join(os.path.dirname(HERE), "tests")]


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--optimise", action="store_true")
    p.add_argument("--limit", type=int, default=None)
    a = p.parse_args(argv)
    os.environ["ADAPTPREC_PROMOTE"] = "sync"
    import jax

    jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp
    import numpy as np

    import adaptprec as ap
    from adaptprec.nlsq import _promote
    from nist_problems import load_all

    _promote.PROMOTE_AFTER, _promote.PROMOTE_SECONDS = 0, 0.0
    _promote.OPTIMISE = a.optimise
    differ = nfev_differ = total = 0
    for prob in load_all()[:a.limit]:
        x, y = jnp.asarray(prob.x), jnp.asarray(prob.y)
        for s in prob.starts:
            _promote.clear()
            host = ap.solve_nlsq(prob.residual, jnp.asarray(s), args=(x, y))
            whole = ap.solve_nlsq(prob.residual, jnp.asarray(s), args=(x, y))
            assert _promote.stats()["ready"] == 1
            same = all(np.array_equal(np.asarray(u), np.asarray(v), equal_nan=True) for u, v in
                       zip(jax.tree.leaves(host), jax.tree.leaves(whole)))
            total += 1
            differ += not same
            nfev_differ += int(host.nfev) != int(whole.nfev)
            print(f"{prob.name:10s} nfev {int(host.nfev):4d} {int(whole.nfev):4d} "
                  f"{'same' if same else 'DIFFER'}", flush=True)
    print(f"{total} solves: {differ} differ, {nfev_differ} with another nfev")


if __name__ == "__main__":
    main()
