"""The data of a pointwise residual in cache-sized blocks of points: each data leaf with
its point axis first, padded with copies of its last point (masked) and reshaped to
``(blocks, size, ...)`` once before the loop; ``lax.scan`` walks the blocks.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["PointBlocks", "block_size", "residual_and_rows"]

#: Points per block: a block's residual and Jacobian rows (``n + 1`` vectors) stay in L2
#: (benchmarks/RESULTS.md, "the 1e6-point fit").
TARGET_BLOCK = 4096


def block_size(m: int, target: int = TARGET_BLOCK) -> int:
    """Points per block: the divisor of ``m`` nearest to ``target`` within
    ``target / 2`` of it if there is one (no padding), else ``target`` (``m`` itself when
    ``m <= target``)."""
    if m <= target:
        return m
    for delta in range(target // 2 + 1):
        for c in (target + delta, target - delta):
            if m % c == 0:
                return c
    return target


def residual_and_rows(fun, x, args):
    """``f = fun(x, *args)`` and the Jacobian's rows ``J^T`` (``n x m``, no transpose):
    one forward-mode pass, ``jvp`` along each unit vector with the primal shared."""
    eye = jnp.eye(x.shape[0], dtype=x.dtype)

    def r(z):
        return fun(z, *args)

    return jax.vmap(lambda v: jax.jvp(r, (x,), (v,)), out_axes=(None, 0))(eye)


class PointBlocks:
    """Blocking of ``m`` data points for the leaves of an ``args`` pytree (``axes``: per
    leaf, the axis holding the points; ``None``: not data, passed whole to every block).

    Example:
        >>> import jax.numpy as jnp
        >>> from adaptprec.nlsq._blocks import PointBlocks
        >>> pb = PointBlocks(10, (0, None), size=4)
        >>> blocked = pb.block((jnp.arange(10.0), jnp.ones(3)))
        >>> blocked[0].shape, pb.padded
        ((3, 4), True)
        >>> data, valid = pb.xs(blocked)
        >>> t_blk, c = pb.unblock(blocked, [d[2] for d in data])
        >>> t_blk.tolist(), c.shape, valid[2].tolist()
        ([8.0, 9.0, 9.0, 9.0], (3,), [True, True, False, False])
    """

    def __init__(self, m: int, axes: tuple, size: int | None = None):
        self.m = int(m)
        self.axes = tuple(axes)
        self.size = int(size) if size is not None else block_size(self.m)
        self.count = -(-self.m // self.size)
        self.padded = self.count * self.size != self.m

    def block(self, args):
        """``args`` with each data leaf reshaped to ``(count, size, ...)`` (point axis first)."""
        leaves, treedef = jax.tree.flatten(args)
        out = []
        for leaf, a in zip(leaves, self.axes):
            if a is None:
                out.append(leaf)
                continue
            x = jnp.moveaxis(jnp.asarray(leaf), a, 0)
            pad = self.count * self.size - self.m
            if pad:
                x = jnp.concatenate([x, jnp.repeat(x[-1:], pad, axis=0)])
            out.append(x.reshape((self.count, self.size) + x.shape[1:]))
        return jax.tree.unflatten(treedef, out)

    def xs(self, blocked):
        """What ``lax.scan`` walks: the blocked data leaves and a ``(count, size)``
        mask of real (not padded) points."""
        leaves = jax.tree.leaves(blocked)
        data = [x for x, a in zip(leaves, self.axes) if a is not None]
        valid = (np.arange(self.count * self.size) < self.m).reshape(self.count, self.size)
        return data, jnp.asarray(valid)

    def unblock(self, blocked, block_leaves):
        """The residual's arguments for one block: ``blocked`` with its data leaves
        replaced by ``block_leaves`` (one block each), point axis back in place."""
        leaves, treedef = jax.tree.flatten(blocked)
        it = iter(block_leaves)
        out = [leaf if a is None else jnp.moveaxis(next(it), 0, a)
               for leaf, a in zip(leaves, self.axes)]
        return jax.tree.unflatten(treedef, out)

    def scan_rows(self, fun, x, blocked, body, init):
        """``lax.scan`` over the blocks of ``blocked`` (from :meth:`block`): each step
        forms ``f`` and ``J^T`` of one block (padded points zeroed) and returns
        ``body(carry, f, JT) -> (carry, ys)``; ``ys`` come back stacked per block
        (:meth:`points` flattens them)."""

        def one(carry, xs):
            blk, valid = xs
            f, JT = residual_and_rows(fun, x, self.unblock(blocked, blk))
            if self.padded:
                f = jnp.where(valid, f, 0.0)
                JT = jnp.where(valid, JT, 0.0)
            return body(carry, f, JT)

        return jax.lax.scan(one, init, self.xs(blocked))

    def points(self, ys):
        """``(count, size, ...)`` per-block outputs as ``(m, ...)``."""
        return ys.reshape((-1,) + ys.shape[2:])[: self.m]
