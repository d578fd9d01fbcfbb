"""Op-level precision policies: which dtype each kind of primitive computes in.

A :class:`PrecisionPolicy` has a *low* dtype (``dtype``, the cheap precision values are
stored and moved in), an *accumulation* dtype (``accumulate``, float32 by default) and a
:class:`Rule` per :class:`~adaptprec.OpKind`, optionally overridden per primitive
name. Rules:

``low``         cast floating operands to the low dtype and compute there.
``high``        cast floating operands to the accumulation dtype and compute there.
``accumulate``  read operands in the low dtype, accumulate in the accumulation dtype:
                ``dot_general``/``conv`` get low operands and
                ``preferred_element_type``; sums/products/cumsums upcast their operand
                inside the op (XLA fuses the convert into the reduction); max/min/arg*
                reductions are exact in any precision and are left alone.
``input``       compute in the (widest) dtype of the floating operands: no casts unless
                operands disagree. This is what unknown primitives get.
a dtype         cast floating operands to exactly that dtype (``"f32"``, ``"bf16"``...).

The rule for ``CONTROL`` decides the dtype of ``scan``/``while`` loop carries, the rule
for ``BOUNDARY`` the dtype inputs are cast to on entry. Outputs are returned in the dtype
``fn`` itself returns, unless ``output`` is set. With ``cast_back=True`` every result of a
``high``/``accumulate`` op is cast straight back to the low dtype (values at rest are
always low); otherwise results stay in the dtype they were computed in and a later
consumer that needs another dtype casts them once (casts are reused).

Presets:

===========================  ===  ===========================================================
preset                       low  rules
===========================  ===  ===========================================================
``ALWAYS_F32``               f32  every op, carry and input in float32
``ALWAYS_F16``               f16  every op in float16, no float32 accumulation
``ALWAYS_BF16``              bf16 every op in bfloat16, no float32 accumulation
``AUTO_MIXED_CONSERVATIVE``  f16  dot/conv low with f32 accumulation; every reduction and
                                  transcendental cast up to f32 and straight back down
``AUTO_MIXED``               f16  dot/conv low with f32 accumulation; sums accumulate in
                                  f32, max/min stay low; transcendentals and linalg in f32;
                                  results stay f32 until a consumer needs low (fewer casts)
``AUTO_MIXED_BF16``          bf16 ``AUTO_MIXED`` with bfloat16 as the low dtype
===========================  ===  ===========================================================

Under the AUTO presets elementwise and data-movement ops run in the widest dtype of their
operands (torch.autocast's rule for unlisted ops), loop carries are float32 so that
``y + h * f(y)`` does not stagnate, and inputs are left in the dtype they arrive in.

String form: a preset name, optionally followed by ``key=value`` overrides, or only
overrides (applied to ``AUTO_MIXED_BF16``). Keys: ``dtype``, ``accumulate``,
``preferred_element_type``, ``dot_precision`` (``none``/``default``/``high``/``highest``),
``output`` (``same`` or a dtype), ``cast_back`` (``true``/``false``), any op kind, any
primitive name. ``str(policy)`` prints this form and ``PrecisionPolicy.parse`` reads it.

A policy satisfies the runtime's ``Rung`` protocol (``dtype`` and ``wrap(fn)``), so it can
be a rung of an ``adaptive()`` ladder.

Example:
    >>> import adaptprec as ap
    >>> pol = ap.PrecisionPolicy.parse("auto_mixed_bf16, exp=f32, reduction=high")
    >>> str(pol)
    'auto_mixed_bf16,reduction=high,exp=f32'
    >>> ap.PrecisionPolicy.parse(str(pol)) == pol
    True
    >>> pol.dtype.name, pol.rule_for("exp"), pol.rule_for("reduce_sum")
    ('bfloat16', dtype('float32'), <Rule.HIGH: 'high'>)
    >>> str(ap.AUTO_MIXED_BF16)
    'auto_mixed_bf16'
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Callable, Mapping
from typing import Any, Union

import jax
import numpy as np
from jax import lax

from ..precision import DTypeLike, canonical_dtype, dtype_name, require_x64
from .._opkind import PRIMITIVE_KINDS, NamedEnum, OpKind, classify

__all__ = [
    "Rule",
    "PrecisionPolicy",
    "ALWAYS_F32",
    "ALWAYS_F16",
    "ALWAYS_BF16",
    "AUTO_MIXED_CONSERVATIVE",
    "AUTO_MIXED",
    "AUTO_MIXED_BF16",
    "PRESETS",
]


class Rule(NamedEnum):
    """How an op kind picks its compute dtype (see the module docstring).

    Example:
        >>> from adaptprec import Rule
        >>> Rule.parse("Accumulate")
        <Rule.ACCUMULATE: 'accumulate'>
    """

    LOW = "low"
    HIGH = "high"
    ACCUMULATE = "accumulate"
    INPUT = "input"


RuleLike = Union[Rule, str, DTypeLike]
_RuleValue = Union[Rule, np.dtype]

_OPTION_KEYS = ("dtype", "accumulate", "preferred_element_type", "dot_precision",
                "output", "cast_back")
_OPTION_ALIASES = {"pet": "preferred_element_type", "acc": "accumulate", "low": "dtype",
                   "precision": "dot_precision", "out": "output"}
_PRECISIONS = {"default": lax.Precision.DEFAULT, "high": lax.Precision.HIGH,
               "highest": lax.Precision.HIGHEST}


def _floating(value: DTypeLike, what: str) -> np.dtype:
    try:
        dtype = canonical_dtype(value, check_x64=False)
    except ValueError as exc:
        raise ValueError(f"{what} must be a floating dtype (bf16, f16, f32, f64 or an "
                         f"alias); got {value!r}: {exc}") from None
    try:
        require_x64(dtype)
    except ValueError as exc:
        raise ValueError(f"{what} {value!r}: {exc}") from None
    return dtype


def _parse_rule(key: str, value: RuleLike) -> _RuleValue:
    if isinstance(value, Rule):
        return value
    if isinstance(value, str) and value.strip().lower() in {r.value for r in Rule}:
        return Rule.parse(value)
    if isinstance(value, str) and value.strip().lower() == "keep":
        return Rule.INPUT
    try:
        canonical_dtype(value, check_x64=False)
    except ValueError:
        raise ValueError(
            f"the rule for {key!r} must be one of {', '.join(r.value for r in Rule)} or a "
            f"floating dtype (bf16, f16, f32, f64); got {value!r}"
        ) from None
    return _floating(value, f"the rule for {key!r}")


def _parse_key(key: OpKind | str) -> str:
    """Canonical rule key: an op kind's value or a primitive name."""
    if isinstance(key, OpKind):
        return key.value
    if not isinstance(key, str):
        raise TypeError(f"precision policy rules are keyed by OpKind or primitive name, "
                        f"got {key!r} of type {type(key).__name__}")
    try:
        return OpKind.parse(key).value
    except ValueError:
        pass
    name = key.strip()
    if name in PRIMITIVE_KINDS:
        return name
    raise ValueError(
        f"unknown op kind or primitive {key!r} in precision policy; op kinds are "
        f"{', '.join(k.value for k in OpKind)}; primitives are named as in jaxprs (e.g. "
        f"'exp', 'dot_general', 'reduce_sum', 'scatter-add'; the full list is "
        f"PRIMITIVE_KINDS in the adaptprec.autocast package)"
    )


def _rule_str(rule: _RuleValue) -> str:
    return rule.value if isinstance(rule, Rule) else dtype_name(rule)


def _parse_bool(key: str, value: Any) -> bool:
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    text = str(value).strip().lower()
    if text in ("true", "1", "yes", "on"):
        return True
    if text in ("false", "0", "no", "off"):
        return False
    raise ValueError(f"{key} must be true or false, got {value!r}")


def _parse_precision(value: Any) -> lax.Precision | None:
    if value is None or isinstance(value, lax.Precision):
        return value
    text = str(value).strip().lower()
    if text == "none":
        return None
    if text in _PRECISIONS:
        return _PRECISIONS[text]
    raise ValueError(f"dot_precision must be none, default, high, highest or a "
                     f"jax.lax.Precision; got {value!r}")


def _optional_dtype(value: Any, what: str, none_words: tuple[str, ...]) -> np.dtype | None:
    if value is None or (isinstance(value, str) and value.strip().lower() in none_words):
        return None
    return _floating(value, what)


_KIND_ORDER = tuple(k.value for k in OpKind)


@jax.tree_util.register_static
@dataclasses.dataclass(frozen=True, init=False)
class PrecisionPolicy:
    """Precision rules per op kind / primitive for :func:`~adaptprec.autocast`.

    Args:
        dtype: the low dtype (also the policy's nominal precision as a ladder rung).
        rules: ``{OpKind or kind name or primitive name: rule}``; unspecified kinds take the
            AUTO rules (see the module docstring), primitives not listed take their kind's.
        accumulate: the dtype of ``high`` ops and of accumulation (default float32).
        preferred_element_type: accumulator dtype for ``dot_general``/``conv`` whose
            operands are narrower than it (``None``: accumulate in the operand dtype).
        dot_precision: ``jax.lax.Precision`` for dots/convs, or ``None`` to keep fn's.
        output: dtype of floating outputs; ``None`` returns what ``fn`` returns.
        cast_back: cast results of ``high``/``accumulate`` ops straight back to ``dtype``.

    Frozen, hashable and a static pytree node (safe as a ``jit`` static argument).

    Example:
        >>> import adaptprec as ap
        >>> pol = ap.PrecisionPolicy("bf16", {"transcendental": "f32", "exp": "high"})
        >>> pol.rule_for("log"), pol.rule_for("exp")
        (dtype('float32'), <Rule.HIGH: 'high'>)
        >>> ap.PrecisionPolicy("int8")
        Traceback (most recent call last):
        ...
        ValueError: PrecisionPolicy dtype must be a floating dtype ...
    """

    dtype: np.dtype
    accumulate: np.dtype
    preferred_element_type: np.dtype | None
    dot_precision: lax.Precision | None
    output: np.dtype | None
    cast_back: bool
    rules: tuple[tuple[str, _RuleValue], ...]

    def __init__(self, dtype: DTypeLike = "bf16",
                 rules: Mapping[OpKind | str, RuleLike] | None = None, *,
                 accumulate: DTypeLike = "f32",
                 preferred_element_type: DTypeLike | None = "f32",
                 dot_precision: lax.Precision | str | None = None,
                 output: DTypeLike | None = None,
                 cast_back: bool = False):
        table: dict[str, _RuleValue] = dict(_AUTO_RULES)
        if rules is not None:
            if not isinstance(rules, Mapping):
                raise TypeError(f"rules must be a mapping from OpKind or primitive name "
                                f"to a rule, got {rules!r}")
            for key, value in rules.items():
                k = _parse_key(key)
                table[k] = _parse_rule(k, value)
        kinds = [(k, table[k]) for k in _KIND_ORDER]
        prims = sorted((k, v) for k, v in table.items() if k not in _KIND_ORDER)
        set_ = object.__setattr__
        set_(self, "dtype", _floating(dtype, "PrecisionPolicy dtype"))
        set_(self, "accumulate", _floating(accumulate, "PrecisionPolicy accumulate"))
        set_(self, "preferred_element_type", _optional_dtype(
            preferred_element_type, "preferred_element_type", ("none",)))
        set_(self, "dot_precision", _parse_precision(dot_precision))
        set_(self, "output", _optional_dtype(output, "PrecisionPolicy output",
                                             ("same", "none")))
        set_(self, "cast_back", _parse_bool("cast_back", cast_back))
        set_(self, "rules", tuple(kinds + prims))

    # ---------------------------------------------------------------- queries
    @property
    def rule_map(self) -> dict[str, _RuleValue]:
        """``{kind value or primitive name: rule}`` (kinds first)."""
        return dict(self.rules)

    def rule_for(self, key: OpKind | str) -> _RuleValue:
        """The rule a primitive (by name) or an op kind gets under this policy.

        A primitive takes its own override if there is one, else its kind's rule;
        unknown primitive names take the ``UNKNOWN`` kind's rule.

        Example:
            >>> import adaptprec as ap
            >>> ap.ALWAYS_BF16.rule_for("exp"), ap.AUTO_MIXED.rule_for(ap.OpKind.COMPUTE)
            (<Rule.LOW: 'low'>, <Rule.ACCUMULATE: 'accumulate'>)
        """
        table = self.rule_map
        if isinstance(key, OpKind):
            return table[key.value]
        if key in table and key not in _KIND_ORDER:
            return table[key]
        if key in _KIND_ORDER:
            return table[key]
        return table[classify(key).value]

    @property
    def name(self) -> str | None:
        """The preset name if this policy equals a preset, else ``None``."""
        for pname, preset in PRESETS.items():
            if preset == self:
                return pname
        return None

    # ---------------------------------------------------------------- building
    def replace(self, **changes: Any) -> PrecisionPolicy:
        """A copy with options changed; ``rules=`` entries are merged, not replaced.

        Example:
            >>> import adaptprec as ap
            >>> str(ap.AUTO_MIXED_BF16.replace(output="f32", rules={"exp": "low"}))
            'auto_mixed_bf16,output=f32,exp=low'
        """
        opts = self._options()
        unknown = set(changes) - set(opts) - {"rules"}
        if unknown:
            raise ValueError(f"unknown PrecisionPolicy fields {sorted(unknown)}; use "
                             f"{', '.join(_OPTION_KEYS)} or rules")
        rules = dict(self.rule_map)
        for key, value in (changes.pop("rules", None) or {}).items():
            k = _parse_key(key)
            rules[k] = _parse_rule(k, value)
        opts.update(changes)
        return PrecisionPolicy(opts.pop("dtype"), rules, **opts)

    def with_dtype(self, dtype: DTypeLike) -> PrecisionPolicy:
        """The same rules with another low dtype (e.g. AUTO_MIXED with bfloat16)."""
        return self.replace(dtype=dtype)

    def _options(self) -> dict[str, Any]:
        return {"dtype": self.dtype, "accumulate": self.accumulate,
                "preferred_element_type": self.preferred_element_type,
                "dot_precision": self.dot_precision, "output": self.output,
                "cast_back": self.cast_back}

    # ---------------------------------------------------------------- string form
    def _fields_str(self) -> dict[str, str]:
        out = {
            "dtype": dtype_name(self.dtype),
            "accumulate": dtype_name(self.accumulate),
            "preferred_element_type": ("none" if self.preferred_element_type is None
                                       else dtype_name(self.preferred_element_type)),
            "dot_precision": ("none" if self.dot_precision is None
                              else self.dot_precision.name.lower()),
            "output": "same" if self.output is None else dtype_name(self.output),
            "cast_back": "true" if self.cast_back else "false",
        }
        out.update((k, _rule_str(v)) for k, v in self.rules)
        return out

    def __str__(self) -> str:
        mine = self._fields_str()
        best: tuple[tuple[int, bool], str, list[str]] | None = None
        for pname, preset in PRESETS.items():
            theirs = preset._fields_str()
            diff = [f"{k}={v}" for k, v in mine.items() if theirs.get(k) != v]
            score = (len(diff), preset.dtype != self.dtype)
            if best is None or score < best[0]:
                best = (score, pname, diff)
        assert best is not None
        return ",".join([best[1], *best[2]])

    def __repr__(self) -> str:
        return f"PrecisionPolicy.parse({str(self)!r})"

    @classmethod
    def parse(cls, spec: str | PrecisionPolicy) -> PrecisionPolicy:
        """Read the string form (see the module docstring); ``ValueError`` on bad input.

        Example:
            >>> import adaptprec as ap
            >>> ap.PrecisionPolicy.parse("always_bf16, cast_back=true").cast_back
            True
            >>> ap.PrecisionPolicy.parse("auto_mixed, bogus=f32")
            Traceback (most recent call last):
            ...
            ValueError: unknown op kind or primitive 'bogus' in precision policy; ...
        """
        if isinstance(spec, PrecisionPolicy):
            return spec
        if not isinstance(spec, str):
            raise TypeError(f"a precision policy is a PrecisionPolicy or a string such as "
                            f"'auto_mixed_bf16' or 'auto_mixed,exp=f32'; got {spec!r}")
        parts = [p.strip() for p in spec.replace(";", ",").split(",")]
        if not spec.strip() or any(not p for p in parts):
            raise ValueError(f"cannot parse precision policy {spec!r}: expected a preset "
                             f"name ({', '.join(PRESETS)}) optionally followed by "
                             f"key=value overrides, separated by commas")
        base = AUTO_MIXED_BF16
        if "=" not in parts[0]:
            name = parts[0].lower()
            if name not in PRESETS:
                close = difflib.get_close_matches(name, PRESETS, n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise ValueError(f"unknown precision policy preset {parts[0]!r} in "
                                 f"{spec!r}{hint}; presets are {', '.join(PRESETS)}")
            base = PRESETS[name]
            parts = parts[1:]
        opts: dict[str, Any] = {}
        rules: dict[str, Any] = {}
        for part in parts:
            if part.count("=") != 1:
                raise ValueError(f"cannot parse {part!r} in precision policy {spec!r}: "
                                 f"expected key=value, e.g. 'exp=f32' or 'dtype=bf16'")
            key, value = (s.strip() for s in part.split("="))
            key_l = _OPTION_ALIASES.get(key.lower(), key.lower())
            if key_l in _OPTION_KEYS:
                opts[key_l] = value
            else:
                rules[key] = value
        return base.replace(rules=rules, **opts)

    # ---------------------------------------------------------------- Rung protocol
    def wrap(self, fn: Callable) -> Callable:
        """``autocast(fn, self)``: lets a policy be a rung of an ``adaptive()`` ladder.

        Example:
            >>> import jax.numpy as jnp
            >>> import adaptprec as ap
            >>> ap.ALWAYS_BF16.wrap(jnp.sin)(jnp.ones(2, jnp.float32)).dtype.name
            'float32'
        """
        return _interpreter["autocast"](fn, self)


#: The interpreter's ``autocast``, registered by :mod:`.interpret` when it is imported
#: (the package imports it before any policy can be wrapped): the interpreter reads
#: policies, so this module does not import it (no cycle presets <-> interpret).
_interpreter: dict[str, Callable] = {}


_AUTO_RULES: dict[str, _RuleValue] = {
    "compute": Rule.ACCUMULATE,
    "reduction": Rule.ACCUMULATE,
    "elementwise": Rule.INPUT,
    "transcendental": Rule.HIGH,
    "linalg": Rule.HIGH,
    "data_movement": Rule.INPUT,
    "control": Rule.HIGH,
    "boundary": Rule.INPUT,
    "unknown": Rule.INPUT,
}


def _always(dtype: str) -> PrecisionPolicy:
    low = {k: Rule.LOW for k in _KIND_ORDER}
    low["unknown"] = Rule.INPUT
    return PrecisionPolicy(dtype, low, accumulate=dtype, preferred_element_type=None)


ALWAYS_F32 = _always("f32")
"""Every op, loop carry and input in float32 (``"always_f32"``)."""
ALWAYS_F16 = _always("f16")
"""Every op in float16, including reductions (no float32 accumulation;
``"always_f16"``)."""
ALWAYS_BF16 = _always("bf16")
"""Every op in bfloat16, including reductions (no float32 accumulation;
``"always_bf16"``)."""
AUTO_MIXED_CONSERVATIVE = PrecisionPolicy("f16", {"reduction": Rule.HIGH},
                                          cast_back=True)
"""float16 with every reduction and transcendental cast up to float32 and back
(``"auto_mixed_conservative"``)."""
AUTO_MIXED = PrecisionPolicy("f16")
"""float16 dots with float32 accumulation; sums, transcendentals and linalg in float32
(``"auto_mixed"``)."""
AUTO_MIXED_BF16 = PrecisionPolicy("bf16")
"""``AUTO_MIXED`` with bfloat16 as the low dtype: bfloat16 dots (float32 accumulation),
float32 sums, transcendentals and linalg (``"auto_mixed_bf16"``)."""

PRESETS: dict[str, PrecisionPolicy] = {
    "always_f32": ALWAYS_F32,
    "always_f16": ALWAYS_F16,
    "always_bf16": ALWAYS_BF16,
    "auto_mixed_conservative": AUTO_MIXED_CONSERVATIVE,
    "auto_mixed": AUTO_MIXED,
    "auto_mixed_bf16": AUTO_MIXED_BF16,
}
"""Preset name -> policy: the names accepted where a policy may be a string
(``autocast(fn, "auto_mixed_bf16")`` is ``autocast(fn, AUTO_MIXED_BF16)``)."""
