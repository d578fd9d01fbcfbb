"""Residual identity: key compiled programs on what a residual computes, not on which
Python object computes it.

A residual written inline per call (``lambda p, t, y: ...`` inside a loop, a closure
over new data) is a new object every time; keying on the object would compile again
for every call. Instead the residual is traced once to a jaxpr with the arrays it
captures hoisted out as arguments (as ``equinox.filter_closure_convert`` does); the key
is the jaxpr's text (equations, shapes, dtypes, literal values) plus the shapes and
dtypes of the hoisted constants. Two residuals with the same key compute the same
function of ``(constants, x, *args)``, so one compiled program serves both, each called
with its own constants. No ``id()`` of a live object enters a key.

Example:
    >>> import jax.numpy as jnp, numpy as np
    >>> from adaptprec.nlsq._identity import trace_residual
    >>> x, t = jnp.ones(2), jnp.linspace(0.0, 1.0, 5)
    >>> a = trace_residual(lambda p, t: p[0] * jnp.exp(-p[1] * t) - np.ones(5), x, (t,))
    >>> b = trace_residual(lambda p, t: p[0] * jnp.exp(-p[1] * t) - np.zeros(5), x, (t,))
    >>> a.key == b.key, [float(c.sum()) for c in (a.consts[0], b.consts[0])]
    (True, [5.0, 0.0])
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import numpy as np

__all__ = ["TracedResidual", "trace_residual", "jaxpr_function"]


class TracedResidual(NamedTuple):
    key: tuple  #: hashable identity of the computation
    jaxpr: Any  #: open jaxpr: constvars (hoisted captures), then x, then the args' leaves
    consts: tuple  #: the hoisted captured arrays, in constvar order
    out_shape: Any  #: ``jax.ShapeDtypeStruct`` of the (flat) output


def _aval(a):
    return jax.ShapeDtypeStruct(np.shape(a), jax.numpy.result_type(a))


def trace_residual(fun, x, args) -> TracedResidual:
    """Trace ``fun(x, *args)`` (one flat output array) at the shapes/dtypes of ``x`` and
    ``args`` (arrays or ``ShapeDtypeStruct``); see the module docstring."""
    leaves, treedef = jax.tree.flatten(args)

    def flat(xx, *ls):
        return fun(xx, *jax.tree.unflatten(treedef, ls))

    closed = jax.make_jaxpr(flat)(_aval(x), *[_aval(a) for a in leaves])
    if len(closed.jaxpr.outvars) != 1:
        raise ValueError("trace_residual expects a function with one array output")
    consts = tuple(closed.consts)
    key = (str(closed.jaxpr), str(treedef),
           tuple((np.shape(c), str(c.dtype if hasattr(c, "dtype") else np.asarray(c).dtype))
                 for c in consts))
    out = closed.jaxpr.outvars[0].aval
    return TracedResidual(key, closed.jaxpr, consts,
                          jax.ShapeDtypeStruct(out.shape, out.dtype))


def jaxpr_function(jaxpr, consts):
    """``fun(x, *args)`` evaluating ``jaxpr`` with ``consts`` (traced or concrete)."""

    def fun(x, *args):
        return jax.core.eval_jaxpr(jaxpr, list(consts), x, *jax.tree.leaves(args))[0]

    return fun
