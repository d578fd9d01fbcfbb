"""Run time of one promoted whole-solve program (adaptprec/nlsq/_promote.py) compiled with
different XLA:CPU option sets, in one process, on the same inputs, checking that every
set gives the bits of the first.

The program is the steady ``curve_fit`` repeat of a 3-parameter exponential on 120 points
(bucket 128), x64 off: the one ``bench_latency.py`` times end to end. Each option set is
added to the options adaptprec compiles it with (``_promote._options()``); ``{}`` is those
options as they are.

Run:  python benchmarks/bench_program_options.py ['{"name": {option: value}, ...}'] [--calls N]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

DEFAULT_SETS = {
    "as compiled": {},
    "default scheduler": {"xla_cpu_scheduler_type": "CPU_SCHEDULER_TYPE_DEFAULT",
                          "xla_cpu_copy_insertion_use_region_analysis": False},
    "concurrency scheduler": {
        "xla_cpu_scheduler_type": "CPU_SCHEDULER_TYPE_CONCURRENCY_OPTIMIZED"},
    "as compiled, again": {},
}


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("sets", nargs="?", default=None, help="JSON: name -> extra options")
    p.add_argument("--calls", type=int, default=1500)
    a = p.parse_args(argv)
    sets = json.loads(a.sets) if a.sets else DEFAULT_SETS
    os.environ["ADAPTPREC_PROMOTE"] = "sync"
    os.environ["ADAPTPREC_CACHE_DIR"] = "off"
    import jax
    import jax.numpy as jnp
    import numpy as np

    import adaptprec as ap
    from adaptprec._x64_scope import float64_scope
    from adaptprec.nlsq import _promote
    from adaptprec.nlsq._pack import Packer

    builds = []
    lower = _promote._lower

    def capture(build):
        builds.append(build)
        return lower(build)

    _promote._lower = capture
    rng = np.random.default_rng(0)
    t = np.linspace(0, 4, 120)
    y = 2.5 * np.exp(-1.3 * t) + 0.5 + 0.01 * rng.standard_normal(120)

    def model(t, a, k, c):
        return a * jnp.exp(-k * t) + c

    for _ in range(400):  # host loops until promoted, then the repeat path's plan
        ap.curve_fit(model, t, y, p0=[1.0, 1.0, 0.0])
    build = builds[-1]
    fast = next(iter(_promote.plans.values())).fast  # the promoted program's fixed inputs
    base = dict(_promote._options())
    print(f"load {os.getloadavg()[0]:.1f}; base options {base}")

    def packed(*args):
        tree = build.fn(*args)
        return Packer(tree, bool_as=np.int32).pack(tree)

    with float64_scope():
        ctx = jax.device_put((np.concatenate((fast.prefix, np.array([1.0, 1.0, 0.0]))),))
        args = (t, y) if fast.pad is None else tuple(np.take(v, fast.idx) for v in (t, y))
        args = jax.device_put(args)
        ref = None
        for name, extra in sets.items():
            t0 = time.perf_counter()
            exe = jax.jit(packed, compiler_options={**base, **extra}).lower(
                *build.args).compile()
            compile_ms = (time.perf_counter() - t0) * 1e3
            out = [np.asarray(v) for v in
                   jax.tree.leaves(exe(ctx, fast.consts, args, fast.m_arr))]
            same = ref is None or all(np.array_equal(u, v, equal_nan=True)
                                      for u, v in zip(out, ref))
            ref = ref or out
            ts = []
            for _ in range(a.calls):
                t0 = time.perf_counter()
                jax.block_until_ready(exe(ctx, fast.consts, args, fast.m_arr))
                ts.append(time.perf_counter() - t0)
            print(f"{name:28s} compile {compile_ms:7.1f} ms   run median "
                  f"{np.median(ts) * 1e6:6.1f} us, min {np.min(ts) * 1e6:6.1f} us   "
                  f"same bits as the first: {same}", flush=True)


if __name__ == "__main__":
    main()
