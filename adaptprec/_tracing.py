"""Whether values are being traced: boundary checks run only on concrete inputs.

Private helper of the bottom layer, shared by linalg, nlsq and batch.
"""

from __future__ import annotations

import jax
import numpy as np

__all__ = ["is_traced", "is_concrete", "trace_active", "is_eager"]


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
    return any(not isinstance(t, (np.ndarray, np.generic))   # a NumPy leaf: no walk
               and any(isinstance(leaf, jax.core.Tracer) for leaf in jax.tree.leaves(t))
               for t in trees)


def is_concrete(*trees) -> bool:
    """True when no leaf is a tracer: values can be inspected on the host.

    Example:
        >>> import jax.numpy as jnp
        >>> from adaptprec._tracing import is_concrete
        >>> is_concrete({"a": jnp.ones(2)}, 3.0)
        True
    """
    return not is_traced(*trees)


def trace_active() -> bool:
    """True inside a user's ``jit``/``vmap``/``grad`` trace, even when the arguments are
    concrete: a residual may close over the trace's values (``lambda p: f(p) - s * y``
    with ``s`` traced), so ahead-of-time compiled programs and host loops cannot run it.

    Example:
        >>> import jax
        >>> from adaptprec._tracing import trace_active
        >>> seen = []
        >>> _ = jax.jit(lambda x: seen.append(trace_active()) or x)(1.0)
        >>> trace_active(), seen
        (False, [True])
    """
    try:
        from jax._src import core
        return not core.trace_state_clean()
    except (ImportError, AttributeError):  # a JAX without it: arguments decide alone
        return False


def is_eager(*trees) -> bool:
    """True for an eager call: no leaf of ``trees`` is a tracer and no trace is active
    (:func:`trace_active`), so host-side machinery (ahead-of-time executables, host
    loops, NumPy results) may run.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from adaptprec._tracing import is_eager
        >>> seen = []
        >>> _ = jax.jit(lambda x: seen.append(is_eager(jnp.ones(2))) or x)(1.0)
        >>> is_eager(jnp.ones(2)), seen
        (True, [False])
    """
    return is_concrete(*trees) and not trace_active()
