"""Pack a pytree of arrays into one flat vector per dtype, and back.

A compiled program's call cost grows with its number of array arguments and results:
on XLA:CPU each one costs a few microseconds of argument handling and buffer creation
(measured: 44 scalar arguments and results cost ~120 us per call, one ~10 us). The host
driver's trust-region state has ~40 leaves, so its ``step`` program packs that state into
one vector per dtype (``concatenate`` / ``slice`` inside the program: exact, no rounding)
and the host loop carries the packed vectors from call to call.

Example:
    >>> import jax, jax.numpy as jnp, numpy as np
    >>> from adaptprec.nlsq._pack import Packer
    >>> tree = {"a": jnp.ones((2, 2)), "b": jnp.asarray(3, jnp.int32), "c": jnp.zeros(3),
    ...         "d": jnp.asarray(True)}
    >>> p = Packer(jax.eval_shape(lambda: tree))
    >>> [v.shape for v in p.pack(tree)]
    [(7,), (2,)]
    >>> back = p.unpack(p.pack(tree))
    >>> bool(jnp.all(back["a"] == 1.0)), int(back["b"]), back["d"].dtype
    (True, 3, dtype('bool'))
    >>> p.unpack_numpy(p.pack(tree))["c"].shape
    (3,)
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["Packer"]


class Packer:
    """Packs trees with the structure and avals of ``avals`` (a pytree of
    ``ShapeDtypeStruct``) into a tuple of 1-D arrays, one per dtype (in order of first
    appearance); booleans travel in the ``bool_as`` group (exact: 0/1)."""

    def __init__(self, avals, bool_as=np.int32):
        leaves, self.treedef = jax.tree.flatten(avals)
        self.dtypes: list = []
        self.slots: list = []          # per leaf: (group, start, size, shape)
        self.bools: list = []          # per leaf: stored as bool_as, given back as bool
        sizes: dict = {}
        for a in leaves:
            dt = np.dtype(a.dtype)
            self.bools.append(dt == np.bool_ and bool_as is not None)
            if self.bools[-1]:
                dt = np.dtype(bool_as)
            if dt not in sizes:
                sizes[dt] = 0
                self.dtypes.append(dt)
            size = int(np.prod(a.shape, dtype=np.int64))
            self.slots.append((self.dtypes.index(dt), sizes[dt], size, tuple(a.shape)))
            sizes[dt] += size
        self.sizes = tuple(sizes[d] for d in self.dtypes)

    def pack(self, tree):
        """The tree's leaves concatenated per dtype (traceable)."""
        leaves = self.treedef.flatten_up_to(tree)
        groups = [[] for _ in self.dtypes]
        for (g, _, _, _), leaf in zip(self.slots, leaves):
            groups[g].append(jnp.ravel(jnp.asarray(leaf, self.dtypes[g])))
        return tuple(jnp.concatenate(g) if len(g) > 1 else g[0] for g in groups)

    def pack_numpy(self, tree):
        """:meth:`pack` on the host (NumPy; no compilation)."""
        leaves = self.treedef.flatten_up_to(tree)
        groups = [[] for _ in self.dtypes]
        for (g, _, _, _), leaf in zip(self.slots, leaves):
            groups[g].append(np.ravel(np.asarray(leaf, self.dtypes[g])))
        return tuple(np.concatenate(g) for g in groups)

    def _unpack(self, vecs, xnp):
        leaves = [xnp.reshape(vecs[g][s:s + k], shape) for g, s, k, shape in self.slots]
        leaves = [v != 0 if b else v for v, b in zip(leaves, self.bools)]
        return jax.tree.unflatten(self.treedef, leaves)

    def unpack(self, vecs):
        """The tree back from :meth:`pack`'s vectors (traceable)."""
        return self._unpack(vecs, jnp)

    def unpack_numpy(self, vecs):
        """:meth:`unpack` on the host (NumPy views; no compilation)."""
        return self._unpack(tuple(np.asarray(v) for v in vecs), np)
