"""Miss and false-alarm rates of ``guards.accuracy`` over seeds (the figures in
docs/runtime.md).

For every kernel of tests/accuracy_kernels.py (known low-precision failures and benign
kernels), every rung and every seed (the guard's random-rounding seed and, for kernels
with random inputs, the inputs), the guard is evaluated on the rung and the rung's true
normwise relative error is measured against float64. Then:

* miss: the guard passes although the true error is above ``rtol``;
* false alarm: the guard fires although the true error is at most ``rtol``;
* ratio: estimated error / true error (``10**-digits`` against the true error) for the
  passing cases, a check of the safety factor;
* ratio to max(true, u): the same against the true error floored at the rung's unit
  roundoff ``u``. The estimate is never below ``u`` (storing the result costs that much,
  and a rung coarser than ``rtol`` must never pass), so where the true error happens to
  be far below ``u`` (exactly representable results) the first ratio measures that
  floor, not the estimator; the second is the estimator's own pessimism.

Run:  python benchmarks/calibrate_accuracy.py [--seeds 12] [--samples 2]
      python benchmarks/calibrate_accuracy.py --check first_order   # the cost model's
      cheap check (first-order bound at the working precision; deterministic, so the
      seed varies only the inputs)
"""

from __future__ import annotations

import argparse
import os
import sys

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from adaptprec import guards  # noqa: E402
from adaptprec._policy import cast_floating  # noqa: E402
from adaptprec.precision import unit_roundoff  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
from accuracy_kernels import BENIGN, FAILING, reference, rel_error  # noqa: E402

#: (rung, rtol) pairs: an rtol a healthy kernel can meet on that rung.
RUNGS = (("bf16", 3e-2), ("f32", 1e-4))


def run(name, fn, make, rung, rtol, seeds, samples, check="mca"):
    g = guards.accuracy(rtol, samples)
    dtype = jnp.dtype(jnp.bfloat16) if rung == "bf16" else jnp.dtype(rung.replace(
        "f", "float"))

    @jax.jit
    def guarded(seed, *xs):
        cx, _ = cast_floating((xs, {}), dtype)
        out = fn(*cx)
        ctx = guards.GuardContext(fn, cx, {}, (xs, {}), out, dtype, unit_roundoff(dtype),
                                  check=check)
        r = g.estimate(ctx, seed) if check == "mca" else g.check(ctx)
        return out, r.ok, r.value

    from adaptprec._first_order import Unsupported
    try:
        guarded.lower(jnp.uint32(0), *make(np.random.default_rng(0)))
    except Unsupported as exc:
        print(f"| {name} | {rung} | {rtol:g} | unsupported ({exc}) | | | | | | |")
        return 0, 0
    fired = misses = alarms = 0
    ratios, floored = [], []
    u = unit_roundoff(dtype)
    for s in range(seeds):
        xs = make(np.random.default_rng(s))
        y, ok, digits = guarded(jnp.uint32(s), *xs)
        err = rel_error(y, reference(fn, xs))
        ok = bool(ok)
        fired += not ok
        misses += ok and err > rtol
        alarms += (not ok) and err <= rtol
        if ok and err > 0:
            ratios.append(10.0 ** -float(digits) / err)
        if ok:
            floored.append(10.0 ** -float(digits) / max(err, u))

    def span(r):
        return f"{min(r):.2g} | {max(r):.2g}" if r else "- | -"

    print(f"| {name} | {rung} | {rtol:g} | {fired}/{seeds} | {misses} | {alarms} | "
          f"{span(ratios)} | {span(floored)} |")
    return misses, alarms


def main():
    ap_ = argparse.ArgumentParser()
    ap_.add_argument("--seeds", type=int, default=12)
    ap_.add_argument("--samples", type=int, default=2)
    ap_.add_argument("--check", default="mca", choices=("mca", "first_order"))
    args = ap_.parse_args()
    print(f"check={args.check}, samples={args.samples}, seeds={args.seeds}")
    print("| kernel | rung | rtol | fired | misses | false alarms | min est/true | "
          "max est/true | min est/max(true,u) | max est/max(true,u) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    tot_m = tot_a = 0
    for suite in (FAILING, BENIGN):
        for name, (fn, make) in suite.items():
            for rung, rtol in RUNGS:
                m, a = run(name, fn, make, rung, rtol, args.seeds, args.samples,
                           args.check)
                tot_m += m
                tot_a += a
    print(f"total misses {tot_m}, total false alarms {tot_a}")


if __name__ == "__main__":
    main()
