"""The user's functions and objects as they enter the library: named in errors about
what they returned (:func:`returns_arrays`) or how they failed to trace
(:func:`explain_trace_error`), and as keys of memos (:func:`hashable`, :func:`sig`).

Entry points call the user's function inside their own wrappers (``lambda x, a:
residual(unravel(x), *a)``), so when it returns something that is not an array JAX's
error names the wrapper: "function <lambda> at .../nlsq/solve.py:237 traced for jit
returned a value of type <class 'str'>". :func:`returns_arrays` checks
the output's Python types where the entry point gets it (it reads no values, so it works
inside ``jit``/``vmap``/``grad`` traces) and raises a ``TypeError`` that names the user's
function, where it is defined, what it returned, and the fix.

Example:
    >>> from adaptprec._user_fn import describe, returns_arrays
    >>> def residual(p):
    ...     return "oops"
    >>> try:
    ...     returns_arrays(residual, residual(1.0), "residual")
    ... except TypeError as e:
    ...     msg = str(e).replace(describe(residual), "residual (file:line)")
    >>> msg[:54]
    'residual residual (file:line) must return an array (or'
    >>> msg[55:102]
    "a pytree of arrays): it returned the str 'oops'"
"""

from __future__ import annotations

import functools
import inspect
import numbers

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["describe", "returns_arrays", "explain_trace_error", "hashable", "sig"]


def describe(fn) -> str:
    """``fn``'s ``__qualname__`` and ``file:line`` of its definition, as far as known
    (``functools.partial`` and callable objects are unwrapped to what they call).

    Example:
        >>> from adaptprec._user_fn import describe
        >>> describe(len)
        'len'
    """
    target = fn
    while isinstance(target, functools.partial):
        target = target.func
    target = inspect.unwrap(target) if callable(target) else target
    name = getattr(target, "__qualname__", None) or getattr(target, "__name__", None)
    if name is None:                           # a callable object: its class's __call__
        name = type(target).__qualname__
        target = getattr(type(target), "__call__", target)
    code = getattr(target, "__code__", None)
    if code is None:
        return name
    return f"{name} ({code.co_filename}:{code.co_firstlineno})"


def _is_array_leaf(x) -> bool:
    # (tracers are jax.Array instances too; NumPy arrays of numbers, NumPy scalars and
    # Python numbers are arrays to JAX; strings, None and other objects are not)
    if isinstance(x, jax.Array) or hasattr(x, "__jax_array__"):
        return True
    if isinstance(x, (np.ndarray, np.generic)):
        return x.dtype == np.bool_ or jax.numpy.issubdtype(x.dtype, np.number)
    return isinstance(x, numbers.Number)


def _shown(value) -> str:
    if value is None:
        return "None"
    text = repr(value)
    if len(text) > 60:
        text = text[:57] + "..."
    kind = type(value).__name__
    if isinstance(value, (np.ndarray, np.generic)):
        return f"a NumPy array of dtype {value.dtype}"
    return f"the {kind} {text}"


def returns_arrays(fn, out, role: str = "function", fix: str | None = None):
    """``out`` (what ``fn`` returned) unchanged if it is an array or a pytree of arrays;
    otherwise a ``TypeError`` naming ``fn`` (``__qualname__``, file:line), what it
    returned, and ``fix``.

    Args:
        fn: the user's function (only its name and location are read).
        out: its output.
        role: what the entry point calls it (``"residual"``, ``"model"``, ``"profiled
            function"``).
        fix: the remedy; default: return a ``jax.numpy`` array.

    Example:
        >>> import jax.numpy as jnp
        >>> from adaptprec._user_fn import returns_arrays
        >>> returns_arrays(len, jnp.ones(2), "residual").shape
        (2,)
    """
    leaves = jax.tree_util.tree_leaves(out, is_leaf=lambda x: x is None)
    bad = [x for x in leaves if not _is_array_leaf(x)]
    if out is None or not leaves or bad:
        got = out if out is None or not leaves or not bad or bad[0] is out else bad[0]
        where = "" if got is out else " (inside what it returned)"
        fix = fix or (f"return a jax.numpy array, e.g. jnp.asarray(...) of the {role}'s "
                      "values, computed with jax.numpy from the parameters")
        raise TypeError(f"{role} {describe(fn)} must return an array (or a pytree of "
                        f"arrays): it returned {_shown(got)}{where}. Fix: {fix}.")
    return out


# ---------------------------------------------------------------- tracing errors
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
        >>> from adaptprec._user_fn import explain_trace_error
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


# ---------------------------------------------------------------- keys
def sig(tree):
    """The structure, shapes and dtypes of a pytree (a hashable key)."""
    leaves, treedef = jax.tree.flatten(tree)
    return treedef, tuple((np.shape(a), str(jnp.result_type(a)) if hasattr(a, "dtype")
                           else type(a).__name__) for a in leaves)


class _Same:
    """Cache-key stand-in for an unhashable object: equal only to itself, and it keeps
    the object alive while the key is cached (a bare ``id()`` could be reused by a new
    object after the old one is collected, and hit the wrong compiled program)."""

    __slots__ = ("obj",)

    def __init__(self, obj):
        self.obj = obj

    def __eq__(self, other):
        return isinstance(other, _Same) and other.obj is self.obj

    def __hash__(self):
        return object.__hash__(self.obj)


def hashable(obj):
    """``obj`` if hashable, else a stand-in equal only to itself."""
    try:
        hash(obj)
        return obj
    except TypeError:
        return _Same(obj)
