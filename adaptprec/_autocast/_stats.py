"""Bookkeeping of one autocast trace: ops, compute dtypes and casts per op kind, and the
same counts per name-stack scope (``scopes``: full path -> its own ``_Stats``).

Integer counters (``retained_converts``: fn's own conversions still performed;
``guarded_dots``: dots kept behind a barrier for the backend, :mod:`.dots`) are counted
with ``+= 1`` and land in the totals and in the scope's own counts."""

from __future__ import annotations

import dataclasses
from collections import Counter
from .._opkind import OpKind

_LABELS: dict = {}


def _label(dtype) -> str:
    """``str(dtype)``, memoized (``str`` of a numpy dtype is slow and asked per op)."""
    try:
        return _LABELS[dtype]
    except KeyError:
        out = _LABELS[dtype] = str(dtype)
        return out
    except TypeError:  # unhashable
        return str(dtype)


@dataclasses.dataclass
class _Stats:
    ops: Counter = dataclasses.field(default_factory=Counter)
    casts: Counter = dataclasses.field(default_factory=Counter)
    dtypes: dict = dataclasses.field(default_factory=dict)
    primitives: dict = dataclasses.field(default_factory=dict)
    unknown: set = dataclasses.field(default_factory=set)
    fallback: set = dataclasses.field(default_factory=set)
    retained_converts: int = 0
    guarded_dots: int = 0
    scopes: dict = dataclasses.field(default_factory=dict)

    def op(self, kind: OpKind, name: str, dtype) -> None:
        self.ops[kind] += 1
        prims = self.primitives.get(kind)
        if prims is None:
            prims = self.primitives[kind] = Counter()
        prims[name] += 1
        if dtype is not None:
            seen = self.dtypes.get(kind)
            if seen is None:
                seen = self.dtypes[kind] = set()
            seen.add(_label(dtype))

    def cast(self, kind: OpKind) -> None:
        self.casts[kind] += 1

    def at(self, scope: str) -> _Stats:
        """The counts of one scope (created on first use)."""
        hit = self.scopes.get(scope)
        if hit is None:
            hit = self.scopes[scope] = _Stats()
        return hit

    def merge(self, other: _Stats | _Tagged) -> None:
        if isinstance(other, _Tagged):
            other = other.base
        self.ops.update(other.ops)
        self.casts.update(other.casts)
        for k, v in other.dtypes.items():
            self.dtypes.setdefault(k, set()).update(v)
        for k, v in other.primitives.items():
            self.primitives.setdefault(k, Counter()).update(v)
        self.unknown |= other.unknown
        self.fallback |= other.fallback
        self.retained_converts += other.retained_converts
        self.guarded_dots += other.guarded_dots
        for k, v in other.scopes.items():
            self.at(k).merge(v)


#: The integer counters of a ``_Stats`` (see the module docstring).
_COUNTERS = frozenset({"retained_converts", "guarded_dots"})


class _Tagged:
    """A ``_Stats`` seen from one scope: every count goes to the totals and to the
    scope's own ``_Stats``; everything else is the underlying object's."""

    _OWN = frozenset({"base", "scope", "_own"})

    def __init__(self, base: _Stats | _Tagged, scope: str):
        if isinstance(base, _Tagged):
            base = base.base
        object.__setattr__(self, "base", base)
        object.__setattr__(self, "scope", scope)
        object.__setattr__(self, "_own", base.at(scope))

    def op(self, kind: OpKind, name: str, dtype) -> None:
        self.base.op(kind, name, dtype)
        self._own.op(kind, name, dtype)

    def cast(self, kind: OpKind) -> None:
        self.base.cast(kind)
        self._own.cast(kind)

    def merge(self, other) -> None:
        self.base.merge(other)

    def __getattr__(self, name: str):
        return getattr(self.base, name)

    def __setattr__(self, name: str, value) -> None:
        if name in _COUNTERS:  # ``+= 1`` counts for the scope too
            own = getattr(self._own, name) + value - getattr(self.base, name)
            setattr(self._own, name, own)
            setattr(self.base, name, value)
        elif name in self._OWN:
            object.__setattr__(self, name, value)
        else:
            setattr(self.base, name, value)
