"""JAX's thread-local float64 scope, made safe for NumPy constants.

The entry points that give float64 without setup (every one, by the rule of
:mod:`adaptprec._x64_rule`) run inside ``jax.enable_x64(True)`` while the program's
``jax_enable_x64`` stays off. JAX converts a NumPy array that a traced function closes
over (``lambda p: model(x, *p) - y``) to a canonical host array once and caches the
result per array object, whatever the x64 setting at the time (jaxlib 0.10's
``canonicalize_value``). Flipping the setting then hands one mode the other's constant:
after a default ``solve_nlsq`` with x64 off, the user's own ``model(x, *p)`` on the same
arrays failed ("RuntimeProgramInputMismatch ... f32[50] ... got f64[50]"), and a
``precision="f32"`` solve followed by the default one failed to lower ("'stablehlo.multiply'
op requires compatible types"). :func:`float64_scope` installs, on first use, a handler
for NumPy arrays that caches per array object *and* x64 setting (weakly, as JAX does), so
both modes get their own constant.

Example:
    >>> import jax, numpy as np
    >>> from adaptprec._x64_scope import float64_scope
    >>> with float64_scope():
    ...     str(jax.numpy.asarray(np.ones(2)).dtype)
    'float64'
"""

from __future__ import annotations

import contextlib
import threading
import weakref

import jax
import jax.numpy as jnp
import numpy as np
from jax._src import config, dtypes, literals

__all__ = ["float64_scope", "install_x64_aware_constants"]

_installed = False
_install_lock = threading.Lock()
#: id(array) -> (weakref to the array, {x64 setting: weakref to its canonical value})
_canonical: dict = {}


def _canonicalize_ndarray(x):
    """JAX's NumPy-array canonicalisation (the array in its canonical dtype, as JAX's
    host-side ``TypedNdArray``), cached per array object and x64 setting."""
    dt = x.dtype
    # (JAX's own rule: numeric, bool, ml_dtypes' and its float0 tangents; no objects,
    # strings or dates)
    if dt.kind in "OUSMm" or (dt.kind == "V" and dt != dtypes.float0
                              and not jnp.issubdtype(dt, np.number)):
        raise TypeError(f"Dtype {dt} is not a valid JAX array type. Only arrays of numeric "
                        "types are supported by JAX.")
    x64 = bool(config.enable_x64.value)
    key = id(x)
    entry = _canonical.get(key)
    if entry is not None and entry[0]() is x:
        ref = entry[1].get(x64)
        value = ref() if ref is not None else None
        if value is not None:
            return value
    value = literals.TypedNdArray(np.asarray(x, dtypes.canonicalize_dtype(dt)))
    if entry is None or entry[0]() is not x:
        # (the dict bound as a default: at interpreter exit the module's globals are gone)
        entry = (weakref.ref(x, lambda _, k=key, d=_canonical: d.pop(k, None)), {})
        _canonical[key] = entry
    entry[1][x64] = weakref.ref(value)
    return value


def install_x64_aware_constants() -> bool:
    """Register :func:`_canonicalize_ndarray` for NumPy arrays (once per process);
    ``False`` where this JAX has no such registry (nothing is changed then)."""
    global _installed
    if _installed:
        return True
    with _install_lock:
        if _installed:
            return True
        register = getattr(dtypes, "register_canonicalize_value_handler", None)
        if register is None:
            return False
        register(np.ndarray, _canonicalize_ndarray)
        _installed = True
        return True


@contextlib.contextmanager
def float64_scope():
    """``jax.enable_x64(True)`` (thread-local) with x64-aware NumPy constants."""
    if not _installed:
        install_x64_aware_constants()
    with jax.enable_x64(True):
        yield
