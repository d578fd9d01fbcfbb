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
  Mary 2019) exceeds ``rtol`` (it would almost surely fail), or when its check costs at
  least what passing it would save: ``check(r) >= cost(s) + check(s) - cost(r)``, ``s``
  the next rung tried above it.

Without an accuracy guard (finite-only and custom guards, which cost ~nothing) or with
``plan="all"`` every rung is tried with Monte Carlo checks, as before the cost model.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax

from . import _cost
from ._first_order import Unsupported

__all__ = ["Plan", "choose_plan", "all_rungs", "TOP_BUDGET"]

#: The share of the top rung's time its check may add when nothing below can pay for it
#: (the issue's target: adaptive <= 1.25x plain float64 on every kernel).
TOP_BUDGET = 0.25


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


def _fmt(s: float) -> str:
    return f"{s * 1e3:.3g} ms" if s >= 1e-4 else f"{s * 1e6:.3g} us"


def choose_plan(n_rungs: int, dtypes, rtol: float, rung_fn, check_fn, avals,
                scale: float = 1.0, backend: str | None = None) -> Plan:
    """The cheapest plan that still checks every answer it returns.

    ``rung_fn(k)``: a function of the arrays computing rung ``k``'s outputs;
    ``check_fn(k, method)``: the same plus the accuracy check by ``method`` (raises
    :class:`~adaptprec._first_order.Unsupported` when the method cannot model the
    kernel). ``avals``: ShapeDtypeStructs of the arrays; ``scale``: multiplies every cost
    (the batch size when planned per element under ``vmap``).
    """
    table = _cost.throughput_for(backend)
    top = n_rungs - 1
    cost = [_cost.program_cost(rung_fn(k), avals, table, dtypes[k]).seconds * scale
            for k in range(n_rungs)]
    if sum(cost) < _cost.FLOOR:
        return all_rungs(n_rungs, f"small kernel (~{_fmt(sum(cost))} for all rungs, "
                                  "modelled): every rung tried, Monte Carlo checks")

    def check_cost(k, method):
        try:
            full = _cost.program_cost(check_fn(k, method), avals, table, dtypes[k])
        except Unsupported:
            return None
        return max(full.seconds * scale - cost[k], 0.0)

    attempt = [False] * n_rungs
    check = [None] * n_rungs
    note = [""] * n_rungs
    share = [None] * n_rungs

    # the top rung: always run; the most thorough check that fits the budget
    budget = max(_cost.FLOOR, TOP_BUDGET * cost[top])
    mca = check_cost(top, "mca")
    fo = check_cost(top, "first_order")
    attempt[top] = True
    if mca is not None and mca <= budget:
        check[top], c = "mca", mca
        note[top] = "Monte Carlo check"
    elif fo is not None and fo <= budget:
        check[top], c = "first_order", fo
        note[top] = "first-order error bound"
    else:
        check[top], c = "screen", check_cost(top, "screen") or 0.0
        best = min(x for x in (mca, fo, float("inf")) if x is not None)
        note[top] = (f"screens only (cancellation, finite): an error estimate would cost "
                     f"{_fmt(best)} > {TOP_BUDGET:.0%} of the rung's {_fmt(cost[top])}")
    share[top] = c / (cost[top] + c) if cost[top] + c > 0 else 0.0
    note[top] += f" (check ~{share[top]:.0%} of the rung's time, modelled)"
    next_total = cost[top] + c

    jaxpr = jax.make_jaxpr(rung_fn(0))(*avals).jaxpr
    n_acc = _cost.longest_accumulation(jaxpr)
    for k in range(top - 1, -1, -1):
        u = 2.0 ** -(int(jax.numpy.finfo(dtypes[k]).nmant) + 1)
        prior = u * math.sqrt(n_acc)
        if prior > rtol:
            note[k] = (f"skipped: a-priori error u*sqrt({n_acc}) = {prior:.2g} > rtol "
                       f"{rtol:g}")
            continue
        fo = check_cost(k, "first_order")
        method, c = ("first_order", fo) if fo is not None else ("mca",
                                                                check_cost(k, "mca"))
        saving = next_total - cost[k]
        if c is None or c >= saving:
            note[k] = (f"skipped: its check ({_fmt(c or 0.0)}) would cost more than it "
                       f"saves ({_fmt(max(saving, 0.0))}), modelled")
            continue
        attempt[k], check[k] = True, method
        share[k] = c / (cost[k] + c) if cost[k] + c > 0 else 0.0
        what = "first-order error bound" if method == "first_order" else "Monte Carlo check"
        note[k] = f"{what} (check ~{share[k]:.0%} of the rung's time, modelled)"
        next_total = cost[k] + c
    return Plan(tuple(attempt), tuple(check), tuple(note), tuple(share))
