"""Benchmark: latency of the scipy drop-in entry points, as a scipy user meets it.

Every measurement runs in a FRESH Python process (no warm JIT caches), the libraries in
the same run, on the same machine, one after another:

(a) curve_fit of a 3-parameter exponential, x64 OFF (a scipy user's setup): ``import``
    (jax alone, then the library), first fit (120 points), a new length in the same
    bucket (125), new lengths in new buckets (157, 301), repeats (120 points again), a
    fresh lambda per call (median of 5); "repeat" (median of 30) and "repeat_min" on
    the fit's one program. adaptprec against scipy.optimize.curve_fit (NumPy model) and
    optimistix LevenbergMarquardt (jax model; float32 with x64 off).
(b) solve_nlsq_batch: 1000 fits, then 1001 and 1017 (same bucket), then 1600 (new
    bucket); scipy's curve_fit in a loop over 1000 fits for scale.
(c) NIST StRD (every problem with a model in tests/nist_problems.py, both starts, x64 on),
    total wall time INCLUDING compilation: adaptprec (default "adaptive") against
    optimistix LevenbergMarquardt (rtol=atol=1e-10), each in its own fresh process.
(d) (a) again for adaptprec with its own on-disk program cache (adaptprec/_disk_cache.py)
    in a temporary directory: "cache off" is (a) (``ADAPTPREC_CACHE_DIR=off``: the first
    fit ever on a machine), "filling" a first process with an empty cache, "warm" the
    minimum over two later fresh processes (the "first curve_fit <= 0.3 s" target is
    about this one), and warm again with jaxlib's own LAPACK start-up
    (``ADAPTPREC_FAST_LAPACK=0``). Also JAX's own persistent compilation cache
    (``JAX_COMPILATION_CACHE_DIR``, library cache off), without --quick.

(a) and (c) run with adaptprec's cache off, so they include compilation.

Bytecode: the children import every library from compiled bytecode (``.pyc``), as from an
installed wheel (pip compiles on install). With ``PYTHONDONTWRITEBYTECODE`` set and no
``__pycache__`` (a source checkout on some machines) every ``import adaptprec`` compiles
its ~100 source files again, 40-90 ms of the import row; so the children get a bytecode
cache in a temporary directory (``PYTHONPYCACHEPREFIX``), filled by one warm-up import
before anything is timed. ``--source-import`` measures the old way (no bytecode cache).

(f) ``--new-model`` (only this): calls 2-12 of a 4-parameter logistic (24 points, x64 off)
    in a fresh process with the program cache empty, off, holding another model's
    program, and holding this model's; against scipy in the same process.
(g) ``--repeat`` (only this): the steady repeat of (f)'s fit and of a decay on 1,000
    points, 8 rounds of 25 adaptprec then 25 scipy calls in one fresh process: wall
    medians and CPU means (under load the CPU figures are the steadier).
(e) ``--fresh-loop`` (only this): 100 curve_fit calls of a 4PL fit (12 points, with
    bounds and without, new data each call) in a fresh process with an EMPTY adaptprec
    cache, against scipy: the first call, then calls 2-100 together (<= 3x
    scipy's 99 calls). scipy runs in its own fresh process and again in adaptprec's,
    after it (the ratio under the same load).

Run:  python benchmarks/bench_latency.py [--quick] [--fresh-loop]
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


# ----------------------------------------------------------------------------- children
def _curve_child(lib: str, reps: int) -> dict:
    out = {}
    t0 = time.perf_counter()
    import jax  # noqa: F401
    import numpy as np

    out["import_jax"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    if lib == "adaptprec":
        import jax.numpy as jnp

        import adaptprec as ap

        def model(t, a, k, c):
            return a * jnp.exp(-k * t) + c

        def fit(t, y, f=model):
            return ap.curve_fit(f, t, y, p0=[1.0, 1.0, 0.0])[0]

        def fresh(t, y):
            return fit(t, y, lambda t, a, k, c: a * jnp.exp(-k * t) + c)
    elif lib == "scipy":
        import scipy.optimize as so

        def model(t, a, k, c):
            return a * np.exp(-k * t) + c

        def fit(t, y, f=model):
            return so.curve_fit(f, t, y, p0=[1.0, 1.0, 0.0])[0]

        def fresh(t, y):
            return fit(t, y, lambda t, a, k, c: a * np.exp(-k * t) + c)
    else:
        import jax.numpy as jnp
        import optimistix as optx

        solver = optx.LevenbergMarquardt(rtol=1e-8, atol=1e-8)

        def resid(p, args):
            t, y = args
            return p[0] * jnp.exp(-p[1] * t) + p[2] - y

        def fit(t, y, f=resid):
            sol = optx.least_squares(f, solver, jnp.asarray([1.0, 1.0, 0.0]),
                                     args=(jnp.asarray(t), jnp.asarray(y)), throw=False)
            return np.asarray(sol.value)

        def fresh(t, y):
            return fit(t, y, lambda p, a: p[0] * jnp.exp(-p[1] * a[0]) + p[2] - a[1])
    out["import_lib"] = time.perf_counter() - t0

    def data(m):
        rng = np.random.default_rng(m)
        t = np.linspace(0.0, 4.0, m)
        return t, 2.5 * np.exp(-1.3 * t) + 0.5 + 0.01 * rng.standard_normal(m)

    def timed(fn, *a):
        t0 = time.perf_counter()
        r = fn(*a)
        return time.perf_counter() - t0, r

    out["first_fit"], popt = timed(fit, *data(120))
    out["popt_dtype"] = str(np.asarray(popt).dtype)
    for m in (125, 157, 301):
        out[f"new_length_{m}"], _ = timed(fit, *data(m))
    t, y = data(120)
    for _ in range(3):
        fit(t, y)
    times = [timed(fit, t, y)[0] for _ in range(max(reps, 20))]
    out["repeat"] = float(np.median(times))
    out["repeat_min"] = float(np.min(times))
    out["fresh_lambda"] = float(np.median([timed(fresh, t, y)[0] for _ in range(5)]))
    # steady state: new lengths in a bucket already compiled (121..127 -> 128)
    out["new_len_steady"] = float(np.median([timed(fit, *data(m))[0]
                                             for m in range(121, 128)]))
    return out


def _loop_child(lib: str, reps: int) -> dict:
    """``reps`` curve_fit calls of a 4PL dose-response fit (12
    concentrations, bounds, the textbook start; new noisy data every call, x64 off), each
    timed: the first call compiles (or loads from the cache), calls 2..reps are the loop
    a user runs over plates. ``lib`` ``"name:free"``: without bounds (scipy's lm)."""
    import numpy as np

    lib, _, variant = lib.partition(":")

    conc = np.logspace(-3, 2, 12)
    p0 = [0.0, 1.0, float(np.median(conc)), 1.0]
    bounds = ([-1, 0.1, 1e-4, 0], [1, 10, 1e3, 3])
    rng = np.random.default_rng(0)
    ys = [0.05 + 0.95 / (1 + (conc / 0.8) ** 1.2) + 0.02 * rng.standard_normal(12)
          for _ in range(reps)]
    t0 = time.perf_counter()
    if lib == "scipy":
        from scipy.optimize import curve_fit

        def f(x, bottom, hill, ec50, top):
            return top + (bottom - top) / (1.0 + (x / ec50) ** hill)
    else:
        import jax.numpy as jnp  # noqa: F401 - the model is written with jnp

        from adaptprec import curve_fit

        def f(x, bottom, hill, ec50, top):
            return top + (bottom - top) / (1.0 + (x / ec50) ** hill)
    t_import = time.perf_counter() - t0

    def loop(fit):
        times = []
        for y in ys:
            t = time.perf_counter()
            if variant == "free":
                fit(f, conc, y, p0=p0)
            else:
                fit(f, conc, y, p0=p0, bounds=bounds)
            times.append(time.perf_counter() - t)
        return times

    times = loop(curve_fit)
    out = {"import": t_import, "first": times[0], "calls_2_on": sum(times[1:]),
           "median_2_on": sorted(times[1:])[len(times) // 2], "times": times}
    if lib == "adaptprec":
        from adaptprec import _disk_cache

        st = _disk_cache.stats()
        out.update(compiles=st["compiles"], disk_loads=st["disk_hits"])
        # scipy's loop in this process too: the ratio under the same machine load (the
        # other process's is noisier)
        import scipy.optimize

        here = loop(scipy.optimize.curve_fit)   # (f has operators only: NumPy works)
        out["scipy_here_2_on"] = sum(here[1:])
    return out


def _newmodel_child(lib: str, reps: int) -> dict:
    """12 curve_fit calls of a 4-parameter logistic on 24 points (x64 off, new data each
    call), each timed, and scipy's 12 in the same process after them. ``lib``
    ``"adaptprec:other"`` fits a differently written model (another program)."""
    import numpy as np
    import scipy.optimize

    lib, _, variant = lib.partition(":")
    x = np.logspace(-2, 2, 24)
    rng = np.random.default_rng(1)
    ys = [0.1 + 0.9 / (1 + (x / 1.5) ** 1.2) + 0.01 * rng.standard_normal(24)
          for _ in range(reps)]
    p0 = [1.0, 1.0, 1.0, 0.0]
    if variant == "other":
        def f(x, a, b, c, d):
            return a + (d - a) * (x ** b) / (c ** b + x ** b)
    else:
        def f(x, a, b, c, d):
            return d + (a - d) / (1 + (x / c) ** b)
    from adaptprec import curve_fit

    def loop(fit):
        times = []
        for y in ys:
            t = time.perf_counter()
            fit(f, x, y, p0=p0)
            times.append(time.perf_counter() - t)
        return times

    ap_times, sp_times = loop(curve_fit), loop(scipy.optimize.curve_fit)
    return {"first": ap_times[0], "median_2_on": float(np.median(ap_times[1:])),
            "scipy_median_2_on": float(np.median(sp_times[1:]))}


def _repeat_child(fit: str, reps: int) -> dict:
    """``reps`` rounds of 25 repeat calls of adaptprec's then scipy's ``curve_fit`` (the
    (f) fit, or a 3-parameter decay on 1,000 points), new data each call, x64 off: wall
    medians and CPU means (``process_time``, XLA's threads included) per call."""
    import statistics

    import jax.numpy as jnp
    import numpy as np
    import scipy.optimize

    import adaptprec as ap

    if fit == "4pl":
        x = np.logspace(-2, 2, 24)
        rng = np.random.default_rng(1)
        ys = [0.1 + 0.9 / (1 + (x / 1.5) ** 1.2) + 0.01 * rng.standard_normal(24)
              for _ in range(50)]
        p0, models = [1.0, 1.0, 1.0, 0.0], [lambda x, a, b, c, d: d + (a - d) / (
            1 + (x / c) ** b)] * 2
    else:
        x = np.linspace(0.0, 4.0, 1000)
        rng = np.random.default_rng(0)
        ys = [2.5 * np.exp(-1.3 * x) + 0.5 + 0.01 * rng.standard_normal(1000)
              for _ in range(50)]
        p0, models = [1.0, 1.0, 0.0], [lambda t, a, k, c: a * jnp.exp(-k * t) + c,
                                       lambda t, a, k, c: a * np.exp(-k * t) + c]
    for y in ys[:5]:
        ap.curve_fit(models[0], x, y, p0=p0)
    times = {"ap": ([], []), "scipy": ([], [])}
    for _ in range(reps):
        for (name, w_c), fit_fn, model in zip(times.items(), (
                ap.curve_fit, scipy.optimize.curve_fit), models):
            for i in range(25):
                w0, c0 = time.perf_counter(), time.process_time()
                fit_fn(model, x, ys[i % 50], p0=p0)
                w_c[0].append(time.perf_counter() - w0)
                w_c[1].append(time.process_time() - c0)
    return {f"{k}_{stat}": f(v[i]) for k, v in times.items()
            for i, (stat, f) in enumerate((("wall", statistics.median),
                                           ("cpu", statistics.mean)))}


def repeat(reps: int = 8) -> None:
    """``--repeat``: the steady repeat against scipy in the same fresh process."""
    for fit in ("4pl", "decay1000"):
        r = _run("repeat", fit, reps)
        print(f"repeat {fit:10s} wall {_ms(r['ap_wall'])} scipy {_ms(r['scipy_wall'])} "
              f"ratio {r['ap_wall'] / r['scipy_wall']:.2f} | cpu {_ms(r['ap_cpu'])} scipy "
              f"{_ms(r['scipy_cpu'])} ratio {r['ap_cpu'] / r['scipy_cpu']:.2f} | load "
              f"{os.getloadavg()[0]:.2f}")


def new_model(reps: int = 12) -> None:
    """``--new-model``: calls 2-12 of a model in a fresh process, whatever the program
    cache holds: empty, off, filled by an earlier process with another model, and with
    this model (x64 off, 4-parameter logistic on 24 points; the issue-46 table)."""
    with tempfile.TemporaryDirectory() as d:
        rows = [("empty cache, the process's first model",
                 _run("newmodel", "adaptprec", reps, {"ADAPTPREC_CACHE_DIR": d})),
                ("cache off", _run("newmodel", "adaptprec", reps,
                                   {"ADAPTPREC_CACHE_DIR": "off"}))]
        with tempfile.TemporaryDirectory() as d2:
            _run("newmodel", "adaptprec:other", reps, {"ADAPTPREC_CACHE_DIR": d2})
            rows.append(("cache holding another model's program, a new model",
                         _run("newmodel", "adaptprec", reps, {"ADAPTPREC_CACHE_DIR": d2})))
        rows.append(("the same cache, a model seen before",
                     _run("newmodel", "adaptprec", reps, {"ADAPTPREC_CACHE_DIR": d})))
    print(f"(f) a new model: 4PL, 24 points, x64 off, fresh processes; ms; load "
          f"{os.getloadavg()[0]:.2f}")
    print(f"{'situation':55s}{'first':>9s}{'2-12':>9s}{'scipy':>9s}{'ratio':>7s}")
    for name, r in rows:
        print(f"{name:55s}{_ms(r['first']):>9s}{_ms(r['median_2_on']):>9s}"
              f"{_ms(r['scipy_median_2_on']):>9s}"
              f"{r['median_2_on'] / r['scipy_median_2_on']:7.2f}")


def fresh_loop(reps: int = 100) -> dict:
    """``--fresh-loop``: each library in its own fresh process, adaptprec with an empty
    program cache (``ADAPTPREC_CACHE_DIR`` a new temporary directory); the target is
    calls 2..100 together <= 3x scipy's."""
    out = {}
    for variant, what in (("", "bounds (trf)"), (":free", "no bounds (lm)")):
        with tempfile.TemporaryDirectory() as d:
            ap = _run("loop", "adaptprec" + variant, reps, {"ADAPTPREC_CACHE_DIR": d})
        sp = _run("loop", "scipy" + variant, reps)
        print(f"(e) 4PL curve_fit loop, {what}: {reps} calls, 12 points, fresh processes, "
              "x64 off, adaptprec's cache empty; ms")
        print(f"{'':14s}{'adaptprec':>12s}{'scipy':>12s}{'ratio':>8s}")
        for k in ("import", "first", "calls_2_on", "median_2_on"):
            print(f"{k:14s}{_ms(ap[k]):>12s}{_ms(sp[k]):>12s}{ap[k] / sp[k]:8.2f}")
        t = ap["times"]
        print("  adaptprec calls " + ", ".join(
            f"{lo + 1}-{hi}: {1e3 * sum(t[lo:hi]):.1f}"
            for lo, hi in ((1, 10), (10, 30), (30, 60), (60, reps))))
        print(f"  scipy's calls 2-{reps} in adaptprec's process (after it): "
              f"{_ms(ap['scipy_here_2_on']).strip()} ms; calls 2-{reps} ratio "
              f"{ap['calls_2_on'] / ap['scipy_here_2_on']:.2f}")
        print(f"  programs compiled: {ap['compiles']}, loaded from disk: "
              f"{ap['disk_loads']}; load average {os.getloadavg()[0]:.2f}\n")
        out[what] = {"adaptprec": ap, "scipy": sp}
    return out


def _batch_child(reps: int) -> dict:
    import jax.numpy as jnp
    import numpy as np
    import scipy.optimize as so

    import adaptprec as ap

    t = np.linspace(0.0, 1.0, 20)

    def model(p, t):
        return p[0] * jnp.exp(-p[1] * t)

    def run(B):
        k = np.linspace(0.5, 2.0, B)
        y = 3.0 * np.exp(-k[:, None] * t)
        t0 = time.perf_counter()
        r = ap.solve_nlsq_batch(model, np.ones((B, 2)), (t,), in_axes=None, ydata=y)
        dt = time.perf_counter() - t0
        assert np.allclose(r.x[:, 1], k, rtol=1e-6)
        return dt

    out = {f"batch_{B}": run(B) for B in (1000, 1001, 1017, 1600)}
    k = np.linspace(0.5, 2.0, 1000)
    t0 = time.perf_counter()
    for kk in k:
        so.curve_fit(lambda t, a, b: a * np.exp(-b * t), t, 3.0 * np.exp(-kk * t),
                     p0=[1.0, 1.0])
    out["scipy_loop_1000"] = time.perf_counter() - t0
    return out


def _nist_child(lib: str) -> dict:
    import jax

    jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp
    import numpy as np

    sys.path.insert(0, os.path.join(ROOT, "tests"))
    from nist_problems import load_all, lre

    problems = load_all()
    t0 = time.perf_counter()
    if lib == "adaptprec":
        import adaptprec as ap
    else:
        import optimistix as optx

        solver = optx.LevenbergMarquardt(rtol=1e-10, atol=1e-10)
    t_import = time.perf_counter() - t0
    scores, total = [], 0.0
    for p in problems:
        x, y = jnp.asarray(p.x), jnp.asarray(p.y)
        for s in p.starts:
            t0 = time.perf_counter()
            if lib == "adaptprec":
                xs = np.asarray(ap.solve_nlsq(p.residual, jnp.asarray(s), args=(x, y)).x)
            else:
                def fn(b, args, model=p.model):
                    return model(b, args[0]) - args[1]

                sol = optx.least_squares(fn, solver, jnp.asarray(s), args=(x, y),
                                         max_steps=2000, throw=False)
                xs = np.asarray(sol.value)
            total += time.perf_counter() - t0
            scores.append(float(lre(xs, p.certified)))
    return {"nist_total": total, "nist_import": t_import, "nist_solves": len(scores),
            "nist_problems": len(problems), "nist_lre_min": min(scores),
            "nist_lre_below_6": int(sum(s < 6 for s in scores))}


# ----------------------------------------------------------------------------- parent
_PYC: dict = {}   # env for the children: a bytecode cache (see the module docstring)


def _bytecode_env(source_import: bool) -> None:
    if source_import:
        return
    d = tempfile.mkdtemp(prefix="bench-pyc-")
    atexit.register(shutil.rmtree, d, True)
    _PYC.update(PYTHONPYCACHEPREFIX=d)
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=ROOT, **_PYC)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    subprocess.run([sys.executable, "-c", "import adaptprec, adaptprec.batch, optimistix, "
                    "scipy.optimize; from adaptprec import *"], env=env, check=True,
                   cwd=ROOT, timeout=600)


def _run(kind: str, lib: str, reps: int, env_extra: dict | None = None) -> dict:
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=ROOT, **_PYC)
    if _PYC:
        env.pop("PYTHONDONTWRITEBYTECODE", None)   # (even empty, it would count as set)
    env["JAX_ENABLE_X64"] = "1" if kind == "nist" else "0"
    env["ADAPTPREC_CACHE_DIR"] = "off"   # compile as the first fit ever; (d) turns it on
    env.update(env_extra or {})
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", kind, lib,
                           "--reps", str(reps)], env=env, capture_output=True, text=True,
                          timeout=3600, cwd=ROOT)
    if proc.returncode != 0:
        raise RuntimeError(f"{kind}/{lib} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _ms(v):
    # (two decimals below 10 ms: the repeat rows are tenths of a millisecond)
    return f"{1e3 * v:9.2f}" if abs(v) < 0.01 else f"{1e3 * v:9.1f}"


def main(argv=None):
    ap_ = argparse.ArgumentParser()
    ap_.add_argument("--quick", action="store_true", help="skip NIST and the cache runs")
    ap_.add_argument("--reps", type=int, default=30)
    ap_.add_argument("--child", nargs=2)
    ap_.add_argument("--source-import", action="store_true",
                     help="no bytecode cache for the children (imports compile sources)")
    ap_.add_argument("--new-model", action="store_true",
                     help="only (f): calls 2-12 of a model whatever the cache holds")
    ap_.add_argument("--repeat", action="store_true",
                     help="only (g): the steady repeat against scipy, CPU and wall time")
    ap_.add_argument("--fresh-loop", action="store_true",
                     help="only (e): 100 curve_fit calls of a 4PL fit in a fresh process "
                          "with an empty cache, against scipy")
    args = ap_.parse_args(argv)
    if args.child:
        kind, lib = args.child
        res = {"curve": lambda: _curve_child(lib, args.reps),
               "batch": lambda: _batch_child(args.reps),
               "nist": lambda: _nist_child(lib),
               "loop": lambda: _loop_child(lib, args.reps),
               "newmodel": lambda: _newmodel_child(lib, 12),
               "repeat": lambda: _repeat_child(lib, args.reps)}[kind]()
        print(json.dumps(res))
        return

    _bytecode_env(args.source_import)
    if args.fresh_loop:
        fresh_loop(100)
        return
    if args.new_model:
        new_model()
        return
    if args.repeat:
        repeat(8)
        return
    print("imports from " + ("sources (no bytecode cache)" if args.source_import else
                             "a bytecode cache (as an installed wheel)"))
    libs = ("adaptprec", "scipy", "optimistix")
    curve = {lib: _run("curve", lib, args.reps) for lib in libs}
    rows = ["import_jax", "import_lib", "first_fit", "new_length_125", "new_length_157",
            "new_length_301", "new_len_steady", "repeat", "repeat_min", "fresh_lambda"]
    print("(a) curve_fit, fresh processes, x64 off; times in ms")
    print(f"{'':16s}" + "".join(f"{lib:>12s}" for lib in libs) + f"{'ap/scipy':>10s}"
          + f"{'ap/optx':>10s}")
    for r in rows:
        v = [curve[lib][r] for lib in libs]
        print(f"{r:16s}" + "".join(f"{_ms(x):>12s}" for x in v)
              + f"{v[0] / v[1]:10.2f}{v[0] / v[2]:10.2f}")
    print("popt dtype: " + ", ".join(f"{lib} {curve[lib]['popt_dtype']}" for lib in libs))

    b = _run("batch", "adaptprec", args.reps)
    print("\n(b) solve_nlsq_batch, one fresh process, x64 off; times in ms")
    for k, v in b.items():
        print(f"{k:16s}{_ms(v)}")

    rows = ("import_lib", "first_fit", "new_length_125", "new_length_157", "new_length_301",
            "repeat_min")
    print("\n(d) adaptprec's own program cache (fresh processes, x64 off); ms")
    with tempfile.TemporaryDirectory() as d:
        env = {"ADAPTPREC_CACHE_DIR": d}
        fill = _run("curve", "adaptprec", 5, env)
        warm = [_run("curve", "adaptprec", 5, env) for _ in range(2)]
        # the same warm cache with jaxlib's own LAPACK start-up (it imports all of
        # scipy.linalg; adaptprec/_lapack_init.py loads two extension modules instead)
        slow_lapack = _run("curve", "adaptprec", 5, dict(env, ADAPTPREC_FAST_LAPACK="0"))
    print(f"{'':16s}{'cache off':>12s}{'filling':>12s}{'warm (min)':>12s}{'scipy':>12s}"
          f"{'warm/scipy':>12s}{'warm,slowLAPACK':>16s}")
    for r in rows:
        w = min(x[r] for x in warm)
        print(f"{r:16s}{_ms(curve['adaptprec'][r]):>12s}{_ms(fill[r]):>12s}{_ms(w):>12s}"
              f"{_ms(curve['scipy'][r]):>12s}{w / curve['scipy'][r]:12.2f}"
              f"{_ms(slow_lapack[r]):>16s}")
    over = [x["import_lib"] for x in (curve["adaptprec"], fill, *warm, slow_lapack)]
    print(f"import adaptprec over import jax, {len(over)} fresh processes: "
          f"{1e3 * min(over):.0f}-{1e3 * max(over):.0f} ms (import jax "
          f"{1e3 * curve['adaptprec']['import_jax']:.0f} ms in (a))")

    if args.quick:
        return
    print("\n(c) NIST StRD, both starts, x64 on, including compilation; fresh processes")
    nist = {lib: _run("nist", lib, args.reps) for lib in ("adaptprec", "optimistix")}
    for lib, v in nist.items():
        print(f"{lib:12s} total {v['nist_total']:7.2f} s over {v['nist_solves']} solves "
              f"({v['nist_problems']} problems); min LRE {v['nist_lre_min']:.1f}, "
              f"{v['nist_lre_below_6']} below 6")
    print(f"optimistix / adaptprec: "
          f"{nist['optimistix']['nist_total'] / nist['adaptprec']['nist_total']:.2f}x")

    print("\n(e) adaptprec with JAX's persistent compilation cache, library cache off, "
          "x64 off; ms")
    with tempfile.TemporaryDirectory() as d:
        env = {"JAX_COMPILATION_CACHE_DIR": d,
               "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
               "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0"}
        fill = _run("curve", "adaptprec", 5, env)
        warm = _run("curve", "adaptprec", 5, env)
    print(f"{'':16s}{'no cache':>12s}{'filling':>12s}{'cache warm':>12s}")
    for r in ("import_lib", "first_fit", "new_length_157", "new_length_301"):
        print(f"{r:16s}{_ms(curve['adaptprec'][r]):>12s}{_ms(fill[r]):>12s}"
              f"{_ms(warm[r]):>12s}")


if __name__ == "__main__":
    main()
