"""Mixed-precision solve vs float64 LU (jnp.linalg.solve and scipy.linalg.solve), one run.

For each n (random Gaussian A, one right-hand side) the same run times, jitted and
interleaved (best of ``--repeats``):

* ``f64``: ``jnp.linalg.solve`` in float64, and ``scipy.linalg.solve`` (LAPACK ``dgesv``
  through scipy, default arguments);
* ``default``: ``x, info = ap.linalg.solve(A, b)`` under ``jit`` returning x *and* the full
  ``SolveInfo`` — the call issue 16's targets are about. Its condition estimate is
  deferred (``estimate_cond="lazy"``): the info carries the float32 factors and the
  estimate's four single-column solves run when ``info.cond_estimate`` is read;
* ``+cond``: the same call with ``info.cond_estimate`` read inside the ``jit`` (what a
  caller who looks at the estimate pays);
* ``x only``: ``jit(lambda A, b: ap.linalg.solve(A, b)[0])``;
* the float32 and float64 LU alone (LAPACK getrf, no copies: the bound on any speed-up).

and reports speed-ups as ratios, the backward errors of all answers, and process CPU-time
ratios as a second opinion (the machine is shared; wall time includes waiting for a core).
Then: SPD systems (``assume_a="pos"``) against ``jax.scipy.linalg.cho_solve`` in float64,
the half-precision factor paths on this CPU (``factor="bf16"``, GMRES-IR; LAPACK on the
rounded matrix, and the blocked tensor-core LU that accelerators use), and a condition
sweep at ``--sweep-n`` showing where refinement stops paying off.

Targets (issue 16), default call with full info, float64-level backward error:
>= 1.25x at n = 2048 and >= 1.5x at n = 4096 over jnp.linalg.solve (float64).

Run:  python benchmarks/bench_linalg.py                 (about 5 minutes on an idle machine)
      python benchmarks/bench_linalg.py --sizes 512 1024 --sweep-n 0 --no-extras  (quick)
      python benchmarks/bench_linalg.py --sizes 8192 --repeats 3 --sweep-n 0 --no-extras
      (n = 8192 is not in the default list: 0.5 GB per float64 matrix and ~6 s per
      float64 LU here, so it takes minutes on its own)
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import time

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import jax.scipy.linalg as jsl  # noqa: E402
import numpy as np  # noqa: E402
import scipy.linalg  # noqa: E402

import adaptprec as ap  # noqa: E402

from adaptprec.linalg._getrf import lu_factor_transposed  # noqa: E402

solve_mod = importlib.import_module("adaptprec.linalg.solve")


def eta(A, x, b):
    r = np.abs(b - A @ x).max()
    return float(r / (np.abs(A).sum(1).max() * np.abs(x).max() + np.abs(b).max()))


def best_times(fns, args, repeats):
    """Interleaved timing: min wall time and min process CPU time over repeats for each
    fn (compile and warm-up excluded)."""
    for f in fns:
        jax.block_until_ready(f(*args))
    wall = [np.inf] * len(fns)
    cpu = [np.inf] * len(fns)
    for _ in range(repeats):
        for i, f in enumerate(fns):
            c0, t0 = time.process_time(), time.perf_counter()
            jax.block_until_ready(f(*args))
            wall[i] = min(wall[i], time.perf_counter() - t0)
            cpu[i] = min(cpu[i], time.process_time() - c0)
    return wall, cpu


ref_solve = jax.jit(jnp.linalg.solve)
ours_full = jax.jit(lambda A, b: ap.linalg.solve(A, b))           # x and full SolveInfo


@jax.jit
def ours_cond(A, b):
    """The default call with the deferred condition estimate read inside the jit."""
    x, info = ap.linalg.solve(A, b)
    return x, info, info.cond_estimate


ours_x = jax.jit(lambda A, b: ap.linalg.solve(A, b)[0])           # x only
ours_gmres = jax.jit(lambda A, b: ap.linalg.solve(A, b, refine="gmres"))
lu32 = jax.jit(lambda A: lu_factor_transposed(A.astype(jnp.float32)[None])[0])
lu64 = jax.jit(lambda A: lu_factor_transposed(A[None])[0])


def scipy_solve(A, b):
    return scipy.linalg.solve(A, b)


def size_table(sizes, repeats):
    print("\n== default call vs float64 LU, random Gaussian A, 1 rhs (best of "
          f"{repeats}) ==")
    print(f"{'n':>5} {'jnp f64':>9} {'scipy':>9} {'default':>9} {'+cond':>9} {'x only':>9} "
          f"{'vs jnp':>7} {'vs scipy':>8} {'+cond':>6} {'x only':>7} {'cpu':>6} {'iters':>5} "
          f"{'eta jnp':>8} {'eta scipy':>9} {'eta ours':>8} {'LU64/32':>7}")
    rows = []
    for n in sizes:
        rng = np.random.default_rng(n)
        A = rng.standard_normal((n, n))
        b = rng.standard_normal(n)
        Aj, bj = jnp.asarray(A), jnp.asarray(b)
        reps = repeats if n <= 4096 else max(2, repeats // 2)
        # scipy takes numpy arrays: timed in the same interleaved loop
        jobs = [(ref_solve, (Aj, bj)), (ours_full, (Aj, bj)), (ours_x, (Aj, bj)),
                (lu32, (Aj,)), (lu64, (Aj,)), (scipy_solve, (A, b)), (ours_cond, (Aj, bj))]
        for f, a in jobs:
            jax.block_until_ready(f(*a))
        wall = [np.inf] * len(jobs)
        cpu = [np.inf] * len(jobs)
        for _ in range(reps):
            for i, (f, a) in enumerate(jobs):
                c0, t0 = time.process_time(), time.perf_counter()
                jax.block_until_ready(f(*a))
                wall[i] = min(wall[i], time.perf_counter() - t0)
                cpu[i] = min(cpu[i], time.process_time() - c0)
        t_ref, t_full, t_x, t32, t64, t_sp, t_cond = wall
        x, info = ours_full(Aj, bj)
        e_ref = eta(A, np.asarray(ref_solve(Aj, bj)), b)
        e_sp = eta(A, scipy_solve(A, b), b)
        e_ours = eta(A, np.asarray(x), b)
        cpu_ratio = cpu[0] / cpu[1]
        print(f"{n:>5} {t_ref * 1e3:>7.1f}ms {t_sp * 1e3:>7.1f}ms {t_full * 1e3:>7.1f}ms "
              f"{t_cond * 1e3:>7.1f}ms {t_x * 1e3:>7.1f}ms {t_ref / t_full:>6.2f}x "
              f"{t_sp / t_full:>7.2f}x {t_ref / t_cond:>5.2f}x "
              f"{t_ref / t_x:>6.2f}x {cpu_ratio:>5.2f}x {int(info.iterations):>5} "
              f"{e_ref:>8.1e} {e_sp:>9.1e} {e_ours:>8.1e} {t64 / t32:>6.2f}x", flush=True)
        rows.append((n, t_ref / t_full, cpu_ratio, e_ours, bool(info.fell_back),
                     int(info.status), t_ref / t_cond))
    print("default: jit(lambda A, b: ap.linalg.solve(A, b)) returning x and SolveInfo "
          "(condition estimate deferred: the info carries the f32 factors); vs jnp / vs "
          "scipy: speed-up of the default call; +cond: speed-up when info.cond_estimate is "
          "also read inside the jit; x only: speed-up when only x is returned; cpu: "
          "process-CPU-time ratio jnp f64 / default; LU64/32: float64 LU time / float32 LU "
          "time (LAPACK getrf alone, the ceiling).")
    return rows


def spd_table(n, repeats):
    print(f"\n== SPD, assume_a='pos' (Cholesky + refinement, dsposv) at n = {n} ==")
    rng = np.random.default_rng(n + 1)
    G = rng.standard_normal((n, n))
    A = G @ G.T / n + np.eye(n)
    b = rng.standard_normal(n)
    Aj, bj = jnp.asarray(A), jnp.asarray(b)
    cho = jax.jit(lambda A, b: jsl.cho_solve(jsl.cho_factor(A), b))
    pos = jax.jit(lambda A, b: ap.linalg.solve(A, b, assume_a="pos"))
    (t_cho, t_pos, t_gen), _ = best_times([cho, pos, ours_full], (Aj, bj), repeats)
    x, info = pos(Aj, bj)
    print(f"cho_solve f64 {t_cho * 1e3:.1f} ms; ours pos {t_pos * 1e3:.1f} ms "
          f"({t_cho / t_pos:.2f}x); ours gen on the same A {t_gen * 1e3:.1f} ms; iters "
          f"{int(info.iterations)}, eta ours {eta(A, np.asarray(x), b):.1e}, eta cho "
          f"{eta(A, np.asarray(cho(Aj, bj)), b):.1e}", flush=True)


def half_table(n, repeats):
    print(f"\n== half-precision factors on this CPU at n = {n} (kappa ~ Gaussian) ==")
    rng = np.random.default_rng(n + 2)
    A = rng.standard_normal((n, n))
    b = rng.standard_normal(n)
    Aj, bj = jnp.asarray(A), jnp.asarray(b)
    rounded = jax.jit(lambda A, b: ap.linalg.solve(A, b, factor="bf16", refine="gmres"))
    saved = solve_mod._backend
    solve_mod._backend = lambda: "gpu"          # trace the accelerator path on CPU
    try:
        blocked = jax.jit(lambda A, b: ap.linalg.solve(A, b, factor="bf16",
                                                        refine="gmres"))
        jax.block_until_ready(blocked(Aj, bj))
    finally:
        solve_mod._backend = saved
    from adaptprec.linalg._blocked_lu import blocked_lu
    blu = jax.jit(lambda A: blocked_lu(A.astype(jnp.float32), low=jnp.bfloat16)[0])
    (t_ref, t_def, t_r, t_b), _ = best_times([ref_solve, ours_full, rounded, blocked],
                                             (Aj, bj), repeats)
    (t32, tb), _ = best_times([lu32, blu], (Aj,), repeats)
    for name, fn, t in (("default (f32 LU-IR)", ours_full, t_def),
                        ("bf16 rounded + LAPACK f32 LU, GMRES-IR", rounded, t_r),
                        ("bf16 blocked TC-LU, GMRES-IR", blocked, t_b)):
        x, info = fn(Aj, bj)
        print(f"{name:>40}: {t * 1e3:8.1f} ms ({t_ref / t:.2f}x vs jnp f64), iters "
              f"{int(info.iterations)}, fell_back {bool(info.fell_back)}, eta "
              f"{eta(A, np.asarray(x), b):.1e}", flush=True)
    print(f"factorization alone: LAPACK f32 LU {t32 * 1e3:.1f} ms, blocked bf16-GEMM LU "
          f"{tb * 1e3:.1f} ms ({tb / t32:.2f}x the f32 LU time)")


def trsv_table(sizes, repeats):
    """LAPACK single-column strsm vs the blocked panel solves of linalg/_trsv.py: k solve
    pairs M^T x = b chained in one program (k = 1, 4), per-pair cost and one-time cost."""
    from jax import lax

    from adaptprec.linalg._common import lu_solve
    from adaptprec.linalg._trsv import make_panels, panel_solve
    print("\n== triangular solve pairs from float32 LU factors: LAPACK strsm vs panels ==")
    for n in sizes:
        rng = np.random.default_rng(n)
        lu, _, perm = lax.linalg.lu(jnp.asarray(rng.standard_normal((n, n)), jnp.float32))
        F = jnp.asarray(np.asarray(lu).T.copy())
        y = jnp.asarray(rng.standard_normal((n, 1)), jnp.float32)

        def prog(kind, k):
            def f(F, perm, y):
                if kind == "panels":
                    p = make_panels(F)

                    def solve(v):
                        return panel_solve(p, perm, v, transpose=True)
                else:
                    def solve(v):
                        return lu_solve(F.T, perm, v, transpose=True)
                for _ in range(k):
                    y = solve(y)
                    y = y / jnp.max(jnp.abs(y))
                return y
            return jax.jit(f)

        progs = [prog(kd, k) for kd in ("lapack", "panels") for k in (1, 4)]
        wall, cpu = best_times(progs, (F, perm, y), repeats)
        for i, kd in ((0, "lapack"), (2, "panels")):
            pair_w, pair_c = (wall[i + 1] - wall[i]) / 3, (cpu[i + 1] - cpu[i]) / 3
            print(f"n = {n:>5} {kd:>6}: per pair {pair_w * 1e3:6.2f} ms wall "
                  f"{pair_c * 1e3:6.2f} ms cpu; one-time {max(wall[i] - pair_w, 0) * 1e3:6.2f}"
                  f" ms wall {max(cpu[i] - pair_c, 0) * 1e3:6.2f} ms cpu", flush=True)


def kappa_sweep(n, repeats):
    print(f"\n== condition sweep at n = {n} (prescribed singular values 1 .. 1/kappa; "
          "default call, full info) ==")
    rng = np.random.default_rng(0)
    U, _ = np.linalg.qr(rng.standard_normal((n, n)))
    V, _ = np.linalg.qr(rng.standard_normal((n, n)))
    b = rng.standard_normal(n)
    bj = jnp.asarray(b)
    print(f"{'kappa':>7} {'refine':>6} {'speedup':>8} {'iters':>5} {'fell_back':>9} "
          f"{'eta ours':>9} {'eta f64':>9}")
    stop = {}
    for kappa in (1e0, 1e2, 1e4, 1e6, 1e7, 1e8, 1e10, 1e12):
        A = (U * np.logspace(0, -np.log10(kappa), n)) @ V.T
        Aj = jnp.asarray(A)
        (t_ref, t_lu, t_gm), _ = best_times([ref_solve, ours_full, ours_gmres], (Aj, bj),
                                            repeats)
        e_ref = eta(A, np.asarray(ref_solve(Aj, bj)), b)
        for name, fn, t in (("lu", ours_full, t_lu), ("gmres", ours_gmres, t_gm)):
            x, info = fn(Aj, bj)
            sp = t_ref / t
            print(f"{kappa:>7.0e} {name:>6} {sp:>7.2f}x {int(info.iterations):>5} "
                  f"{str(bool(info.fell_back)):>9} {eta(A, np.asarray(x), b):>9.1e} "
                  f"{e_ref:>9.1e}", flush=True)
            if name not in stop and (sp < 1.0 or bool(info.fell_back)):
                stop[name] = kappa
    for name in ("lu", "gmres"):
        where = f"kappa = {stop[name]:.0e}" if name in stop else "beyond kappa = 1e12"
        print(f"refine={name}: refinement stops paying off (slower than float64 LU, or "
              f"falls back) at {where}")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", type=int, nargs="+", default=[512, 1024, 2048, 4096])
    p.add_argument("--sweep-n", type=int, default=2048)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--no-extras", action="store_true", help="skip the SPD and half tables")
    p.add_argument("--extras-n", type=int, default=2048)
    p.add_argument("--trsv", action="store_true",
                   help="also time LAPACK strsm vs the blocked panel solves at --sizes")
    args = p.parse_args(argv)
    print(f"jax {jax.__version__}, backend {jax.default_backend()}, "
          f"{jax.local_device_count()} device(s), {os.cpu_count()} cpus; load average at "
          f"start {os.getloadavg()[0]:.1f} (timings are only meaningful on an idle machine)")
    t0 = time.perf_counter()
    rows = size_table(args.sizes, args.repeats)
    if args.trsv:
        trsv_table(args.sizes, max(args.repeats, 9))
    if not args.no_extras:
        spd_table(args.extras_n, args.repeats)
        half_table(args.extras_n, args.repeats)
    if args.sweep_n:
        kappa_sweep(args.sweep_n, args.repeats)
    print("\n== targets (default call, full info) ==")
    for n, sp, cpu_sp, e, fb, st, sp_cond in rows:
        target = {2048: 1.25, 4096: 1.5}.get(n)
        if target:
            ok = e < 1e-14 and not fb and st == int(ap.Status.CONVERGED)
            print(f"n = {n}: default call {sp:.2f}x wall "
                  f"({'met' if ok and sp >= target else 'MISSED'}), {cpu_sp:.2f}x cpu time; "
                  f"target {target}x, eta {e:.1e}; with info.cond_estimate read in the jit "
                  f"{sp_cond:.2f}x")
    print(f"load average at end {os.getloadavg()[0]:.1f}; total "
          f"{time.perf_counter() - t0:.0f} s. Reproduce: python benchmarks/bench_linalg.py "
          f"{' '.join(sys.argv[1:])}".rstrip())


if __name__ == "__main__":
    main()
