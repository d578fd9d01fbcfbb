"""``autocast``: re-evaluate any JAX function's jaxpr with each primitive at its precision.

``autocast(fn, policy)`` traces ``fn`` to a jaxpr with :func:`jax.make_jaxpr` and evaluates
the equations again, one by one, casting the floating operands of each to the dtype its
:class:`~adaptprec.PrecisionPolicy` rule gives (integer, boolean and complex
values are never touched; the walk itself is :func:`adaptprec._jaxpr.eval_jaxpr`, shared
with the pointwise analysis and the fits-last evaluator). Higher-order primitives are
recursed into with JAX's public APIs, so the result is an ordinary traceable function that
composes with ``jit``, ``grad``, ``vmap`` and ``adaptive()``:

* calls, ``remat``, ``scan``/``while``/``cond``: :mod:`.control` (floating loop carries
  get the ``CONTROL`` rule's dtype, float32 under the AUTO presets);
* ``custom_jvp_call``/``custom_vjp_call``: :mod:`.custom_rules` (re-wrapped with the
  original rules, so custom derivatives keep working);
* ``dot_general``: :mod:`.dots` (accumulation dtype, precision, and a form the backend
  runs);
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

import functools
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

try:  # jax.extend.core's classes, without importing all of jax.extend (its pallas
    # module alone costs ~15 ms of `import adaptprec`)
    from jax._src.core import Jaxpr
except ImportError:  # pragma: no cover
    from jax.extend.core import Jaxpr

from .. import _jaxpr as jx
from .._opkind import CALLS, PRIMITIVE_KINDS, OpKind, classify
from . import context as _context
from . import dots as _dots
from . import presets as _presets
from . import scopes as _scopes
from ._stats import _Stats
from .context import (  # noqa: F401  (_Ctx, _is_float, _raw: the accuracy guard's hook)
    _Ctx,
    _dtype,
    _fmt,
    _is_float,
    _Lit,
    _lit_value,
    _raw,
    _resolve,
    _widest,
)
from .control import _cond, _inline, _remat, _scan, _while
from .custom_rules import _custom_jvp, _custom_vjp
from .presets import AUTO_MIXED_BF16, PrecisionPolicy, Rule
from .vocabulary import precision_policy

__all__ = ["autocast"]


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
        return _Lit(_lit_value(v.val, dtype), np.dtype(dtype))
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
        params = _dots.dot_params(policy, rule, target, params)
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
    if name == "dot_general":
        outs = _dots.runnable(ctx.stats, target, outs)
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
        return [_Lit(_lit_value(x.val, target), target)]
    if x.dtype == target:
        out = [x]
    else:
        ctx.stats.retained_converts += 1
        out = jx.bind(eqn, [x], dict(eqn.params, new_dtype=target))
    return out if ctx.hook is None else ctx.hook(ctx, eqn, [x], out)


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
         stats: _Stats | None = None, scopes: _scopes.ScopeRules | None = None,
         warn: bool = True):
    """``fn(*args, **kwargs)`` evaluated under ``policy`` and ``scopes``; statistics go to
    ``stats``. With ``warn``, a scope pattern that matched no scope of ``fn`` warns."""
    closed, out_tree, dyn = _trace(fn, args, kwargs)
    rules = _scopes.ScopeRules(policy) if scopes is None else scopes
    stats = _Stats() if stats is None else stats
    ctx = _Ctx(policy, stats, where=(rules, (), False))
    consts = [_boundary(ctx, jnp.asarray(c)) for c in closed.consts]
    ins = [_boundary(ctx, jnp.asarray(x)) for x in dyn]
    outs = _eval_jaxpr(ctx, closed.jaxpr, consts, ins)
    if warn and rules:
        name = getattr(fn, "__qualname__", getattr(fn, "__name__", repr(fn)))
        for pattern, hint in rules.unmatched(stats.scopes):
            warnings.warn(f"autocast scopes: the pattern {pattern!r} matched no scope of "
                          f"{name}; {hint}. ap.explain(fn, policy, scopes=...)(*args) "
                          f"shows every scope and the rule that decided it", stacklevel=3)
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

    ``policy`` is a :class:`~adaptprec.PrecisionPolicy`, a preset or policy string
    (``"auto_mixed_bf16"``, ``"always_f32, exp=f32"``), or a jmp-style policy
    (:class:`~adaptprec.Policy` or ``"p=f32,c=bf16,o=f32"``), which means: compute in
    ``c`` throughout (dots and sums accumulating in float32 or wider), floating outputs
    in ``o``.

    ``scopes={pattern: rule}`` gives regions of ``fn`` their own rule, matched against the
    name stack of ``jax.named_scope``/``jax.named_call``/module scopes (the most specific
    pattern wins; ``"attn/*"`` matches at any depth, a leading ``/`` anchors at the root);
    a rule is a policy, a policy string, a dtype (the region computes in it, accumulating
    in float32 or wider) or ``"keep"`` (the region runs at its traced dtypes). A pattern
    that matches no scope of ``fn`` warns when ``fn`` is traced, naming the closest scope
    names. See :class:`~adaptprec.ScopeRules` for the pattern syntax and precedence.

    ``autocast(fn, policy)`` returns a function with ``fn``'s signature; array arguments
    (any pytree) are traced, other leaves (Python numbers, strings...) are static. Floating
    outputs come back in the dtype ``fn`` returns (or ``policy.output``). Works under
    ``jit``, ``grad``, ``vmap`` and as an ``adaptive()`` rung. Also usable as a decorator:
    ``@autocast(policy="auto_mixed")``.

    Raises ``TypeError`` if ``fn`` is not callable or cannot be traced, ``ValueError`` for
    a bad policy string (naming which vocabulary it was read as).

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
    pol = precision_policy(policy)
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


_context._WALK["walk"] = _eval_jaxpr
