"""Errors a scipy user meets when a model is first traced by JAX, with the fix.

A model written for scipy often uses NumPy functions (``np.exp``) or Python control flow
on a parameter (``if k > 0:``); JAX's own messages about tracers do not say which line of
*the user's model* to change or how. :func:`explain_trace_error` turns those (and only
those) into a ``TypeError`` naming the construct and the fix; any other exception raised
by the user's code propagates unchanged.

Example:
    >>> import numpy as np, jax.numpy as jnp
    >>> import adaptprec as ap
    >>> t = np.linspace(0.0, 1.0, 10)
    >>> try:
    ...     ap.curve_fit(lambda t, a, k: a * np.exp(-k * t), t, np.exp(-t), p0=[1.0, 1.0])
    ... except TypeError as e:
    ...     message = str(e)
    >>> message[:60]
    'the model calls a NumPy function on its parameters (e.g. np.'
"""

from __future__ import annotations

import jax

__all__ = ["explain_trace_error"]

_NUMPY = (
    "the model calls a NumPy function on its parameters (e.g. np.exp(-k * t)) or converts "
    "a parameter with np.asarray/float(). adaptprec differentiates and compiles the model "
    "with JAX, so the parameters are JAX tracers there: write the model with jax.numpy "
    "(`import jax.numpy as jnp`; jnp.exp, jnp.sin, jnp.where ...), which accepts NumPy "
    "data as well.")
_CONTROL = (
    "the model uses Python control flow on a parameter (`if k > 0:`, `while`, `and`/`or`, "
    "bool/int/float(...)) or a function of Python's math module (math.exp(k), "
    "math.sqrt(a): write jnp.exp, jnp.sqrt). The parameters are JAX tracers with no value "
    "while the model is compiled: replace `a if cond else b` by jnp.where(cond, a, b) "
    "(both sides are computed; keep them finite), or use jax.lax.cond; min/max of "
    "parameters: jnp.minimum / jnp.maximum / jnp.clip.")
_LOSS = (
    "the loss callable rho(z) uses NumPy or Python control flow on z (np.log1p(z), "
    "np.empty and item assignment, `if z > 1:`). adaptprec compiles the loss with JAX, so "
    "z is a JAX tracer there: write it with jax.numpy and jnp.where, e.g. "
    "`lambda z: jnp.log1p(z)` (its derivatives are taken by autodiff), or return scipy's "
    "(3, m) array as jnp.stack([rho, drho, d2rho]).")
_INTEGER = (
    "the model converts a parameter to a Python int (int(p), range(p), or indexing an "
    "array with a parameter). Parameters are continuous JAX tracers: keep integer "
    "quantities as data (in xdata/args), or use jnp.round and jax.lax.dynamic_slice.")


def explain_trace_error(exc: BaseException, who: str = "the model"):
    """A ``TypeError`` explaining ``exc`` if it is JAX's complaint about a NumPy call,
    Python control flow or an int conversion on a traced parameter; ``None`` otherwise
    (the caller then re-raises ``exc`` unchanged). ``who``: the user function that was
    traced (``"the model"``, ``"jac"``, ``"loss"``).

    Example:
        >>> from adaptprec.nlsq._errors import explain_trace_error
        >>> explain_trace_error(ValueError("the user's own error")) is None
        True
    """
    if isinstance(exc, jax.errors.TracerArrayConversionError):
        text = _NUMPY
    elif isinstance(exc, jax.errors.TracerIntegerConversionError):
        text = _INTEGER
    elif isinstance(exc, jax.errors.ConcretizationTypeError):  # incl. bool conversion
        text = _CONTROL
    else:
        return None
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if who == "loss":
        text = _LOSS
    elif who != "the model":
        text = text.replace("differentiates and compiles the model", f"compiles {who}")
        text = text.replace("the model", who)
    return TypeError(f"{text}\n(JAX said: {first})")
