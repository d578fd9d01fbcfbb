"""One policy vocabulary: where an autocast policy is asked for, a jmp policy works too.

adaptprec has two policy languages. jmp's (:class:`~adaptprec.Policy`,
``"p=f32,c=bf16,o=f32"``) says which dtype parameters, computation and outputs use; it
is applied by casting at function boundaries. autocast's
(:class:`~adaptprec.PrecisionPolicy`, ``"auto_mixed_bf16"``, ``"always_f32, exp=f32"``)
says which dtype each *kind of operation* computes in. Each entry point takes the other
kind wherever its meaning is clear:

* ``autocast``, ``explain``, scope rules and ``profile`` configurations take a jmp policy
  as "compute in ``c`` throughout": every operation's operands in the compute dtype, dots
  and sums accumulated in float32 or wider, loop carries at least float32, floating
  outputs in ``o`` (:func:`precision_policy`, :func:`region_policy`);
* ``train_step`` and ``mixed_value_and_grad`` take an autocast policy as ``policy=`` to
  mean ``precision=`` that policy with float32 parameters (:func:`training_policies`);
* ``ap.Policy`` / ``ap.policy`` / ``cast_floating`` do not take autocast policies (a
  three-dtype policy cannot say "dots in bfloat16, sums in float32"): the error says where
  they go.

Each entry point reads its own grammar first: ``"compute=bf16"`` is an autocast rule
(the ``compute`` op kind in bfloat16) for ``autocast`` and a jmp policy for
``train_step``'s ``policy=``.

Example:
    >>> import adaptprec as ap
    >>> from adaptprec._autocast.vocabulary import precision_policy
    >>> pol = precision_policy("p=f32,c=bf16,o=f32")
    >>> pol.dtype.name, pol.rule_for("exp"), pol.rule_for("dot_general"), pol.output.name
    ('bfloat16', <Rule.LOW: 'low'>, <Rule.ACCUMULATE: 'accumulate'>, 'float32')
    >>> precision_policy("auto_mixed_bf16") == ap.AUTO_MIXED_BF16
    True
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._opkind import OpKind
from .._policy import Policy, is_jmp_spec
from ..precision import canonical_dtype, require_x64
from .presets import PrecisionPolicy, Rule

__all__ = ["precision_policy", "region_policy", "training_policies", "is_autocast_spec"]

_JMP_KEYS = ("p", "params", "param", "c", "compute", "o", "output")


def region_policy(dtype: Any, output: Any = None) -> PrecisionPolicy:
    """The policy of "compute in ``dtype``": every op in ``dtype``, dots and sums
    accumulated in float32 or wider, loop carries float32 or wider (a bare-dtype scope
    rule, or a jmp policy's compute dtype); floating outputs in ``output`` if given.

    Example:
        >>> from adaptprec._autocast.vocabulary import region_policy
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
    return PrecisionPolicy(low, rules, accumulate=acc, preferred_element_type=acc,
                           output=output)


def _from_jmp(policy: Policy) -> PrecisionPolicy:
    return region_policy(policy.compute, output=policy.output)


def is_autocast_spec(spec: Any) -> bool:
    """Whether ``spec`` is an autocast policy: a :class:`~adaptprec.PrecisionPolicy` or a
    string :meth:`~adaptprec.PrecisionPolicy.parse` reads.

    Example:
        >>> from adaptprec._autocast.vocabulary import is_autocast_spec
        >>> is_autocast_spec("auto_mixed_bf16"), is_autocast_spec("p=f32,c=bf16,o=f32")
        (True, False)
    """
    if isinstance(spec, PrecisionPolicy):
        return True
    if not isinstance(spec, str) or is_jmp_spec(spec):
        return False
    try:
        PrecisionPolicy.parse(spec)
    except ValueError:
        return False
    return True


def precision_policy(value: Any, param: str = "policy") -> PrecisionPolicy:
    """An autocast policy from any accepted form: a :class:`~adaptprec.PrecisionPolicy`,
    a preset or policy string, a jmp :class:`~adaptprec.Policy` or jmp string (see the
    module docstring). ``param`` names the argument in error messages.

    Example:
        >>> from adaptprec._autocast.vocabulary import precision_policy
        >>> precision_policy("p=f32,exp=f32")
        Traceback (most recent call last):
        ...
        ValueError: policy='p=f32,exp=f32' mixes jmp keys (p) with autocast rules (exp)...
    """
    if isinstance(value, PrecisionPolicy):
        return value
    if isinstance(value, Policy):
        return _from_jmp(value)
    if not isinstance(value, str):
        raise TypeError(f"{param} must be an autocast policy (a preset such as "
                        f"'auto_mixed_bf16', a policy string such as 'auto_mixed, exp=f32', "
                        f"an ap.PrecisionPolicy) or a jmp policy ('p=f32,c=bf16,o=f32', "
                        f"ap.Policy); got {value!r} of type {type(value).__name__}")
    try:  # autocast's own grammar first: "compute=bf16" is the rule of the compute kind
        return PrecisionPolicy.parse(value)
    except ValueError as exc:
        auto_error = exc
    if is_jmp_spec(value):
        try:
            return _from_jmp(Policy.parse(value))
        except ValueError as exc:
            raise ValueError(f"{param}={value!r}: {exc}") from None
    keys = [p.split("=", 1)[0].strip() for p in value.split(",") if "=" in p]
    jmp = [k for k in keys if k.lower() in _JMP_KEYS]
    if jmp:
        other = [k for k in keys if k.lower() not in _JMP_KEYS]
        raise ValueError(
            f"{param}={value!r} mixes jmp keys ({', '.join(jmp)}) with autocast rules "
            f"({', '.join(other) or 'a preset'}); write either a jmp policy "
            f"('p=f32,c=bf16,o=f32') or an autocast policy ('auto_mixed_bf16, exp=f32'). "
            f"In ap.train_step / ap.mixed_value_and_grad the jmp policy goes to policy= "
            f"and the autocast policy to precision=")
    raise ValueError(
        f"{param}={value!r} is neither a jmp policy (a dtype alias such as 'bf16', or "
        f"'p=f32,c=bf16,o=f32') nor an autocast policy: {auto_error}")


def training_policies(policy: Any, precision: Any) -> tuple[Policy, Any]:
    """``(jmp policy, autocast precision or None)`` of a training step's ``policy=`` and
    ``precision=``: an autocast policy given as ``policy=`` means ``precision=`` it, with
    float32 parameters, computation boundaries and outputs.

    Example:
        >>> from adaptprec._autocast.vocabulary import training_policies
        >>> jmp, precision = training_policies("auto_mixed_bf16", None)
        >>> str(jmp), precision
        ('p=f32,c=f32,o=f32', 'auto_mixed_bf16')
    """
    if not is_autocast_spec(policy):
        try:
            return Policy.parse(policy), precision
        except ValueError as exc:   # the message names where autocast policies go
            raise ValueError(f"policy={policy!r}: {exc}") from None
    if precision is not None:
        raise ValueError(
            f"policy={policy!r} is an autocast policy and precision={precision!r} is given "
            f"too; pass the autocast policy once, as precision=, and a jmp policy "
            f"('p=f32,c=bf16,o=f32') as policy=")
    return Policy("f32"), policy
