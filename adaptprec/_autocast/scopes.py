"""Per-scope precision rules: match the name stack of named scopes and modules.

``autocast(fn, policy, scopes={pattern: rule})`` runs each equation of ``fn`` under the
rule of the most specific pattern matching the equation's *name stack*: the scopes that
``jax.named_scope``, ``jax.named_call`` and module libraries push while ``fn`` is traced
(Equinox pushes the module class, e.g. ``eqx.nn.MLP/eqx.nn.Linear``; Haliax modules use
``jax.named_call``). Transform wrappers (``jvp(...)``, ``transpose(...)``, ``vmap()``) are
not scopes and are ignored. Inside ``scan``/``while``/``cond`` bodies and inlined ``jit``
calls, the path is the enclosing equation's path followed by the body's own scopes.

Patterns (``/`` separates scopes; each scope is matched with :func:`fnmatch.fnmatchcase`,
so ``*``, ``?`` and ``[...]`` work inside a scope name):

* ``"encoder"`` (no ``/``): a scope named ``encoder`` at any depth, and everything in it;
* ``"encoder/layer*"`` (a ``/`` anywhere, a leading one allowed): anchored at the root;
* ``"**"`` as a whole component matches any number of scopes (``"**/attn"``).

A pattern covers the scope it names and every scope nested in it. When several patterns
match, the most specific wins: the one whose match reaches deepest into the path (counted
up to its last scope with a literal character, so ``"*"`` never beats a named scope), then
the one with more wildcard-free scopes, then more literal characters, then the one listed
first. Equations outside every pattern use the base policy.

Rules: a :class:`~adaptprec.PrecisionPolicy` or its string form (``"auto_mixed_bf16"``,
``"always_f32"``, ``"auto_mixed,exp=f32"``); a dtype (``"bf16"``, ``"f16"``, ``"f32"``,
``"f64"``), meaning "this region computes in that dtype": every op's operands in the
dtype, dots and sums accumulated in float32 or wider, loop carries at least float32; or
``"keep"``: the region runs at the dtypes it was traced at (values arriving from a
low-precision region are cast back to their traced dtype). A jmp-style
:class:`~adaptprec.Policy` stands for its compute dtype.

Example:
    >>> import adaptprec as ap
    >>> rules = ap.ScopeRules(ap.AUTO_MIXED_BF16,
    ...                       {"encoder": "bf16", "encoder/layer2": "f32", "head": "keep"})
    >>> [rules.match(p).pattern for p in ("encoder/layer0", "encoder/layer2/mlp", "head")]
    ['encoder', 'encoder/layer2', 'head']
    >>> rules.match("decoder").pattern is None   # no pattern: the base policy
    True
    >>> rules.match("model/head").keep, rules.match("encoder/layer0").policy.dtype.name
    (True, 'bfloat16')
"""

from __future__ import annotations

import contextlib
import dataclasses
import fnmatch
import re
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import jax
import numpy as np

from .._policy import Policy
from ..precision import canonical_dtype, dtype_name, require_x64, x64_enabled
from .._opkind import OpKind
from .presets import PrecisionPolicy, Rule

__all__ = ["ScopeRules", "ScopeMatch", "KEEP", "scope_path", "region_policy"]

#: The rule that leaves a region at the dtypes it was traced at.
KEEP = "keep"


def region_policy(dtype: Any) -> PrecisionPolicy:
    """The policy of a bare-dtype scope rule: every op in ``dtype``, dots and sums
    accumulated in float32 or wider, loop carries float32 or wider.

    Example:
        >>> import adaptprec as ap
        >>> from adaptprec._autocast.scopes import region_policy
        >>> pol = region_policy("bf16")
        >>> pol.rule_for("exp"), pol.rule_for("dot_general"), pol.accumulate.name
        (<Rule.LOW: 'low'>, <Rule.ACCUMULATE: 'accumulate'>, 'float32')
    """
    low = canonical_dtype(dtype, check_x64=False)
    require_x64(low)
    acc = np.promote_types(low, np.float32)
    rules: dict[str, Any] = {k.value: Rule.LOW for k in OpKind}
    rules.update({"compute": Rule.ACCUMULATE, "reduction": Rule.ACCUMULATE,
                  "control": Rule.HIGH, "boundary": Rule.INPUT, "unknown": Rule.INPUT})
    return PrecisionPolicy(low, rules, accumulate=acc, preferred_element_type=acc)


def _keep_policy() -> PrecisionPolicy:
    """Used by the control-flow handlers inside a ``keep`` region: every rule ``input``
    (operands arrive already cast to their traced dtypes), nothing capped."""
    wide = "f64" if x64_enabled() else "f32"
    rules = {k.value: Rule.INPUT for k in OpKind}
    return PrecisionPolicy("f32", rules, accumulate=wide, preferred_element_type=None)


@dataclasses.dataclass(frozen=True)
class ScopeMatch:
    """What applies at one name-stack path.

    Attributes:
        pattern: the winning pattern, or ``None`` (no pattern matched: the base policy).
        rule: the rule as given (``"bf16"``, ``"keep"``, a policy string...), or ``None``.
        policy: the :class:`~adaptprec.PrecisionPolicy` the equations there run under.
        keep: ``True`` in a ``keep`` region (equations run at their traced dtypes).

    Example:
        >>> import adaptprec as ap
        >>> ap.ScopeRules("auto_mixed", {"a/*": "f32"}).match("a/b").rule
        'f32'
    """

    pattern: str | None
    rule: str | None
    policy: PrecisionPolicy
    keep: bool = False


@dataclasses.dataclass(frozen=True)
class _Pattern:
    text: str
    parts: tuple[str, ...]
    anchored: bool
    order: int
    rule: str
    policy: PrecisionPolicy | None  # None: keep

    @property
    def literal(self) -> tuple[int, int]:
        """(wildcard-free scopes, literal characters)."""
        lit = [p for p in self.parts if not any(c in p for c in "*?[")]
        return len(lit), sum(len(_literal_chars(p)) for p in self.parts)


def _literal_chars(part: str) -> str:
    return re.sub(r"\[[^\]]*\]|[*?]", "", part)


def _parse_pattern(text: Any) -> tuple[tuple[str, ...], bool]:
    if not isinstance(text, str) or not text.strip().strip("/"):
        raise ValueError(f"a scope pattern is a non-empty string such as 'encoder', "
                         f"'encoder/layer*' or '**/attn'; got {text!r}")
    t = text.strip()
    anchored = "/" in t.rstrip("/")
    parts = tuple(t.strip("/").split("/"))
    if any(not p for p in parts):
        raise ValueError(f"scope pattern {text!r} has an empty scope name ('//'); "
                         f"write 'a/b' or 'a/**/b'")
    for p in parts:
        if "**" in p and p != "**":
            raise ValueError(f"in scope pattern {text!r}, '**' must be a whole scope "
                             f"('a/**/b'), not part of one ({p!r}); use '*' inside a name")
    return parts, anchored


def _parse_rule(pattern: str, value: Any) -> tuple[str, PrecisionPolicy | None]:
    if isinstance(value, PrecisionPolicy):
        return str(value), value
    if isinstance(value, Policy):  # a jmp-style policy: its compute dtype
        return str(value), region_policy(value.compute)
    if isinstance(value, str) and value.strip().lower() == KEEP:
        return KEEP, None
    try:
        dtype = canonical_dtype(value, check_x64=False)
    except (ValueError, TypeError):
        dtype = None
    if dtype is not None:
        try:
            return dtype_name(dtype), region_policy(dtype)
        except ValueError as exc:
            raise ValueError(f"scope rule for {pattern!r}: {exc}") from None
    if isinstance(value, str):
        try:
            return value.strip(), PrecisionPolicy.parse(value)
        except ValueError as exc:
            raise ValueError(
                f"scope rule {value!r} for {pattern!r} is neither 'keep', a floating dtype "
                f"(bf16, f16, f32, f64) nor a precision policy: {exc}") from None
    raise TypeError(f"the rule for scope pattern {pattern!r} must be 'keep', a floating "
                    f"dtype (bf16, f16, f32, f64), a PrecisionPolicy or a policy string "
                    f"such as 'auto_mixed_bf16'; got {value!r} of type "
                    f"{type(value).__name__}")


def _depth(parts: Sequence[str], path: Sequence[str], anchored: bool) -> int | None:
    """How deep in ``path`` a match of ``parts`` reaches, counted up to the last pattern
    scope with a literal character (``*``, ``**`` and ``?`` extend a match without making
    it deeper, so a catch-all ``*`` never beats a named scope); ``None``: no match."""
    starts = [0] if anchored else range(len(path) + 1)
    best: list[int] = []

    def go(i: int, j: int, lit: int) -> None:  # pattern index i, path index j
        if i == len(parts):
            best.append(lit)
            return
        if parts[i] == "**":
            for k in range(j, len(path) + 1):
                go(i + 1, k, lit)
            return
        if j < len(path) and fnmatch.fnmatchcase(path[j], parts[i]):
            go(i + 1, j + 1, j + 1 if _literal_chars(parts[i]) else lit)

    for s in starts:
        go(0, s, 0)
    return max(best) if best else None


class ScopeRules:
    """A base policy plus ``{pattern: rule}``; :meth:`match` resolves a name-stack path.

    Built once per :func:`~adaptprec.autocast` call (bad patterns and rules are rejected
    there, naming the offending entry); lookups are memoized per path.

    Example:
        >>> import adaptprec as ap
        >>> r = ap.ScopeRules("auto_mixed_bf16", {"*": "f32", "head": "bf16"})
        >>> r.match("body/head").pattern, r.match("body").pattern, r.match("").pattern
        ('head', '*', None)
    """

    def __init__(self, base: PrecisionPolicy | str,
                 scopes: Mapping[str, Any] | None = None):
        self.base = PrecisionPolicy.parse(base)
        if scopes is None:
            scopes = {}
        if not isinstance(scopes, Mapping):
            raise TypeError(f"scopes must be a mapping {{pattern: rule}}, e.g. "
                            f"{{'encoder': 'bf16', 'head': 'keep'}}; got {scopes!r}")
        pats = []
        for order, (text, value) in enumerate(scopes.items()):
            parts, anchored = _parse_pattern(text)
            rule, pol = _parse_rule(text, value)
            pats.append(_Pattern(text, parts, anchored, order, rule, pol))
        self.patterns: tuple[_Pattern, ...] = tuple(pats)
        self._memo: dict[tuple[str, ...], ScopeMatch] = {}

    def __bool__(self) -> bool:
        return bool(self.patterns)

    def __repr__(self) -> str:
        inner = ", ".join(f"{p.text!r}: {p.rule!r}" for p in self.patterns)
        return f"ScopeRules({str(self.base)!r}, {{{inner}}})"

    def match(self, path: str | Sequence[str]) -> ScopeMatch:
        """The rule for a path (``"a/b"`` or ``("a", "b")``; ``""`` is the root)."""
        if isinstance(path, str):
            path = tuple(p for p in path.split("/") if p)
        path = tuple(path)
        hit = self._memo.get(path)
        if hit is not None:
            return hit
        best, best_key = None, None
        for p in self.patterns:
            depth = _depth(p.parts, path, p.anchored)
            if depth is None:
                continue
            key = (depth, *p.literal, -p.order)
            if best_key is None or key > best_key:
                best, best_key = p, key
        if best is None:
            hit = ScopeMatch(None, None, self.base, False)
        elif best.policy is None:
            hit = ScopeMatch(best.text, best.rule, _keep_policy(), True)
        else:
            hit = ScopeMatch(best.text, best.rule, best.policy, False)
        self._memo[path] = hit
        return hit


def scope_path(name_stack: Any) -> tuple[str, ...]:
    """The scope names of an equation's ``source_info.name_stack`` (transforms dropped).

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from adaptprec._autocast.scopes import scope_path
        >>> def f(x):
        ...     with jax.named_scope("enc"), jax.named_scope("l0"):
        ...         return jnp.sin(x)
        >>> eqn = jax.make_jaxpr(jax.grad(f))(1.0).jaxpr.eqns[0]
        >>> str(eqn.source_info.name_stack), scope_path(eqn.source_info.name_stack)
        ('jvp(enc)/l0', ('enc', 'l0'))
    """
    stack = getattr(name_stack, "stack", None)
    if stack is not None:
        return tuple(e.name for e in stack
                     if type(e).__name__ == "Scope" and getattr(e, "name", ""))
    out = []  # fallback: parse the string form, unwrapping "transform(...)"
    for part in str(name_stack).split("/"):
        while part.endswith(")") and "(" in part:
            part = part[part.index("(") + 1:-1]
        if part:
            out.append(part)
    return tuple(out)


@contextlib.contextmanager
def named(names: Sequence[str]) -> Iterator[None]:
    """Re-enter the scopes ``names`` so re-bound equations keep their name stack."""
    if not names:
        yield
        return
    with contextlib.ExitStack() as stack:
        for n in names:
            stack.enter_context(jax.named_scope(n))
        yield
