"""The one float64 rule of every entry point (eager: a local scope; traced: one error).

JAX leaves ``jax_enable_x64`` off, and adaptprec never turns it on globally. With it off:

* An **eager** call whose precision, ladder or policy needs float64 (``curve_fit``,
  ``solve_nlsq``, ``solve_nlsq_batch`` and their ``"adaptive"`` default; ``adaptive`` /
  ``MixedPrecisionManager.run`` with a float64 rung; ``linalg.solve``/``lstsq`` with their
  ``working="f64"`` default; ``linalg.matmul``/``cond_estimate`` on float64 NumPy input or
  a float64 policy; ``profile`` with a float64 configuration) computes inside JAX's
  thread-local ``jax.enable_x64(True)`` scope (:func:`~adaptprec._x64_scope.float64_scope`)
  and hands back its float64 results as NumPy float64 arrays: a JAX float64 array used
  outside the scope is truncated to float32 by the next JAX operation (``x + 1``), with a
  warning, while others keep it (``jnp.dot``). The scipy-style fits return all of their
  arrays as NumPy, as scipy does. Other results (an adaptive kernel's output in its
  float32 input dtype, integer status codes) stay JAX arrays.
* A **traced** call (under ``jit``/``vmap``/``grad``, or eager arguments inside a user's
  trace) that needs float64 raises ``ValueError(TRACED_X64_MESSAGE)``, the same text from
  every entry point: every traced array is already float32 and float64 cannot be recovered
  inside the trace.

With ``jax_enable_x64`` on, nothing here changes a call.

Example:
    >>> from adaptprec._x64_rule import wants_float64
    >>> wants_float64("adaptive"), wants_float64("f32"), wants_float64("f32,f64")
    (True, False, True)
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable

import jax
import numpy as np

from ._tracing import is_eager, is_traced
from ._x64_scope import float64_scope
from .precision import Ladder, canonical_dtype, is_adaptive, x64_enabled

__all__ = ["TRACED_X64_MESSAGE", "traced_x64_error", "wants_float64", "float64_entry",
           "float64_call", "to_host", "to_device", "float64_to_numpy"]

#: The one error for float64 under a user's trace with x64 off (every entry point):
#: ``entry`` names the call, ``arg``/``value`` the argument that asks for float64 and
#: ``f32`` how to ask for float32 instead.
TRACED_X64_MESSAGE = (
    "{entry}: {arg}={value!r} needs float64, but it was called under jit/vmap/grad with "
    "jax_enable_x64 off, so every traced array is float32 and float64 cannot be "
    "recovered inside the trace. Either call it eagerly (outside jit: it then computes "
    "in float64 by itself and returns its float64 results as NumPy arrays), turn float64 "
    "on for your program (JAX_ENABLE_X64=1 in the environment, or JAX's jax_enable_x64 "
    "option set at the top of the program), or ask for float32 explicitly with {f32}.")


def traced_x64_error(entry: str, arg: str, value, f32: str) -> ValueError:
    """The :data:`TRACED_X64_MESSAGE` error, filled in.

    Example:
        >>> from adaptprec._x64_rule import traced_x64_error
        >>> str(traced_x64_error("solve", "working", "f64", "working='f32'"))[:45]
        "solve: working='f64' needs float64, but it wa"
    """
    return ValueError(TRACED_X64_MESSAGE.format(entry=entry, arg=arg, value=value, f32=f32))


def wants_float64(precision) -> bool:
    """Whether ``precision`` (an entry point's argument: a dtype, alias, ladder string,
    :class:`~adaptprec.Ladder` or a sequence of them) asks for a float64 rung.

    Example:
        >>> from adaptprec._x64_rule import wants_float64
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
            rungs = [canonical_dtype(getattr(p, "dtype", p), check_x64=False)
                     for p in precision]
        else:
            rungs = [canonical_dtype(precision, check_x64=False)]
    except (ValueError, TypeError):
        return False  # the entry point reports the bad value with its own message
    return any(np.dtype(r) == np.float64 for r in rungs)


def to_host(tree):
    """Every JAX array leaf of ``tree`` as a NumPy array (other leaves unchanged).

    Example:
        >>> import jax.numpy as jnp
        >>> from adaptprec._x64_rule import to_host
        >>> type(to_host({"a": jnp.ones(2)})["a"]).__name__
        'ndarray'
    """
    if type(tree) is tuple and all(type(a) is np.ndarray for a in tree):
        return tree   # (the scipy-style fits' (popt, pcov): NumPy already)
    return jax.tree.map(lambda a: np.asarray(a) if isinstance(a, jax.Array) else a, tree)


def to_device(tree):
    """Every NumPy array or scalar leaf of ``tree`` as a JAX array (one transfer for the
    tree); other leaves (a scipy sparse Jacobian, a ``LinearOperator``) unchanged.

    Example:
        >>> import numpy as np
        >>> from adaptprec._x64_rule import to_device
        >>> out = to_device({"a": np.ones(2), "b": "text"})
        >>> type(out["a"]).__name__, out["b"]
        ('ArrayImpl', 'text')
    """
    leaves, treedef = jax.tree.flatten(tree)
    where = [i for i, a in enumerate(leaves)
             if isinstance(a, (np.ndarray, np.generic, bool, int, float, complex))]
    moved = jax.device_put([leaves[i] for i in where])
    for i, a in zip(where, moved):
        leaves[i] = a
    return jax.tree.unflatten(treedef, leaves)


def float64_to_numpy(tree):
    """The float64 JAX array leaves of ``tree`` as NumPy float64 (others unchanged): what
    an eager call computed in the float64 scope hands back (see the module docs).

    Example:
        >>> import jax.numpy as jnp, numpy as np
        >>> from adaptprec._x64_rule import float64_to_numpy
        >>> out = float64_to_numpy((jnp.ones(2, jnp.float32), np.ones(1)))
        >>> [type(a).__name__ for a in out]
        ['ArrayImpl', 'ndarray']
    """
    def host(a):
        if isinstance(a, jax.Array) and a.dtype == np.float64 and a.is_fully_addressable:
            return np.asarray(a)
        return a

    return jax.tree.map(host, tree)


def float64_call(fn: Callable, describe: Callable, host: Callable = float64_to_numpy):
    """Apply the rule to ``fn``: ``describe(*args, **kwargs)`` returns ``None`` when the
    call needs no float64, else ``(entry, arg, value, f32, traced_trees)``; with x64 off
    the call then runs in the float64 scope (its result through ``host``) or, when any
    of ``traced_trees`` is traced (or a trace is active), raises
    :func:`traced_x64_error`.

    Example:
        >>> import jax.numpy as jnp
        >>> from adaptprec._x64_rule import float64_call
        >>> f = float64_call(lambda x: x * 2, lambda x: None)
        >>> float(f(jnp.ones(())))
        2.0
    """

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if x64_enabled():
            return fn(*args, **kwargs)
        need = describe(*args, **kwargs)
        if need is None:
            return fn(*args, **kwargs)
        entry, arg, value, f32, trees = need
        if not is_eager(*trees):
            raise traced_x64_error(entry, arg, value, f32)
        with float64_scope():
            return host(fn(*args, **kwargs))

    return wrapper


def float64_entry(entry: str, traced_args: tuple[str, ...], host: Callable = to_host,
                  always_host: bool = False, device: Callable | None = None):
    """Decorator for an entry point ``fn(..., precision=...)`` (the fits).

    With ``jax_enable_x64`` on, ``fn`` runs unchanged (its eager result through
    ``device`` when given: an entry whose work hands back NumPy returns JAX arrays
    there). With it off and ``precision`` asking for float64: if any argument named in
    ``traced_args`` holds a tracer, raise :func:`traced_x64_error`; otherwise run ``fn``
    inside ``jax.enable_x64(True)`` and return ``host(result)``. ``always_host``: also
    pass the eager result through ``host`` when no scope was needed (curve_fit returns
    NumPy as scipy does).
    """

    def deco(fn):
        sig = inspect.signature(fn)
        value = _argument_lookup(sig)
        p = sig.parameters.get("precision")
        default = p.default if p is not None else "adaptive"

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            if x64_enabled():
                out = fn(*args, **kwargs)
                if is_traced(out):
                    return out
                if always_host:
                    return host(out)
                return device(out) if device is not None else out
            # (a bad call reads None for what it lacks; fn raises Python's TypeError)
            precision = value(args, kwargs, "precision", default)
            # (or a user's trace around concrete arguments: the residual may close over
            # its values)
            traced = not is_eager(tuple(value(args, kwargs, a) for a in traced_args))
            if not wants_float64(precision):
                if always_host and not traced:
                    return host(fn(*args, **kwargs))
                return fn(*args, **kwargs)
            if traced:
                sig.bind(*args, **kwargs)   # a bad call: Python's TypeError first
                raise traced_x64_error(entry, "precision", precision, "precision='f32'")
            with float64_scope():
                return host(fn(*args, **kwargs))

        return wrapper

    return deco


def _argument_lookup(sig: inspect.Signature):
    """``value(args, kwargs, name, default=None)``: the argument a call of a function
    with signature ``sig`` gives for the parameter ``name`` (by position or by keyword;
    for the variadic keyword parameter, the keywords no other parameter takes), or
    ``default``. A name that is no parameter is looked up among the keywords (a
    ``**kwargs`` option such as ``curve_fit``'s ``precision``). Nothing is validated:
    the call itself raises Python's ``TypeError`` when it does not bind."""
    params = sig.parameters
    positional = {name: i for i, (name, p) in enumerate(params.items())
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)}
    var_keyword = next((name for name, p in params.items() if p.kind is p.VAR_KEYWORD),
                       None)

    def value(args: tuple, kwargs: dict, name: str, default=None):
        if name == var_keyword:
            return {k: v for k, v in kwargs.items() if k not in params}
        i = positional.get(name)
        if i is not None and (i < len(args) or params[name].kind is params[name].
                              POSITIONAL_ONLY):
            return args[i] if i < len(args) else default
        return kwargs.get(name, default)

    return value
