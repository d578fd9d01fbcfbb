"""Bookkeeping of one autocast trace: ops, compute dtypes and casts per op kind."""

from __future__ import annotations

import dataclasses
from collections import Counter

from .opkind import OpKind


@dataclasses.dataclass
class _Stats:
    ops: Counter = dataclasses.field(default_factory=Counter)
    casts: Counter = dataclasses.field(default_factory=Counter)
    dtypes: dict = dataclasses.field(default_factory=dict)
    primitives: dict = dataclasses.field(default_factory=dict)
    unknown: set = dataclasses.field(default_factory=set)
    fallback: set = dataclasses.field(default_factory=set)
    retained_converts: int = 0

    def op(self, kind: OpKind, name: str, dtype) -> None:
        self.ops[kind] += 1
        self.primitives.setdefault(kind, Counter())[name] += 1
        if dtype is not None:
            self.dtypes.setdefault(kind, set()).add(str(dtype))

    def cast(self, kind: OpKind) -> None:
        self.casts[kind] += 1

    def merge(self, other: _Stats) -> None:
        self.ops.update(other.ops)
        self.casts.update(other.casts)
        for k, v in other.dtypes.items():
            self.dtypes.setdefault(k, set()).update(v)
        for k, v in other.primitives.items():
            self.primitives.setdefault(k, Counter()).update(v)
        self.unknown |= other.unknown
        self.fallback |= other.fallback
        self.retained_converts += other.retained_converts
