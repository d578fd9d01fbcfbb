"""How close is ``guards.accuracy``'s estimate to the true error? (the figures in
docs/runtime.md, "When adaptivity pays" and "Measured miss and false-alarm rates").

Two tables.

**The default estimate** (the default run): for every kernel of the calibration suite
-- the accuracy suite's benign kernels (tests/accuracy_kernels.py, small: checked by
Monte Carlo arithmetic) and the kernels users write with loops, chained products and
reductions (at sizes where the plan picks a cheaper check) -- and every seed (inputs
drawn anew), the float32 rung is checked the way ``adaptive(fn, rtol)``'s plan checks it
(the check the plan chose for float32, or the one it would choose when it skipped the
rung) and its estimate is compared with the rung's true normwise relative error against
float64: ``estimate / true``. The estimate is never below the rung's unit roundoff ``u``
(storing the result costs that much), so the table also gives ``estimate / max(true,
u)``, the estimator's own pessimism where the true error happens to be far below ``u``.
Target (issue 44): within 3x, worst case within 10x.

**Miss and false-alarm rates** (``--check mca`` / ``--check first_order``): the accuracy
suite's known low-precision failures and benign kernels, on bf16 and f32, over seeds:

* miss: the guard passes although the true error is above ``rtol``;
* false alarm: the guard fires although the true error is at most ``rtol``;
* the same ratios as above for the passing cases.

Run:  python benchmarks/calibrate_accuracy.py [--seeds 6]          # the default estimate
      python benchmarks/calibrate_accuracy.py --check mca [--seeds 12] [--samples 2]
          [--safety 1,1.5,2]                      # what each safety factor buys
      python benchmarks/calibrate_accuracy.py --check first_order   # the first-order
      bound (deterministic, so the seed varies only the inputs)
"""

from __future__ import annotations

import argparse
import os
import sys

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import adaptprec as ap  # noqa: E402
from adaptprec import guards  # noqa: E402
from adaptprec._policy import cast_floating  # noqa: E402
from adaptprec.precision import unit_roundoff  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
import accuracy_kernels as K  # noqa: E402
from accuracy_kernels import BENIGN, FAILING, reference, rel_error  # noqa: E402

#: (rung, rtol) pairs: an rtol a healthy kernel can meet on that rung.
RUNGS = (("bf16", 3e-2), ("f32", 1e-4))


def _f64(*xs):
    return tuple(jnp.asarray(x, jnp.float64) for x in xs)


def _unit_norm(a):
    return a / np.linalg.norm(a, 2)


def _grid(n, rng):
    u = np.zeros((n, n))
    u[0], u[-1], u[:, 0] = 1.0, rng.uniform(size=n), 0.5
    return u


#: name: (fn, make_inputs(rng) -> float64 arrays, rtol). The benign suite at its own
#: sizes, then kernels large enough for a planned check other than Monte Carlo.
SUITE = {
    **{f"suite.{k}": (fn, lambda rng, make=make: _f64(*make(rng)), 1e-4)
       for k, (fn, make) in BENIGN.items()},
    "matpow8": (K.matpow8, lambda rng: _f64(_unit_norm(rng.normal(size=(256, 256)))),
                1e-3),
    "mlp4": (K.mlp4, lambda rng: _f64(rng.normal(size=(256, 256)), *(
        rng.normal(size=(256, 256)) / 16 for _ in range(4))), 1e-3),
    "elementwise": (K.gauss, lambda rng: _f64(rng.uniform(-2, 2, 2 ** 18)), 1e-3),
    "kepler": (K.kepler, lambda rng: _f64(rng.uniform(0, 2 * np.pi, 2 ** 16),
                                          np.full(2 ** 16, 0.3)), 1e-4),
    "lorenz_rk4": (K.lorenz_rk4, lambda rng: _f64(rng.normal(size=(8192, 3)) * 5
                                                  + [0.0, 0.0, 25.0]), 1e-3),
    "jacobi": (K.jacobi_sweeps, lambda rng: _f64(_grid(256, rng),
                                                 rng.normal(size=(256, 256)) * 1e-3), 1e-4),
    "trapezoid": (K.trapezoid, lambda rng: _f64(rng.uniform(0.1, 10.0, 256)), 1e-3),
    "sin_mean": (K.sin_mean, lambda rng: _f64(rng.normal(size=2 ** 18)), 1e-3),
}


def default_estimate(name, fn, make, rtol, seeds):
    """Per seed: (check, estimate, true error, u) of the float32 rung, checked as the
    plan checks it."""
    from adaptprec import _plan
    rows = []
    for s in range(seeds):
        xs = make(np.random.default_rng(s))
        f = ap.adaptive(fn, ladder="f32,f64", rtol=rtol)
        _, rep = jax.jit(f.with_report)(*xs)
        prog = next(iter(f.manager._cache.values())).program
        check = rep.checks[0]
        if check == "skipped":      # the check it would have had
            avals = tuple(jax.ShapeDtypeStruct(x.shape, x.dtype) for x in xs)
            methods = _plan.check_order(prog._structure(avals), False)
            plan = _plan.choose_plan(2, tuple(f.manager.ladder), rtol, prog._rung_fn,
                                     prog._check_fn, avals, methods=methods,
                                     p_fail=(0.0, 0.0))
            check = plan.check[0] or "mca"
        if check in (None, "", "mca"):
            check = "mca"
        out, _, digits = jax.jit(prog._check_fn(0, None if check == "mca" else check))(*xs)
        y = np.asarray(out[0], np.float64)
        rows.append((check, 10.0 ** -float(digits), rel_error(y, reference(fn, xs)),
                     unit_roundoff(jnp.float32)))
    return rows


def run_default(seeds):
    print(f"the default estimate of the float32 rung, {seeds} seeds (inputs drawn anew); "
          f"load {os.getloadavg()[0]:.1f}")
    print("| kernel | rtol | check | true error | est/true (min-max) | "
          "est/max(true,u) (min-max) |")
    print("|---|---|---|---|---|---|")
    ratios, floored = [], []
    for name, (fn, make, rtol) in SUITE.items():
        rows = default_estimate(name, fn, make, rtol, seeds)
        r = [e / t for _, e, t, _ in rows if t > 0]
        fl = [e / max(t, u) for _, e, t, u in rows]
        ratios += r
        floored += fl
        checks = "/".join(sorted({c for c, *_ in rows}))
        true = [t for _, _, t, _ in rows]

        def span(v):
            return f"{min(v):.2g}-{max(v):.2g}" if v else "-"
        print(f"| {name} | {rtol:g} | {checks} | {min(true):.2g}-{max(true):.2g} | "
              f"{span(r)} | {span(fl)} |", flush=True)

    def summary(v, what):
        v = np.asarray(v)
        within3 = np.mean((v >= 1 / 3) & (v <= 3))
        print(f"{what}: median {np.median(v):.2g}, within 3x {within3:.0%}, "
              f"range {v.min():.2g}-{v.max():.2g} (targets: within 3x, worst within 10x)")
    summary(ratios, "estimate/true")
    summary(floored, "estimate/max(true, u)")


def run(name, fn, make, rung, rtol, seeds, samples, check="mca", safety=2.0):
    """One row: ``(misses, false alarms)`` of ``guards.accuracy(rtol, samples,
    safety=safety)`` over the seeds."""
    g = guards.accuracy(rtol, samples, safety=safety)
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

    print(f"| {name} | {rung} | {rtol:g} | {safety:g} | {fired}/{seeds} | {misses} | "
          f"{alarms} | "
          f"{span(ratios)} | {span(floored)} |")
    return misses, alarms


def run_rates(args):
    safeties = [float(x) for x in args.safety.split(",")] if args.check == "mca" else [2.0]
    print(f"check={args.check}, samples={args.samples}, seeds={args.seeds}, "
          f"load {os.getloadavg()[0]:.1f}")
    print("| kernel | rung | rtol | safety | fired | misses | false alarms | "
          "min est/true | max est/true | min est/max(true,u) | max est/max(true,u) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    tot = {s: [0, 0] for s in safeties}
    for suite in (FAILING, BENIGN):
        for name, (fn, make) in suite.items():
            for rung, rtol in RUNGS:
                for safety in safeties:
                    m, a = run(name, fn, make, rung, rtol, args.seeds, args.samples,
                               args.check, safety)
                    tot[safety][0] += m
                    tot[safety][1] += a
    for safety, (m, a) in tot.items():
        print(f"safety {safety:g}: total misses {m}, total false alarms {a}")


def main():
    ap_ = argparse.ArgumentParser()
    ap_.add_argument("--seeds", type=int, default=None)
    ap_.add_argument("--samples", type=int, default=2)
    ap_.add_argument("--safety", default="2",
                     help="--check mca: the Monte Carlo safety factors to compare, e.g. "
                          "1,1.5,2 (each a row per kernel and rung)")
    ap_.add_argument("--check", default="default",
                     choices=("default", "mca", "first_order"))
    args = ap_.parse_args()
    if args.check == "default":
        run_default(args.seeds or 6)
    else:
        args.seeds = args.seeds or 12
        run_rates(args)


if __name__ == "__main__":
    main()
