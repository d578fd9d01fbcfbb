"""Pytree parameters for batched fits: ``x0`` may be any pytree of arrays whose leaves
share a leading batch axis; the solver works on the flat ``(B, n)`` matrix.

Leaves are flattened in ``jax.tree`` order, each per fit in C order (as
``jax.flatten_util.ravel_pytree``), so ``pcov`` rows follow that order.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["BatchedTreeSpec", "is_array_like", "TreeResidual", "TiedResidual"]


def is_array_like(x0) -> bool:
    """``x0`` given as one ``(B, n)`` array (an array, or nested lists of numbers) rather
    than a pytree of arrays (a dict, a namedtuple / dataclass / module, or a list/tuple
    of arrays)."""
    if isinstance(x0, (jax.Array, np.ndarray)):
        return True
    if isinstance(x0, (list, tuple)) and not hasattr(x0, "_fields"):
        return not any(isinstance(leaf, (jax.Array, np.ndarray))
                       for leaf in jax.tree.leaves(x0))
    return False


@dataclasses.dataclass(frozen=True)
class BatchedTreeSpec:
    """Structure of one fit's parameters: tree structure and per-fit leaf shapes.

    Example:
        >>> import jax.numpy as jnp
        >>> from adaptprec.batch._pytree import BatchedTreeSpec
        >>> x0 = {"amp": jnp.ones(4), "centre": jnp.zeros((4, 2))}
        >>> spec, flat = BatchedTreeSpec.ravel(x0)
        >>> flat.shape, spec.n
        ((4, 3), 3)
        >>> back = spec.unravel_batched(flat)
        >>> back["amp"].shape, back["centre"].shape, spec.unravel(flat[0])["centre"].shape
        ((4,), (4, 2), (2,))
    """

    treedef: Any
    shapes: tuple

    @property
    def n(self) -> int:
        return int(sum(int(np.prod(s)) for s in self.shapes))

    @classmethod
    def ravel(cls, x0):
        """``(spec, flat)`` with ``flat`` of shape ``(B, n)``; ValueError on leaves
        without the common leading batch axis."""
        leaves, treedef = jax.tree.flatten(x0)
        if not leaves:
            raise ValueError("x0 is an empty pytree; give at least one parameter array")
        arrs = [a if isinstance(a, jax.Array) else np.asarray(a) for a in leaves]
        sizes = {a.shape[0] if a.ndim else None for a in arrs}
        if None in sizes or len(sizes) != 1:
            shapes = [tuple(a.shape) for a in arrs]
            raise ValueError(f"every leaf of a pytree x0 needs the same leading batch "
                             f"axis (one entry per fit); got leaf shapes {shapes}")
        size = sizes.pop()
        flt = [a.dtype for a in arrs if np.issubdtype(a.dtype, np.floating)]
        # float64 leaves with x64 off (precision="f32"): float32, without JAX's warning
        dt = jax.dtypes.canonicalize_dtype(np.result_type(*flt)) if flt else \
            jnp.zeros(()).dtype
        flat = jnp.concatenate([jnp.asarray(a, dt).reshape(size, -1) for a in arrs], axis=1)
        return cls(treedef, tuple(tuple(a.shape[1:]) for a in arrs)), flat

    def _split(self, flat, lead: tuple):
        # leaves come back in the flat vector's dtype: on a float32 rung the model sees
        # float32 parameters whatever x0's leaves were (the rung decides the precision)
        out, start = [], 0
        for shape in self.shapes:
            k = int(np.prod(shape))
            out.append(flat[..., start:start + k].reshape(lead + shape))
            start += k
        return jax.tree.unflatten(self.treedef, out)

    def unravel(self, x):
        """One fit's flat ``(n,)`` vector as the parameter pytree."""
        return self._split(x, ())

    def unravel_batched(self, X):
        """``(B, n)`` as the pytree with leaves ``(B, ...)``."""
        return self._split(X, (X.shape[0],))


@dataclasses.dataclass(frozen=True)
class TreeResidual:
    """``fun(unravel(x), *args)``: the user's function of a parameter pytree as a
    function of one fit's flat vector (hashable, so compiled solvers are reused)."""

    fun: Callable
    spec: BatchedTreeSpec

    def __call__(self, x, *args):
        return self.fun(self.spec.unravel(x), *args)


@dataclasses.dataclass(frozen=True)
class TiedResidual:
    """``fun(p, *args)`` with one fit's parameters ``p = params.expand(q)`` computed from
    its free coordinates ``q`` (``params``: a
    :class:`~adaptprec.modeling.parameters.ParameterSpec`, the ties and the constraints'
    slacks), handed over as x0's pytree when ``tree`` is set (hashable, so compiled
    solvers are reused)."""

    fun: Callable
    params: Any
    tree: BatchedTreeSpec | None = None

    def __call__(self, q, *args):
        p = self.params.expand(q, np.zeros(0))
        return self.fun(p if self.tree is None else self.tree.unravel(p), *args)
