"""The cost model that chooses an adaptive call's plan (which rungs to try, which check).

A plan "rung r + check" beats "go straight to the next attempted rung s" only when
``cost(r) + check(r) < cost(s) + check(s)``, i.e. the check costs less than the time the
cheaper rung saves. The model prices a program from XLA's cost analysis of its lowered
HLO (``jax.jit(f).lower(...).cost_analysis()``: flops and transcendentals) weighted by a
per-backend throughput table, with the contraction flops (``dot_general``/convolutions,
counted from the jaxpr) priced at the matmul rate of their dtype:

    time = dot_flops / DOT[dtype] + other_flops / ELEMENTWISE[dtype]
           + transcendentals / TRANSCENDENTAL[dtype]

Bytes are not priced: XLA's pre-fusion byte counts are not what a fused program moves,
and the elementwise rate already folds in this machine's bandwidth (f64 ~ half of f32).
A check's cost is the cost of the program "rung + check" minus the rung's own (XLA
shares the common subexpressions, so the difference is what the check adds).

Costs below ``FLOOR`` seconds are "free": a call pays a dispatch overhead of that order
anyway, so small kernels keep the thorough plan (every rung, Monte Carlo checks).

The CPU table was measured on this project's 2-core AVX512_BF16 machine (median of
repeats, one process: ``benchmarks/bench_value.py --throughput``); the GPU table is
vendor peak rates (H100 SXM data sheet), unmeasured, for the docs' on-paper plans.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import jax
import numpy as np

from . import _jaxpr as jx

__all__ = ["Throughput", "THROUGHPUT", "Cost", "program_cost", "throughput_for", "FLOOR",
           "measure", "measure_many", "MEASURE"]

#: Modelled seconds below which work is "free": an eager call's fixed overhead on CPU
#: (dispatch, the report's arrays) is ~30-100 us, so kernels whose rungs together model
#: below this keep the thorough plan, and a top-rung check below it always runs.
FLOOR = 5e-5

#: Above the floor, price the candidate programs by one-time measurement (compiled, run
#: on sample data, cached with the plan) instead of the throughput table. The table
#: still decides "small" and prices the Monte Carlo check (at least two evaluations one
#: dtype wider: never close on CPU, so it is not worth compiling to find out).
MEASURE = True


class Throughput(NamedTuple):
    """Operations per second by dtype name (``"bfloat16"``, ``"float32"``, ``"float64"``)."""

    dot: dict
    elementwise: dict
    transcendental: dict


THROUGHPUT = {
    # measured here (bench_value.py --throughput, loaded 2-core machine): matmul
    # 1024^3 165/91/35 GFLOP/s; a*x+b on 2^22 ~1.8/1.4-2/0.2-1 Gelem/s (noisy); exp 0.35
    # (f32) / 0.17 (f64) Gelem/s. bf16 elementwise is upcast by XLA:CPU: priced below f32.
    "cpu": Throughput(
        dot={"bfloat16": 1.2e11, "float16": 2e10, "float32": 9e10, "float64": 3.5e10},
        elementwise={"bfloat16": 1.0e9, "float16": 0.5e9, "float32": 2.0e9,
                     "float64": 1.0e9},
        transcendental={"bfloat16": 0.3e9, "float16": 0.2e9, "float32": 0.35e9,
                        "float64": 0.17e9}),
    # H100 SXM vendor peaks (dense tensor-core bf16 989 TFLOP/s, fp64 tensor 67, fp32
    # CUDA cores 67, HBM3 3.35 TB/s: elementwise at bandwidth, bytes per element), SFU
    # transcendentals ~1/4 of the fp32 rate; unmeasured.
    "gpu": Throughput(
        dot={"bfloat16": 9.9e14, "float16": 9.9e14, "float32": 6.7e13, "float64": 6.7e13},
        elementwise={"bfloat16": 3.35e12 / 2 / 2, "float16": 3.35e12 / 2 / 2,
                     "float32": 3.35e12 / 4 / 2, "float64": 3.35e12 / 8 / 2},
        transcendental={"bfloat16": 1.6e13, "float16": 1.6e13, "float32": 1.6e13,
                        "float64": 1e12}),
}


def throughput_for(backend: str | None = None) -> Throughput:
    """The table for ``backend`` (default: JAX's default backend; unknown ones use CPU's)."""
    backend = backend or jax.default_backend()
    return THROUGHPUT.get(backend, THROUGHPUT["gpu" if backend in ("cuda", "rocm")
                                               else "cpu"])


class Cost(NamedTuple):
    """Modelled work of one program: flops by class and the time it prices to."""

    dot_flops: float
    other_flops: float
    transcendentals: float
    seconds: float

    def __sub__(self, other: "Cost") -> "Cost":
        return Cost(*(max(a - b, 0.0) for a, b in zip(self, other)))


def _dtype_name(d) -> str:
    try:
        return np.dtype(d).name
    except TypeError:
        return "float32"


def _contraction_flops(jaxpr) -> dict:
    """Flops of dot_general/conv per output dtype name, counted from the jaxpr."""
    out: dict = {}
    for eqn in jx.iter_eqns(jaxpr):
        name = eqn.primitive.name
        if name == "dot_general":
            a, b = (v.aval for v in eqn.invars)
            (ca, _), _ = eqn.params["dimension_numbers"]
            k = math.prod(a.shape[d] for d in ca) if ca else 1
            y = eqn.outvars[0].aval
            f = 2.0 * math.prod(y.shape) * k
        elif name == "conv_general_dilated":
            k = eqn.invars[1].aval
            y = eqn.outvars[0].aval
            o = k.shape[eqn.params["dimension_numbers"].rhs_spec[0]]
            f = 2.0 * math.prod(y.shape) * math.prod(k.shape) / max(o, 1)
        else:
            continue
        dt = _dtype_name(eqn.invars[0].aval.dtype)
        out[dt] = out.get(dt, 0.0) + f
    return out


def program_cost(fn: Callable, avals, table: Throughput, dtype) -> Cost:
    """Price ``fn(*avals)`` (``avals``: ShapeDtypeStructs) at the rung ``dtype``.

    Elementwise and transcendental work is priced at ``dtype``'s rates (the program's
    own floating dtype); contractions at their operands' dtype.
    """
    dtype = _dtype_name(dtype)
    lowered = jax.jit(fn).lower(*avals)
    ca = lowered.cost_analysis() or {}
    if isinstance(ca, (list, tuple)):
        ca = ca[0] if ca else {}
    flops = float(ca.get("flops", 0.0))
    trans = float(ca.get("transcendentals", 0.0))
    contraction = _contraction_flops(jax.make_jaxpr(fn)(*avals).jaxpr)
    dot_flops = sum(contraction.values())
    other = max(flops - dot_flops, 0.0)
    seconds = (sum(f / table.dot.get(d, table.dot["float32"]) for d, f in contraction.items())
               + other / table.elementwise.get(dtype, table.elementwise["float32"])
               + trans / table.transcendental.get(dtype, table.transcendental["float32"]))
    return Cost(dot_flops, other, trans, seconds)


def _sample_inputs(avals, seed: int = 0):
    rng = np.random.default_rng(seed)
    out = []
    for a in avals:
        dt = np.dtype(a.dtype)
        if np.issubdtype(dt, np.floating) or dt.name == "bfloat16":
            out.append(rng.uniform(0.5, 1.5, a.shape).astype(dt))
        elif dt == np.bool_:
            out.append(np.zeros(a.shape, dt))
        else:
            out.append(np.ones(a.shape, dt))
    return out


def measure(fn: Callable, avals, repeats: int = 5) -> float:
    """Seconds of one call of compiled ``fn`` on sample data (the minimum of
    ``repeats`` after a warm-up: on a loaded machine the minimum is the least noisy)."""
    return measure_many([fn], avals, repeats)[0]


def measure_many(fns, avals, repeats: int = 7, budget: float = 0.3,
                 max_repeats: int = 31, cache: dict | None = None) -> list:
    """Seconds of one call of each compiled ``fns[i]`` on the same sample data
    (``repeats`` rounds at least, more up to ``max_repeats`` while they fit ``budget``).

    The programs are timed round by round (interleaved), so a burst of load on a shared
    machine hits them alike, and each is priced relative to the last: ``min`` of the last
    program's times, times the *median* over rounds of ``t_i / t_last``. Ratios are what
    a plan compares; timed one after the other and by their minima, a plan flipped from
    run to run on the loaded 2-core machine. ``cache``: a dict reused across
    calls so a program timed again is compiled once.
    """
    import time

    def compile_(f):
        # ``cache``: id(f) -> (f, executable), shared by one plan's timings (a program
        # timed again is not compiled again; f is kept so its id stays its own)
        hit = None if cache is None else cache.get(id(f))
        if hit is not None and hit[0] is f:
            return hit[1]
        exe = jax.jit(f).lower(*avals).compile()
        if cache is not None:
            cache[id(f)] = (f, exe)
        return exe

    compiled = [compile_(f) for f in fns]
    # concrete even when the plan is chosen while an outer function is being traced
    with jax.ensure_compile_time_eval():
        args = [jax.device_put(x) for x in _sample_inputs(avals)]
        t = time.perf_counter()
        for c in compiled:
            jax.block_until_ready(c(*args))
        # more rounds when they are cheap (up to ``budget`` seconds): a median of few
        # ratios still flipped the MLP's plan under load
        one = time.perf_counter() - t
        repeats = int(min(max(repeats, budget / max(one, 1e-9)), max_repeats))
        times = np.empty((repeats, len(compiled)))
        for r in range(repeats):
            for i, c in enumerate(compiled):
                t = time.perf_counter()
                jax.block_until_ready(c(*args))
                times[r, i] = time.perf_counter() - t
    ref = times[:, -1]
    return [float(np.median(times[:, i] / ref) * ref.min()) for i in range(len(compiled))]


def longest_accumulation(jaxpr) -> int:
    """The longest sum a rounding error can accumulate over: contraction lengths of
    dot_general/conv and reduce_sum/cumsum extents (1 when there is none)."""
    n = 1
    for eqn in jx.iter_eqns(jaxpr):
        name = eqn.primitive.name
        if name == "dot_general":
            a = eqn.invars[0].aval
            (ca, _), _ = eqn.params["dimension_numbers"]
            n = max(n, math.prod(a.shape[d] for d in ca) if ca else 1)
        elif name == "conv_general_dilated":
            k = eqn.invars[1].aval
            o = k.shape[eqn.params["dimension_numbers"].rhs_spec[0]]
            n = max(n, math.prod(k.shape) // max(o, 1))
        elif name == "reduce_sum":
            a = eqn.invars[0].aval
            n = max(n, math.prod(a.shape[d] for d in eqn.params["axes"]) or 1)
        elif name == "cumsum":
            n = max(n, eqn.invars[0].aval.shape[eqn.params["axis"]])
    return n
