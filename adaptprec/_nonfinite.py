"""Which operation of a function first turns finite inputs into Inf or NaN, and what that
usually means: the diagnosis behind scipy's "Residuals are not finite in the initial
point" error (:mod:`adaptprec.nlsq._start`). Runs only on that failure path: it evaluates
the function's jaxpr one equation at a time (the one walker, :mod:`adaptprec._jaxpr`).

Example:
    >>> import jax.numpy as jnp
    >>> from adaptprec._nonfinite import first_nonfinite_op, describe
    >>> culprit = first_nonfinite_op(lambda p: jnp.exp(p * 1000.0) - 1.0, jnp.array([1.0]))
    >>> culprit[0], "overflow in exp" in describe(culprit)
    ('exp', True)
"""

from __future__ import annotations

import jax
import numpy as np

from ._jaxpr import bind, call_body, eval_jaxpr

__all__ = ["first_nonfinite_op", "describe"]

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




def _finite(v) -> bool:
    a = np.asarray(v)
    return not np.issubdtype(a.dtype, np.inexact) or bool(np.all(np.isfinite(a)))


def _where(eqn) -> str:
    try:
        from jax._src import source_info_util
        return source_info_util.summarize(eqn.source_info)
    except Exception:  # (private API: the location is a courtesy)
        return ""


def first_nonfinite_op(fn, *args):
    """``(primitive name, its inputs, source location)`` of the first operation in
    ``fn(*args)`` whose inputs are finite and outputs are not (inside jitted helpers
    too), or ``None``."""
    closed = jax.make_jaxpr(fn)(*args)
    found: list = []

    def step(eqn, ins):
        body = call_body(eqn, custom=False, remat=False)
        if body is not None:   # jnp's jitted helpers: look inside
            return eval_jaxpr(body[0], body[1], ins, step)
        outs = bind(eqn, ins)
        if not found and all(map(_finite, ins)) and not all(map(_finite, outs)):
            found.append((eqn.primitive.name, [np.asarray(i) for i in ins], _where(eqn)))
        return outs

    eval_jaxpr(closed.jaxpr, closed.consts, jax.tree.leaves(args), step)
    return found[0] if found else None


def describe(culprit) -> str:
    """A sentence naming the likely cause of :func:`first_nonfinite_op`'s culprit."""
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
