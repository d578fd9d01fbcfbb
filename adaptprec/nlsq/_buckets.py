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
import numpy as np

__all__ = ["bucket", "pad_points", "padded_avals"]

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
