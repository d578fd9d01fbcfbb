"""Cache keys for user objects: a hashable stand-in for any object, and the structure,
shapes and dtypes of a pytree. Shared by the entry points and the drivers' program caches.

Example:
    >>> import numpy as np
    >>> from adaptprec.nlsq._keys import hashable, sig
    >>> k = hashable([1, 2])          # a list is unhashable: equal only to itself
    >>> k == k, k == hashable([1, 2]), sig((np.zeros(3),))[1]
    (True, False, (((3,), 'float64'),))
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["hashable", "sig"]


def sig(tree):
    """The structure, shapes and dtypes of a pytree (a hashable key)."""
    leaves, treedef = jax.tree.flatten(tree)
    return treedef, tuple((np.shape(a), str(jnp.result_type(a)) if hasattr(a, "dtype")
                           else type(a).__name__) for a in leaves)


class _Same:
    """Cache-key stand-in for an unhashable object: equal only to itself, and it keeps
    the object alive while the key is cached (a bare ``id()`` could be reused by a new
    object after the old one is collected, and hit the wrong compiled program)."""

    __slots__ = ("obj",)

    def __init__(self, obj):
        self.obj = obj

    def __eq__(self, other):
        return isinstance(other, _Same) and other.obj is self.obj

    def __hash__(self):
        return object.__hash__(self.obj)


def hashable(obj):
    """``obj`` if hashable, else a stand-in equal only to itself."""
    try:
        hash(obj)
        return obj
    except TypeError:
        return _Same(obj)
