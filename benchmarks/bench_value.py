"""Does adaptivity pay? ``adaptive(fn, rtol)`` against plain f64 and the oracle plan.

Every kernel runs, in this one process after compilation, as

* ``call``: ``adaptive(fn, rtol)(*x)`` called eagerly on float64 inputs, what a user
  runs. It returns the output alone, so work that only fed the report is not computed
  (``MixedPrecisionManager.call``), while every check that decides an escalation runs;
  its Python dispatch is included;
* ``jit``: ``jax.jit(adaptive(fn, rtol))`` on the same inputs (a user's jitted program,
  traced before any eager call: no history, every planned rung and check runs);
* ``report``: ``jax.jit(adaptive(fn, rtol).with_report)``: the output *and* the report,
  every guard the plan runs computed (printed, not held to the targets: see below);
* plain ``jax.jit(fn)`` on the float64 inputs (``f64``) and on float32 inputs (``f32``,
  for reference);
* the **oracle**: the cheapest rung whose plain error meets rtol, measured. Each rung
  runs as ``jax.jit(lambda *x: fn(*x.astype(rung)).astype(float64))`` on the same
  float64 inputs (the casts a user with float64 data pays, as ``adaptive`` does, with no
  check); its error against float64 (normwise ``max|y - y64| / max|y64|``, or per
  element for a componentwise row) decides whether it qualifies. float64 always does.

interleaved round by round in a random order, medians compared (at least ``--rounds``
rounds; light kernels more, until plain f64 alone has taken ``--seconds``, at most 401).
For each kernel it prints the ratios to plain f64 and to the oracle, the rung returned,
the adaptive answer's true relative error (must be <= rtol) and the checks the plan chose,
then whether the targets are met (issue 44), for ``call`` and ``jit`` alike:

* adaptive <= 1.15x the oracle on every kernel, geometric mean <= 1.1;
* adaptive <= 1.25x plain f64 on every kernel, geometric mean <= 0.8;
* ``linalg.solve`` default <= 0.67x f64 at n = 2048 (``--solve``);
* ``--solvers``: ``solve_nlsq_batch`` default >= 2x the throughput of ``precision="f64"``
  on 1e5 2-D Gaussian fits, every parameter within 1e-3 of its f64 standard error;
  ``curve_fit`` default <= 0.7x ``precision="f64"`` time at m = 1e6, <= 1.25x at
  m = 1,000 (where it runs float64 alone).

The ``report`` column is printed beside them, not held to them: a report's exact finite
check of the top rung's output is one more read of that output, and XLA:CPU fuses no
reduction into the kernel that writes it, so a light memory-bound kernel planned f64
alone reports at ~1.3-1.7x plain f64.

Usage::

    python benchmarks/bench_value.py                 # the kernel table
    python benchmarks/bench_value.py --solve         # plus linalg.solve at n = 2048
    python benchmarks/bench_value.py --solvers       # solve_nlsq_batch, curve_fit vs f64
    python benchmarks/bench_value.py --solvers --batch-only   # solve_nlsq_batch alone
    python benchmarks/bench_value.py --rounds 15 --only mlp,elementwise
    python benchmarks/bench_value.py --throughput    # the cost model's CPU table
    python benchmarks/bench_value.py --gpu-paper     # plans under the GPU table (unmeasured)
    python benchmarks/bench_value.py --componentwise-rates   # plain f32 per entry, and the
                                                     # plan's a-priori chance of failing

Needs float64 (turned on here: a benchmark is an application).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

jax.config.update("jax_enable_x64", True)
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import adaptprec as ap  # noqa: E402
import accuracy_kernels as K  # noqa: E402

# ----------------------------------------------------------------------------- kernels


def mlp3(x, w1, w2, w3):
    h = jnp.tanh(x @ w1)
    h = jnp.tanh(h @ w2)
    return h @ w3


def elementwise(x):
    return jnp.exp(x) * jnp.cos(x) + jnp.log1p(x)


def reduction(x):
    return jnp.sum(jnp.sin(x)) / x.shape[0]


def attention(q, k, v):
    s = q @ k.T / math.sqrt(q.shape[-1])
    return jax.nn.softmax(s, axis=-1) @ v


def layernorm(x):
    return K.layernorm(x)


def conv(x, w):
    return jax.lax.conv_general_dilated(x, w, (1, 1), "SAME",
                                        dimension_numbers=("NHWC", "HWIO", "NHWC"))


def polynomial(x):
    c = [0.3, -1.2, 0.8, 2.0, -0.5, 0.1, 0.05, -0.01, 0.002]
    y = jnp.full_like(x, c[-1])
    for ci in c[-2::-1]:
        y = y * x + ci
    return y


def _f64(*xs):
    return tuple(np.asarray(x, np.float64) for x in xs)


def _grid(rng, n=512):
    """Boundary values of a Jacobi grid (interior 0)."""
    u = np.zeros((n, n))
    u[0], u[-1], u[:, 0], u[:, -1] = 1.0, rng.uniform(size=n), 0.5, 0.25
    return u


def _unit_norm(a):
    return a / np.linalg.norm(a, 2)


def _near_a_zero(p):
    """``p`` with its point nearest pi moved to pi + 1e-4, where the integral of cos(p x)
    over [0, 1] is ~3e-5: float32's error there is ~3e-3 of the value (componentwise)."""
    p = p.copy()
    p[np.argmin(np.abs(p - np.pi))] = np.pi + 1e-4
    return p


#: keyword arguments of ``adaptive`` per benchmark row (the default: none)
OPTIONS = {"trapezoid.cw": dict(componentwise=True)}


def kernels(rng):
    n = 2 ** 20
    s = 1 / math.sqrt(512)
    return {
        # name: (fn, inputs (float64), rtol, matmul_heavy)
        "mlp": (mlp3, _f64(rng.normal(size=(256, 512)), rng.normal(size=(512, 512)) * s,
                           rng.normal(size=(512, 512)) * s, rng.normal(size=(512, 512)) * s),
                1e-2, True),
        "elementwise": (elementwise, _f64(rng.uniform(0.0, 2.0, n)), 1e-3, False),
        "reduction": (reduction, _f64(rng.uniform(0.0, 2.0, n)), 1e-3, False),
        "attention": (attention, _f64(rng.normal(size=(1024, 64)), rng.normal(size=(1024, 64)),
                                      rng.normal(size=(1024, 64))), 1e-3, True),
        "layernorm": (layernorm, _f64(rng.normal(size=(2048, 512))), 1e-3, False),
        "conv": (conv, _f64(rng.normal(size=(8, 64, 64, 32)),
                            rng.normal(size=(3, 3, 32, 32)) / math.sqrt(288)), 1e-3, True),
        "polynomial": (polynomial, _f64(rng.uniform(-1.0, 1.0, n)), 1e-3, False),
        # the accuracy suite's kernels (tests/accuracy_kernels.py) at benchmark sizes
        "suite.gauss": (K.gauss, _f64(rng.uniform(-2, 2, n)), 1e-3, False),
        "suite.softplus": (K.softplus, _f64(rng.normal(size=n) * 3), 1e-3, False),
        "suite.mlp": (K.mlp, _f64(rng.normal(size=(4096, 32)), rng.normal(size=(32, 64)) / 6,
                                  rng.normal(size=64) * 0.1, rng.normal(size=(64, 8)) / 8),
                      1e-3, False),
        "suite.layernorm": (K.layernorm, _f64(rng.normal(size=(4096, 64))), 1e-3, False),
        "suite.cancellation": (K.cancellation, _f64(1e-3 * (1 + 0.1 * rng.random(n))),
                               1e-3, False),
        "suite.naive_variance": (K.naive_variance,
                                 _f64(1000.0 + np.sin(np.arange(n) + rng.random())),
                                 1e-3, False),
        "suite.quadratic": (K.quadratic, _f64(np.ones(n), 1e4 * (1 + rng.random(n)),
                                              np.ones(n)), 1e-3, False),
        "suite.count": (K.count, _f64(1.0 + 1e-3 * (1 + rng.random(n))), 1e-3, False),
        "suite.argmax": (K.argmax, _f64(rng.random(n)), 1e-3, False),
        "suite.overflow": (K.overflow, _f64(100.0 + rng.random(n)), 1e-3, False),
        # kernels users write (issue 44): loops, chained products, quadrature
        "lorenz_rk4": (K.lorenz_rk4, _f64(rng.normal(size=(65536, 3)) * 5.0
                                          + np.array([0.0, 0.0, 25.0])), 1e-3, False),
        "jacobi": (K.jacobi_sweeps, _f64(_grid(rng), rng.normal(size=(512, 512)) * 1e-3),
                   1e-4, False),
        "matpow8": (K.matpow8, _f64(_unit_norm(rng.normal(size=(512, 512)))), 1e-3, True),
        "ln_gelu_mlp": (K.ln_gelu_mlp, _f64(rng.normal(size=(512, 1024)),
                                            rng.normal(size=(1024, 1024)) / 32,
                                            rng.normal(size=(1024, 1024)) / 32), 1e-2, True),
        "trapezoid": (K.trapezoid, _f64(_near_a_zero(np.linspace(0.1, 10.0, 256))), 1e-3,
                      False),
        "trapezoid.cw": (K.trapezoid, _f64(_near_a_zero(np.linspace(0.1, 10.0, 256))),
                         1e-3, False),
        "sin_mean.normal": (K.sin_mean, _f64(rng.normal(size=n)), 1e-3, False),
        "kepler": (K.kepler, _f64(rng.uniform(0, 2 * np.pi, 2 ** 18),
                                  np.full(2 ** 18, 0.3)), 1e-4, False),
        "mlp4": (K.mlp4, _f64(rng.normal(size=(256, 512)),
                              *(rng.normal(size=(512, 512)) * s for _ in range(4))),
                 1e-3, True),
    }


# ----------------------------------------------------------------------------- timing


def _time(f, args):
    t = time.perf_counter()
    jax.block_until_ready(f(*args))
    return time.perf_counter() - t


def _rel_error(y, ref, componentwise=False):
    """Normwise ``max|y - ref| / max|ref|`` or, componentwise, ``max |y - ref| / |ref|``
    (discrete outputs: 0 when equal, else inf)."""
    y, ref = np.asarray(y), np.asarray(ref)
    if not np.issubdtype(ref.dtype, np.floating):
        return 0.0 if np.array_equal(y, ref) else math.inf
    d = np.abs(y.astype(np.float64) - ref)
    if componentwise:
        with np.errstate(divide="ignore", invalid="ignore"):
            r = np.where(d == 0, 0.0, d / np.abs(ref))
        return float(np.max(r))
    n = np.max(np.abs(ref))
    return 0.0 if np.max(d) == 0 else float(np.max(d) / n) if n else math.inf


def _rounds_for(rounds, seconds, f, args, cap=401):
    """``rounds``, raised so the f64 column alone takes at least ``seconds`` (at most
    ``cap``): a median of 21 rounds of a 0.3-1 ms kernel samples ~20 ms of a machine
    shared by other processes, and identical programs (an eager call planned f64 alone
    compiles to plain f64's program plus a scalar) measured 0.98-1.42x of each other."""
    t = min(_time(f, args) for _ in range(3))
    return int(min(cap, max(rounds, math.ceil(seconds / max(t, 1e-9)))))


def _at_rung(fn, dtype):
    """``fn`` on its float64 inputs cast to ``dtype``, the result cast back to float64:
    a plain rung with the casts ``adaptive`` pays on float64 data, and no check."""
    def run(*xs):
        out = fn(*(x.astype(dtype) for x in xs))
        return jax.tree_util.tree_map(
            lambda y: y.astype(jnp.float64) if jnp.issubdtype(y.dtype, jnp.floating) else y,
            out)
    return jax.jit(run)


def run_kernel(name, fn, inputs, rtol, rounds, seconds=0.0, options=None):
    options = options or {}
    componentwise = bool(options.get("componentwise"))
    x64 = tuple(jnp.asarray(x) for x in inputs)
    x32 = tuple(jnp.asarray(x, jnp.float32) for x in inputs)
    ad = ap.adaptive(fn, rtol=rtol, **options)
    t0 = time.perf_counter()
    adaptive_jit = jax.jit(ad.with_report)
    y, rep = adaptive_jit(*x64)
    jax.block_until_ready(y)
    compile_s = time.perf_counter() - t0
    plain = jax.jit(fn)
    ref = plain(*x64)
    plain(*x32)
    # traced before any eager call: a jitted program without this kernel's history (a
    # program traced after eager calls plans with what they showed, _outcomes.py)
    jitted = jax.jit(ad)
    np.testing.assert_array_equal(np.asarray(jitted(*x64)), np.asarray(y))
    y_call = ad(*x64)
    np.testing.assert_array_equal(np.asarray(y_call), np.asarray(y))  # the same answer
    runs = {"report": (adaptive_jit, x64), "call": (ad, x64), "jit": (jitted, x64),
            "f64": (plain, x64), "f32": (plain, x32)}
    # the oracle's candidates: the lower rungs whose plain error meets rtol
    errors = {}
    for rung in ("bf16", "f32"):
        prog = _at_rung(fn, jnp.bfloat16 if rung == "bf16" else jnp.float32)
        errors[rung] = _rel_error(prog(*x64), ref, componentwise)
        if errors[rung] <= rtol:
            runs["plain " + rung] = (prog, x64)
    rounds = _rounds_for(rounds, seconds, plain, x64)
    times = {k: [] for k in runs}
    order = np.random.default_rng(1)
    for _ in range(rounds):
        # a fresh order each round: under load the program run right after another
        # was measured up to 1.6x slower than an identical one
        for k in order.permutation(list(runs)):
            f, a = runs[k]
            times[k].append(_time(f, a))
    med = {k: float(np.median(v)) for k, v in times.items()}
    cands = {"f64": med["f64"]}
    cands.update({k[6:]: v for k, v in med.items() if k.startswith("plain ")})
    oracle = min(cands, key=cands.get)
    return dict(name=name, rung=rep.rung_name, ok=bool(rep.ok),
                err=_rel_error(y, ref, componentwise), rtol=rtol,
                mode="cw" if componentwise else "", ad=med["report"], call=med["call"],
                jit=med["jit"], f64=med["f64"], f32=med["f32"], oracle=oracle,
                oracle_t=cands[oracle], rung_errors=errors, plan=rep.checks,
                summary=rep.summary(), compile=compile_s, rounds=rounds)


def run_solve(rounds, n=2048):
    rng = np.random.default_rng(0)
    a = jnp.asarray(rng.normal(size=(n, n)) + n ** 0.5 * np.eye(n))
    b = jnp.asarray(rng.normal(size=n))
    ad = jax.jit(lambda a, b: ap.linalg.solve(a, b)[0])
    f64 = jax.jit(jnp.linalg.solve)
    ad(a, b).block_until_ready()
    f64(a, b).block_until_ready()
    ta, tf = [], []
    for _ in range(rounds):
        ta.append(_time(ad, (a, b)))
        tf.append(_time(f64, (a, b)))
    return float(np.median(ta)), float(np.median(tf))


# ------------------------------------------------------------------ solver rows (issue 31.3)
def _interleaved(fns, rounds):
    """Median wall time of each thunk, interleaved round by round (after one warm-up)."""
    for f in fns.values():
        jax.block_until_ready(f())
    times = {k: [] for k in fns}
    for _ in range(rounds):
        for k, f in fns.items():
            t0 = time.perf_counter()
            jax.block_until_ready(f())
            times[k].append(time.perf_counter() - t0)
    return {k: float(np.median(v)) for k, v in times.items()}


def run_solvers(rounds, fits=100_000, points=1_000_000, curve=True):
    """``solve_nlsq_batch`` on Gpufit's 2-D Gaussian and ``curve_fit`` of a double
    exponential, default (adaptive) against ``precision="f64"`` (and f32) in this process.
    The batch's agreement criterion: every parameter within 1e-3 of its f64 standard error."""
    from adaptprec._demos.batch import gauss2d, make_problem

    xy, data, _, x0 = make_problem(fits)
    kw = dict(args=(xy,), in_axes=None, ydata=data)
    batch = {p: (lambda p=p: ap.solve_nlsq_batch(gauss2d, x0, precision=p, **kw).x)
             for p in ("adaptive", "f64", "f32")}
    tb = _interleaved(batch, rounds)
    ad = ap.solve_nlsq_batch(gauss2d, x0, **kw)
    ref = ap.solve_nlsq_batch(gauss2d, x0, precision="f64", return_pcov=True, **kw)
    se = np.sqrt(np.diagonal(np.asarray(ref.pcov), axis1=1, axis2=2))
    worst = float(np.max(np.abs(np.asarray(ad.x) - np.asarray(ref.x)) / se))
    one = float(np.mean(np.asarray(ad.njev) - np.asarray(ad.nit) == 1))
    rows = [dict(name=f"solve_nlsq_batch {fits:.0e} fits", speed=tb["f64"] / tb["adaptive"],
                 target=2.0, note=f"fits/s adaptive {fits / tb['adaptive']:,.0f}, f64 "
                 f"{fits / tb['f64']:,.0f}, f32 {fits / tb['f32']:,.0f}; "
                 f"max |x - x64|/se {worst:.1e} (<= 1e-3); verified in one f64 "
                 f"evaluation: {one:.1%} of fits", ok=worst <= 1e-3)]
    if not curve:
        return rows

    def dexp(t, a1, k1, a2, k2, c):
        return a1 * jnp.exp(-k1 * t) + a2 * jnp.exp(-k2 * t) + c

    p0 = np.array([2.0, 1.0, 1.0, 0.1, 0.0])
    # m = 1,000: the small-problem rule runs float64 alone, so the default must cost what
    # precision="f64" costs (<= 1.25x); m = 1e6: float32 iterates, float64 verifies
    for m, target in ((1_000, 1.25), (points, 0.7)):
        rng = np.random.default_rng(0)
        t = jnp.asarray(np.linspace(0.0, 10.0, m))
        y = jnp.asarray(3.0 * np.exp(-1.7 * np.asarray(t)) + 1.2 * np.exp(
            -0.23 * np.asarray(t)) + 0.4 + 0.01 * rng.standard_normal(m))
        fit = {p: (lambda p=p, t=t, y=y: ap.curve_fit(dexp, t, y, p0=p0, precision=p)[0])
               for p in ("adaptive", "f64")}
        # (a fit at 1e6 is ~50 ms: all the rounds; at 1,000 ~2 ms: 20x as many)
        tc = _interleaved(fit, rounds if m > 10_000 else 20 * rounds)
        pa, pcov, info, _, _ = ap.curve_fit(dexp, t, y, p0=p0, full_output=True)
        pf, pcov64, info64, _, _ = ap.curve_fit(dexp, t, y, p0=p0, precision="f64",
                                                full_output=True)
        worst = float(np.max(np.abs(np.asarray(pa) - np.asarray(pf))
                             / np.sqrt(np.diag(pcov64))))
        # evaluations per rung (float64 verifies the hand-off, it does not iterate)
        per_rung = "/".join(str(int(v)) for v in np.asarray(info["result"].rung_nfev))
        rows.append(dict(name=f"curve_fit m = {m:,}", time=tc["adaptive"] / tc["f64"],
                         target=target, note=f"f64 {tc['f64'] * 1e3:.3g} ms; max |p - "
                         f"p64|/se {worst:.1e}; evaluations per rung {per_rung} (f64 "
                         f"alone {int(info64['result'].nfev)})", ok=worst <= 1e-3))
    return rows


def gpu_paper(ks):
    """The plan the cost model would choose with the GPU table (vendor peaks, unmeasured):
    the same programs priced by the GPU rates."""
    from adaptprec import _cost, _plan
    floor = _cost.FLOOR
    _cost.FLOOR = 5e-6      # a GPU launch is ~5 us
    try:
        print(f"{'kernel':22s} {'bf16/f64':>8s} {'f32/f64':>8s}  plan (GPU table, unmeasured)")
        table = _cost.throughput_for("gpu")
        for name, (fn, inputs, rtol, _) in ks.items():
            x64 = tuple(jnp.asarray(x) for x in inputs)
            ad = ap.adaptive(fn, rtol=rtol, **OPTIONS.get(name, {}))
            ad.with_report(*x64)
            prog = next(iter(ad.manager._cache.values())).program
            avals = tuple(jax.ShapeDtypeStruct(x.shape, x.dtype) for x in x64)
            cost = [_cost.program_cost(prog._rung_fn(k), avals, table).seconds
                    for k in range(3)]
            methods = _plan.check_order(prog._structure(avals),
                                        bool(OPTIONS.get(name, {}).get("componentwise")))
            plan = _plan.choose_plan(3, tuple(prog.mgr.ladder), rtol, prog._rung_fn,
                                     prog._check_fn, avals, backend="gpu", methods=methods)
            steps = ",".join((c or "mca") if a else "skipped"
                             for a, c in zip(plan.attempt, plan.check))
            print(f"{name:22s} {cost[0] / cost[2]:8.3f} {cost[1] / cost[2]:8.3f}  {steps}")
    finally:
        _cost.FLOOR = floor


#: per cost kind of adaptprec/_cost.py, an operation representative of it (on x in
#: [0.1, 1]), timed in fused chains of ``_CHAIN`` for the table's seconds per element
_KIND_OPS = {
    "cheap": lambda x: x * 1.0001 + 0.0001, "div": lambda x: 1.0 / (x + 0.5),
    "sqrt": lambda x: jnp.sqrt(x + 0.5), "exp": lambda x: jnp.exp(-x),
    "log": lambda x: jnp.log1p(x), "trig": lambda x: jnp.cos(x * 8.0),
    "tanh": jnp.tanh, "erf": jax.lax.erf, "pow": lambda x: x ** 0.7,
    "atan": lambda x: jnp.arctan2(x, 0.5),
}
_CHAIN = 8


#: The anchor of the measured table: float32 matmul flops per second on this machine,
#: measured quiet (docs/runtime.md, 1024^3: 91 GFLOP/s). Everything else is measured as
#: a ratio to a float32 matmul timed in the same rounds, so the table does not move with
#: the machine's load.
ANCHOR_DOT_F32 = 9e10


def throughput(rounds=31):
    """The cost model's CPU table (adaptprec/_cost.py), measured: seconds per element of
    each kind's operation in a fused chain (2^18 entries, in cache), matmul flop rates,
    the bandwidth of a streaming pass and a loop iteration's overhead. Each program is
    timed in interleaved rounds against a float32 matmul (1024^3); the median of the
    per-round ratios, times the matmul's quiet time (``ANCHOR_DOT_F32``), is the table's
    value: load scales both sides of a ratio alike."""
    rng = np.random.default_rng(0)
    n = 2 ** 18
    progs = {}
    for kind, op in _KIND_OPS.items():
        for dt in (jnp.float32, jnp.float64):
            def chain(x, op=op):
                for _ in range(_CHAIN):
                    x = op(x) * 0.5 + 0.3
                return x
            progs[(kind, jnp.dtype(dt).name)] = (jax.jit(chain), (jnp.asarray(
                rng.uniform(0.1, 1.0, n), dt),))
    for dt in (jnp.bfloat16, jnp.float32, jnp.float64):
        m = jnp.asarray(rng.normal(size=(1024, 1024)), dt)
        progs[("dot", jnp.dtype(dt).name)] = (jax.jit(lambda a: a @ a), (m,))
    big = jnp.asarray(rng.uniform(size=2 ** 24))
    progs[("stream", "float64")] = (jax.jit(lambda v: v * 2.0), (big,))
    progs[("loop", "")] = (jax.jit(lambda v: jax.lax.fori_loop(
        0, 20_000, lambda i, c: c * 0.999 + 0.001, v)), (jnp.ones(256),))
    ratios = {k: [] for k in progs}
    for f, a in progs.values():
        jax.block_until_ready(f(*a))
    anchor_f, anchor_a = progs[("dot", "float32")]
    for _ in range(rounds):
        ref = _time(anchor_f, anchor_a)
        for k, (f, a) in progs.items():
            ratios[k].append(_time(f, a) / ref)
    unit = 2 * 1024 ** 3 / ANCHOR_DOT_F32
    med = {k: float(np.median(v)) * unit for k, v in ratios.items()}
    per = {}
    for (kind, dt), t in med.items():
        if kind in _KIND_OPS:
            per[(kind, dt)] = t / (n * _CHAIN)
    for (kind, dt), t in list(per.items()):
        if kind != "cheap":     # the chain's own mul-add (a cheap op) is in every row
            per[(kind, dt)] = max(t - per[("cheap", dt)], 0.0)
    print(f"per_element seconds (f32, f64), anchored at {ANCHOR_DOT_F32:.3g} flop/s f32 "
          f"matmul (load {os.getloadavg()[0]:.1f}):")
    for kind in _KIND_OPS:
        print(f'    "{kind}": _rates({per[(kind, "float32")]:.2g}, '
              f'{per[(kind, "float64")]:.2g}),')
    for dt in ("bfloat16", "float32", "float64"):
        print(f"dot {dt}: {2 * 1024 ** 3 / med[('dot', dt)]:.3g} flop/s")
    print(f"bandwidth: {16 * 2 ** 24 / med[('stream', 'float64')]:.3g} bytes/s")
    print(f"loop_iteration: {med[('loop', '')] / 20_000:.2g} s")


def componentwise_rates(ks):
    """Per kernel: plain float32's normwise and componentwise error against float64, and
    the plan's a-priori chance that float32 fails a componentwise ``rtol``
    (``_plan.componentwise_fail_chance``: it prices the float32 rung of a componentwise
    plan)."""
    from adaptprec import _cost, _plan

    print("kernel | rtol | outputs | f32 normwise | f32 componentwise | a-priori chance")
    fails = meets = 0
    for name, (fn, inputs, rtol, _) in ks.items():
        ref = np.asarray(jax.jit(fn)(*inputs))
        if not np.issubdtype(ref.dtype, np.floating):
            continue
        y = np.asarray(jax.jit(lambda *x: fn(*(v.astype(jnp.float32) for v in x)))(*inputs))
        nw, cw = _rel_error(y, ref), _rel_error(y, ref, componentwise=True)
        n_acc = _cost.longest_accumulation(jax.make_jaxpr(fn)(*inputs).jaxpr)
        chance = _plan.componentwise_fail_chance(ref.size, ap.unit_roundoff("f32"), n_acc,
                                                 rtol)
        if nw <= rtol:
            meets += 1
            fails += cw > rtol
        print(f"{name} | {rtol:g} | {ref.size} | {nw:.1e} | {cw:.1e}"
              f"{' FAILS' if cw > rtol else ''} | {chance:.2f}")
    print(f"float32 meets rtol normwise on {meets} kernels; componentwise it fails on {fails}")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=9,
                   help="interleaved rounds per kernel (at least; see --seconds)")
    p.add_argument("--seconds", type=float, default=0.3,
                   help="light kernels get more rounds, up to 401, until plain f64 alone "
                        "takes this long (0: exactly --rounds)")
    p.add_argument("--only", default="")
    p.add_argument("--solve", action="store_true")
    p.add_argument("--solvers", action="store_true",
                   help="only the solver rows: solve_nlsq_batch (1e5 fits), curve_fit (m=1e6)")
    p.add_argument("--batch-only", action="store_true",
                   help="with --solvers: only the solve_nlsq_batch row")
    p.add_argument("--fits", type=int, default=100_000)
    p.add_argument("--throughput", action="store_true")
    p.add_argument("--gpu-paper", action="store_true",
                   help="print the plans the GPU throughput table would choose")
    p.add_argument("--verbose", action="store_true", help="print each report's summary")
    p.add_argument("--componentwise-rates", action="store_true",
                   help="plain float32's componentwise errors and the a-priori chances")
    args = p.parse_args()
    if args.throughput:
        throughput()
        return
    if args.solvers:
        print(f"solvers vs precision='f64', median of {args.rounds} interleaved rounds")
        fails = []
        for r in run_solvers(args.rounds, args.fits, curve=not args.batch_only):
            if "speed" in r:
                line, bad = (f"throughput x{r['speed']:.2f} f64 (target >= {r['target']})",
                             r["speed"] < r["target"])
            else:
                line, bad = (f"time {r['time']:.2f} x f64 (target <= {r['target']})",
                             r["time"] > r["target"])
            print(f"{r['name']}: {line}; {r['note']}", flush=True)
            if bad or not r["ok"]:
                fails.append(r["name"])
        print("targets met" if not fails else "targets NOT met: " + ", ".join(fails))
        return
    ks = kernels(np.random.default_rng(0))
    if args.only:
        ks = {k: v for k, v in ks.items() if k in args.only.split(",")}
    if args.componentwise_rates:
        componentwise_rates(ks)
        return
    if args.gpu_paper:
        gpu_paper(ks)
        return
    print(f"jax {jax.__version__}, backend {jax.default_backend()}, {os.cpu_count()} cpus; "
          f"median of >= {args.rounds} interleaved rounds (light kernels: until f64 "
          f"alone takes {args.seconds:g} s, at most 401; load {os.getloadavg()[0]:.1f})")
    print(f"{'kernel':20s} {'rtol':>8s} {'call/f64':>8s} {'jit/f64':>7s} {'report':>6s} "
          f"{'oracle':>6s} {'orc/f64':>7s} {'call/orc':>8s} {'jit/orc':>7s} {'rung':>4s} "
          f"{'err':>8s}  checks per rung")
    rows, fails = [], []
    for name, (fn, inputs, rtol, heavy) in ks.items():
        r = run_kernel(name, fn, inputs, rtol, args.rounds, args.seconds,
                       OPTIONS.get(name))
        r["heavy"] = heavy
        rows.append(r)
        f64 = r["f64"]
        print(f"{name:20s} {rtol:6.0e}{r['mode']:>2s} {r['call'] / f64:8.2f} "
              f"{r['jit'] / f64:7.2f} {r['ad'] / f64:6.2f} {r['oracle']:>6s} "
              f"{r['oracle_t'] / f64:7.2f} {r['call'] / r['oracle_t']:8.2f} "
              f"{r['jit'] / r['oracle_t']:7.2f} {r['rung']:>4s} {r['err']:8.1e}  "
              f"{','.join(r['plan'])}  (f64 {f64 * 1e3:.2f} ms, {r['rounds']} rounds; "
              f"plain bf16/f32 error {r['rung_errors']['bf16']:.1e}/"
              f"{r['rung_errors']['f32']:.1e})", flush=True)
        if args.verbose:
            print("    " + r["summary"])
        if r["err"] > rtol:
            fails.append(f"{name}: error {r['err']:.2g} > rtol {rtol:g}")
        for col in ("call", "jit"):
            if r[col] / f64 > 1.25:
                fails.append(f"{name}: {col}/f64 {r[col] / f64:.2f} > 1.25")
            if r[col] / r["oracle_t"] > 1.15:
                fails.append(f"{name}: {col}/oracle {r[col] / r['oracle_t']:.2f} > 1.15")
    for col, k in (("call", "call"), ("jit", "jit"), ("report", "ad")):
        g = math.exp(np.mean([math.log(r[k] / r["f64"]) for r in rows]))
        go = math.exp(np.mean([math.log(r[k] / r["oracle_t"]) for r in rows]))
        held = col != "report"
        print(f"geometric mean {col}/f64: {g:.2f}, {col}/oracle: {go:.2f}"
              + (" (targets <= 0.8, <= 1.1)" if held else
                 " (not a target: see the docstring of benchmarks/bench_value.py)"))
        if held and g > 0.8:
            fails.append(f"geometric mean {col}/f64 {g:.2f} > 0.8")
        if held and go > 1.1:
            fails.append(f"geometric mean {col}/oracle {go:.2f} > 1.1")
    og = math.exp(np.mean([math.log(r["oracle_t"] / r["f64"]) for r in rows]))
    print(f"geometric mean oracle/f64: {og:.2f}")
    over = [f"{r['name']} {r['ad'] / r['f64']:.2f}" for r in rows if r["ad"] / r["f64"] > 1.25]
    if over:
        print("report/f64 above 1.25 (its exact finite pass over the output): "
              + ", ".join(over))
    if args.solve:
        ta, tf = run_solve(max(3, args.rounds // 3))
        print(f"linalg.solve n=2048: default/f64 {ta / tf:.2f} (target <= 0.67)")
        if ta / tf > 0.67:
            fails.append(f"linalg.solve {ta / tf:.2f} > 0.67")
    print(f"load {os.getloadavg()[0]:.1f}")
    print("targets met" if not fails else "targets NOT met:\n  " + "\n  ".join(fails))


if __name__ == "__main__":
    main()
