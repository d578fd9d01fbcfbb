"""Control flow under autocast: calls, ``remat``, ``scan``, ``while`` and ``cond``.

Each handler re-issues the primitive with JAX's public API over the transformed body:

* ``jit``/``closed_call``: inlined (the body's equations run in the caller's context);
* ``remat2``: re-wrapped in :func:`jax.checkpoint`;
* ``scan``/``while``: :func:`jax.lax.scan` / :func:`jax.lax.while_loop`; floating loop
  carries get the ``CONTROL`` rule's dtype (float32 under the AUTO presets, so that
  ``y + h * f(y)`` does not stagnate) and the body's new carry is cast to it; under an
  ``input`` carry rule the carry dtype is widened until the body returns what it is
  given (a fixed point reached in a few passes);
* ``cond``: :func:`jax.lax.switch` over the transformed branches, outputs promoted to a
  common dtype.

Bodies may be traced more than once (shape probes, the real trace): each trace gets its
own context from a :class:`~.context._Recorder`, and only the last one's statistics are
merged into the caller's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

try:  # jax.extend.core's classes, without importing all of jax.extend
    from jax._src.core import ClosedJaxpr, Jaxpr
except ImportError:  # pragma: no cover
    from jax.extend.core import ClosedJaxpr, Jaxpr

from .. import _jaxpr as jx
from .._opkind import OpKind
from .context import (
    _Ctx,
    _fmt,
    _is_float,
    _raw,
    _Recorder,
    _resolve,
    _split_literals,
    _widest,
    walk,
    walk_closed,
)
from .presets import Rule

__all__: list[str] = []


def _inline(ctx: _Ctx, eqn, invals) -> list:
    ctx.stats.op(OpKind.CONTROL, eqn.primitive.name, None)
    return walk(ctx, *jx.call_body(eqn), invals)


def _remat(ctx: _Ctx, eqn, invals) -> list:
    sub: Jaxpr = eqn.params["jaxpr"]
    rec = _Recorder(ctx)
    ctx.stats.op(OpKind.CONTROL, "remat2", None)

    def body(*xs):
        return [_raw(o) for o in walk(rec.child(), sub, (), xs)]

    out = jax.checkpoint(body, prevent_cse=eqn.params["prevent_cse"],
                         policy=eqn.params["policy"])(*[_raw(v) for v in invals])
    rec.commit()
    return list(out)


def _carry_dtypes(ctx: _Ctx, name: str, init: Sequence[Any]) -> list:
    rule = ctx.policy.rule_for(name)
    return [np.dtype(_resolve(ctx.policy, rule, v.dtype, name, OpKind.CONTROL))
            if _is_float(v.dtype) else None for v in init]


def _fix_carry(ctx: _Ctx, name: str, init: list, step: Callable) -> list:
    """Carry dtypes of a loop: the CONTROL rule's dtype; under an ``input`` rule, widened
    until the body returns what it is given (a fixed point reached in a few passes)."""
    dts = _carry_dtypes(ctx, name, init)
    if ctx.policy.rule_for(name) is not Rule.INPUT:
        return dts
    for _ in range(4):
        avals = [jax.ShapeDtypeStruct(v.shape, v.dtype if d is None else d)
                 for v, d in zip(init, dts)]
        outs = jax.eval_shape(step, avals)
        new = [None if d is None else np.dtype(jnp.promote_types(d, o.dtype))
               for d, o in zip(dts, outs)]
        if new == dts:
            break
        dts = new
    return dts


def _cast_carry(ctx: _Ctx, outs: Sequence[Any], dts: Sequence[Any], init) -> list:
    return [ctx.cast(o, d, OpKind.CONTROL) if d is not None else _raw(o, i.dtype)
            for o, d, i in zip(outs, dts, init)]


def _scan(ctx: _Ctx, eqn, invals) -> list:
    p = eqn.params
    body: ClosedJaxpr = p["jaxpr"]
    nc, ncar = p["num_consts"], p["num_carry"]
    consts = invals[:nc]
    init = [_raw(v) for v in invals[nc:nc + ncar]]
    xs = [_raw(v) for v in invals[nc + ncar:]]
    rec = _Recorder(ctx)

    def probe(carry):  # the body's carry output dtypes for given carry dtypes
        def run(c, xsl):
            return [_raw(o) for o in walk_closed(rec.quiet(), body, [*consts, *c, *xsl])]
        xsl = [jax.ShapeDtypeStruct(x.shape[1:], x.dtype) for x in xs]
        return jax.eval_shape(run, carry, xsl)[:ncar]

    dts = _fix_carry(ctx, "scan", init, probe)

    def step(carry, x):
        c = rec.child()
        outs = walk_closed(c, body, [*consts, *carry, *(x if x is not None else ())])
        return _cast_carry(c, outs[:ncar], dts, init), [_raw(o) for o in outs[ncar:]]

    init_c = _cast_carry(ctx, init, dts, init)
    ctx.stats.op(OpKind.CONTROL, "scan", _fmt(dts))
    carry, ys = lax.scan(step, init_c, xs if xs else None, length=p["length"],
                         reverse=p["reverse"], unroll=p["unroll"])
    rec.commit()
    return [*carry, *ys]


def _while(ctx: _Ctx, eqn, invals) -> list:
    p = eqn.params
    cj: ClosedJaxpr = p["cond_jaxpr"]
    bj: ClosedJaxpr = p["body_jaxpr"]
    cn, bn = p["cond_nconsts"], p["body_nconsts"]
    cconsts, bconsts = invals[:cn], invals[cn:cn + bn]
    init = [_raw(v) for v in invals[cn + bn:]]
    crec, brec = _Recorder(ctx), _Recorder(ctx)

    def probe(carry):
        return jax.eval_shape(
            lambda c: [_raw(o) for o in walk_closed(brec.quiet(), bj, [*bconsts, *c])],
            carry)

    dts = _fix_carry(ctx, "while", init, probe)

    def cond_fun(carry):
        return _raw(walk_closed(crec.child(), cj, [*cconsts, *carry])[0])

    def body_fun(carry):
        c = brec.child()
        return _cast_carry(c, walk_closed(c, bj, [*bconsts, *carry]), dts, init)

    init_c = _cast_carry(ctx, init, dts, init)
    ctx.stats.op(OpKind.CONTROL, "while", _fmt(dts))
    out = lax.while_loop(cond_fun, body_fun, init_c)
    crec.commit()
    brec.commit()
    return list(out)


def _cond(ctx: _Ctx, eqn, invals) -> list:
    branches: Sequence[ClosedJaxpr] = eqn.params["branches"]
    index = _raw(invals[0])
    ops, _, rebuild = _split_literals(invals[1:])
    recs = [_Recorder(ctx) for _ in branches]
    shapes = [jax.eval_shape(lambda *o, br=br, r=r: [
        _raw(x) for x in walk_closed(r.quiet(), br, rebuild(o))], *ops)
        for br, r in zip(branches, recs)]
    dts = [_widest([s[i].dtype for s in shapes]) for i in range(len(shapes[0]))]

    def make(br, rec):
        def run(*o):
            c = rec.child()
            outs = walk_closed(c, br, rebuild(o))
            return [c.cast(x, d, OpKind.CONTROL) if _is_float(d) else _raw(x, d)
                    for x, d in zip(outs, dts)]
        return run

    ctx.stats.op(OpKind.CONTROL, "cond", _fmt(dts))
    out = lax.switch(index, [make(br, r) for br, r in zip(branches, recs)], *ops)
    for r in recs:
        r.commit()
    return list(out)
