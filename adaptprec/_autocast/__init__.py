"""Op-level precision policies and autocast for any JAX function.

* :class:`OpKind` and :func:`classify`: the numerical class of each JAX primitive;
* :class:`PrecisionPolicy` with presets ``ALWAYS_F32``, ``ALWAYS_F16``, ``ALWAYS_BF16``,
  ``AUTO_MIXED_CONSERVATIVE``, ``AUTO_MIXED``, ``AUTO_MIXED_BF16`` and a string form;
* :func:`autocast`: re-evaluates ``fn``'s jaxpr with each primitive at its kind's precision
  (composes with ``jit``, ``grad``, ``vmap``, custom derivatives and ``adaptive()``);
* :func:`explain`: the table of ops, dtypes and casts a policy produces;
* :class:`ScopeRules`: per-region rules (``scopes={pattern: rule}``) matched on the name
  stack of ``jax.named_scope`` / module scopes.

Example:
    >>> import jax.numpy as jnp
    >>> import adaptprec as ap
    >>> f = ap.autocast(lambda x: jnp.tanh(x) @ x, ap.AUTO_MIXED_BF16)
    >>> f(jnp.eye(2, dtype=jnp.float32)).dtype.name
    'float32'
"""

from .explain import Explanation, KindRow, ScopeRow, explain
from .interpret import autocast
from .opkind import EXACT_REDUCTIONS, PRIMITIVE_KINDS, OpKind, classify
from .presets import (
    ALWAYS_BF16,
    ALWAYS_F16,
    ALWAYS_F32,
    AUTO_MIXED,
    AUTO_MIXED_BF16,
    AUTO_MIXED_CONSERVATIVE,
    PRESETS,
    PrecisionPolicy,
    Rule,
)
from .scopes import KEEP, ScopeMatch, ScopeRules

__all__ = [
    "autocast",
    "explain",
    "ScopeRules",
    "ScopeMatch",
    "ScopeRow",
    "KEEP",
    "Explanation",
    "KindRow",
    "OpKind",
    "classify",
    "PRIMITIVE_KINDS",
    "EXACT_REDUCTIONS",
    "PrecisionPolicy",
    "Rule",
    "PRESETS",
    "ALWAYS_F32",
    "ALWAYS_F16",
    "ALWAYS_BF16",
    "AUTO_MIXED_CONSERVATIVE",
    "AUTO_MIXED",
    "AUTO_MIXED_BF16",
]
