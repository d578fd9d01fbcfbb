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

# Each submodule's __all__ is re-exported as is (one list per name, kept by its module).
from .explain import *  # noqa: F403  explain, Explanation, KindRow, ScopeRow
from .explain import __all__ as _explain_all
from .interpret import *  # noqa: F403  autocast
from .interpret import __all__ as _interpret_all
from .opkind import EXACT_REDUCTIONS, PRIMITIVE_KINDS, OpKind, classify
from .presets import *  # noqa: F403  Rule, PrecisionPolicy, the presets and PRESETS
from .presets import __all__ as _presets_all
from .scopes import KEEP, ScopeMatch, ScopeRules

__all__ = [
    *_interpret_all, *_explain_all, *_presets_all,
    "ScopeRules", "ScopeMatch", "KEEP",
    "OpKind", "classify", "PRIMITIVE_KINDS", "EXACT_REDUCTIONS",
]
