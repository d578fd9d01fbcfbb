"""Loss scaling for float16 training, in the style of jmp but correct by construction.

The scale lives in float32 whatever the compute dtype (a float16 scale overflows at
65504 and cannot be doubled past 32768). ``DynamicLossScale`` keeps ``period``,
``factor`` *and* ``min_scale`` through flatten/unflatten and ``jit``. The safe sequence is
:meth:`DynamicLossScale.unscale_and_adjust`, which unscales gradients with the scale that
produced them and only then adjusts it.

Example:
    >>> import jax, jax.numpy as jnp
    >>> import adaptprec as ap
    >>> ls = ap.DynamicLossScale(2.0 ** 10, period=2)
    >>> loss_fn = lambda w: jnp.sum(w.astype(jnp.float16) ** 2)
    >>> w = jnp.ones(3)
    >>> grads = jax.grad(lambda w: ls.scale(loss_fn(w)))(w)
    >>> grads, finite, ls = ls.unscale_and_adjust(grads)
    >>> grads.tolist(), bool(finite)
    ([2.0, 2.0, 2.0], True)
"""

from __future__ import annotations

from typing import TypeVar

import jax
import jax.numpy as jnp
import numpy as np

from ._tracing import is_concrete

__all__ = [
    "NoOpLossScale",
    "StaticLossScale",
    "DynamicLossScale",
    "all_finite",
    "select_tree",
]

T = TypeVar("T")
_SCALE_DTYPE = jnp.float32
_F32_MAX = float(np.finfo(np.float32).max)


def _scale_tree(tree: T, factor) -> T:
    # Multiply in float32 (or wider), then return to the leaf's dtype.
    def f(x):
        if not jnp.issubdtype(jnp.result_type(x), jnp.floating):
            return x
        x = jnp.asarray(x)
        wide = jnp.promote_types(x.dtype, _SCALE_DTYPE)
        return (x.astype(wide) * jnp.asarray(factor, wide)).astype(x.dtype)

    return jax.tree_util.tree_map(f, tree)


def all_finite(tree) -> jax.Array:
    """Scalar boolean: every floating leaf of ``tree`` is free of NaN and Inf.

    Example:
        >>> import jax.numpy as jnp
        >>> import adaptprec as ap
        >>> bool(ap.all_finite({"a": jnp.ones(2), "b": jnp.array([1.0, jnp.inf])}))
        False
    """
    leaves = [jnp.all(jnp.isfinite(x)) for x in jax.tree_util.tree_leaves(tree)
              if jnp.issubdtype(jnp.result_type(x), jnp.inexact)]
    if not leaves:
        return jnp.array(True)
    return jnp.all(jnp.stack(leaves))


def select_tree(pred, on_true: T, on_false: T) -> T:
    """Leafwise ``where(pred, on_true, on_false)`` for a scalar boolean ``pred``.

    Example:
        >>> import jax.numpy as jnp
        >>> import adaptprec as ap
        >>> ap.select_tree(jnp.array(False), {"x": jnp.ones(2)}, {"x": jnp.zeros(2)})["x"].tolist()
        [0.0, 0.0]
    """
    pred = jnp.asarray(pred)
    if pred.shape != () or pred.dtype != jnp.bool_:
        raise ValueError(f"select_tree needs a scalar boolean predicate, got shape "
                         f"{pred.shape} dtype {pred.dtype}")
    return jax.tree_util.tree_map(lambda a, b: jnp.where(pred, a, b), on_true, on_false)


class _LossScaleBase:
    loss_scale: jax.Array

    def scale(self, tree: T) -> T:
        """Multiply floating leaves by the loss scale (computed in float32)."""
        return _scale_tree(tree, self.loss_scale)

    def unscale(self, tree: T) -> T:
        """Divide floating leaves by the loss scale (computed in float32)."""
        return _scale_tree(tree, 1.0 / self.loss_scale)

    def unscale_and_adjust(self, grads: T):
        """``(unscaled grads, grads_finite, adjusted loss scale)`` in the safe order."""
        unscaled = self.unscale(grads)
        finite = all_finite(unscaled)
        return unscaled, finite, self.adjust(finite)


@jax.tree_util.register_pytree_node_class
class NoOpLossScale(_LossScaleBase):
    """A loss scale that does nothing (scale 1).

    Example:
        >>> import jax.numpy as jnp
        >>> import adaptprec as ap
        >>> ap.NoOpLossScale().scale(jnp.ones(2)).tolist()
        [1.0, 1.0]
    """

    @property
    def loss_scale(self):
        return jnp.ones((), _SCALE_DTYPE)

    def scale(self, tree: T) -> T:
        return tree

    def unscale(self, tree: T) -> T:
        return tree

    def adjust(self, grads_finite) -> NoOpLossScale:
        del grads_finite
        return self

    def tree_flatten(self):
        return (), None

    @classmethod
    def tree_unflatten(cls, aux, children):
        return cls()

    def __repr__(self):
        return "NoOpLossScale()"


@jax.tree_util.register_pytree_node_class
class StaticLossScale(_LossScaleBase):
    """A fixed loss scale, stored in float32.

    Example:
        >>> import jax.numpy as jnp
        >>> import adaptprec as ap
        >>> ls = ap.StaticLossScale(128.0)
        >>> ls.unscale(ls.scale(jnp.float16(3.0))).item()
        3.0
    """

    def __init__(self, loss_scale):
        self.loss_scale = _as_scale(loss_scale, "loss_scale")

    def adjust(self, grads_finite) -> StaticLossScale:
        del grads_finite
        return self

    def tree_flatten(self):
        return (self.loss_scale,), None

    @classmethod
    def tree_unflatten(cls, aux, children):
        obj = object.__new__(cls)
        obj.loss_scale = children[0]
        return obj

    def __repr__(self):
        return f"StaticLossScale({self.loss_scale!r})"


def _as_scale(value, name):
    # arrays too, when concrete: a zero scale would skip every step forever, a negative
    # one would flip the gradients
    if is_concrete(value):
        v = np.asarray(value, np.float64)
        if v.shape != () or not np.isfinite(v) or v <= 0:
            raise ValueError(f"{name} must be a finite positive scalar, got {value!r}")
    return jnp.asarray(value, _SCALE_DTYPE)


@jax.tree_util.register_pytree_node_class
class DynamicLossScale(_LossScaleBase):
    r"""A loss scale that grows after ``period`` finite steps and shrinks on overflow.

    ``adjust(grads_finite)``: if the gradients were finite, increment the counter and
    multiply the scale by ``factor`` when the counter reaches ``period`` (capped at the
    float32 maximum); otherwise divide it by ``factor`` (never below ``min_scale``) and
    reset the counter. ``loss_scale``, ``counter`` and ``min_scale`` are leaves (float32,
    int32, float32); ``period`` and ``factor`` are static.

    Example:
        >>> import jax.numpy as jnp
        >>> import adaptprec as ap
        >>> ls = ap.DynamicLossScale(4.0, period=2, factor=2, min_scale=2.0)
        >>> ls = ls.adjust(jnp.array(False)).adjust(jnp.array(False))
        >>> float(ls.loss_scale)   # halved once, then held at min_scale
        2.0
    """

    def __init__(self, scale=2.0 ** 15, period: int = 2000, factor: float = 2,
                 min_scale=1.0, counter=None):
        if not isinstance(period, (int, np.integer)) or period < 1:
            raise ValueError(f"period must be a positive integer, got {period!r}")
        if not isinstance(factor, (int, float)) or not factor > 1:
            raise ValueError(f"factor must be a number > 1, got {factor!r}")
        self.loss_scale = _as_scale(scale, "scale")
        self.min_scale = _as_scale(min_scale, "min_scale")
        if is_concrete((scale, min_scale)) and float(min_scale) > float(scale):
            raise ValueError(f"min_scale ({float(min_scale)}) must not exceed scale "
                             f"({float(scale)}): an overflow would raise the scale")
        self.counter = (jnp.zeros((), jnp.int32) if counter is None
                        else jnp.asarray(counter, jnp.int32))
        self.period = int(period)
        self.factor = factor

    def adjust(self, grads_finite) -> DynamicLossScale:
        grads_finite = jnp.asarray(grads_finite, jnp.bool_)
        grown_counter = self.counter + 1
        grow = grown_counter >= self.period
        grown = jnp.where(grow, jnp.minimum(self.loss_scale * self.factor, _F32_MAX),
                          self.loss_scale)
        # never above the current scale (a traced min_scale above it cannot be refused)
        shrunk = jnp.maximum(self.loss_scale / self.factor,
                             jnp.minimum(self.min_scale, self.loss_scale))
        new_scale = jnp.where(grads_finite, grown, shrunk).astype(_SCALE_DTYPE)
        new_counter = jnp.where(grads_finite & ~grow, grown_counter, 0).astype(jnp.int32)
        return DynamicLossScale._make(new_scale, new_counter, self.min_scale, self.period,
                                      self.factor)

    @classmethod
    def _make(cls, scale, counter, min_scale, period, factor):
        obj = object.__new__(cls)
        obj.loss_scale, obj.counter, obj.min_scale = scale, counter, min_scale
        obj.period, obj.factor = period, factor
        return obj

    def tree_flatten(self):
        return (self.loss_scale, self.counter, self.min_scale), (self.period, self.factor)

    @classmethod
    def tree_unflatten(cls, aux, children):
        return cls._make(*children, *aux)

    def __repr__(self):
        return (f"DynamicLossScale(scale={self.loss_scale!r}, counter={self.counter!r}, "
                f"period={self.period}, factor={self.factor}, min_scale={self.min_scale!r})")
