"""LAPACK start-up without importing all of ``scipy.linalg``.

jaxlib takes its CPU LAPACK kernels from SciPy: the first lowering of a linear-algebra
op (or :func:`jax._src.lax.linalg.initialize_lapack`) imports
``scipy.linalg.cython_blas`` and ``scipy.linalg.cython_lapack``, and with them the whole
``scipy.linalg`` package (0.2-0.4 s, most of a warm-cache first fit). jaxlib only needs
the two Cython extension modules' function-pointer capsules, so :func:`ensure_lapack`
loads just those two extension modules, lets jaxlib read them, and removes them from
``sys.modules`` again. A later ``import scipy.linalg`` loads the package as usual and
gets the same module objects (Cython extension modules are created once per process),
so nothing the user sees changes, except that the first fit is faster.

The fast path is taken only when ``scipy.linalg`` is not imported yet (otherwise the
normal path costs nothing). On any failure (no SciPy, a layout this code does not know,
an import error) it falls back to jaxlib's own initialisation, which then behaves
exactly as without this module. ``ADAPTPREC_FAST_LAPACK=0`` turns the fast path off.

Example:
    >>> from adaptprec._lapack_init import ensure_lapack
    >>> ensure_lapack() in ("fast", "normal", "already")
    True
    >>> ensure_lapack()
    'already'
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys
import threading

__all__ = ["ensure_lapack"]

_MODULES = ("cython_blas", "cython_lapack")
_lock = threading.Lock()
_state: list = []  # ["fast"] or ["normal"] once initialised


def _load_extension(directory: str, name: str):
    full = "scipy.linalg." + name
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        path = os.path.join(directory, name + suffix)
        if os.path.isfile(path):
            break
    else:
        raise ImportError(f"no extension module {full} in {directory}")
    spec = importlib.util.spec_from_file_location(full, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[full] = module
    spec.loader.exec_module(module)
    return module


def _fast(initialize) -> None:
    """Load the two Cython modules under their full names, initialise, unregister."""
    added = []
    try:
        import scipy  # the top-level package only (a few ms), not scipy.linalg

        directory = os.path.join(os.path.dirname(scipy.__file__), "linalg")
        for name in _MODULES:
            full = "scipy.linalg." + name
            if full in sys.modules:
                continue
            added.append(full)
            _load_extension(directory, name)
        initialize()
    finally:
        # A later `import scipy.linalg` imports them again as submodules of the package
        # (and gets these module objects back); left here, the package would lack them
        # as attributes. (If something imported scipy.linalg meanwhile, they are its
        # submodules already: leave them.)
        if "scipy.linalg" not in sys.modules:
            for full in added:
                sys.modules.pop(full, None)


def ensure_lapack() -> str:
    """Initialise jaxlib's CPU LAPACK kernels once per process (see the module
    docstring). Returns ``"fast"`` (the two extension modules only), ``"normal"``
    (jaxlib's own path) or ``"already"`` (done earlier by this function)."""
    if _state:
        return "already"
    with _lock:
        if _state:
            return "already"
        from jax._src.lax.linalg import initialize_lapack

        how = "normal"
        if ("scipy.linalg" not in sys.modules
                and os.environ.get("ADAPTPREC_FAST_LAPACK", "1").strip() != "0"):
            try:
                _fast(initialize_lapack)
                how = "fast"
            except Exception:  # fall back to jaxlib's own start-up below
                how = "normal"
        if how == "normal":
            initialize_lapack()
        _state.append(how)
        return how
