"""The values and the context of one autocast trace.

Values: a jaxpr literal stays a :class:`_Lit` (cast for free, never votes on dtypes);
every other value is an array in the dtype it was computed in. The context
(:class:`_Ctx`) holds what an equation needs to pick its dtypes: the policy of its scope,
the statistics ``explain`` reports and the cast cache (each value is cast to each dtype
at most once per traced scope). :class:`_Recorder` makes the contexts of sub-traces (loop
bodies, branches, custom rules) and merges their statistics. :func:`_resolve` is the
dtype a policy rule gives an operation.

The equation walk itself lives in :mod:`.interpret`; the handlers that recurse into
bodies (:mod:`.control`, :mod:`.custom_rules`) reach it through :func:`walk`, which the
interpreter registers when it is imported (they cannot import it: it imports them).
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable, Sequence
from typing import Any

import jax.numpy as jnp
import numpy as np
from jax import lax

from .._opkind import EXACT_REDUCTIONS, OpKind
from . import scopes as _scopes
from ._stats import _Stats, _Tagged
from .presets import PrecisionPolicy, Rule

__all__: list[str] = []


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


def _lit_value(val: Any, dtype: Any) -> np.ndarray:
    """A literal's value in ``dtype``; out of range it rounds to +-inf, as an array cast
    does (a ``-1e9`` mask in float16), without numpy's overflow warning."""
    with np.errstate(over="ignore"):
        return np.asarray(val, dtype=dtype)


def _raw(v: Any, dtype: Any = None) -> Any:
    """A bindable value: literals become numpy scalars (of ``dtype`` if given)."""
    if isinstance(v, _Lit):
        return _lit_value(v.val, v.dtype if dtype is None else dtype)
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


def _fmt(dts: Sequence[Any]) -> str | None:
    """The dtypes of a loop carry or branch outputs, for ``explain`` (``a/b``)."""
    names = sorted({np.dtype(d).name for d in dts if d is not None})
    return "/".join(names) if names else None


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
            return _lit_value(v.val, dtype)
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


# --------------------------------------------------------------------------- the walk
#: The interpreter's equation walk ``walk(ctx, jaxpr, consts, args) -> outputs``,
#: registered by :mod:`.interpret` when it is imported (the package imports it first).
_WALK: dict[str, Callable] = {}


def walk(ctx: _Ctx, jaxpr, consts: Sequence[Any], args: Sequence[Any]) -> list:
    """Evaluate ``jaxpr`` under ``ctx`` (the interpreter's walk)."""
    return _WALK["walk"](ctx, jaxpr, consts, args)


def walk_closed(ctx: _Ctx, closed, args: Sequence[Any]) -> list:
    """Evaluate a ``ClosedJaxpr`` under ``ctx``."""
    return walk(ctx, closed.jaxpr, closed.consts, args)


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
