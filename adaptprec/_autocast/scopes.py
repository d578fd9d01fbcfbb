"""Per-scope precision rules: match the name stack of named scopes and modules.

``autocast(fn, policy, scopes={pattern: rule})`` runs each equation of ``fn`` under the
rule of the most specific pattern matching the equation's *name stack*: the scopes that
``jax.named_scope``, ``jax.named_call`` and module libraries push while ``fn`` is traced
(Flax linen pushes module names, e.g. ``Block_0/attn/query``; Equinox the module class,
e.g. ``eqx.nn.MLP/eqx.nn.Linear``; Haliax modules use ``jax.named_call``). Transform
wrappers (``jvp(...)``, ``transpose(...)``, ``vmap()``) are not scopes and are ignored.
Inside ``scan``/``while``/``cond`` bodies and inlined ``jit`` calls, the path is the
enclosing equation's path followed by the body's own scopes.

Patterns (``/`` separates scopes; each scope is matched with :func:`fnmatch.fnmatchcase`,
so ``*``, ``?`` and ``[...]`` work inside a scope name):

* ``"attn"``, ``"attn/*"``, ``"enc/layer[01]"``: consecutive scopes anywhere in the path
  (``"attn/*"`` matches ``Block_0/attn/query``);
* a leading ``/`` anchors the pattern at the root of ``fn``: ``"/enc"`` matches ``enc``
  but not ``model/enc``;
* ``"**"`` as a whole component matches any number of scopes (``"enc/**/mlp"``).

A pattern covers the scopes it names and every scope nested in them.

**The most specific pattern wins** (as in CSS): compare, in order,

1. how deep in the path its match ends, counted up to its last scope with a literal
   character (so a catch-all ``"*"`` never beats a named scope);
2. how many scopes it names (``"attn/*"`` names two, ``"attn"`` one: on ``attn/query``
   the first wins);
3. how many of them are wildcard-free, then how many literal characters it has;
4. on an exact tie, the one listed **last** (later rules override earlier ones, as in CSS
   and ``.gitignore``).

Equations outside every pattern use the base policy. A pattern that matches no scope of
``fn`` is reported with the closest scope names (:meth:`ScopeRules.unmatched`; ``autocast``
warns, ``explain`` lists them).

Rules: a :class:`~adaptprec.PrecisionPolicy` or its string form (``"auto_mixed_bf16"``,
``"always_f32"``, ``"auto_mixed,exp=f32"``); a dtype (``"bf16"``, ``"f16"``, ``"f32"``,
``"f64"``), meaning "this region computes in that dtype": every op's operands in the
dtype, dots and sums accumulated in float32 or wider, loop carries at least float32; or
``"keep"``: the region runs at the dtypes it was traced at (values arriving from a
low-precision region are cast back to their traced dtype). A jmp-style policy
(:class:`~adaptprec.Policy` or ``"p=f32,c=bf16"``) stands for its compute dtype.

Example:
    >>> import adaptprec as ap
    >>> rules = ap.ScopeRules(ap.AUTO_MIXED_BF16, {"attn": "f32", "attn/*": "bf16"})
    >>> [rules.match(p).pattern for p in ("Block_0/attn", "Block_0/attn/query")]
    ['attn', 'attn/*']
    >>> rules.match("Block_0/mlp").pattern is None   # no pattern: the base policy
    True
    >>> rules.match("Block_0/attn/query").policy.dtype.name
    'bfloat16'
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import fnmatch
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import jax

from .._policy import Policy
from ..precision import canonical_dtype, dtype_name, x64_enabled
from .._opkind import OpKind
from .presets import PrecisionPolicy, Rule
from .vocabulary import precision_policy, region_policy

__all__ = ["ScopeRules", "ScopeMatch", "KEEP", "scope_path"]

#: The rule that leaves a region at the dtypes it was traced at.
KEEP = "keep"


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
        >>> ap.ScopeRules("auto_mixed", {"a/*": "f32"}).match("x/a/b").rule
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
    def specificity(self) -> tuple[int, int, int]:
        """(scopes named, wildcard-free scopes, literal characters): steps 2 and 3 of the
        precedence (the depth of step 1 depends on the path)."""
        named = [p for p in self.parts if p != "**"]
        lit = [p for p in named if not any(c in p for c in "*?[")]
        return len(named), len(lit), sum(len(_literal_chars(p)) for p in named)


def _literal_chars(part: str) -> str:
    return re.sub(r"\[[^\]]*\]|[*?]", "", part)


def _parse_pattern(text: Any) -> tuple[tuple[str, ...], bool]:
    if not isinstance(text, str) or not text.strip().strip("/"):
        raise ValueError(f"a scope pattern is a non-empty string such as 'encoder', "
                         f"'attn/*' or '/encoder/layer0'; got {text!r}")
    t = text.strip()
    anchored = t.startswith("/")
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
        return str(value), precision_policy(value)
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
            return value.strip(), precision_policy(value, f"the rule for {pattern!r}")
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


def _as_path(path: str | Sequence[str]) -> tuple[str, ...]:
    if isinstance(path, str):
        return tuple(p for p in path.split("/") if p)
    return tuple(path)


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
        self.base = precision_policy(base)
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
        path = _as_path(path)
        hit = self._memo.get(path)
        if hit is not None:
            return hit
        best, best_key = None, None
        for p in self.patterns:
            depth = _depth(p.parts, path, p.anchored)
            if depth is None:
                continue
            key = (depth, *p.specificity, p.order)
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

    def unmatched(self, paths: Iterable[str | Sequence[str]]) -> list[tuple[str, str]]:
        """``(pattern, hint)`` for every pattern that matches none of ``paths`` (the
        scope paths of a function's equations); the hint names the closest scope names.

        Example:
            >>> import adaptprec as ap
            >>> r = ap.ScopeRules("always_f32", {"Dense_0": "bf16", "attn": "f32"})
            >>> r.unmatched(["Block_0/attn/query", "Block_0/Dense_1"])
            [('Dense_0', "closest scope names: 'Dense_1', 'Block_0/Dense_1'")]
        """
        paths = [_as_path(p) for p in paths]
        out = []
        for p in self.patterns:
            if not any(_depth(p.parts, path, p.anchored) is not None for path in paths):
                out.append((p.text, _closest(p, paths)))
        return out


def _closest(p: _Pattern, paths: list[tuple[str, ...]]) -> str:
    names = sorted({n for path in paths for n in path})
    if not names:
        return ("the function has no named scopes (jax.named_scope, jax.named_call, "
                "Flax linen module names, Equinox module classes)")
    full = sorted({"/".join(path) for path in paths if path})
    hints = []
    if p.anchored and any(_depth(p.parts, path, False) is not None for path in paths):
        hints.append(f"the leading '/' anchors it at the root of the function; "
                     f"{p.text.lstrip('/')!r} matches at any depth")
    text = "/".join(p.parts)
    close = difflib.get_close_matches(text, names + [f for f in full if f not in names],
                                      n=3, cutoff=0.5)
    if close:
        hints.append("closest scope names: " + ", ".join(repr(c) for c in close))
    else:
        shown = full[:6]
        hints.append("scopes of the function: " + ", ".join(repr(c) for c in shown)
                     + (", ..." if len(full) > len(shown) else ""))
    return "; ".join(hints)


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
