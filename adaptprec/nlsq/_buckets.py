"""Shape buckets: pad the data points of a pointwise residual to a bucket length.

A new data length in the same bucket reuses the compiled residual programs: the data
are padded (copies of the last point, so padded residuals are finite) and a mask zeroes
the padded rows of the residual and Jacobian, so they contribute nothing to the cost,
the model, the gradient or the covariance. Buckets are ``2^k`` and ``3 * 2^(k-1)``
(at most 50% padding); below 16 points every length is its own bucket.

Example:
    >>> from adaptprec.nlsq._buckets import bucket
    >>> [bucket(m) for m in (5, 16, 17, 120, 157, 301, 1000)]
    [5, 16, 24, 128, 192, 384, 1024]
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["bucket", "pad_points", "padded_avals", "masked", "PointMemo"]

MIN_BUCKET = 16


def bucket(m: int) -> int:
    """The bucket length for ``m`` points (``m`` itself below :data:`MIN_BUCKET`)."""
    m = int(m)
    if m <= MIN_BUCKET:
        return m
    p = 1 << (m - 1).bit_length()  # smallest power of two >= m
    return 3 * p // 4 if 3 * p // 4 >= m else p


def _pad_shape(shape, axis, M):
    s = list(shape)
    s[axis] = M
    return tuple(s)


def padded_avals(args, axes, M):
    """``ShapeDtypeStruct`` s of ``args`` with each data leaf's point axis at length ``M``."""
    leaves, treedef = jax.tree.flatten(args)
    out = [jax.ShapeDtypeStruct(np.shape(a) if ax is None else _pad_shape(np.shape(a), ax, M),
                                jax.numpy.result_type(a))
           for a, ax in zip(leaves, axes)]
    return jax.tree.unflatten(treedef, out)


def pad_points(args, axes, m: int, M: int):
    """``args`` (concrete) with each data leaf padded along its point axis from ``m`` to
    ``M`` points by repeating the last point (NumPy; no compilation)."""
    leaves, treedef = jax.tree.flatten(args)
    idx = np.minimum(np.arange(M), m - 1)
    out = [a if ax is None else np.take(np.asarray(a), idx, axis=ax)
           for a, ax in zip(leaves, axes)]
    return jax.tree.unflatten(treedef, out)


def masked(fun, mask):
    """``fun`` with the residuals of padded points (``~mask``) set to zero (so are their
    Jacobian rows); ``fun`` itself when ``mask`` is ``None``."""
    if mask is None:
        return fun
    return lambda x, *a: jnp.where(mask, fun(x, *a), 0.0)


# ----------------------------------------------------------------------------- memo
class PointMemo:
    """Remembers, per residual object (weakly), the point axes proved for an argument
    structure, so that a new data length needs no trace: the residual's size is the data
    leaves' common length along their point axes.

    Example:
        >>> import numpy as np
        >>> from adaptprec.nlsq._buckets import PointMemo
        >>> memo, f = PointMemo(), (lambda p, t, y: p[0] * t - y)
        >>> memo.remember(f, np.ones(2), (np.ones(5), np.ones(5)), (0, 0))
        >>> memo.recall(f, np.ones(2), (np.ones(7), np.ones(7)))
        (7, (0, 0))
        >>> memo.recall(f, np.ones(2), (np.ones(7), np.ones(6))) is None
        True
    """

    def __init__(self):
        import weakref

        self._memo = weakref.WeakKeyDictionary()

    @staticmethod
    def _key(x0, args, axes):
        leaves, treedef = jax.tree.flatten(args)
        if len(leaves) != len(axes):
            return None, None
        lengths, sig = set(), []
        for a, ax in zip(leaves, axes):
            shape = list(np.shape(a))
            if ax is not None:
                if ax >= len(shape):
                    return None, None
                lengths.add(shape[ax])
                shape[ax] = -1
            sig.append((tuple(shape), str(jax.numpy.result_type(a))))
        if len(lengths) != 1:
            return None, None
        x_sig = (np.shape(x0), str(jax.numpy.result_type(x0)))
        return (x_sig, treedef, tuple(sig)), lengths.pop()

    def recall(self, residual, x0, args):
        """``(m, axes)`` for these arguments if remembered, else ``None``."""
        try:
            entries = self._memo.get(residual)
        except TypeError:  # not weak-referenceable
            return None
        for axes, key in list(entries.items()) if entries else ():
            k, m = self._key(x0, args, axes)
            if k is not None and k == key:
                return m, axes
        return None

    def clear(self) -> None:
        self._memo.clear()

    def remember(self, residual, x0, args, axes) -> None:
        key, _ = self._key(x0, args, axes)
        if key is None:
            return
        try:
            entries = self._memo.setdefault(residual, {})
        except TypeError:
            return
        entries[axes] = key
        if len(entries) > 8:
            entries.pop(next(iter(entries)))
