"""Custom derivatives under autocast: ``custom_jvp_call`` and ``custom_vjp_call``.

Both are re-wrapped with :func:`jax.custom_jvp` / :func:`jax.custom_vjp` so the user's
rules keep working: the primal is the call's jaxpr evaluated under the policy; the JVP
rule is the original JVP jaxpr evaluated under the policy (tangents cast to the primal
output dtypes); the VJP forward is the original forward jaxpr under the policy and the
backward is the user's own function (cotangents cast to the dtypes of the primal inputs).
Rules run in other traces than the primal, so they get a fresh cast cache.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

try:  # jax.extend.core's classes, without importing all of jax.extend
    from jax._src.core import ClosedJaxpr
except ImportError:  # pragma: no cover
    from jax.extend.core import ClosedJaxpr

from .._opkind import OpKind
from .context import _Ctx, _is_float, _Lit, _raw, _Recorder, _split_literals, walk, walk_closed

__all__: list[str] = []


def _custom_setup(ctx: _Ctx, eqn, invals):
    """Shared by the custom_jvp/custom_vjp handlers: the array operands (literals are
    closed over), their positions, ``rebuild``, a recorder with a fresh cast cache (rules
    run in other traces), and the primal evaluated under the policy — recorded or quiet."""
    call: ClosedJaxpr = eqn.params["call_jaxpr"]
    arrays, pos, rebuild = _split_literals(invals)
    rec = _Recorder(ctx, inherit_cache=False)
    ctx.stats.op(OpKind.CONTROL, eqn.primitive.name, None)

    def primal(*xs):
        return [_raw(o) for o in walk_closed(rec.child(), call, rebuild(xs))]

    def quiet(*xs):
        return [_raw(o) for o in walk_closed(rec.quiet(), call, rebuild(xs))]

    return arrays, pos, rebuild, rec, primal, quiet


def _custom_jvp(ctx: _Ctx, eqn, invals) -> list:
    """Re-wrap with jax.custom_jvp: primal = call_jaxpr under the policy, rule = the
    original JVP jaxpr under the policy (tangents cast to the primal output dtypes)."""
    p = eqn.params
    jvp_fun, nconst, symbolic = p["jvp_jaxpr_fun"], p["num_consts"], p["symbolic_zeros"]
    arrays, pos, rebuild, rec, primal, quiet = _custom_setup(ctx, eqn, invals)

    def rule(primals, tangents):
        full = rebuild(primals)
        out = quiet(*primals)
        tfull: list = [None] * len(full)
        for i, t in zip(pos, tangents):
            tfull[i] = t
        args, targs = full[nconst:], tfull[nconst:]
        if symbolic:
            zeros = [t is None or _is_zero_tangent(t) for t in targs]
        else:  # the rule expects instantiated zeros, as JAX would give it
            targs = [_zero_tangent(a) if t is None else t for a, t in zip(args, targs)]
            zeros = [False] * len(targs)
        jaxpr, consts, out_zeros = jvp_fun.call_wrapped(*zeros)
        nz = [t for t, z in zip(targs, zeros) if not z]
        res = walk(rec.quiet(), jaxpr, consts, [*args, *nz])
        nz_out = iter(res[len(out_zeros):])
        tan_out = []
        for o, z in zip(out, out_zeros):
            if z:
                tan_out.append(jnp.zeros(o.shape, _tangent_dtype(o.dtype)))
            else:
                t = _raw(next(nz_out))
                tan_out.append(t.astype(o.dtype) if _is_float(o.dtype) else t)
        return out, tan_out

    f = jax.custom_jvp(primal)
    f.defjvp(rule)
    out = f(*arrays)
    rec.commit()
    return list(out)


def _custom_vjp(ctx: _Ctx, eqn, invals) -> list:
    """Re-wrap with jax.custom_vjp: primal = call_jaxpr under the policy, fwd = the
    original forward jaxpr under the policy, bwd = the user's backward function as is
    (cotangents cast to the dtypes of the primal inputs)."""
    p = eqn.params
    fwd_thunk, bwd, out_trees = p["fwd_jaxpr_thunk"], p["bwd"], p["out_trees"]
    nconst = p["num_consts"]
    arrays, pos, rebuild, rec, primal, quiet = _custom_setup(ctx, eqn, invals)

    def fwd(*xs):
        full = rebuild(xs)
        shapes = jax.eval_shape(quiet, *xs)
        nonzeros = [not isinstance(v, _Lit) for v in full[nconst:]]
        jaxpr, consts = fwd_thunk.call_wrapped(*nonzeros)
        res_out = walk(rec.quiet(), jaxpr, consts, full[nconst:])
        _, res_tree, input_fwds = out_trees()
        n_res = res_tree.num_leaves - sum(f is not None for f in input_fwds)
        res_it = iter(_raw(r) for r in res_out[:n_res])
        res = [next(res_it) if f is None else _raw(full[f]) for f in input_fwds]
        outs = [_raw(o).astype(s.dtype) if _is_float(s.dtype) else _raw(o)
                for o, s in zip(res_out[n_res:], shapes)]
        return outs, res

    def bwd_rule(res, cts):
        cts_in = list(bwd.call_wrapped(*res, *cts))
        out = []
        for i, x in zip(pos, arrays):
            ct = cts_in[i - nconst] if i >= nconst else None
            if not _is_float(x.dtype):
                out.append(None)
            elif ct is None or not hasattr(ct, "dtype") or not hasattr(ct, "shape"):
                out.append(jnp.zeros(x.shape, x.dtype))
            else:
                out.append(jnp.asarray(ct).astype(x.dtype))
        return tuple(out)

    f = jax.custom_vjp(primal)
    f.defvjp(fwd, bwd_rule)
    out = f(*arrays)
    rec.commit()
    return list(out)


def _is_zero_tangent(t: Any) -> bool:
    return getattr(t, "dtype", None) == jax.dtypes.float0


def _zero_tangent(v: Any) -> Any:
    v = _raw(v)
    return jnp.zeros(jnp.shape(v), _tangent_dtype(v.dtype))


def _tangent_dtype(dtype):
    return dtype if _is_float(dtype) or jnp.issubdtype(dtype, jnp.complexfloating) \
        else jax.dtypes.float0
