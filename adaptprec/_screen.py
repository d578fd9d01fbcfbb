"""The cancellation screen: the deterministic part of the Monte Carlo check, alone.

The top rung's cheapest accuracy check when no estimate fits the plan's budget
(``check="screen"``): per top-level ``add``/``sub``, CADNA's unstable-cancellation
ratio ``u * max(|a|+|b|) / max|a+-b|``, and whether one cancelled nonzero operands to an
exact 0.
"""

from __future__ import annotations

from collections.abc import Callable

import jax.numpy as jnp
import numpy as np
from jax import lax

from . import _jaxpr as jx
from ._autocast.interpret import _trace
from ._opkind import OpKind, classify
from ._reductions import materialized

__all__ = ["cancellation_screen"]


def _is_float(dtype) -> bool:
    return dtype is not None and jnp.issubdtype(dtype, jnp.floating)


def _u(dtype) -> float:
    return float(2.0 ** -(int(jnp.finfo(dtype).nmant) + 1))


_ADDSUB = frozenset({"add", "sub", "add_any"})


def cancellation_screen(fn: Callable, args: tuple, kwargs: dict, rung_dtype,
                        componentwise: bool = False):
    """``(u * max(|a|+|b|) / max|a+-b|`` over the top-level add/subs (float32),
    whether one gave exactly 0 from nonzero operands)``: the deterministic screen of the
    Monte Carlo check without its samples (an evaluation XLA shares with the kernel's
    own, plus two reductions per add/sub). Calls are inlined; loops and branches are
    run as they are (their insides are not screened). The subtraction of a max/min (a
    softmax shift) is not a cancellation, as in the Monte Carlo check."""
    closed, _, dyn = _trace(fn, args, kwargs)
    ratios: list = []
    zeros: list = []
    shifts: set = set()

    def step(eqn, vals):
        name = eqn.primitive.name
        body = jx.call_body(eqn, remat=True, custom=True)
        if body is not None:
            jaxpr, consts = body
            return jx.eval_jaxpr(jaxpr, consts, vals, step)
        outs = jx.bind(eqn, vals)
        if name in ("reduce_max", "reduce_min") or (
                any(id(v) in shifts for v in vals) and (
                    classify(name) is OpKind.DATA_MOVEMENT
                    or name in ("stop_gradient", "neg", "max", "min"))):
            shifts.update(id(o) for o in outs)
        elif name in _ADDSUB and not any(id(v) in shifts for v in vals) and \
                _is_float(jnp.result_type(outs[0])):
            (y,) = outs
            w = np.dtype(jnp.promote_types(y.dtype, jnp.float32))
            a, b = (jnp.abs(jnp.asarray(v)).astype(w) for v in vals)
            def reduce(a, b, y):
                num = jnp.broadcast_to(a + b, y.shape)
                den = jnp.abs(y).astype(w)
                # a float max, not jnp.any: boolean reductions are slow on XLA:CPU
                zero = jnp.max(jnp.where((den == 0) & (num > 0), 1.0, 0.0), initial=0.0)
                if componentwise:
                    r = jnp.max(jnp.where(num == 0, 0.0, jnp.where(
                        den == 0, 0.0, num / den)), initial=0.0)
                else:
                    nmax, dmax = jnp.max(num, initial=0.0), jnp.max(den, initial=0.0)
                    r = jnp.where(nmax == 0, 0.0, jnp.where(dmax == 0, 0.0, nmax / dmax))
                return r, zero > 0

            r, zero = materialized(reduce, a, b, y)
            zeros.append(zero)
            ratios.append((r * _u(eqn.outvars[0].aval.dtype)).astype(jnp.float32))
        return outs

    consts = [lax.stop_gradient(jnp.asarray(c)) for c in closed.consts]
    jx.eval_jaxpr(closed.jaxpr, consts, [lax.stop_gradient(x) for x in dyn], step)
    ratio = jnp.max(jnp.stack(ratios)) if ratios else jnp.float32(0)
    zero = jnp.any(jnp.stack(zeros)) if zeros else jnp.asarray(False)
    return jnp.where(jnp.isnan(ratio), jnp.inf, ratio), zero
