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

One exception: a jaxpr prints the Python functions it calls back into by name only
(a ``jax.custom_jvp``/``custom_vjp`` rule shows as ``jvp=<lambda>``, a ``pure_callback``
as its name), so two residuals with the same text could differentiate or call back
differently, and an edited rule would find the old program on disk. The user's functions
reachable from such equations (:func:`user_callables`; jax's own rules, as in
``jax.nn.relu`` or ``jnp.logaddexp``, are part of the jax version) therefore enter the
key as objects: programs are then shared only between residuals that use the same
function objects, and are kept in memory only (the disk cache skips keys holding an
object's address).

Example:
    >>> import jax.numpy as jnp, numpy as np
    >>> from adaptprec._identity import trace_residual
    >>> x, t = jnp.ones(2), jnp.linspace(0.0, 1.0, 5)
    >>> a = trace_residual(lambda p, t: p[0] * jnp.exp(-p[1] * t) - np.ones(5), x, (t,))
    >>> b = trace_residual(lambda p, t: p[0] * jnp.exp(-p[1] * t) - np.zeros(5), x, (t,))
    >>> a.key == b.key, [float(c.sum()) for c in (a.consts[0], b.consts[0])]
    (True, [5.0, 0.0])
"""

from __future__ import annotations

import dataclasses
import functools
import types
import weakref
from typing import Any, NamedTuple

import jax
import numpy as np

__all__ = ["TracedResidual", "trace_residual", "jaxpr_function", "user_callables"]


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
    # a function replaying a recorded trace (_residual.traced_once) lists its own: there
    # the rules sit too deep in the replayed equations for user_callables to reach
    opaque = tuple({id(f): f for f in (*user_callables(closed.jaxpr),
                                       *getattr(fun, "user_callables", ()))}.values())
    if opaque:
        key = key + (opaque,)
    out = closed.jaxpr.outvars[0].aval
    return TracedResidual(key, closed.jaxpr, consts,
                          jax.ShapeDtypeStruct(out.shape, out.dtype))


def jaxpr_function(jaxpr, consts):
    """``fun(x, *args)`` evaluating ``jaxpr`` with ``consts`` (traced or concrete)."""

    def fun(x, *args):
        return jax.core.eval_jaxpr(jaxpr, list(consts), x, *jax.tree.leaves(args))[0]

    return fun


def _is_jax(module) -> bool:
    return isinstance(module, str) and (module == "jax" or module.startswith(("jax.",
                                                                            "jaxlib")))


def user_callables(jaxpr) -> tuple:
    """The user's Python callables reachable from ``jaxpr``'s equation parameters
    (custom derivative rules, callbacks; also in nested jaxprs), in order, without
    duplicates: what the jaxpr's text names but does not show. Functions defined in jax
    itself are not listed (the jax version keys them).

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from adaptprec._identity import user_callables
        >>> f = jax.custom_jvp(jnp.sin)
        >>> rule = lambda p, t: (f(p[0]), 2.0 * t[0])
        >>> _ = f.defjvp(rule)
        >>> user_callables(jax.make_jaxpr(f)(1.0).jaxpr) == (rule,)
        True
        >>> g = lambda x: jax.nn.relu(jnp.logaddexp(x, 1.0))   # jax's own rules
        >>> user_callables(jax.make_jaxpr(g)(1.0).jaxpr)
        ()
    """
    from jax._src import core
    from jax._src import linear_util as lu

    out: list = []
    seen: set = set()

    def visit(obj, depth):
        if depth > 8 or id(obj) in seen or obj is None or isinstance(
                obj, (str, bytes, int, float, bool, np.ndarray, np.generic, np.dtype, type,
                      weakref.ref, core.AbstractValue, jax.Array)):
            return
        seen.add(id(obj))
        if isinstance(obj, core.ClosedJaxpr):
            visit(obj.jaxpr, depth)
        elif isinstance(obj, core.Jaxpr):
            for eqn in obj.eqns:
                for v in eqn.params.values():
                    visit(v, depth)
        elif isinstance(obj, (tuple, list, frozenset, set)):
            for v in obj:
                visit(v, depth)
        elif isinstance(obj, dict):
            for v in obj.values():
                visit(v, depth)
        elif isinstance(obj, lu.WrappedFun):
            visit(obj.f, depth + 1)
            visit(tuple(obj.transforms), depth + 1)
        elif isinstance(obj, functools.partial):
            visit((obj.func, obj.args, obj.keywords), depth + 1)
        elif isinstance(obj, types.MethodType):
            visit((obj.__func__, obj.__self__), depth + 1)
        elif isinstance(obj, types.FunctionType):
            if not _is_jax(obj.__module__):
                out.append(obj)
                return
            for cell in obj.__closure__ or ():
                try:
                    visit(cell.cell_contents, depth + 1)
                except ValueError:  # an empty cell
                    pass
        elif _is_jax(type(obj).__module__):   # jax's wrappers: look inside
            if dataclasses.is_dataclass(obj):
                visit(tuple(getattr(obj, f.name, None) for f in dataclasses.fields(obj)),
                      depth + 1)
            if hasattr(obj, "__dict__"):
                visit(vars(obj), depth + 1)
            for name in getattr(type(obj), "__slots__", ()) or ():
                visit(getattr(obj, name, None), depth + 1)
        elif callable(obj) and type(obj).__module__ not in ("builtins", "numpy"):
            out.append(obj)   # a user's callable object

    visit(jaxpr, 0)
    unique: dict = {}
    for f in out:
        unique.setdefault(id(f), f)
    return tuple(unique.values())
