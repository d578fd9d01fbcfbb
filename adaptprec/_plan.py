"""An adaptive call's plan: which rungs to try and how each is checked (static).

Chosen once per (function, argument shapes and dtypes, backend) at trace time by the cost
model (:mod:`adaptprec._cost`), so every plan is an ordinary static program: it composes
with ``jit``, ``vmap`` and ``grad``. Rules, for a kernel with an accuracy guard:

* **Small kernels** (all rungs together model below ``_cost.FLOOR``): every rung is tried,
  checked by Monte Carlo arithmetic (the most thorough check; its cost is below the call's
  dispatch overhead).
* **Check per rung**: the first-order error bound (:mod:`adaptprec._first_order`) when it
  models every operation of the kernel, else Monte Carlo arithmetic.
* **Top rung** (always run): Monte Carlo when it costs at most ``TOP_BUDGET`` of the rung
  (or is below the floor), else the first-order bound under the same budget, else the
  cancellation screen alone ("screened only": the report says so).
* **Lower rungs**, top down: rung ``r`` is skipped when its a-priori probabilistic error
  ``u_r * sqrt(n)`` (``n`` the longest accumulation: a contraction or a sum; Higham &
  Mary 2019) exceeds ``rtol`` (it would almost surely fail), or when it and its check
  cost more than ``MARGIN`` of the plan above it: ``cost(r) + check(r) +
  ATTEMPT_OVERHEAD > MARGIN * (cost(s) + check(s))``, ``s`` the next rung tried above it. A *measured* plan keeps
  the throughput table's decision unless the timings disagree by more than a margin
  (``KEEP``, ``MARGIN**2``: hysteresis, so near break-even plans do not flip with load);
  a timing against the table, or within ``BORDER`` of the limit, is settled by timing the
  rung with its check against the plan above directly, the majority of up to three
  deciding (a burst of load flipped conv's plan to f64 in one run, the overflow kernel's
  to a float32 rung that always escalates in another). A top-rung check measured over
  its budget (up to ``RETIME_WITHIN`` times) is timed again, the smaller kept, and the
  table's view of the plan above prices the most thorough top check timed that near.

Without an accuracy guard (finite-only and custom guards, which cost ~nothing) or with
``plan="all"`` every rung is tried with Monte Carlo checks, as before the cost model.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax

from . import _cost
from ._first_order import Unsupported

__all__ = ["Plan", "choose_plan", "all_rungs", "speculative", "TOP_BUDGET", "KEEP"]

#: The share of the top rung's time its check may add when nothing below can pay for it
#: (the issue's target: adaptive <= 1.25x plain float64 on every kernel).
TOP_BUDGET = 0.25

#: A lower rung is tried only when it and its check cost at most this share of the plan
#: above it: a margin for the noise of one-time measurements on a loaded machine and for
#: the chance that the rung fails (then its time and its check's are lost).
MARGIN = 0.8


#: Hysteresis of a measured plan (one-time timings on a loaded machine flipped plans
#: that are near break-even from run to run): when the throughput table says a lower
#: rung pays (``MARGIN``), the measurement drops it only when it shows less than a 10%
#: saving (``cost(r) + check(r) > KEEP * plan above``: the table does not price the
#: casts a rung adds, which can take a light kernel's whole saving, e.g. a layer norm);
#: when the table says it does not pay, the measurement must show ``<= MARGIN * MARGIN``
#: of the plan above to try it.
KEEP = 0.9


#: Seconds a tried lower rung adds to a call beyond its program and check, which the
#: per-program timings do not see: the escalation's ``cond`` and finite check, and an
#: eager call's escalation bookkeeping (~30-70 us here). Decides small kernels (a 0.65 ms
#: MLP planned f32 + sampled rows measured 1.31x f64 per call).
ATTEMPT_OVERHEAD = 5e-5


#: A lower rung whose first timing lands between ``BORDER * limit`` and the limit is
#: timed again against the plan above before it is tried (``_vote``).
BORDER = 0.8


#: A measured top-rung check up to this factor over its budget is timed again (the
#: smaller of the two kept) before the plan falls back to a cheaper check.
RETIME_WITHIN = 2.5


#: A row-separable kernel's lower rung is checked on a sample of rows (statistical)
#: instead of by the first-order bound (deterministic) only when the bound costs more
#: than this share of the rung (attention: the bound walks the B x B scores).
ROW_SAMPLE_ABOVE = 0.2


class Plan(NamedTuple):
    """Per rung: ``attempt`` (bool), ``check`` (``"mca"``, ``"first_order"``,
    ``"screen"`` or ``None``: guards run as configured), ``note`` (a readable reason),
    ``share`` (modelled share of the check in the rung's time, ``None`` if not run or
    not modelled)."""

    attempt: tuple
    check: tuple
    note: tuple
    share: tuple


def all_rungs(n: int, why: str = "") -> Plan:
    return Plan((True,) * n, (None,) * n, (why,) * n, (None,) * n)


def speculative(n: int, rung: int) -> Plan:
    """Rung ``rung`` alone with the finite check only: an earlier eager call verified
    it for these shapes (``MixedPrecisionManager(speculate=N)``)."""
    note = ("skipped (speculative call)",) * n
    note = note[:rung] + (f"speculative: verified on an earlier call for these shapes; "
                          f"this call checked finite only",) + note[rung + 1:]
    return Plan(tuple(k == rung for k in range(n)),
                tuple("speculative" if k == rung else None for k in range(n)), note,
                (None,) * n)


def _fmt(s: float) -> str:
    return f"{s * 1e3:.3g} ms" if s >= 1e-4 else f"{s * 1e6:.3g} us"


_WHAT = {"mca": "Monte Carlo check", "first_order": "first-order error bound",
         "sample": "sampled check (256 entries re-evaluated in the widest dtype; "
                   "statistical)", "screen": "screens only (cancellation, finite)",
         "sample_rows": "sampled check (16 rows re-evaluated in the widest dtype; "
                        "statistical)",
         "sample_conv": "sampled check (256 output positions of the convolution "
                        "re-evaluated in the widest dtype; statistical)",
         "none": "finite only: accuracy not checked"}


def _same(made: dict, kind: str, make):
    """``make`` memoized per argument tuple in ``made``."""
    def get(*key):
        if (kind,) + key not in made:
            made[(kind,) + key] = make(*key)
        return made[(kind,) + key]
    return get


def _vote(first, limit, ck, c, next_total, direct):
    """A lower rung's timing that contradicts the table or lies near the limit, settled
    by timing the rung with its check against the plan above directly: once, and a third
    time when the two disagree; the majority decides. A burst of load on the shared
    machine made conv's float32 rung look as slow as float64 in one of several runs,
    and made the overflow kernel's float32 rung (which always escalates there: e^100)
    look cheap in another (report 2.84x f64). Returns ``(rung, check, how)``
    seconds: the first timing's when it wins, else the median winning direct ratio
    times the plan above (split between rung and check as the first timing was)."""
    ratios = [first]
    for _ in range(2):
        mine, theirs = direct()
        ratios.append((mine + ATTEMPT_OVERHEAD) / max(theirs, 1e-30))
        keeps = [r <= limit for r in ratios]
        if len(ratios) == 2 and keeps[0] == keeps[1]:
            break
    keep = sum(r <= limit for r in ratios) * 2 > len(ratios)
    how = f"measured {('twice', 'three times')[len(ratios) - 2]}"
    if keep == (first <= limit):
        return ck, c, how
    won = sorted(r for r in ratios if (r <= limit) == keep)
    total = won[len(won) // 2] * next_total - ATTEMPT_OVERHEAD
    frac = c / max(ck + c, 1e-30)
    return total * (1.0 - frac), total * frac, how


def choose_plan(n_rungs: int, dtypes, rtol: float, rung_fn, check_fn, avals,
                scale: float = 1.0, backend: str | None = None,
                entrywise: bool = False, rowwise: bool = False,
                conv: bool = False) -> Plan:
    """The cheapest plan that still checks every answer it returns.

    ``rung_fn(k)``: a function of the arrays computing rung ``k``'s outputs;
    ``check_fn(k, method)``: the same plus the accuracy check by ``method`` (raises
    :class:`~adaptprec._first_order.Unsupported` when the method cannot model the
    kernel). ``avals``: ShapeDtypeStructs of the arrays; ``scale``: multiplies every cost
    (the batch size when planned per element under ``vmap``); ``entrywise``: the kernel
    may be checked on a sample of entries; ``rowwise``: on a sample of rows
    (:mod:`adaptprec._rowwise`), chosen when the first-order bound costs more than
    ``ROW_SAMPLE_ABOVE`` of the rung; ``conv``: the kernel is one convolution, checked
    on a sample of output positions (:mod:`adaptprec._convsample`; ~1% of the rung, so
    preferred, as the sampled entries of an entrywise kernel are).
    """
    table = _cost.throughput_for(backend)
    top = n_rungs - 1
    # one function object per program, so a program timed again (``retimed``, ``_vote``)
    # reuses its executable (``compiled``)
    made, compiled = {}, {}
    rung_fn = _same(made, "rung", rung_fn)
    check_fn = _same(made, "check", check_fn)

    def measure_many(fns):
        return _cost.measure_many(fns, avals, cache=compiled)
    modelled = [_cost.program_cost(rung_fn(k), avals, table, dtypes[k]).seconds * scale
                for k in range(n_rungs)]
    if sum(modelled) < _cost.FLOOR:
        return all_rungs(n_rungs, f"small kernel (~{_fmt(sum(modelled))} for all rungs, "
                                  "modelled): every rung tried, Monte Carlo checks")
    measured = _cost.MEASURE and scale == 1.0
    how = "measured once" if measured else "modelled"
    if measured:
        cost = measure_many([rung_fn(k) for k in range(n_rungs)])
    else:
        cost = modelled

    memo = {}

    def check_cost(k, method, by_measure=measured):
        if (k, method, by_measure) not in memo:
            memo[k, method, by_measure] = _check_cost(k, method, by_measure)
        return memo[k, method, by_measure]

    def _check_cost(k, method, measured):
        if not measured:
            try:
                full = _cost.program_cost(check_fn(k, method), avals, table,
                                          dtypes[k]).seconds * scale
            except Unsupported:
                return None
            return max(full - modelled[k], 0.0)
        if method == "mca":     # the table's difference (never close on CPU: not timed)
            return check_cost(k, method, False)
        try:
            # timed interleaved with the rung alone: the difference of the two is the
            # check's cost (the rung's time is what the plan compares)
            full, alone = measure_many([check_fn(k, method), rung_fn(k)])
        except Unsupported:
            return None
        return max(full / alone - 1.0, 0.0) * cost[k]

    attempt = [False] * n_rungs
    check = [None] * n_rungs
    note = [""] * n_rungs
    share = [None] * n_rungs

    def retimed(k, method, c):
        """A measured check cost over its budget, timed once more and the smaller kept
        (a burst of load only makes a program slower): the top rung's first-order bound
        measured ~15% of the rung in three of four plans of the same MLP and over the
        budget in the fourth, and the plan then checked less. Only within
        ``RETIME_WITHIN`` of the budget: further off is no burst, and each timing
        compiles the check again."""
        if not measured or method == "mca" or c is None:
            return c
        full, alone = measure_many([check_fn(k, method), rung_fn(k)])
        return min(c, max(full / alone - 1.0, 0.0) * cost[k])

    # the top rung: always run; the most thorough check that fits the budget
    budget = max(_cost.FLOOR, TOP_BUDGET * cost[top])
    attempt[top] = True
    tried = {}
    near = None     # the most thorough check timed within RETIME_WITHIN of the budget
    for method in ("mca", "first_order", "screen"):
        c = check_cost(top, method)
        if c is not None and budget < c <= RETIME_WITHIN * budget:
            c = retimed(top, method, c)
        if near is None and c is not None and c <= RETIME_WITHIN * budget:
            near = method
        tried[method] = c
        if c is not None and c <= budget:
            check[top] = method
            break
    if check[top] is None:
        check[top], c = "none", 0.0
        best = min(x for x in list(tried.values()) + [float("inf")] if x is not None)
        note[top] = (f"finite only: accuracy not checked (the cheapest screen costs "
                     f"{_fmt(best)} > {TOP_BUDGET:.0%} of the rung's {_fmt(cost[top])}, "
                     f"{how})")
    else:
        share[top] = c / (cost[top] + c) if cost[top] + c > 0 else 0.0
        note[top] = (f"{_WHAT[check[top]]} (check ~{share[top]:.0%} of the rung's time, "
                     f"{how})")
    next_total = cost[top] + c
    # the program of the plan above (re-measured against a lower rung on a contradiction)
    above = rung_fn(top) if check[top] == "none" else check_fn(top, check[top])
    # the table's view of the plan above, for the hysteresis of measured plans; with the
    # most thorough check timed near the budget, not the one load may have pushed it to
    # (at load ~7 reduction's top bound timed over budget, the screen's lower table cost
    # then said its f32 rung cannot pay, and f32 was dropped without a second timing)
    view = near if near is not None and measured else check[top]
    next_model = modelled[top] + (check_cost(top, view, False) or 0.0
                                  if view != "none" else 0.0)

    jaxpr = jax.make_jaxpr(rung_fn(0))(*avals).jaxpr
    n_acc = _cost.longest_accumulation(jaxpr)
    for k in range(top - 1, -1, -1):
        u = 2.0 ** -(int(jax.numpy.finfo(dtypes[k]).nmant) + 1)
        prior = u * math.sqrt(n_acc)
        if prior > rtol:
            note[k] = (f"skipped: a-priori error u*sqrt({n_acc}) = {prior:.2g} > rtol "
                       f"{rtol:g}")
            continue
        saving = next_total - cost[k]
        if saving <= 0 and (not measured or modelled[k] > MARGIN * next_model):
            note[k] = (f"skipped: not faster than the rung above ({_fmt(cost[k])} vs "
                       f"{_fmt(next_total)} with its check, {how})")
            continue
        method, c = None, None
        methods = (("sample",) if entrywise else ()) + (
            ("sample_conv",) if conv else ()) + ("first_order", "mca")
        if rowwise and not entrywise:
            fo = check_cost(k, "first_order")
            if fo is None or fo > ROW_SAMPLE_ABOVE * cost[k]:
                methods = ("sample_rows",) + methods
        for m in methods:
            cm = check_cost(k, m)
            if cm is not None:
                method, c = m, cm
                break
        limit, c_model, pays, ck, how_k = MARGIN, None, False, cost[k], how
        if measured and c is not None:
            c_model = check_cost(k, method, False)
            pays = (c_model is not None
                    and modelled[k] + c_model <= MARGIN * next_model)
            limit = KEEP if pays else MARGIN * MARGIN
        if measured and c is not None:
            first = (ck + c + ATTEMPT_OVERHEAD) / max(next_total, 1e-30)
            if (pays and first > limit) or BORDER * limit < first <= limit:
                ck, c, how_k = _vote(first, limit, ck, c, next_total,
                                     lambda: measure_many([check_fn(k, method), above]))
        if c is None or ck + c + ATTEMPT_OVERHEAD > limit * next_total:
            what = ("no check models it" if c is None else
                    f"it and its check ({_fmt(ck + c)}, + {_fmt(ATTEMPT_OVERHEAD)} per "
                    f"call) would cost more than "
                    f"{limit:.0%} of the plan above it ({_fmt(next_total)})")
            note[k] = f"skipped: {what}, {how_k}"
            continue
        attempt[k], check[k] = True, method
        share[k] = c / (ck + c) if ck + c > 0 else 0.0
        note[k] = f"{_WHAT[method]} (check ~{share[k]:.0%} of the rung's time, {how_k})"
        next_total = ck + c
        next_model = modelled[k] + (c_model if c_model is not None else c)
        above = check_fn(k, method)
    return Plan(tuple(attempt), tuple(check), tuple(note), tuple(share))
