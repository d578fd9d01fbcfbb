"""The first-order error walk through sums and extrema, and the affine bound of a
bounded-derivative function of a value.

A sum over ``n`` summands ``x`` with bounds ``e`` has the error ``sum e`` plus its own
rounding. Below the top rung that rounding is *measured*: ``|y - sum_wide(x)|``, the
rung's result against the same summands summed one dtype wider. On the top rung, where
there is no wider dtype, it is bounded by ``sqrt(n) u sum|x|`` (Higham & Mary's
probabilistic ``lambda sqrt(n) u`` with ``lambda = 1``; not a proof). When the summands'
errors are their own (``_first_order._Own``: independent under the model of independent
roundings) they combine in quadrature (Hoeffding, ``SUM_FAILURE`` below).

:class:`Affine` keeps the bound ``scale |base| + offset`` symbolic: below the top rung
(where sums are measured), ``sin`` and ``cos`` of a value whose bound is relative (``_first_order._Rel``, an input's rounding
``u |x|``) have the bound ``u |x| + 4u`` (their values and derivatives are at most 1). A
sum of it reads ``base`` once, in one reduction (:meth:`SumRules.affine_sum`), instead of
an error array written and read again; an input's rounding is measured against the
input as the user passed it, ``|fl(x) - x| <= u |x|``, which the rung reads anyway.

Mixed into the walk of :mod:`adaptprec._first_order` (``SumRules``): ``self.edt``,
``self.local``, ``self.dense`` and ``self.own_in`` are the walk's.
"""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np
from jax import lax

from ._mca import wider as _wider
from ._reductions import materialized
from .precision import unit_roundoff as _u

__all__ = ["Affine", "SumRules", "SUM_FAILURE"]

#: The failure probability of each probabilistic sum (per output entry of a sum of own
#: errors, union-bounded over the sum's outputs).
SUM_FAILURE = 1e-6


class Affine:
    """The error bound ``scale * |base| + offset`` (``base``: an array of the value's
    shape; ``wide``: the user's input ``base`` was rounded from, or ``None``), kept
    symbolic until a sum reads it or another rule needs the array. ``tag``: as
    ``_first_order._Own``'s (``None``: not own)."""

    __slots__ = ("base", "wide", "scale", "offset", "tag")

    def __init__(self, base, wide, scale: float, offset: float, tag):
        self.base, self.wide, self.scale, self.offset, self.tag = (
            base, wide, scale, offset, tag)

    def array(self, w, wide: bool = False):
        """The bound as an array of dtype ``w``; ``wide``: scaled from the user's input
        (``u |x|`` bounds the rounding ``|fl(x) - x|`` as ``u |fl(x)|`` does)."""
        b = self.wide if wide and self.wide is not None else self.base
        if self.scale == 0:
            return jnp.full(jnp.shape(self.base), self.offset, w)
        a = jnp.abs(jnp.asarray(b))
        return (a * a.dtype.type(self.scale)).astype(w) + w.type(self.offset)


class SumRules:
    """``reduce_sum``, ``cumsum``, ``reduce_max``/``reduce_min`` and the trigonometric
    functions' affine bound for the first-order walk."""

    def trig(self, x, e, y):
        """``sin``/``cos`` of ``x`` with bound ``e`` (``None`` or relative): ``e(x) +
        4u`` absolute, the ``2u |y| + 2u`` of their implementations with ``|y| <= 1``,
        and ``|f'| <= 1``, from no value of the kernel (derived from ``y`` or
        ``cos(x)``, the bound made XLA recompute sin in the error's fusion)."""
        off = 4 * _u(y.dtype)
        if e is None:
            return Affine(x, None, 0.0, off, None)
        return Affine(x, getattr(e, "orig", None), e.scale, off, e.tag)

    def p_reduce_sum(self, eqn, vals, errs, outs):
        (x,), (e,), (y,) = vals, errs, outs
        axes = eqn.params["axes"]
        n = int(np.prod([x.shape[a] for a in axes])) if axes else 1
        w = self.edt(y.dtype)
        ref = _wider(y.dtype)
        if ref is not None:
            # the sum's own rounding, measured: the same summands summed one dtype wider
            # (they are materialized for the rung's own sum: no second producer)
            out = materialized(lambda x, y: jnp.abs(
                y.astype(ref) - jnp.sum(x.astype(ref), axis=axes)).astype(w), x, y)
        else:
            scale = w.type(math.sqrt(max(n, 1)) * _u(y.dtype))
            acc = materialized(lambda x: jnp.sum(jnp.abs(x).astype(w), axis=axes), x)
            out = acc * scale + self.local(y)
        own = e is not None and self.own_in[0]
        if isinstance(e, Affine):
            red = self.affine_sum(e, axes, n, own, w)
        elif own:
            red = materialized(lambda e: jnp.sqrt(jnp.sum(e * e, axis=axes)),
                               self.dense(e, x))
        elif e is not None:
            red = materialized(lambda e: jnp.sum(e, axis=axes), self.dense(e, x))
        if own:
            # the summands' own errors are independent: Hoeffding, |sum err| <= lam
            # sqrt(sum e^2) but with probability 2 exp(-lam^2 / 2) per sum,
            # union-bounded over the sums to SUM_FAILURE
            lam = math.sqrt(2.0 * math.log(2.0 * max(y.size, 1) / SUM_FAILURE))
            out = out + w.type(lam) * red
        elif e is not None:
            out = out + red
        return [(y, out)]

    @staticmethod
    def affine_sum(e: Affine, axes, n: int, own: bool, w):
        """``sqrt(sum e^2)`` (own errors) or ``sum e`` of ``e = scale |b| + offset`` over
        ``axes``, from one reduction of ``b`` (the user's input when ``e`` is its
        rounding): Minkowski, ``||scale |b| + offset||_2 <= scale ||b||_2 + offset
        sqrt(n)``, an upper bound (a few percent above on the benchmarks' data) that
        XLA:CPU computes at the speed of reading ``b`` once, where the error array
        itself costs a write and a read (sum(sin x) on 2^20 entries: 0.33 ms against
        0.65 ms single-threaded)."""
        if e.scale == 0:                            # a constant bound: no pass
            return jnp.asarray(w.type((math.sqrt(n) if own else n) * e.offset))
        b = jnp.asarray(e.wide if e.wide is not None else e.base)
        b = b.astype(jnp.promote_types(b.dtype, w))
        if own:
            norm = jnp.sqrt(jnp.sum(jnp.square(b), axis=axes))
            return (norm * e.scale).astype(w) + w.type(math.sqrt(n) * e.offset)
        return (jnp.sum(jnp.abs(b), axis=axes) * e.scale).astype(w) + w.type(n * e.offset)

    def p_reduce_max(self, eqn, vals, errs, outs):
        _, (e,), (y,) = vals, errs, outs
        if e is None:
            return [(y, None)]
        axes = eqn.params["axes"]
        return [(y, materialized(lambda e: jnp.max(e, axis=axes), e))]

    p_reduce_min = p_reduce_max

    def p_cumsum(self, eqn, vals, errs, outs):
        (x,), (e,), (y,) = vals, errs, outs
        axis = eqn.params["axis"]
        n = x.shape[axis]
        w = self.edt(y.dtype)
        rev = eqn.params.get("reverse", False)
        ref = _wider(y.dtype)
        if ref is not None:     # measured, as for sums
            out = jnp.abs(y.astype(ref) - lax.cumsum(x.astype(ref), axis=axis,
                                                     reverse=rev)).astype(w)
        else:
            acc = lax.cumsum(jnp.abs(x).astype(w), axis=axis, reverse=rev) * w.type(
                math.sqrt(max(n, 1)) * _u(y.dtype))
            out = acc + self.local(y)
        if e is not None:
            out = out + lax.cumsum(e, axis=axis, reverse=rev)
        return [(y, out)]
