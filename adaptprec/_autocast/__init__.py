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
# ``import adaptprec`` does not load this package (the op table it shares with the
# jaxpr walker is adaptprec/_opkind.py). Loading it loads the interpreter, which
# registers itself with the policies (``PrecisionPolicy.wrap``; presets.py does not
# import it: no cycle); the other names on first use, through ``__getattr__``.
from typing import TYPE_CHECKING

from .._opkind import EXACT_REDUCTIONS, PRIMITIVE_KINDS, OpKind, classify
from . import interpret as _interpret  # noqa: F401  (registers autocast with presets)

_LAZY = {
    **dict.fromkeys(("explain", "Explanation", "KindRow", "ScopeRow"), ".explain"),
    "autocast": ".interpret",
    **dict.fromkeys(("Rule", "PrecisionPolicy", "ALWAYS_F32", "ALWAYS_F16", "ALWAYS_BF16",
                     "AUTO_MIXED_CONSERVATIVE", "AUTO_MIXED", "AUTO_MIXED_BF16", "PRESETS"),
                    ".presets"),
    **dict.fromkeys(("ScopeRules", "ScopeMatch", "KEEP"), ".scopes"),
}


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY))


if TYPE_CHECKING:  # pragma: no cover
    from .explain import Explanation, KindRow, ScopeRow, explain
    from .interpret import autocast
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

__all__ = [*_LAZY, "OpKind", "classify", "PRIMITIVE_KINDS", "EXACT_REDUCTIONS"]
