"""``autocast``: re-evaluate any JAX function's jaxpr with each primitive at its precision.

``autocast(fn, policy)`` traces ``fn`` to a jaxpr with :func:`jax.make_jaxpr` and evaluates
the equations again, one by one, casting the floating operands of each to the dtype its
:class:`~adaptprec.PrecisionPolicy` rule gives (integer, boolean and complex
values are never touched; the walk itself is :func:`adaptprec._jaxpr.eval_jaxpr`, shared
with the pointwise analysis and the fits-last evaluator). Higher-order primitives are
recursed into with JAX's public APIs, so the result is an ordinary traceable function that
composes with ``jit``, ``grad``, ``vmap`` and ``adaptive()``:

* ``jit``/``closed_call``: inlined; ``remat2``: re-wrapped in :func:`jax.checkpoint`;
* ``scan``/``while``: :func:`jax.lax.scan` / :func:`jax.lax.while_loop` over the transformed
  body; floating loop carries get the ``CONTROL`` rule's dtype (float32 under the AUTO
  presets) and the body's new carry is cast to it; ``cond``: :func:`jax.lax.switch` over
  the transformed branches, outputs promoted to a common dtype;
* ``custom_jvp_call``/``custom_vjp_call``: re-wrapped with :func:`jax.custom_jvp` /
  :func:`jax.custom_vjp` whose rules are the original rules (the JVP jaxpr / the forward
  jaxpr re-evaluated under the policy, the user's backward function as is), so custom
  derivatives keep working;
* ``LINALG`` primitives never run below float32 (LAPACK and cuSOLVER have no
  half-precision factorizations), whatever the rule says;
* other primitives carrying jaxprs (``reduce`` with a custom computation,
  ``custom_linear_solve``...) and primitives that refuse the new dtypes run at the dtype
  they were traced at; :func:`~adaptprec.explain` lists them.

A float-to-float ``convert_element_type`` in ``fn`` is a precision decision made for the
traced dtypes; autocast re-decides it with the ``convert_element_type`` primitive's rule
(``DATA_MOVEMENT``: under the AUTO presets it becomes a no-op), so fn's own promotions
neither defeat the policy nor add casts. Casts are reused: each value is cast to each
dtype at most once per traced scope.

Example:
    >>> import jax, jax.numpy as jnp
    >>> import adaptprec as ap
    >>> def f(x, w):
    ...     return jax.nn.logsumexp(jnp.tanh(x @ w), axis=-1)
    >>> x = jnp.linspace(-1.0, 1.0, 12, dtype=jnp.float32).reshape(3, 4)
    >>> w = jnp.eye(4, dtype=jnp.float32)
    >>> g = jax.jit(ap.autocast(f, ap.AUTO_MIXED_BF16))
    >>> bool(jnp.allclose(g(x, w), f(x, w), rtol=1e-2)), g(x, w).dtype.name
    (True, 'float32')
    >>> dots = [e for e in jax.make_jaxpr(g)(x, w).eqns[0].params["jaxpr"].eqns
    ...         if e.primitive.name == "dot_general"]
    >>> [v.aval.dtype.name for v in dots[0].invars], dots[0].outvars[0].aval.dtype.name
    (['bfloat16', 'bfloat16'], 'float32')
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
try:  # jax.extend.core's classes, without importing all of jax.extend (its pallas
    # module alone costs ~15 ms of `import adaptprec`)
    from jax._src.core import ClosedJaxpr, Jaxpr
except ImportError:  # pragma: no cover
    from jax.extend.core import ClosedJaxpr, Jaxpr

from .. import _jaxpr as jx
from . import scopes as _scopes
from ._stats import _Stats, _Tagged
from .._opkind import CALLS, EXACT_REDUCTIONS, PRIMITIVE_KINDS, OpKind, classify
from . import presets as _presets
from .presets import AUTO_MIXED_BF16, PrecisionPolicy, Rule

__all__ = ["autocast"]


# --------------------------------------------------------------------------- values
class _Lit:
    """A scalar literal of the jaxpr: cast for free (numpy), never votes on dtypes."""

    __slots__ = ("val", "dtype")

    def __init__(self, val: Any, dtype: Any):
        self.val = val
        self.dtype = dtype


def _dtype(v: Any):
    return v.dtype


def _is_float(dtype: Any) -> bool:
    if dtype is None:
        return False
    try:
        return bool(jnp.issubdtype(dtype, jnp.floating))
    except TypeError:
        return False


def _raw(v: Any, dtype: Any = None) -> Any:
    """A bindable value: literals become numpy scalars (of ``dtype`` if given)."""
    if isinstance(v, _Lit):
        return np.asarray(v.val, dtype=v.dtype if dtype is None else dtype)
    return v


def _widest(dtypes: Sequence[Any]):
    return functools.reduce(jnp.promote_types, dtypes)


def _split_literals(vals: Sequence[Any]):
    """The non-literal values, and a function putting (new) values back among literals:
    literal operands of a sub-function are closed over so they keep adapting."""
    pos = [i for i, v in enumerate(vals) if not isinstance(v, _Lit)]

    def rebuild(xs: Sequence[Any]) -> list:
        full = list(vals)
        for i, x in zip(pos, xs):
            full[i] = x
        return full

    return [vals[i] for i in pos], pos, rebuild


# --------------------------------------------------------------------------- context
class _Ctx:
    """Policy, statistics and the cast cache of one traced scope.

    ``where`` is the name-stack position: (scope rules, path, keep); equations whose own
    name stack adds scopes run in the context :meth:`at` gives them."""

    def __init__(self, policy: PrecisionPolicy, stats: _Stats | None = None,
                 cache: dict | None = None, hook: Callable | None = None,
                 nested: bool = False, where: tuple | None = None):
        self.policy = policy
        self.where = (_scopes.ScopeRules(policy), (), False) if where is None else where
        self.stats = _Tagged(_Stats() if stats is None else stats,
                             "/".join(self.where[1]))
        self.cache = {} if cache is None else cache
        # Optional per-equation callback ``hook(ctx, eqn, args, outs) -> outs`` applied to
        # the results of first-order primitives and float conversions (used by the Monte
        # Carlo arithmetic of ``guards.accuracy``). ``nested``: a sub-trace (loop body,
        # branch, custom rule) whose values cannot leave it.
        self.hook = hook
        self.nested = nested
        self.kids: dict = {}

    @property
    def keep(self) -> bool:
        return self.where[2]

    def at(self, names: tuple) -> _Ctx:
        """The context of an equation whose own name stack is ``names``: the names
        appended to this context's path, the policy of the most specific matching scope
        rule (same statistics and cast cache)."""
        if not names:
            return self
        kid = self.kids.get(names)
        if kid is None:
            rules, path = self.where[0], self.where[1] + names
            m = rules.match(path)
            kid = copy.copy(self)  # keeps any other per-trace state of this context
            kid.policy, kid.where, kid.kids = m.policy, (rules, path, m.keep), {}
            kid.stats = _Tagged(self.stats, "/".join(path))
            self.kids[names] = kid
        return kid

    def cast(self, v: Any, dtype: Any, kind: OpKind) -> Any:
        """``v`` in ``dtype``; literals for free, arrays once per (value, dtype)."""
        if isinstance(v, _Lit):
            return np.asarray(v.val, dtype=dtype)
        if v.dtype == dtype:
            return v
        key = (id(v), np.dtype(dtype))
        hit = self.cache.get(key)
        if hit is not None:
            return hit[1]
        out = lax.convert_element_type(v, dtype)
        self.stats.cast(kind)
        self.cache[key] = (v, out)
        if jnp.promote_types(v.dtype, dtype) == dtype:  # exact upcast: going back is free
            self.cache[(id(out), np.dtype(v.dtype))] = (out, v)
        return out


class _Recorder:
    """Creates the context of a sub-trace (loop body, branch, custom rule) and merges the
    statistics of the last trace into the parent when committed (bodies may be traced more
    than once; eval_shape passes use ``quiet`` contexts that are never merged)."""

    def __init__(self, parent: _Ctx, inherit_cache: bool = True):
        self.parent = parent
        self.inherit = inherit_cache
        self.last: _Ctx | None = None

    def child(self) -> _Ctx:
        self.last = self.quiet()
        return self.last

    def quiet(self) -> _Ctx:
        return _Ctx(self.parent.policy, _Stats(),
                    dict(self.parent.cache) if self.inherit else {},
                    hook=self.parent.hook, nested=True, where=self.parent.where)

    def commit(self) -> None:
        if self.last is not None:
            self.parent.stats.merge(self.last.stats)
            self.last = None


# --------------------------------------------------------------------------- rules
def _resolve(policy: PrecisionPolicy, rule, in_dtype, name: str, kind: OpKind):
    """The dtype the floating operands of ``name`` are cast to."""
    if rule is Rule.LOW:
        return policy.dtype
    if rule is Rule.HIGH:
        return policy.accumulate
    if rule is Rule.ACCUMULATE:
        if name in EXACT_REDUCTIONS:
            return in_dtype
        if kind is OpKind.COMPUTE:
            return policy.dtype
        return policy.accumulate
    if rule is Rule.INPUT:
        return _capped(in_dtype, policy.accumulate)
    return np.dtype(rule)


def _capped(dtype, cap):
    """``dtype``, or ``cap`` if ``dtype`` is more precise than ``cap``."""
    return cap if jnp.finfo(dtype).eps < jnp.finfo(cap).eps else dtype


def _compute_params(policy: PrecisionPolicy, rule, target, params: dict) -> dict:
    """preferred_element_type / precision of dot_general and conv under the policy."""
    params = dict(params)
    acc = target
    pet = policy.preferred_element_type
    if (rule is Rule.ACCUMULATE and pet is not None
            and jnp.promote_types(pet, target) == pet):
        acc = pet
    params["preferred_element_type"] = np.dtype(acc)
    if policy.dot_precision is not None and "precision" in params:
        params["precision"] = (policy.dot_precision, policy.dot_precision)
    return params


# --------------------------------------------------------------------------- evaluation
def _eval_jaxpr(ctx: _Ctx, jaxpr: Jaxpr, consts: Sequence[Any], args: Sequence[Any]):
    def step(eqn, invals):
        handler = _HANDLERS.get(eqn.primitive.name)
        names = _scopes.scope_path(eqn.source_info.name_stack)
        sctx = ctx.at(names)  # the scope rule of eqn's name stack
        with _scopes.named(names):
            if sctx.keep:
                return _kept(sctx, eqn, invals, handler)
            if handler is not None:
                return handler(sctx, eqn, invals)
            if jx.has_sub_jaxpr(eqn) or eqn.primitive.name in _TRACED_DTYPE:
                return _at_traced_dtype(sctx, eqn, invals)
            return _first_order(sctx, eqn, invals)

    return jx.eval_jaxpr(jaxpr, consts, args, step,
                         literal=lambda lit: _Lit(lit.val, lit.aval.dtype))


def _eval_closed(ctx: _Ctx, closed: ClosedJaxpr, args: Sequence[Any]) -> list:
    return _eval_jaxpr(ctx, closed.jaxpr, closed.consts, args)


# Primitives whose meaning depends on the exact traced dtype of their operands: bit
# casts, and opaque host/FFI code with a declared signature.
_TRACED_DTYPE = frozenset({"bitcast_convert_type", "pure_callback", "io_callback",
                           "debug_callback", "ffi_call"})
# Variadic primitives whose operands are independent (never unify their dtypes).
_INDEPENDENT = frozenset({"device_put", "optimization_barrier", "sharding_constraint"})


def _at_traced_dtype(ctx: _Ctx, eqn, invals) -> list:
    """Run ``eqn`` exactly as traced: floating operands cast back to their traced dtypes."""
    name = eqn.primitive.name
    kind = classify(name)
    args = [ctx.cast(v, var.aval.dtype, kind) if _is_float(_dtype(v)) else _raw(v)
            for v, var in zip(invals, eqn.invars)]
    ctx.stats.fallback.add(name)
    ctx.stats.op(kind, name, "as traced")
    return jx.bind(eqn, args)


# Handlers that recurse into bodies (the CONTROL kind); inside a ``keep`` region they still
# run (a nested scope may have its own rule), with operands at their traced dtypes.
_RECURSIVE = frozenset(n for n, k in PRIMITIVE_KINDS.items() if k is OpKind.CONTROL)


def _kept(ctx: _Ctx, eqn, invals, handler) -> list:
    """An equation in a ``keep`` scope: floating operands back at their traced dtypes."""
    name = eqn.primitive.name
    kind = classify(name)
    args = [_to_traced(ctx, v, var.aval.dtype, kind) for v, var in zip(invals, eqn.invars)]
    if handler is not None and name in _RECURSIVE:
        return handler(ctx, eqn, args)
    ctx.stats.op(kind, name, _fmt([v.aval.dtype for v in eqn.outvars
                                   if _is_float(v.aval.dtype)]))
    raw = [_raw(v) for v in args]
    outs = jx.bind(eqn, raw)
    hook = getattr(ctx, "hook", None)  # a per-equation hook, if the context has one
    return outs if hook is None else hook(ctx, eqn, raw, outs)


def _to_traced(ctx: _Ctx, v: Any, dtype: Any, kind: OpKind) -> Any:
    if not _is_float(_dtype(v)) or not _is_float(dtype):
        return v
    if isinstance(v, _Lit):
        return _Lit(np.asarray(v.val, dtype=dtype), np.dtype(dtype))
    return ctx.cast(v, dtype, kind)


def _first_order(ctx: _Ctx, eqn, invals) -> list:
    prim = eqn.primitive
    name = prim.name
    kind = classify(name)
    policy = ctx.policy
    if kind is OpKind.UNKNOWN:
        ctx.stats.unknown.add(name)
    floats = [i for i, v in enumerate(invals) if _is_float(_dtype(v))]
    if not floats or (name in _INDEPENDENT and policy.rule_for(name) is Rule.INPUT):
        ctx.stats.op(kind, name, None)
        return jx.bind(eqn, [_raw(v) for v in invals])
    rule = policy.rule_for(name)
    arrays = [_dtype(invals[i]) for i in floats if not isinstance(invals[i], _Lit)]
    in_dtype = _widest(arrays or [_dtype(invals[i]) for i in floats])
    target = np.dtype(_resolve(policy, rule, in_dtype, name, kind))
    if kind is OpKind.LINALG and jnp.finfo(target).bits < 32:
        target = np.dtype(np.float32)  # LAPACK/cuSOLVER have no half-precision kernels
    params = dict(eqn.params)
    if "preferred_element_type" in params and kind is OpKind.COMPUTE:
        params = _compute_params(policy, rule, target, params)
    if params.get("out_dtype") is not None and _is_float(params["out_dtype"]):
        params["out_dtype"] = None
    fset = set(floats)
    args = [ctx.cast(v, target, kind) if i in fset else _raw(v)
            for i, v in enumerate(invals)]
    try:
        outs = jx.bind(eqn, args, params)
    except (TypeError, ValueError):
        # The primitive does not accept these dtypes: run it as traced.
        return _at_traced_dtype(ctx, eqn, invals)
    label = target
    if "preferred_element_type" in params:  # operands -> accumulator
        label = f"{target.name}->{np.dtype(params['preferred_element_type']).name}"
    ctx.stats.op(kind, name, label)
    if ctx.hook is not None:
        outs = ctx.hook(ctx, eqn, args, outs)
    if policy.cast_back and rule in (Rule.HIGH, Rule.ACCUMULATE):
        outs = [ctx.cast(o, policy.dtype, kind) if _is_float(o.dtype) else o
                for o in outs]
    return outs


# --------------------------------------------------------------------------- handlers
def _convert(ctx: _Ctx, eqn, invals) -> list:
    (x,) = invals
    new = eqn.params["new_dtype"]
    name = "convert_element_type"
    kind = classify(name)
    if not _is_float(new):
        ctx.stats.op(kind, name, None)
        ctx.stats.retained_converts += not isinstance(x, _Lit)
        return jx.bind(eqn, [_raw(x)])
    src_float = _is_float(_dtype(x))
    rule = ctx.policy.rule_for(name)
    target = np.dtype(_resolve(ctx.policy, rule, _dtype(x) if src_float else new,
                               name, kind))
    ctx.stats.op(kind, name, target)
    if isinstance(x, _Lit):
        return [_Lit(np.asarray(x.val, dtype=target), target)]
    if x.dtype == target:
        out = [x]
    else:
        ctx.stats.retained_converts += 1
        out = jx.bind(eqn, [x], dict(eqn.params, new_dtype=target))
    return out if ctx.hook is None else ctx.hook(ctx, eqn, [x], out)


def _inline(ctx: _Ctx, eqn, invals) -> list:
    ctx.stats.op(OpKind.CONTROL, eqn.primitive.name, None)
    return _eval_jaxpr(ctx, *jx.call_body(eqn), invals)


def _remat(ctx: _Ctx, eqn, invals) -> list:
    sub: Jaxpr = eqn.params["jaxpr"]
    rec = _Recorder(ctx)
    ctx.stats.op(OpKind.CONTROL, "remat2", None)

    def body(*xs):
        return [_raw(o) for o in _eval_jaxpr(rec.child(), sub, (), xs)]

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
            return [_raw(o) for o in _eval_closed(rec.quiet(), body, [*consts, *c, *xsl])]
        xsl = [jax.ShapeDtypeStruct(x.shape[1:], x.dtype) for x in xs]
        return jax.eval_shape(run, carry, xsl)[:ncar]

    dts = _fix_carry(ctx, "scan", init, probe)

    def step(carry, x):
        c = rec.child()
        outs = _eval_closed(c, body, [*consts, *carry, *(x if x is not None else ())])
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
            lambda c: [_raw(o) for o in _eval_closed(brec.quiet(), bj, [*bconsts, *c])],
            carry)

    dts = _fix_carry(ctx, "while", init, probe)

    def cond_fun(carry):
        return _raw(_eval_closed(crec.child(), cj, [*cconsts, *carry])[0])

    def body_fun(carry):
        c = brec.child()
        return _cast_carry(c, _eval_closed(c, bj, [*bconsts, *carry]), dts, init)

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
        _raw(x) for x in _eval_closed(r.quiet(), br, rebuild(o))], *ops)
        for br, r in zip(branches, recs)]
    dts = [_widest([s[i].dtype for s in shapes]) for i in range(len(shapes[0]))]

    def make(br, rec):
        def run(*o):
            c = rec.child()
            outs = _eval_closed(c, br, rebuild(o))
            return [c.cast(x, d, OpKind.CONTROL) if _is_float(d) else _raw(x, d)
                    for x, d in zip(outs, dts)]
        return run

    ctx.stats.op(OpKind.CONTROL, "cond", _fmt(dts))
    out = lax.switch(index, [make(br, r) for br, r in zip(branches, recs)], *ops)
    for r in recs:
        r.commit()
    return list(out)


def _custom_setup(ctx: _Ctx, eqn, invals):
    """Shared by the custom_jvp/custom_vjp handlers: the array operands (literals are
    closed over), their positions, ``rebuild``, a recorder with a fresh cast cache (rules
    run in other traces), and the primal evaluated under the policy — recorded or quiet."""
    call: ClosedJaxpr = eqn.params["call_jaxpr"]
    arrays, pos, rebuild = _split_literals(invals)
    rec = _Recorder(ctx, inherit_cache=False)
    ctx.stats.op(OpKind.CONTROL, eqn.primitive.name, None)

    def primal(*xs):
        return [_raw(o) for o in _eval_closed(rec.child(), call, rebuild(xs))]

    def quiet(*xs):
        return [_raw(o) for o in _eval_closed(rec.quiet(), call, rebuild(xs))]

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
        res = _eval_jaxpr(rec.quiet(), jaxpr, consts, [*args, *nz])
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
        res_out = _eval_jaxpr(rec.quiet(), jaxpr, consts, full[nconst:])
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


def _fmt(dts: Sequence[Any]) -> str | None:
    names = sorted({np.dtype(d).name for d in dts if d is not None})
    return "/".join(names) if names else None


def _scatter(ctx: _Ctx, eqn, invals) -> list:
    """scatter*: operand and updates share a dtype; the combiner jaxpr is rebuilt."""
    fn = _SCATTERS[eqn.primitive.name]
    p = eqn.params
    name = eqn.primitive.name
    kind = classify(name)
    operand, indices, updates = invals
    rule = ctx.policy.rule_for(name)
    if not _is_float(_dtype(operand)):
        return _at_traced_dtype(ctx, eqn, invals)
    arrays = [v.dtype for v in (operand, updates) if not isinstance(v, _Lit)]
    target = np.dtype(_resolve(ctx.policy, rule, _widest(arrays or [operand.dtype]),
                               name, kind))
    ctx.stats.op(kind, name, target)
    out = fn(ctx.cast(operand, target, kind), _raw(indices),
             ctx.cast(updates, target, kind), p["dimension_numbers"],
             indices_are_sorted=p["indices_are_sorted"],
             unique_indices=p["unique_indices"], mode=p["mode"])
    return [out]


_SCATTERS = {"scatter": lax.scatter, "scatter-add": lax.scatter_add,
             "scatter-sub": lax.scatter_sub, "scatter-mul": lax.scatter_mul,
             "scatter-min": lax.scatter_min, "scatter-max": lax.scatter_max}

_HANDLERS: dict[str, Callable] = {
    "convert_element_type": _convert,
    **{name: _inline for name in CALLS},
    "remat2": _remat,
    "checkpoint": _remat,
    "scan": _scan,
    "while": _while,
    "cond": _cond,
    "custom_jvp_call": _custom_jvp,
    "custom_vjp_call": _custom_vjp,
    **{name: _scatter for name in _SCATTERS},
}


# --------------------------------------------------------------------------- entry
def _is_dynamic(leaf: Any) -> bool:
    return isinstance(leaf, (jax.Array, np.ndarray, np.generic))


def _describe(leaf: Any) -> str:
    if _is_dynamic(leaf):
        return f"{jnp.dtype(leaf.dtype).name}{list(jnp.shape(leaf))}"
    return repr(leaf)


def _trace(fn: Callable, args: tuple, kwargs: dict):
    """(closed jaxpr over the array leaves, output treedef, the array leaves)."""
    leaves, treedef = jax.tree_util.tree_flatten((args, kwargs))
    dyn_idx = [i for i, leaf in enumerate(leaves) if _is_dynamic(leaf)]
    dyn = [leaves[i] for i in dyn_idx]
    store: dict = {}

    def flat(*xs):
        ls = list(leaves)
        for i, x in zip(dyn_idx, xs):
            ls[i] = x
        a, k = jax.tree_util.tree_unflatten(treedef, ls)
        out_leaves, store["tree"] = jax.tree_util.tree_flatten(fn(*a, **k))
        return out_leaves

    try:
        closed = jax.make_jaxpr(flat)(*dyn)
    except (TypeError, jax.errors.UnexpectedTracerError) as exc:
        name = getattr(fn, "__qualname__", getattr(fn, "__name__", repr(fn)))
        shown = ", ".join(_describe(leaf) for leaf in leaves)
        raise TypeError(
            f"autocast could not trace {name}({shown}) to a jaxpr: {type(exc).__name__}: "
            f"{exc}\nautocast needs a function JAX can trace (no Python control flow or "
            f"numpy conversions on array values; use jax.lax.cond/while_loop/scan)."
        ) from exc
    return closed, store["tree"], dyn


def _boundary(ctx: _Ctx, v: Any) -> Any:
    if not _is_float(v.dtype):
        return v
    rule = ctx.policy.rule_for(OpKind.BOUNDARY)
    target = _resolve(ctx.policy, rule, v.dtype, "boundary", OpKind.BOUNDARY)
    return ctx.cast(v, np.dtype(target), OpKind.BOUNDARY)


def _run(fn: Callable, policy: PrecisionPolicy, args: tuple, kwargs: dict,
         stats: _Stats | None = None, scopes: _scopes.ScopeRules | None = None):
    closed, out_tree, dyn = _trace(fn, args, kwargs)
    rules = _scopes.ScopeRules(policy) if scopes is None else scopes
    ctx = _Ctx(policy, stats, where=(rules, (), False))
    consts = [_boundary(ctx, jnp.asarray(c)) for c in closed.consts]
    ins = [_boundary(ctx, jnp.asarray(x)) for x in dyn]
    outs = _eval_jaxpr(ctx, closed.jaxpr, consts, ins)
    final = []
    for o, aval in zip(outs, closed.out_avals):
        want = aval.dtype
        if _is_float(want):
            want = policy.output if policy.output is not None else want
            final.append(ctx.cast(o, want, OpKind.BOUNDARY))
        else:
            final.append(_raw(o, want))
    return jax.tree_util.tree_unflatten(out_tree, final)


def autocast(fn: Callable | None = None,
             policy: PrecisionPolicy | str | Any = AUTO_MIXED_BF16,
             scopes: dict | None = None) -> Callable:
    """Run ``fn`` with every primitive at the precision ``policy`` gives its op kind.

    ``policy`` is a :class:`~adaptprec.PrecisionPolicy`, a policy string, or a jmp-style
    :class:`~adaptprec.Policy`, which means what it means as a scope rule: its compute
    dtype throughout (accumulating in float32 or wider).

    ``scopes={pattern: rule}`` gives regions of ``fn`` their own rule, matched against the
    name stack of ``jax.named_scope``/``jax.named_call``/module scopes (most specific
    pattern wins); a rule is a policy, a policy string, a dtype (the region computes in
    it, accumulating in float32 or wider) or ``"keep"`` (the region runs at its traced
    dtypes). See :class:`~adaptprec.ScopeRules` for the pattern syntax.

    ``autocast(fn, policy)`` returns a function with ``fn``'s signature; array arguments
    (any pytree) are traced, other leaves (Python numbers, strings...) are static. Floating
    outputs come back in the dtype ``fn`` returns (or ``policy.output``). Works under
    ``jit``, ``grad``, ``vmap`` and as an ``adaptive()`` rung. Also usable as a decorator:
    ``@autocast(policy="auto_mixed")``.

    Raises ``TypeError`` if ``fn`` is not callable or cannot be traced, ``ValueError`` for
    a bad policy string.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> import adaptprec as ap
        >>> x = jnp.arange(1.0, 5.0, dtype=jnp.float32)
        >>> f = ap.autocast(lambda x: jnp.sum(jnp.exp(x) * x), "always_bf16")
        >>> float(f(x)) == float(jnp.sum(jnp.exp(x) * x)), f(x).dtype.name
        (False, 'float32')
        >>> grad = jax.grad(ap.autocast(lambda x: jnp.sum(jnp.sin(x)), "always_f32"))
        >>> bool(jnp.allclose(grad(x), jnp.cos(x)))
        True

        Layered precision: the ``early`` scope in bfloat16, the ``late`` one in float32.

        >>> def net(x):
        ...     with jax.named_scope("early"):
        ...         x = jnp.tanh(x * 3.0)
        ...     with jax.named_scope("late"):
        ...         return jnp.sin(x) + 1.0
        >>> g = ap.autocast(net, "always_f32", scopes={"early": "bf16"})
        >>> ops = jax.make_jaxpr(g)(x).eqns
        >>> [e.primitive.name for e in ops if e.outvars[0].aval.dtype == jnp.bfloat16]
        ['convert_element_type', 'mul', 'tanh']
    """
    from .._policy import Policy

    # a jmp-style Policy means what it means as a scope rule: its compute dtype throughout
    pol = (_scopes.region_policy(policy.compute) if isinstance(policy, Policy)
           else PrecisionPolicy.parse(policy))
    rules = _scopes.ScopeRules(pol, scopes)
    if fn is None:
        return lambda f: autocast(f, pol, scopes)
    if not callable(fn):
        raise TypeError(f"autocast needs a callable, got {fn!r} of type "
                        f"{type(fn).__name__}")

    @functools.wraps(fn)
    def wrapped(*args, **kwargs):
        return _run(fn, pol, args, kwargs, scopes=rules)

    wrapped.policy = pol  # type: ignore[attr-defined]
    wrapped.scopes = rules  # type: ignore[attr-defined]
    return wrapped


_presets._interpreter["autocast"] = autocast
