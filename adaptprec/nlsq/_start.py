"""A start where the residual or its Jacobian is not finite: scipy's early, clear
error, with the parameter values and the operation that failed.

Inside ``jit`` the solve reports it through ``status`` (``NONFINITE_RESIDUAL`` or
``NONFINITE_JACOBIAN`` with ``x`` still at ``x0``). Called eagerly,
:func:`raise_nonfinite_start` turns that result into scipy's ``ValueError("Residuals are
not finite in the initial point")``, naming the first operation of the residual that produced an Inf or NaN from
finite inputs (an overflow in ``exp``, a division by zero, a log of a negative number).
The diagnosis runs only on this failure path: a successful fit pays one comparison.

Example:
    >>> import jax.numpy as jnp
    >>> from adaptprec.nlsq._start import first_nonfinite_op
    >>> def r(p):
    ...     return jnp.exp(p * 1000.0) - 1.0
    >>> first_nonfinite_op(r, jnp.array([1.0]))[0]
    'exp'
"""

from __future__ import annotations

import jax
import numpy as np
from jax.flatten_util import ravel_pytree

from .._status import Status

__all__ = ["raise_nonfinite_start", "first_nonfinite_op", "NonFiniteStartError"]

#: what an operation's Inf/NaN from finite inputs usually means
_CAUSES = {
    "exp": "overflow in exp (its argument is too large)",
    "exp2": "overflow in exp2 (its argument is too large)",
    "expm1": "overflow in exp (expm1: its argument is too large)",
    "pow": "overflow or an undefined power",
    "integer_pow": "overflow in a power",
    "div": "a division by zero",
    "log": "a log of zero or of a negative number",
    "log1p": "a log of a number <= 0 (log1p of a number <= -1)",
    "sqrt": "a sqrt of a negative number",
    "rsqrt": "1/sqrt of zero or of a negative number",
    "mul": "Inf * 0",
    "sub": "Inf - Inf",
    "add": "Inf - Inf",
}


class NonFiniteStartError(ValueError):
    """scipy's ``ValueError`` for a residual that is not finite at ``x0``."""


def _finite(v) -> bool:
    a = np.asarray(v)
    return not np.issubdtype(a.dtype, np.inexact) or bool(np.all(np.isfinite(a)))


def _where(eqn) -> str:
    try:
        from jax._src import source_info_util
        return source_info_util.summarize(eqn.source_info)
    except Exception:  # (private API: the location is a courtesy)
        return ""


def _walk(jaxpr, consts, args):
    """Evaluate ``jaxpr`` one equation at a time; return ``(outs, culprit)`` with the
    first equation whose inputs are finite and outputs are not (``None`` if none)."""
    env = {}

    def read(v):
        from jax.extend.core import Literal  # failure path only: a fit never imports it

        return v.val if isinstance(v, Literal) else env[v]

    for v, c in zip(jaxpr.constvars, consts):
        env[v] = c
    for v, a in zip(jaxpr.invars, args):
        env[v] = a
    culprit = None
    for eqn in jaxpr.eqns:
        ins = [read(v) for v in eqn.invars]
        sub = eqn.params.get("jaxpr") if eqn.primitive.name in ("pjit", "jit") else None
        if sub is not None:  # jnp's jitted helpers: look inside
            outs, inner = _walk(sub.jaxpr, sub.consts, ins)
            culprit = culprit or inner
        else:
            outs = eqn.primitive.bind(*ins, **eqn.params)
            if not eqn.primitive.multiple_results:
                outs = [outs]
            if culprit is None and all(map(_finite, ins)) and not all(map(_finite, outs)):
                culprit = (eqn.primitive.name, [np.asarray(i) for i in ins], _where(eqn))
        for v, o in zip(eqn.outvars, outs):
            env[v] = o
    return [read(v) for v in jaxpr.outvars], culprit


def first_nonfinite_op(fn, *args):
    """``(primitive name, its inputs, source location)`` of the first operation in
    ``fn(*args)`` that turns finite inputs into Inf/NaN, or ``None``."""
    closed = jax.make_jaxpr(fn)(*args)
    flat = jax.tree.leaves(args)
    return _walk(closed.jaxpr, closed.consts, flat)[1]


def _describe(culprit) -> str:
    if culprit is None:
        return ""
    name, ins, where = culprit

    def show(a):
        a = np.asarray(a)
        if a.size == 1:
            return f"{a.item():.6g}"
        bad = a.ravel()
        return f"array of shape {a.shape}, range [{np.min(bad):.6g}, {np.max(bad):.6g}]"

    cause = _CAUSES.get(name, f"the operation {name!r}")
    if name == "div" and len(ins) == 2:
        num, den = np.broadcast_arrays(*ins)
        if np.any((den == 0) & (num == 0)):
            cause = "0/0 (a division of zero by zero)"
    loc = f" at {where}" if where else ""
    return (f" The first non-finite value comes from {cause}: {name}("
            f"{', '.join(show(a) for a in ins)}){loc}.")


def raise_nonfinite_start(residual, x0, args, res) -> None:
    """Raise scipy's ``ValueError`` for a solve ``res`` that failed on a non-finite
    residual or Jacobian without leaving ``x0``, with the likely cause (an op-by-op
    evaluation, run only on this failure path); return when it left ``x0``."""
    x0_flat = np.ravel(np.asarray(ravel_pytree(x0)[0], np.float64))
    x = np.ravel(np.asarray(ravel_pytree(res.x)[0], np.float64))
    if x.shape != x0_flat.shape or not np.array_equal(x, x0_flat):
        return  # failed later along the path: the status says so
    args = args if isinstance(args, tuple) else (args,)
    what = ("Residuals are not finite in the initial point"
            if int(np.asarray(res.status)) == Status.NONFINITE_RESIDUAL else
            "The Jacobian is not finite in the initial point")
    try:
        cause = _describe(first_nonfinite_op(lambda p, a: residual(p, *a), res.x, args))
    except Exception:  # the diagnosis must never hide the error itself
        cause = ""
    raise NonFiniteStartError(
        f"{what} x0 = {np.array2string(x0_flat, precision=6)}.{cause} Start from a "
        f"point where the model and its derivatives are finite (e.g. parameters of "
        f"the data's scale; curve_fit's default p0 is all ones).")
