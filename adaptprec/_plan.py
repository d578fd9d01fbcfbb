"""An adaptive call's plan: which rungs to try and how each is checked (static).

Chosen once per (function, argument shapes and dtypes, backend) at trace time by the cost
model (:mod:`adaptprec._cost`: a fixed table, no timings), so every plan is an ordinary
static program that composes with ``jit``, ``vmap`` and ``grad``, and the same program
gets the same plan, and the same answer bits, whatever the load of the machine. Rules,
for a kernel with an accuracy guard:

* **Small kernels** (all rungs together model below ``_cost.FLOOR``): every rung is tried,
  checked by Monte Carlo arithmetic (the most thorough check; its cost is below the
  call's dispatch overhead).
* **A-priori errors**: otherwise a lower rung ``r`` is skipped when its probabilistic
  error ``u_r * sqrt(n)`` (``n`` the longest accumulation: a contraction, a sum, a loop's
  trip count; Higham & Mary 2019) exceeds ``rtol``: it would almost surely fail.
* **Top rung** (always run): Monte Carlo when it costs at most ``TOP_BUDGET`` of the rung
  (or is below the floor), else the first-order bound under the same budget, else the
  cancellation screen alone ("screened only": the report says so), else finite only.
* **Lower rungs**, top down: the check of rung ``r`` is the first of
  :func:`check_order` the kernel supports within ``CHECK_SHARE`` of the rung (else the
  cheapest), and the rung is tried when its *expected* cost, counting the chance
  ``p_fail`` that it fails on the data and the plan above runs too, is at most
  ``MARGIN`` of the plan above:

      cost(r) + check(r) + ATTEMPT_OVERHEAD + p_fail * E(s) <= MARGIN * E(s)

  ``E(s)`` the expected cost from the next rung tried above on. ``p_fail`` is
  ``P_FAIL`` a priori, or for a componentwise ``rtol`` the chance
  :func:`componentwise_fail_chance` that one of the ``N`` output entries lies too near a
  zero for the rung (larger); the runtime passes what the kernel's own eager calls
  showed (:mod:`adaptprec._outcomes`), and retries a rung the componentwise chance
  priced out (``Plan.priced_out``) so that it can learn.

Without an accuracy guard (finite-only and custom guards, which cost ~nothing) or with
``plan="all"`` every rung is tried with Monte Carlo checks, as before the cost model.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax

from . import _cost
from ._first_order import Unsupported
from .precision import unit_roundoff

__all__ = ["Plan", "choose_plan", "all_rungs", "speculative", "check_order", "TOP_BUDGET",
           "MARGIN", "P_FAIL", "componentwise_fail_chance"]

#: The share of the top rung's time its check may add when nothing below can pay for it
#: (the issue's target: adaptive <= 1.25x plain float64 on every kernel).
TOP_BUDGET = 0.25

#: A lower rung is tried only when its expected cost is at most this share of the plan
#: above it: the cost table's error on the benchmark's kernels (modelled against measured
#: rung ratios, benchmarks/RESULTS.md) is within ~10%.
MARGIN = 0.9

#: The a-priori chance that a lower rung which passed the a-priori error test fails its
#: check on the data (then its time and its check's are lost): 3 of the 26 rows of
#: benchmarks/bench_value.py whose lower rung was tried failed on their data.
P_FAIL = 0.1

#: Seconds a tried lower rung adds to a call beyond its program and check: the
#: escalation's ``cond`` and finite check, and an eager call's escalation bookkeeping
#: (~30-70 us here).
ATTEMPT_OVERHEAD = 5e-5

#: A check is taken in the order of :func:`check_order` (the sampled checks, which
#: measure the error, before the bounds, which can be 10-10,000x pessimistic on
#: contractions) when it costs at most this share of its rung; when none does, the
#: first that costs at most ``NEAR`` times the cheapest (a tighter check for a little
#: more: the per-entry bound of a cancelling sum is ~40x its true error, the normwise
#: one ~1000x).
CHECK_SHARE, NEAR = 0.25, 1.25


class Plan(NamedTuple):
    """Per rung: ``attempt`` (bool), ``check`` (``"mca"``, ``"first_order"``,
    ``"sample"``, ... or ``None``: guards run as configured), ``note`` (a readable
    reason), ``share`` (modelled share of the check in the rung's time, ``None`` if not
    run or not modelled); ``priced_out``: the rungs skipped only because the
    componentwise a-priori chance of failing was above ``P_FAIL`` (a kernel's eager
    calls retry them, :mod:`adaptprec._outcomes`)."""

    attempt: tuple
    check: tuple
    note: tuple
    share: tuple
    priced_out: tuple = ()


def componentwise_fail_chance(n_out: int, u: float, n_acc: int, rtol: float) -> float:
    """The a-priori chance that a rung of unit roundoff ``u`` fails a componentwise
    ``rtol`` on some of its ``n_out`` output entries.

    Entry ``i`` carries an absolute error of about ``u sqrt(n_acc) s`` (``s`` the scale
    of the values it accumulates, ``n_acc`` the longest accumulation; Higham & Mary's
    probabilistic scale), so it fails when ``|y_i| < u sqrt(n_acc) s / rtol``. With the
    outputs spread over ``[-s, s]`` and no more dense near 0 than elsewhere, each entry
    does so with probability ``q = u sqrt(n_acc) / rtol`` and some entry of ``n_out``
    with ``1 - exp(-n_out q)``. Measured (``python benchmarks/bench_value.py
    --componentwise-rates``): plain float32 fails a componentwise ``rtol`` on most
    benchmark kernels with ``2^8-2^20`` outputs that meet it normwise, and seldom on the
    accuracy suite's small kernels; the model's misses are outputs bounded away from 0
    (softplus, Kepler's anomaly), which a kernel's eager calls then learn."""
    return 1.0 - math.exp(-n_out * u * math.sqrt(max(n_acc, 1)) / rtol)


def all_rungs(n: int, why: str = "") -> Plan:
    return Plan((True,) * n, (None,) * n, (why,) * n, (None,) * n)


def speculative(n: int, rung: int) -> Plan:
    """Rung ``rung`` alone with the finite check only: an earlier eager call verified
    it for these shapes (``MixedPrecisionManager(speculate=N)``)."""
    note = ("skipped (speculative call)",) * n
    note = note[:rung] + ("speculative: verified on an earlier call for these shapes; "
                          "this call checked finite only",) + note[rung + 1:]
    return Plan(tuple(k == rung for k in range(n)),
                tuple("speculative" if k == rung else None for k in range(n)), note,
                (None,) * n)


def _fmt(s: float) -> str:
    return f"{s * 1e3:.3g} ms" if s >= 1e-4 else f"{s * 1e6:.3g} us"


#: What each check is, for the plan's notes (docs/runtime.md says what each guarantees).
WHAT = {"mca": "Monte Carlo check", "first_order": "first-order error bound",
        "sample": "sampled check (256 entries re-evaluated in the widest dtype; "
                  "statistical)", "screen": "screens only (cancellation, finite)",
        "sample_rows": "sampled check (8-64 rows re-evaluated in the widest dtype; "
                       "statistical)",
        "sample_conv": "sampled check (256 output positions of the convolution "
                       "re-evaluated in the widest dtype; statistical)",
        "probe": "random-probe check of a matrix product (4 probes in the widest dtype; "
                 "statistical)",
        "norm_bound": "normwise first-order bound (a few numbers per value; holds with "
                      "probability 1 - 1e-6 under independent roundings)",
        "none": "finite only: accuracy not checked"}

#: The sampled (statistical) checks.
SAMPLED = ("sample", "sample_conv", "sample_rows", "probe")


def check_order(structure, componentwise: bool) -> tuple:
    """The checks a lower rung may use, most preferred first: the sampled checks the
    kernel's structure allows (entries, convolution outputs, rows, probes of a matrix
    product), then the first-order bound per entry, then the normwise bound, then Monte
    Carlo arithmetic. With ``componentwise`` only the checks that see every entry
    (first-order per entry, Monte Carlo)."""
    if componentwise:
        return ("first_order", "mca")
    sampled = ()
    if structure is not None:
        sampled = tuple(m for m, ok in (("sample", structure.entrywise),
                                        ("sample_conv", structure.conv is not None),
                                        ("sample_rows", structure.rows is not None),
                                        ("probe", structure.product)) if ok)
    return sampled + ("first_order", "norm_bound", "mca")


def choose_plan(n_rungs: int, dtypes, rtol: float, rung_fn, check_fn, avals,
                scale: float = 1.0, backend: str | None = None,
                methods: tuple = ("first_order", "mca"), p_fail=None,
                componentwise: bool = False) -> Plan:
    """The cheapest plan that still checks every answer it returns.

    ``rung_fn(k)``: a function of the arrays computing rung ``k``'s outputs;
    ``check_fn(k, method)``: the same plus the accuracy check by ``method`` (raises
    :class:`~adaptprec._first_order.Unsupported` when the method cannot model the
    kernel). ``avals``: ShapeDtypeStructs of the arrays; ``scale``: multiplies every cost
    (the batch size when planned per element under ``vmap``); ``methods``: the checks a
    lower rung may use, preferred first (:func:`check_order`); ``p_fail``: per rung, the
    chance it fails on the data, learned from the kernel's eager calls (default
    ``P_FAIL`` for every rung a priori, or :func:`componentwise_fail_chance` when
    ``componentwise`` and it is larger; the runtime passes ``componentwise`` for a
    componentwise ``rtol`` without ``atol``: an absolute floor is what spares the
    entries near 0).
    """
    table = _cost.throughput_for(backend)
    top = n_rungs - 1
    prior = p_fail is None
    source = "a priori" if prior else "learned from this kernel's eager calls"
    p_fail = (P_FAIL,) * n_rungs if prior else tuple(p_fail)

    def price(fn, k):
        return _cost.program_cost(fn, avals, table).seconds * scale

    cost = [price(rung_fn(k), k) for k in range(n_rungs)]
    n_acc = _cost.longest_accumulation(jax.make_jaxpr(rung_fn(0))(*avals).jaxpr)
    hopeless = [None] * n_rungs     # a rung whose a-priori error exceeds rtol: why
    p_fail = list(p_fail)
    if prior and componentwise:
        n_out = sum(math.prod(o.shape) for o in jax.tree_util.tree_leaves(
            jax.eval_shape(rung_fn(0), *avals)) if jax.numpy.issubdtype(
                o.dtype, jax.numpy.inexact)) * scale
    for k in range(top):
        u = unit_roundoff(dtypes[k])
        if u * math.sqrt(n_acc) > rtol:
            hopeless[k] = (f"skipped: a-priori error u*sqrt({n_acc}) = "
                           f"{u * math.sqrt(n_acc):.2g} > rtol {rtol:g}")
        elif prior and componentwise:
            p_fail[k] = max(p_fail[k], componentwise_fail_chance(n_out, u, n_acc, rtol))
    if sum(cost) < _cost.FLOOR:
        # (the a-priori test is a heuristic: on a small kernel a rung it calls hopeless
        # costs nothing to try, and a 64-long bf16 sum it rules out passes rtol 3e-2)
        return all_rungs(n_rungs, f"small kernel (~{_fmt(sum(cost))} for all rungs, "
                                  "modelled): every rung tried, Monte Carlo checks")
    memo = {}

    def check_cost(k, method):
        if (k, method) not in memo:
            try:
                memo[k, method] = max(price(check_fn(k, method), k) - cost[k], 0.0)
            except Unsupported:
                memo[k, method] = None
        return memo[k, method]

    attempt, check = [False] * n_rungs, [None] * n_rungs
    note, share, priced_out = [""] * n_rungs, [None] * n_rungs, []
    # the top rung: always run; the most thorough check that fits the budget
    budget = max(_cost.FLOOR, TOP_BUDGET * cost[top])
    attempt[top] = True
    tried = {}
    # (not the normwise bound: where it is far above the error -- a chaotic
    # integration, where its value bounds explode -- it would call a right float64
    # answer unverified; below the top a failed check only escalates)
    for method in ("mca", "first_order", "screen"):
        tried[method] = c = check_cost(top, method)
        if c is not None and c <= budget:
            check[top] = method
            break
    if check[top] is None:
        check[top], c = "none", 0.0
        best = min([x for x in tried.values() if x is not None] + [math.inf])
        note[top] = (f"finite only: accuracy not checked (the cheapest screen costs "
                     f"{_fmt(best)} > {TOP_BUDGET:.0%} of the rung's {_fmt(cost[top])}, "
                     "modelled)")
    else:
        share[top] = c / (cost[top] + c) if cost[top] + c > 0 else 0.0
        note[top] = (f"{WHAT[check[top]]} (check ~{share[top]:.0%} of the rung's time, "
                     "modelled)")
    expected = cost[top] + c      # of the plan from the next rung tried on
    for k in range(top - 1, -1, -1):
        if hopeless[k] is not None:
            note[k] = hopeless[k]
            continue
        method, c = _pick_check(k, cost[k], methods, check_cost)
        if c is None:
            note[k] = "skipped: no check models it"
            continue
        def expected_with(p, k=k, c=c):     # the plan's expected cost trying rung k
            return cost[k] + c + ATTEMPT_OVERHEAD + p * expected

        mine = expected_with(p_fail[k])
        if mine > MARGIN * expected:
            why = source if p_fail[k] == P_FAIL or not prior else (
                f"a priori: componentwise, {n_out} entries")
            note[k] = (f"skipped: it and its {WHAT[method].split(' (')[0]} "
                       f"({_fmt(cost[k] + c)}, + {_fmt(ATTEMPT_OVERHEAD)} per call), with a "
                       f"{p_fail[k]:.0%} chance of failing on the data ({why}), would "
                       f"cost more than {MARGIN:.0%} of the plan above it "
                       f"({_fmt(expected)}, modelled)")
            if prior and p_fail[k] > P_FAIL and expected_with(P_FAIL) <= MARGIN * expected:
                priced_out.append(k)
            continue
        attempt[k], check[k] = True, method
        share[k] = c / (cost[k] + c) if cost[k] + c > 0 else 0.0
        note[k] = f"{WHAT[method]} (check ~{share[k]:.0%} of the rung's time, modelled)"
        expected = mine
    return Plan(tuple(attempt), tuple(check), tuple(note), tuple(share), tuple(priced_out))


def _pick_check(k, rung_cost, methods, check_cost):
    """``(method, its cost)`` for lower rung ``k``: the first check in ``methods`` the
    kernel supports within ``CHECK_SHARE`` of the rung, else the first within ``NEAR``
    of the cheapest it supports."""
    supported = []
    for m in methods:
        c = check_cost(k, m)
        if c is None:
            continue
        if c <= CHECK_SHARE * rung_cost:
            return m, c
        supported.append((m, c))
    if not supported:
        return None, None
    cheapest = min(c for _, c in supported)
    return next((m, c) for m, c in supported if c <= NEAR * cheapest)
