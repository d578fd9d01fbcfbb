"""Whether values are being traced: boundary checks run only on concrete inputs.

Private helper of the bottom layer, shared by linalg, nlsq and batch.
"""

from __future__ import annotations

import jax

__all__ = ["is_traced", "is_concrete"]


def is_traced(*trees) -> bool:
    """True when any leaf is a JAX tracer (we are inside ``jit``/``vmap``/``grad``).

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from adaptprec._tracing import is_traced
        >>> seen = []
        >>> _ = jax.jit(lambda x: seen.append(is_traced(x)) or x)(1.0)
        >>> is_traced(jnp.ones(2)), seen
        (False, [True])
    """
    return any(isinstance(leaf, jax.core.Tracer)
               for t in trees for leaf in jax.tree.leaves(t))


def is_concrete(*trees) -> bool:
    """True when no leaf is a tracer: values can be inspected on the host.

    Example:
        >>> import jax.numpy as jnp
        >>> from adaptprec._tracing import is_concrete
        >>> is_concrete({"a": jnp.ones(2)}, 3.0)
        True
    """
    return not is_traced(*trees)
