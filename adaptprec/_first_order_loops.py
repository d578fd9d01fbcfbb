"""The first-order error walk through loops and branches (``scan``, ``while``, ``cond``).

A loop is walked by a loop of the same kind whose carry holds each carried value *and*
its error bound: every iteration runs the first-order walk of the body on the values and
errors the previous one left, so the error of the carry is propagated step by step
inside the same loop (the rung's own values are computed by that loop too, so the check
adds only the error arithmetic, not a second pass). A carried float value's bound is an
array of its shape from the start (zero when it enters exact); integer carries (loop
counters) stay exact. Decisions the walk finds unstable inside the body (a comparison
within rounding distance) are counted in the carry; a ``while`` loop's exit test is such
a decision too, on every iteration and at the exit (a different trip count is a
different answer). A ``cond`` walks every branch under ``lax.switch`` on its index.

Mixed into the walk of :mod:`adaptprec._first_order` (``LoopRules``): ``self.run``,
``self.dense`` and ``self.fresh`` are the walk's.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax import lax

__all__ = ["LoopRules"]


def _is_float(dtype) -> bool:
    return dtype is not None and jnp.issubdtype(dtype, jnp.floating)


class LoopRules:
    """``scan``, ``while`` and ``cond`` for the first-order walk."""

    def slot(self, v, e):
        """The carried error of value ``v``: an array of its shape in the error dtype
        for a float (zeros when exact), ``None`` for an integer."""
        if not _is_float(jnp.result_type(v)):
            return None
        w = self.edt(jnp.result_type(v))
        if e is None:
            return jnp.zeros(jnp.shape(v), w)
        return jnp.broadcast_to(self.dense(e, v), jnp.shape(v)).astype(w)

    def _body(self, walk, closed, vals, errs):
        """``(values, errors, unstable count)`` of one walk of ``closed`` on fresh
        bookkeeping."""
        walk.unstable = []
        res = walk.run(closed.jaxpr, closed.consts, list(vals), list(errs))
        count = sum(walk.unstable, jnp.float32(0))
        return [v for v, _ in res], [e for _, e in res], count

    def p_scan(self, eqn, vals, errs):
        p = eqn.params
        closed, nc, ncar = p["jaxpr"], p["num_consts"], p["num_carry"]
        errs = [self.dense(e, v) for e, v in zip(errs, vals)]
        consts, ec = vals[:nc], errs[:nc]
        init = [self.slot(v, e) for v, e in zip(vals[nc:nc + ncar], errs[nc:nc + ncar])]
        xs, exs = vals[nc + ncar:], errs[nc + ncar:]
        walk = self.fresh()

        def body(state, x):
            cv, ce, count = state
            v, e, seen = self._body(walk, closed, list(consts) + list(cv) + list(x[0]),
                                    list(ec) + list(ce) + list(x[1]))
            carried = [self.slot(a, b) for a, b in zip(v[:ncar], e[:ncar])]
            ys = [None if b is None else walk.dense(b, a)
                  for a, b in zip(v[ncar:], e[ncar:])]
            return (v[:ncar], carried, count + seen), (v[ncar:], ys)

        (cv, ce, count), (ysv, yse) = lax.scan(
            body, (list(vals[nc:nc + ncar]), init, jnp.float32(0)), (list(xs), list(exs)),
            length=p["length"], reverse=p["reverse"], unroll=p["unroll"])
        self.unstable.append(count)
        return list(zip(cv, ce)) + list(zip(ysv, yse))

    def p_while(self, eqn, vals, errs):
        p = eqn.params
        cj, bj = p["cond_jaxpr"], p["body_jaxpr"]
        cn, bn = p["cond_nconsts"], p["body_nconsts"]
        errs = [self.dense(e, v) for e, v in zip(errs, vals)]
        cc, ecc = vals[:cn], errs[:cn]
        bc, ebc = vals[cn:cn + bn], errs[cn:cn + bn]
        init = [self.slot(v, e) for v, e in zip(vals[cn + bn:], errs[cn + bn:])]
        walk = self.fresh()

        def decide(cv, ce):
            v, _, seen = self._body(walk, cj, list(cc) + list(cv), list(ecc) + list(ce))
            return v[0], seen

        def body(state):
            cv, ce, count = state
            _, entered = decide(cv, ce)     # the exit test that let this iteration run
            v, e, seen = self._body(walk, bj, list(bc) + list(cv), list(ebc) + list(ce))
            return v, [self.slot(a, b) for a, b in zip(v, e)], count + entered + seen

        cv, ce, count = lax.while_loop(lambda s: decide(s[0], s[1])[0], body,
                                       (list(vals[cn + bn:]), init, jnp.float32(0)))
        _, last = decide(cv, ce)            # the exit test that ended the loop
        self.unstable.append(count + last)
        return list(zip(cv, ce))

    def p_cond(self, eqn, vals, errs):
        branches = eqn.params["branches"]
        ops = list(vals[1:])
        eops = [self.dense(e, v) for e, v in zip(errs[1:], vals[1:])]
        walk = self.fresh()
        floats = [_is_float(np.dtype(v.aval.dtype)) for v in eqn.outvars]

        def make(closed):
            def run(ops, eops):
                v, e, seen = self._body(walk, closed, ops, eops)
                # every branch returns the same structure: float errors as arrays
                return v, [self.slot(a, b) if f else None
                           for a, b, f in zip(v, e, floats)], seen
            return run

        v, e, count = lax.switch(vals[0], [make(b) for b in branches], ops, eops)
        self.unstable.append(count)
        return list(zip(v, e))
