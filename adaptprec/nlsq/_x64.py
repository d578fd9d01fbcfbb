"""float64 without setup for the scipy-compatible entry points.

scipy users do not turn on ``jax_enable_x64``. With it off, an *eager* call of
:func:`~adaptprec.curve_fit`, :func:`~adaptprec.solve_nlsq` or
:func:`~adaptprec.solve_nlsq_batch` that asks for float64 (the default ``"adaptive"``
ladder ends on it) runs inside JAX's thread-local ``jax.enable_x64(True)`` scope, never
the global flag, and hands back NumPy float64 arrays (JAX float64 arrays would be
truncated by the first JAX operation outside the scope). Under a user's trace
(``jit``/``vmap``/``grad``) with x64 off the arrays already are float32, so asking for
float64 raises :data:`TRACED_X64_MESSAGE`, the same error from every entry point. A
float32-only answer is given only when asked for (``precision="f32"``).

Example:
    >>> from adaptprec.nlsq._x64 import wants_float64
    >>> wants_float64("adaptive"), wants_float64("f32"), wants_float64("f32,f64")
    (True, False, True)
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import threading
from collections.abc import Callable

import jax
import numpy as np

from .._tracing import is_eager, is_traced
from .._x64_scope import float64_scope
from ..precision import Ladder, canonical_dtype, is_adaptive, x64_enabled

__all__ = ["TRACED_X64_MESSAGE", "wants_float64", "float64_entry", "to_host",
           "numpy_results"]

_tls = threading.local()


def numpy_results() -> bool:
    """Whether the running entry point hands its result back as NumPy (the host driver
    then builds it from NumPy directly instead of making JAX arrays of it first)."""
    return getattr(_tls, "numpy", 0) > 0


@contextlib.contextmanager
def _numpy_out():
    _tls.numpy = getattr(_tls, "numpy", 0) + 1
    try:
        yield
    finally:
        _tls.numpy -= 1

#: The one error for float64 under a user's trace with x64 off (every entry point).
TRACED_X64_MESSAGE = (
    "{entry}: precision={precision!r} needs float64, but it was called under "
    "jit/vmap/grad with jax_enable_x64 off, so every traced array is float32 and float64 "
    "cannot be recovered inside the trace. Either call it eagerly (outside jit: it then "
    "runs in float64 by itself and returns NumPy float64), turn float64 on for your "
    "program (JAX_ENABLE_X64=1 in the environment, or JAX's jax_enable_x64 option set at "
    "the top of the program), or ask for float32 explicitly with precision='f32'.")


def wants_float64(precision) -> bool:
    """Whether ``precision`` (an entry point's argument) asks for a float64 rung.

    Example:
        >>> from adaptprec.nlsq._x64 import wants_float64
        >>> wants_float64("f64"), wants_float64(("bf16", "f32"))
        (True, False)
    """
    if is_adaptive(precision):
        return True
    try:
        if isinstance(precision, Ladder):
            rungs = precision.rungs
        elif isinstance(precision, str) and ("," in precision or ">" in precision):
            # rung by rung, without the x64 check or the order check: with x64 off,
            # parsing "f32,f64" raised, so an explicit ladder was never given the float64
            # scope, and "f64,f32" got the x64 message instead of the order one
            rungs = [canonical_dtype(p.strip(), check_x64=False)
                     for p in precision.replace(">", ",").split(",") if p.strip()]
        elif isinstance(precision, (list, tuple)):
            rungs = [canonical_dtype(p, check_x64=False) for p in precision]
        else:
            rungs = [canonical_dtype(precision, check_x64=False)]
    except (ValueError, TypeError):
        return False  # the entry point reports the bad value with its own message
    return any(np.dtype(r) == np.float64 for r in rungs)


def to_host(tree):
    """Every JAX array leaf of ``tree`` as a NumPy array (other leaves unchanged).

    Example:
        >>> import jax.numpy as jnp
        >>> from adaptprec.nlsq._x64 import to_host
        >>> type(to_host({"a": jnp.ones(2)})["a"]).__name__
        'ndarray'
    """
    return jax.tree.map(lambda a: np.asarray(a) if isinstance(a, jax.Array) else a, tree)


def float64_entry(entry: str, traced_args: tuple[str, ...], host: Callable = to_host,
                  always_host: bool = False):
    """Decorator for an entry point ``fn(..., precision=...)``.

    With ``jax_enable_x64`` on, ``fn`` runs unchanged. With it off and ``precision``
    asking for float64: if any argument named in ``traced_args`` holds a tracer, raise
    ``ValueError(TRACED_X64_MESSAGE)``; otherwise run ``fn`` inside
    ``jax.enable_x64(True)`` and return ``host(result)``. ``always_host``: also pass the
    eager result through ``host`` when no scope was needed (curve_fit returns NumPy as
    scipy does).
    """

    def deco(fn):
        sig = inspect.signature(fn)

        def precision_of(bound):
            if "precision" in bound.arguments:
                return bound.arguments["precision"]
            kw = bound.arguments.get("kwargs", {})
            if "precision" in kw:
                return kw["precision"]
            p = sig.parameters.get("precision")
            return p.default if p is not None else "adaptive"

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            if x64_enabled():
                if always_host:
                    with _numpy_out():
                        out = fn(*args, **kwargs)
                    return out if is_traced(out) else host(out)
                return fn(*args, **kwargs)
            bound = sig.bind(*args, **kwargs)
            precision = precision_of(bound)
            # (or a user's trace around concrete arguments: the residual may close over
            # its values, newcomer audit 2)
            traced = not is_eager(*(bound.arguments.get(a) for a in traced_args))
            if not wants_float64(precision):
                if always_host and not traced:
                    with _numpy_out():
                        return host(fn(*args, **kwargs))
                return fn(*args, **kwargs)
            if traced:
                raise ValueError(TRACED_X64_MESSAGE.format(entry=entry,
                                                           precision=precision))
            with float64_scope(), _numpy_out():
                return host(fn(*args, **kwargs))

        return wrapper

    return deco
