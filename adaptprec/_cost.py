"""The cost model that chooses an adaptive call's plan: a fixed table, no timings.

A plan "rung r + check" beats "go straight to the next attempted rung s" only when
``cost(r) + check(r) < cost(s) + check(s)``, i.e. the check costs less than the time the
cheaper rung saves. The model prices a program from its jaxpr, equation by equation, with
a per-backend table of rates (:data:`THROUGHPUT`):

    time = sum over equations of  elements x seconds_per_element[kind][dtype]
           + contraction flops / DOT[dtype]
           + bytes of the program's inputs and outputs / BANDWIDTH
           + loop iterations x LOOP_ITERATION

* an equation's *kind* (:func:`kind_of`) is its primitive's class of cost: cheap
  arithmetic, division, square roots, each family of transcendentals, reductions, data
  movement; its dtype is its output's (a float32 rung's casts and a float64 check are
  priced as what they are);
* a loop body is priced times its trip count: a ``scan``'s ``length``, a ``while`` whose
  exit test compares a counter with a bound (``fori_loop``) by that bound, any other
  ``while`` by :data:`UNKNOWN_TRIPS`; a ``cond`` by its costliest branch; calls by their
  bodies;
* elementwise work is priced per operation, as if each ran from cache: XLA fuses chains of
  them into one pass over memory, whose traffic is the inputs and outputs term, and the
  operands of a ``cond`` (materialized: written, then read) for the checks' reductions;
* an equation that repeats an earlier one (same primitive, parameters and operands) is
  free, as XLA's common-subexpression elimination makes it: a check that re-traces the
  kernel (the screen, a sampled check reading the rung's values) adds only its own work.

The plan is therefore a function of the kernel, the argument shapes and dtypes, the
backend and this table: the same program gets the same plan on a quiet or a busy machine,
and so the same answer bits (a plan chosen by timing flipped with load).

Costs below ``FLOOR`` seconds are "free": a call pays a dispatch overhead of that order
anyway, so small kernels keep the thorough plan (every rung, Monte Carlo checks).

The CPU table was measured on this project's 2-core AVX512_BF16 machine
(``benchmarks/bench_value.py --throughput``, ops in fused chains of 8 on 2^20 entries,
median of interleaved rounds); the GPU table is vendor peak rates (H100 SXM data sheet),
unmeasured, for the docs' on-paper plans.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import jax
import numpy as np

from . import _jaxpr as jx

__all__ = ["Throughput", "THROUGHPUT", "Cost", "program_cost", "jaxpr_cost",
           "throughput_for", "kind_of", "FLOOR", "UNKNOWN_TRIPS", "longest_accumulation",
           "loop_trips"]

#: Modelled seconds below which work is "free": an eager call's fixed overhead on CPU
#: (dispatch, the report's arrays) is ~30-100 us, so kernels whose rungs together model
#: below this keep the thorough plan, and a top-rung check below it always runs.
FLOOR = 5e-5

#: Trip count assumed for a ``while`` loop whose count the jaxpr does not state (a
#: convergence loop): Newton and fixed-point iterations of the kernels this library has
#: seen take 5-50.
UNKNOWN_TRIPS = 16


class Throughput(NamedTuple):
    """Rates of one backend. ``dot``: contraction flops per second by dtype name;
    ``per_element``: seconds per output element by kind (:func:`kind_of`) and dtype
    name; ``bandwidth``: bytes per second of the program's inputs and outputs;
    ``loop_iteration``: seconds one loop iteration adds beyond its body."""

    dot: dict
    per_element: dict
    bandwidth: float
    loop_iteration: float


def _rates(f32: float, f64: float, bf16: float | None = None) -> dict:
    """Seconds per element by dtype: bfloat16/float16 run as float32 plus the
    conversions on XLA:CPU."""
    b = f32 * 1.3 if bf16 is None else bf16
    return {"bfloat16": b, "float16": b, "float32": f32, "float64": f64}


THROUGHPUT = {
    # measured here (bench_value.py --throughput, 2-core AVX512_BF16): per element in
    # fused chains of 8 in cache, as ratios to a float32 matmul timed in the same rounds
    # (anchored at its quiet 90 GFLOP/s, so load does not move the table)
    "cpu": Throughput(
        dot={"bfloat16": 1.0e11, "float16": 2e10, "float32": 9e10, "float64": 4.5e10},
        per_element={
            "cheap": _rates(0.07e-9, 0.07e-9),
            "div": _rates(0.05e-9, 0.07e-9),
            "sqrt": _rates(0.05e-9, 0.2e-9),
            "exp": _rates(0.65e-9, 2.5e-9),
            "log": _rates(1.6e-9, 6.5e-9),
            "trig": _rates(7e-9, 14e-9),
            "tanh": _rates(0.8e-9, 2.4e-9),
            "erf": _rates(0.5e-9, 7e-9),
            "pow": _rates(6e-9, 14e-9),
            "atan": _rates(14e-9, 13e-9),
            "reduce": _rates(0.1e-9, 0.15e-9),
            "move": _rates(0.2e-9, 0.3e-9),
        },
        bandwidth=4e9,
        loop_iteration=2e-8),
    # H100 SXM vendor peaks (dense tensor-core bf16 989 TFLOP/s, fp64 tensor 67, fp32
    # CUDA cores 67, HBM3 3.35 TB/s), SFU transcendentals ~1/4 of the fp32 rate, fp64
    # transcendentals in software; unmeasured.
    "gpu": Throughput(
        dot={"bfloat16": 9.9e14, "float16": 9.9e14, "float32": 6.7e13, "float64": 6.7e13},
        per_element={
            "cheap": _rates(1.5e-14, 3e-14, 1.5e-14),
            "div": _rates(6e-14, 1.2e-13, 6e-14),
            "sqrt": _rates(6e-14, 2.4e-13, 6e-14),
            "exp": _rates(6e-14, 1e-12, 6e-14), "log": _rates(6e-14, 1e-12, 6e-14),
            "trig": _rates(6e-14, 1e-12, 6e-14), "tanh": _rates(6e-14, 1e-12, 6e-14),
            "erf": _rates(1.2e-13, 2e-12, 1.2e-13), "pow": _rates(1.2e-13, 2e-12, 1.2e-13),
            "atan": _rates(2e-13, 3e-12, 2e-13),
            "reduce": _rates(1.5e-14, 3e-14, 1.5e-14),
            "move": _rates(1.5e-14, 3e-14, 1.5e-14),
        },
        bandwidth=3.35e12,
        loop_iteration=5e-6),
}


def throughput_for(backend: str | None = None) -> Throughput:
    """The table for ``backend`` (default: JAX's default backend; unknown ones use CPU's)."""
    backend = backend or jax.default_backend()
    return THROUGHPUT.get(backend, THROUGHPUT["gpu" if backend in ("cuda", "rocm")
                                               else "cpu"])


_KINDS = {
    "div": "div rem", "sqrt": "sqrt rsqrt cbrt",
    "exp": "exp exp2 expm1", "log": "log log1p",
    "trig": "sin cos tan", "tanh": "tanh logistic sinh cosh",
    "erf": "erf erfc erf_inv lgamma digamma igamma igammac",
    "pow": "pow", "atan": "atan2 atan asin acos asinh acosh atanh",
    "reduce": "reduce_sum reduce_max reduce_min reduce_prod reduce_and reduce_or argmax "
              "argmin cumsum cumprod cummax cummin cumlogsumexp",
    "move": "transpose slice dynamic_slice dynamic_update_slice gather scatter "
            "scatter-add concatenate stack pad rev sort copy copy_p",
}
_KIND = {name: kind for kind, names in _KINDS.items() for name in names.split()}
#: no work of their own (views, shapes, a broadcast XLA fuses into its consumer)
_FREE = frozenset("reshape squeeze expand_dims broadcast_in_dim iota stop_gradient "
                  "optimization_barrier sharding_constraint".split())


#: data movement that builds a new buffer (not fused into what reads it)
_MATERIALIZED = frozenset("concatenate stack dynamic_update_slice scatter scatter-add "
                          "sort".split())


def kind_of(primitive_name: str) -> str | None:
    """The cost kind of a primitive (``None``: priced as free)."""
    if primitive_name in _FREE:
        return None
    return _KIND.get(primitive_name, "cheap")


class Cost(NamedTuple):
    """Modelled work of one program: contraction flops, element operations, loop
    iterations and the time they price to."""

    dot_flops: float
    elements: float
    iterations: float
    seconds: float

    def __add__(self, other: "Cost") -> "Cost":
        return Cost(*(a + b for a, b in zip(self, other)))

    def __mul__(self, k: float) -> "Cost":
        return Cost(*(a * k for a in self))

    def __sub__(self, other: "Cost") -> "Cost":
        return Cost(*(max(a - b, 0.0) for a, b in zip(self, other)))


_ZERO = Cost(0.0, 0.0, 0.0, 0.0)


def _dtype_name(d) -> str:
    try:
        return np.dtype(d).name
    except TypeError:
        return "float32"


def _size(aval) -> int:
    return int(math.prod(getattr(aval, "shape", ()) or ()))


def _contraction(eqn) -> float:
    """Flops of a dot_general / convolution equation."""
    y = eqn.outvars[0].aval
    if eqn.primitive.name == "dot_general":
        a = eqn.invars[0].aval
        (ca, _), _ = eqn.params["dimension_numbers"]
        k = math.prod(a.shape[d] for d in ca) if ca else 1
        return 2.0 * _size(y) * k
    k = eqn.invars[1].aval
    o = k.shape[eqn.params["dimension_numbers"].rhs_spec[0]]
    return 2.0 * _size(y) * _size(k) / max(o, 1)


def loop_trips(eqn) -> int | None:
    """Iterations of a ``scan`` (its length) or of a ``while`` whose exit test is
    ``counter < bound`` on a counter the body adds 1 to, with both known in the jaxpr
    (``fori_loop`` with traced bounds of literal value); ``None`` when not stated."""
    if eqn.primitive.name == "scan":
        return int(eqn.params["length"])
    if eqn.primitive.name != "while":
        return None
    cond = eqn.params["cond_jaxpr"].jaxpr
    body = eqn.params["body_jaxpr"].jaxpr
    cn, bn = eqn.params["cond_nconsts"], eqn.params["body_nconsts"]
    if len(cond.eqns) != 1 or cond.eqns[0].primitive.name != "lt":
        return None
    lhs, rhs = cond.eqns[0].invars
    carry_vars = cond.invars[cn:]
    init = eqn.invars[cn + bn:]
    try:
        i = carry_vars.index(lhs)
        j = carry_vars.index(rhs) if rhs in carry_vars else None
    except ValueError:
        return None
    # the body must add 1 to the counter and pass the bound through
    out = body.outvars[i]
    step = next((e for e in body.eqns if out in e.outvars), None)
    if step is None or step.primitive.name != "add" or not any(
            isinstance(v, jx.Literal) and jx.literal_value(v) == 1 for v in step.invars):
        return None

    def known(atom):
        return jx.literal_value(atom) if isinstance(atom, jx.Literal) else None

    lo = known(init[i])
    hi = known(init[j]) if j is not None else known(rhs)
    if lo is None or hi is None:
        return None
    return max(int(hi) - int(lo), 0)


def _params_key(params):
    """A hashable stand-in for an equation's parameters (a sub-jaxpr by its text)."""
    def key(v):
        if isinstance(v, (tuple, list)):
            return tuple(key(x) for x in v)
        if isinstance(v, dict):
            return tuple(sorted((k, key(x)) for k, x in v.items()))
        if isinstance(v, jx.ClosedJaxpr):   # by structure: XLA merges identical loops
            return ("jaxpr", str(v.jaxpr), tuple(id(c) for c in v.consts))
        if isinstance(v, jx.Jaxpr):
            return ("jaxpr", str(v))
        try:
            hash(v)
        except TypeError:
            return ("id", id(v))
        return v
    return key(params)


def jaxpr_cost(jaxpr, table: Throughput) -> Cost:
    """The modelled work of the equations of ``jaxpr`` (open or closed), loops included;
    calls are inlined, and an equation repeating an earlier one (same primitive,
    parameters and operands: common-subexpression elimination) is free."""
    jaxpr, _ = jx.open_jaxpr(jaxpr)
    return _walk_cost(jaxpr, list(jaxpr.invars), table, {}, {})


def _walk_cost(jaxpr, args, table, seen, alias) -> Cost:
    """Cost of ``jaxpr`` with its inputs standing for ``args`` (canonical atoms of the
    caller); ``seen``/``alias``: the program's table of computed equations."""
    env = dict(zip(jaxpr.invars, args))

    def canon(atom):
        if isinstance(atom, jx.Literal):
            return ("lit", repr(jx.literal_value(atom)), str(atom.aval))
        atom = env.get(atom, atom)
        return alias.get(atom, atom)

    total = _ZERO
    for eqn in jaxpr.eqns:
        ins = [canon(a) for a in eqn.invars]
        body = jx.call_body(eqn, remat=True, custom=True)
        if body is not None:
            total = total + _walk_cost(body[0], ins, table, seen, alias)
            inner = dict(zip(body[0].invars, ins))
            for o, i in zip(eqn.outvars, body[0].outvars):
                alias[o] = i if isinstance(i, jx.Literal) else alias.get(inner.get(i, i),
                                                                         inner.get(i, i))
            continue
        if eqn.primitive.name == "stop_gradient":    # an identity in the compiled program
            alias[eqn.outvars[0]] = ins[0]
            continue
        try:
            key = (eqn.primitive.name, _params_key(eqn.params), tuple(ins))
            hash(key)
        except TypeError:
            key = None
        if key is not None and key in seen:
            for o, first in zip(eqn.outvars, seen[key]):
                alias[o] = first
            continue
        if key is not None:
            seen[key] = list(eqn.outvars)
        total = total + _eqn_cost(eqn, table)
    return total


def _eqn_cost(eqn, table: Throughput) -> Cost:
    name = eqn.primitive.name
    body = jx.call_body(eqn, remat=True, custom=True)
    if body is not None:
        return jaxpr_cost(body[0], table)
    if name == "scan":
        trips = loop_trips(eqn)
        one = jaxpr_cost(eqn.params["jaxpr"], table)
        return (one + Cost(0.0, 0.0, 1.0, table.loop_iteration)) * trips
    if name == "while":
        trips = loop_trips(eqn)
        trips = UNKNOWN_TRIPS if trips is None else trips
        one = (jaxpr_cost(eqn.params["body_jaxpr"], table)
               + jaxpr_cost(eqn.params["cond_jaxpr"], table))
        return (one + Cost(0.0, 0.0, 1.0, table.loop_iteration)) * trips
    if name == "cond":
        # its operands are materialized (written once, which a fusion would have
        # spared): the passes over memory of the checks' reductions
        # (``_reductions.materialized``)
        moved = sum(_size(v.aval) * np.dtype(v.aval.dtype).itemsize
                    for v in eqn.invars[1:])
        branch = max((jaxpr_cost(b, table) for b in eqn.params["branches"]),
                     key=lambda c: c.seconds, default=_ZERO)
        return branch + Cost(0.0, 0.0, 0.0, moved / table.bandwidth)
    if name in ("dot_general", "conv_general_dilated"):
        flops = _contraction(eqn)
        dt = _dtype_name(eqn.invars[0].aval.dtype)
        return Cost(flops, 0.0, 0.0, flops / table.dot.get(dt, table.dot["float32"]))
    if jx.has_sub_jaxpr(eqn):       # custom reductions, other higher-order primitives
        return sum((jaxpr_cost(j, table) for j in jx.sub_jaxprs(eqn)), _ZERO)
    kind = kind_of(name)
    if kind is None:
        return _ZERO
    if kind == "reduce":
        n = max((_size(v.aval) for v in eqn.invars), default=0)
    else:
        n = max((_size(v.aval) for v in eqn.outvars), default=0)
    dt = _dtype_name(eqn.outvars[0].aval.dtype) if eqn.outvars else "float32"
    rates = table.per_element[kind]
    seconds = n * rates.get(dt, rates["float32"])
    if name in _MATERIALIZED:
        # a new buffer XLA does not fuse into its consumers: written and read back (in
        # the rung's dtype: where a narrower rung saves on a multi-stage kernel)
        seconds += 2 * sum(_size(v.aval) * np.dtype(v.aval.dtype).itemsize
                           for v in eqn.outvars) / table.bandwidth
    return Cost(0.0, float(n), 0.0, seconds)


def program_cost(fn: Callable, avals, table: Throughput) -> Cost:
    """Price ``fn(*avals)`` (``avals``: ShapeDtypeStructs): its equations, and its inputs
    and outputs moved once through memory."""
    closed = jax.make_jaxpr(fn)(*avals)
    work = jaxpr_cost(closed.jaxpr, table)
    moved = sum(_size(a) * np.dtype(a.dtype).itemsize for a in avals) + sum(
        _size(a) * np.dtype(a.dtype).itemsize for a in closed.out_avals)
    return work + Cost(0.0, 0.0, 0.0, moved / table.bandwidth)


def longest_accumulation(jaxpr) -> int:
    """The longest sum a rounding error can accumulate over: contraction lengths of
    dot_general/conv, reduce_sum/cumsum extents, and a loop's trip count times the
    longest accumulation in its body (a carry updated every iteration); 1 when there is
    none."""
    jaxpr, _ = jx.open_jaxpr(jaxpr)
    n = 1
    for eqn in jaxpr.eqns:
        name = eqn.primitive.name
        if name in ("scan", "while"):
            trips = loop_trips(eqn) or UNKNOWN_TRIPS
            inner = max(longest_accumulation(j) for j in jx.sub_jaxprs(eqn))
            n = max(n, trips * inner)
        elif jx.has_sub_jaxpr(eqn):
            n = max([n] + [longest_accumulation(j) for j in jx.sub_jaxprs(eqn)])
        elif name == "dot_general":
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
