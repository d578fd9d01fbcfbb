"""``explain``: what a precision policy will do to a function, before running it.

``explain(fn, policy)(*args)`` traces ``autocast(fn, policy)`` abstractly (nothing is
computed) and returns an :class:`Explanation`: per op kind the number of ops, the dtypes
they compute in and the casts the policy inserts, the total cast count, and the
primitives autocast does not know (they run at their input dtype) or had to run at the
dtype they were traced at. Counts are static: an op inside a loop body counts once.
The same counts are grouped by name-stack scope (``Explanation.scopes``, one
:class:`ScopeRow` per scope path, with the ``scopes=`` pattern and rule that decided it);
``str()`` adds that table when ``fn`` has named scopes, then the patterns that matched no
scope (``Explanation.unmatched``, with the closest scope names) and the dots kept in a
form the backend runs (``Explanation.guarded_dots``, see :mod:`.dots`).

Example:
    >>> import jax, jax.numpy as jnp
    >>> import adaptprec as ap
    >>> def f(x, w):
    ...     return jax.nn.softmax(x @ w)
    >>> x, w = jnp.ones((2, 4), jnp.float32), jnp.ones((4, 4), jnp.float32)
    >>> ex = ap.explain(f, ap.AUTO_MIXED_BF16)(x, w)
    >>> ex.casts, ex.row("compute").dtypes
    (2, ('bfloat16->float32',))
    >>> ex.casts < ap.explain(f, ap.AUTO_MIXED_CONSERVATIVE)(x, w).casts
    True
    >>> print(ex)  # doctest: +NORMALIZE_WHITESPACE
    policy auto_mixed_bf16
    kind             ops  casts  dtypes
    compute            1      2  bfloat16->float32
    reduction          2      0  float32
    elementwise        3      0  float32
    transcendental     2      0  float32
    data_movement      2      0  float32
    total             10      2
    dots kept behind a barrier for the backend (bf16 x bf16 -> f32 on XLA:CPU): 1
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax

from ._stats import _Stats
from .interpret import _is_dynamic, _run
from .._opkind import OpKind
from .presets import AUTO_MIXED_BF16, PrecisionPolicy
from .scopes import ScopeRules
from .vocabulary import precision_policy

__all__ = ["explain", "Explanation", "KindRow", "ScopeRow"]


@dataclasses.dataclass(frozen=True)
class KindRow:
    """One line of an :class:`Explanation`: an op kind's ops, casts and compute dtypes.

    Example:
        >>> from adaptprec import KindRow, OpKind
        >>> KindRow(OpKind.REDUCTION, 2, 1, ("float32",), (("reduce_sum", 2),)).casts
        1
    """

    kind: OpKind
    ops: int
    casts: int
    dtypes: tuple[str, ...]
    primitives: tuple[tuple[str, int], ...]


@dataclasses.dataclass(frozen=True)
class ScopeRow:
    """The ops of one name-stack scope in an :class:`Explanation`.

    Attributes:
        scope: the scope path (``"encoder/layer0"``; ``""`` is code outside every scope).
        pattern: the ``scopes=`` pattern that applied, or ``None`` (the base policy).
        rule: that pattern's rule as given (``"bf16"``, ``"keep"``, a policy string).
        ops, casts: counts in this scope (nested scopes have their own rows).
        dtypes: the compute dtypes of its ops, every kind together.
        rows: the per-kind :class:`KindRow` breakdown of this scope.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> import adaptprec as ap
        >>> def f(x):
        ...     with jax.named_scope("early"):
        ...         return jnp.exp(x)
        >>> ex = ap.explain(f, "always_f32", scopes={"early": "bf16"})(jnp.ones(2))
        >>> r = ex.scope("early")
        >>> r.rule, r.ops, r.casts, r.dtypes
        ('bf16', 1, 1, ('bfloat16',))
    """

    scope: str
    pattern: str | None
    rule: str | None
    ops: int
    casts: int
    dtypes: tuple[str, ...]
    rows: tuple[KindRow, ...]


def _rows(stats: _Stats) -> tuple[KindRow, ...]:
    return tuple(
        KindRow(kind, stats.ops[kind], stats.casts[kind],
                tuple(sorted(stats.dtypes.get(kind, ()))),
                tuple(sorted(stats.primitives.get(kind, {}).items())))
        for kind in OpKind if stats.ops[kind] or stats.casts[kind])


def _scope_rows(stats: _Stats, rules: ScopeRules) -> tuple[ScopeRow, ...]:
    out = []
    for path in sorted(stats.scopes):
        sub = stats.scopes[path]
        ops, casts = sum(sub.ops.values()), sum(sub.casts.values())
        if not ops and not casts:
            continue
        m = rules.match(path)
        dtypes = sorted(set().union(*sub.dtypes.values())) if sub.dtypes else []
        out.append(ScopeRow(path, m.pattern, m.rule, ops, casts, tuple(dtypes),
                            _rows(sub)))
    return tuple(out)


@dataclasses.dataclass(frozen=True)
class Explanation:
    """The cost of a policy on one function; ``str()`` prints the table.

    Attributes:
        policy: the policy explained.
        rows: one :class:`KindRow` per op kind that occurs (table order).
        casts: total casts the policy inserts (``convert_element_type`` ops).
        ops: total primitives evaluated (control-flow primitives included).
        retained_converts: conversions of ``fn`` itself that are still performed.
        unknown_primitives: primitives not in the table (run at their input dtype).
        traced_dtype_primitives: primitives run at the dtype they were traced at.
        jaxpr: the transformed program (a ``ClosedJaxpr``), for inspection.
        scopes: one :class:`ScopeRow` per name-stack scope (``""``: outside every scope).
        unmatched: ``(pattern, hint)`` for every ``scopes=`` pattern that matched no scope
            of ``fn`` (the hint names the closest scope names).
        guarded_dots: dots kept behind an optimization barrier so the backend runs them
            (bfloat16 x bfloat16 -> float32 on XLA:CPU; :mod:`adaptprec._autocast.dots`).

    Example:
        >>> import jax.numpy as jnp
        >>> import adaptprec as ap
        >>> ex = ap.explain(jnp.exp, "always_bf16")(jnp.ones(3, jnp.float32))
        >>> ex.casts, ex.row("transcendental").dtypes
        (2, ('bfloat16',))
    """

    policy: PrecisionPolicy
    rows: tuple[KindRow, ...]
    casts: int
    ops: int
    retained_converts: int
    unknown_primitives: tuple[str, ...]
    traced_dtype_primitives: tuple[str, ...]
    jaxpr: Any = dataclasses.field(repr=False, compare=False)
    scopes: tuple[ScopeRow, ...] = ()
    unmatched: tuple[tuple[str, str], ...] = ()
    guarded_dots: int = 0

    def row(self, kind: OpKind | str) -> KindRow:
        """The row of ``kind`` (a zero row if no op of that kind occurs)."""
        kind = OpKind.parse(kind)
        for r in self.rows:
            if r.kind is kind:
                return r
        return KindRow(kind, 0, 0, (), ())

    def scope(self, path: str) -> ScopeRow:
        """The row of scope ``path`` (``""``: outside every scope); ``KeyError`` if no op
        ran there."""
        for r in self.scopes:
            if r.scope == path:
                return r
        raise KeyError(f"no op in scope {path!r}; scopes with ops: "
                       f"{[r.scope for r in self.scopes]}")

    def __str__(self) -> str:
        lines = [f"policy {self.policy}",
                 f"{'kind':<16}{'ops':>4}{'casts':>7}  dtypes"]
        for r in self.rows:
            lines.append(f"{r.kind.value:<16}{r.ops:>4}{r.casts:>7}  "
                         f"{', '.join(r.dtypes) or '-'}")
        lines.append(f"{'total':<16}{self.ops:>4}{self.casts:>7}")
        if self.unknown_primitives:
            lines.append("unknown primitives (run at their input dtype): "
                         + ", ".join(self.unknown_primitives))
        if self.traced_dtype_primitives:
            lines.append("run at their traced dtype: "
                         + ", ".join(self.traced_dtype_primitives))
        if self.guarded_dots:
            lines.append(f"dots kept behind a barrier for the backend (bf16 x bf16 -> f32 "
                         f"on XLA:CPU): {self.guarded_dots}")
        if any(r.scope for r in self.scopes):
            deciders = [_decider(r) for r in self.scopes]
            width = max(16, *(len(r.scope) + 2 for r in self.scopes))
            rw = max(12, *(len(d) + 2 for d in deciders))
            lines.append(f"{'scope':<{width}}{'decided by':<{rw}}{'ops':>4}{'casts':>7}"
                         f"  dtypes")
            for r, d in zip(self.scopes, deciders):
                lines.append(f"{r.scope or '(outside)':<{width}}{d:<{rw}}"
                             f"{r.ops:>4}{r.casts:>7}  {', '.join(r.dtypes) or '-'}")
        for pattern, hint in self.unmatched:
            lines.append(f"pattern {pattern!r} matched no scope; {hint}")
        return "\n".join(lines)


def _decider(row: ScopeRow) -> str:
    """``'pattern': rule`` of a scope row, or ``(base policy)``."""
    return "(base policy)" if row.pattern is None else f"{row.pattern!r}: {row.rule}"


def explain(fn: Callable, policy: PrecisionPolicy | str = AUTO_MIXED_BF16,
            scopes: dict | None = None) -> Callable:
    """``explain(fn, policy)(*args, **kwargs)`` -> :class:`Explanation` (nothing is run).

    Arguments are only used for their shapes and dtypes (``jax.ShapeDtypeStruct`` works).
    ``scopes`` are per-region rules, as in :func:`~adaptprec.autocast`.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> import adaptprec as ap
        >>> spec = jax.ShapeDtypeStruct((8,), jnp.float32)
        >>> ap.explain(lambda x: jnp.log(jnp.sum(jnp.exp(x))), "auto_mixed")(spec).casts
        0
    """
    pol = precision_policy(policy)
    rules = ScopeRules(pol, scopes)
    if not callable(fn):
        raise TypeError(f"explain needs a callable, got {fn!r} of type "
                        f"{type(fn).__name__}")

    def run(*args: Any, **kwargs: Any) -> Explanation:
        leaves, treedef = jax.tree_util.tree_flatten((args, kwargs))
        dyn_idx = [i for i, leaf in enumerate(leaves)
                   if _is_dynamic(leaf) or isinstance(leaf, jax.ShapeDtypeStruct)]
        stats = _Stats()

        def flat(*xs):
            ls = list(leaves)
            for i, x in zip(dyn_idx, xs):
                ls[i] = x
            a, k = jax.tree_util.tree_unflatten(treedef, ls)
            return _run(fn, pol, a, k, stats, scopes=rules, warn=False)

        closed = jax.make_jaxpr(flat)(*[leaves[i] for i in dyn_idx])
        rows = _rows(stats)
        return Explanation(
            policy=pol, rows=rows, casts=sum(stats.casts.values()),
            ops=sum(stats.ops.values()), retained_converts=stats.retained_converts,
            unknown_primitives=tuple(sorted(stats.unknown)),
            traced_dtype_primitives=tuple(sorted(stats.fallback)), jaxpr=closed,
            scopes=_scope_rows(stats, rules),
            unmatched=tuple(rules.unmatched(stats.scopes)) if rules else (),
            guarded_dots=stats.guarded_dots)

    return run
