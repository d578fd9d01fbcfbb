"""scipy-style input normalisation and validation for the least-squares entry points.

``solve_nlsq`` and ``curve_fit`` call these at the top, before anything is traced. They
follow scipy's ``least_squares``/``curve_fit`` wherever scipy defines the behaviour:
lenient where scipy is lenient (a scalar or list ``x0``, ``scipy.optimize.Bounds``,
``None`` tolerances, a ``jac`` returning a 1-D array for one parameter, pandas Series or
any array-like as data), an error of scipy's type where scipy errors (complex ``x0``, a
size-1 bound array for several parameters, all tolerances below machine epsilon, the huber
loss with ``"lm"``, a Jacobian of the wrong shape), and an error naming the alternative for
every scipy option adaptprec does not offer. The differences that remain are listed in
``docs/scipy.md``.

Example:
    >>> from adaptprec.nlsq._inputs import as_x0, check_tolerances
    >>> as_x0([1, 2]).tolist(), check_tolerances(None, 1e-8, 1e-8, "trf")
    ([1.0, 2.0], (0.0, 1e-08, 1e-08))
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import numbers
import warnings

import jax
import jax.numpy as jnp
import numpy as np

from jax.flatten_util import ravel_pytree

from .._tracing import is_concrete

__all__ = ["OptionNotOffered", "as_x0", "as_bounds", "check_tolerances", "check_max_nfev",
           "initialize_feasible", "as_data", "FD_METHODS", "check_jac_option",
           "normalize_jac_output", "check_jac_shape", "check_unsupported", "leastsq_kwargs",
           "default_x_scale", "lists_as_arrays", "check_array_leaves", "METHODS",
           "check_scipy_options"]

EPS = float(np.finfo(np.float64).eps)
#: finite-difference schemes (scipy's names); see :mod:`._finite_diff`.
FD_METHODS = ("2-point", "3-point", "cs")
#: autodiff schemes (adaptprec's own).
AD_METHODS = ("fwd", "rev")
#: the trust-region methods (scipy's three and Gauss-Newton).
METHODS = ("lm", "gn", "trf", "dogbox")


class OptionNotOffered(ValueError, NotImplementedError):
    """A scipy option adaptprec does not offer (a ``ValueError``, as scipy raises for
    option combinations it rejects, and a ``NotImplementedError``); the message names the
    alternative."""


def _is_number_like(leaf) -> bool:
    return isinstance(leaf, (numbers.Number, np.generic, str, bytes)) or (
        isinstance(leaf, (np.ndarray, jax.Array)) and np.ndim(leaf) == 0)


def as_x0(x0):
    """``x0`` as scipy reads it: a scalar, list or tuple of numbers becomes a 1-D float
    array; a complex or non-numeric ``x0`` raises ``ValueError``; arrays and pytrees of
    arrays pass through (float casts of integer leaves happen in ``solve_nlsq``).

    Example:
        >>> from adaptprec.nlsq._inputs import as_x0
        >>> as_x0(2).tolist(), as_x0((0.1, 0.2)).tolist()
        ([2.0], [0.1, 0.2])
    """
    if x0 is None:
        raise ValueError("x0 is None; give an initial guess (a number, a list or an array "
                         "of the parameters).")
    if isinstance(x0, (str, bytes)):
        raise ValueError(f"x0 must be numbers, got the string {x0!r}; pass e.g. "
                         "x0=[1.0, 2.0] or np.array([1.0, 2.0]).")
    scalar_seq = isinstance(x0, (list, tuple)) and all(
        _is_number_like(v) for v in jax.tree.leaves(x0))
    if _is_number_like(x0) or scalar_seq or (hasattr(x0, "__array__") and not
                                              isinstance(x0, (np.ndarray, jax.Array))):
        try:
            arr = np.asarray(x0)
        except Exception as exc:  # noqa: BLE001 - re-raised with context
            raise ValueError(f"x0 could not be read as an array of numbers: {exc}") from exc
        if arr.dtype.kind in "USO":
            raise ValueError(f"x0 must be numbers, got dtype {arr.dtype} ({x0!r}); pass "
                             "floats, e.g. x0=[1.0, 2.0].")
        if np.iscomplexobj(arr):
            raise ValueError("`x0` must be real. Split a complex parameter into its real "
                             "and imaginary parts (two real parameters).")
        return np.atleast_1d(arr).astype(float)
    for leaf in jax.tree.leaves(x0):
        dt = getattr(leaf, "dtype", None)
        if dt is None:
            leaf = np.asarray(leaf)
            dt = leaf.dtype
        if np.dtype(dt).kind == "c":
            raise ValueError("`x0` must be real. Split a complex parameter into its real "
                             "and imaginary parts (two real parameters).")
        if np.dtype(dt).kind in "USO":
            raise ValueError(f"x0 must be numbers, got a leaf of dtype {dt}.")
    return x0


def _bound_leaf_ok(b, n: int, name: str):
    """scipy's shape rule: a bound is a scalar or has one entry per parameter."""
    if isinstance(b, (dict,)) or (isinstance(b, (list, tuple)) and not all(
            _is_number_like(v) for v in jax.tree.leaves(b))):
        return  # a pytree of bounds, checked when flattened
    if not is_concrete(b):
        return
    a = np.asarray(b)
    if np.iscomplexobj(a):
        raise ValueError(f"the {name} bound must be real.")
    if a.ndim and a.size != n:
        raise ValueError(f"Inconsistent shapes between bounds and `x0`: the {name} bound "
                         f"has shape {a.shape}, x0 has {n} parameter(s). Give a scalar "
                         f"(the same bound for every parameter) or {n} values.")


def as_bounds(bounds, n: int):
    """``bounds`` as a pair ``(lb, ub)``: a ``scipy.optimize.Bounds`` (or anything with
    ``lb``/``ub``) is unpacked; each bound must be a scalar or have ``n`` entries.

    Example:
        >>> from scipy.optimize import Bounds
        >>> from adaptprec.nlsq._inputs import as_bounds
        >>> lb, ub = as_bounds(Bounds([0.0, 1.0], [2.0, 3.0]), 2)
        >>> lb.tolist(), ub.tolist()
        ([0.0, 1.0], [2.0, 3.0])
    """
    if hasattr(bounds, "lb") and hasattr(bounds, "ub") and not isinstance(
            bounds, (tuple, list)):
        lb, ub = bounds.lb, bounds.ub
        if np.ndim(lb) == 0:
            lb = np.full(n, float(lb))
        if np.ndim(ub) == 0:
            ub = np.full(n, float(ub))
        bounds = (lb, ub)
    if not isinstance(bounds, (tuple, list)) or len(bounds) != 2:
        raise ValueError("`bounds` must contain 2 elements: (lb, ub) or a "
                         "scipy.optimize.Bounds.")
    for b, name in zip(bounds, ("lower", "upper")):
        _bound_leaf_ok(b, n, name)
    return tuple(bounds)


def check_tolerances(ftol, xtol, gtol, method):
    """scipy's ``check_tolerance``: ``None`` disables a test (0), a tolerance below
    machine epsilon warns, all three below it raise ``ValueError`` (any below it for
    ``method="lm"``, as scipy).

    Example:
        >>> from adaptprec.nlsq._inputs import check_tolerances
        >>> check_tolerances(1e-8, None, None, "trf")
        (1e-08, 0.0, 0.0)
    """
    out = []
    for tol, name in ((ftol, "ftol"), (xtol, "xtol"), (gtol, "gtol")):
        if tol is None:
            out.append(0.0)
            continue
        if not is_concrete(tol):
            raise TypeError(f"{name} must be a Python number, not a traced value; "
                            "tolerances are static.")
        if not np.isscalar(tol) and np.ndim(tol) != 0:
            raise ValueError(f"{name} must be a number or None, got {tol!r}")
        tol = float(tol)
        if not np.isfinite(tol) or tol < 0:
            raise ValueError(f"{name} must be a finite non-negative number or None, got "
                             f"{tol!r}")
        if tol < EPS:
            warnings.warn(f"Setting `{name}` below the machine epsilon ({EPS:.2e}) "
                          "effectively disables the corresponding termination condition.",
                          UserWarning, stacklevel=4)
        out.append(tol)
    ftol, xtol, gtol = out
    if method == "lm" and min(out) < EPS:
        raise ValueError(f"All tolerances must be higher than machine epsilon ({EPS:.2e}) "
                         "for method 'lm'. Use method='trf' to disable a test with None.")
    if max(out) < EPS:
        raise ValueError(f"At least one of the tolerances must be higher than machine "
                         f"epsilon ({EPS:.2e}); otherwise the solve could never stop on "
                         "convergence.")
    return ftol, xtol, gtol


def check_max_nfev(max_nfev):
    """``max_nfev``: ``None`` (no evaluation cap) or a positive integer.

    Example:
        >>> from adaptprec.nlsq._inputs import check_max_nfev
        >>> check_max_nfev(None), check_max_nfev(5)
        (0, 5)
    """
    if max_nfev is None:
        return 0
    if isinstance(max_nfev, bool) or not isinstance(max_nfev, (numbers.Integral,
                                                               np.integer)) and not (
            isinstance(max_nfev, float) and float(max_nfev).is_integer()):
        raise ValueError(f"`max_nfev` must be None or positive integer, got {max_nfev!r}")
    if int(max_nfev) <= 0:
        raise ValueError(f"`max_nfev` must be None or positive integer, got {max_nfev!r}")
    return int(max_nfev)


def default_x_scale(method: str):
    """scipy's default ``x_scale`` for a resolved ``method``: ``"jac"`` for ``lm`` (and
    ``gn``), ``1.0`` for ``trf`` and ``dogbox``.

    Example:
        >>> from adaptprec.nlsq._inputs import default_x_scale
        >>> default_x_scale("lm"), default_x_scale("trf")
        ('jac', 1.0)
    """
    return "jac" if method in ("lm", "gn") else 1.0


def as_scale_inv(x_scale, n: int):
    """``1 / x_scale`` as a float64 vector of length ``n`` (ones for ``"jac"``, whose
    scaling is taken from the Jacobian as it goes); scipy's errors for anything else."""
    if isinstance(x_scale, str):
        if x_scale != "jac":
            raise ValueError(f"x_scale must be 'jac' or an array, got {x_scale!r}")
        return np.ones(n)
    if np.iscomplexobj(x_scale):
        raise ValueError("x_scale must be 'jac' or an array of positive finite (real) "
                         "numbers")
    try:
        xs = np.broadcast_to(np.asarray(x_scale, np.float64), (n,))
    except (TypeError, ValueError) as exc:
        raise ValueError(f"x_scale must be 'jac' or an array of positive finite "
                         f"numbers broadcastable to ({n},): {exc}") from None
    if not np.all(np.isfinite(xs)) or np.any(xs <= 0):
        raise ValueError("x_scale must be 'jac' or an array of positive finite numbers")
    return 1.0 / xs


def as_max_steps(max_steps, n: int) -> int:
    """The iteration cap: ``100 (n + 1)`` by default (:func:`.common.default_max_steps`)."""
    from .common import default_max_steps

    if max_steps is None:
        return default_max_steps(n)
    if int(max_steps) < 1:
        raise ValueError(f"max_steps must be a positive integer, got {max_steps!r}")
    return int(max_steps)


def initialize_feasible(lb, ub):
    """scipy's feasible start for ``curve_fit`` without ``p0``: the midpoint of finite
    bounds, ``lb + 1`` / ``ub - 1`` for one-sided bounds, 1 otherwise.

    Example:
        >>> import numpy as np
        >>> from adaptprec.nlsq._inputs import initialize_feasible
        >>> initialize_feasible(np.array([0.0, 2.0, -np.inf]),
        ...                     np.array([4.0, np.inf, 0.5])).tolist()
        [2.0, 3.0, -0.5]
    """
    lb = np.asarray(lb, float)
    ub = np.asarray(ub, float)
    p0 = np.ones_like(lb)
    lf, uf = np.isfinite(lb), np.isfinite(ub)
    both = lf & uf
    p0[both] = 0.5 * (lb[both] + ub[both])
    p0[lf & ~uf] = lb[lf & ~uf] + 1
    p0[~lf & uf] = ub[~lf & uf] - 1
    return p0


def lists_as_arrays(args):
    """Top-level ``args`` that are (nested) lists of numbers, as NumPy arrays: scipy passes
    ``args`` as they are and NumPy arithmetic takes a list of numbers as an array, but to
    JAX a list is a pytree, and the residual got a Python list of scalars
    (``tracer - list``: newcomer audit).

    Example:
        >>> import numpy as np
        >>> from adaptprec.nlsq._inputs import lists_as_arrays
        >>> x, ys = lists_as_arrays(([1.0, 2.0], [np.ones(2)]))
        >>> type(x).__name__, type(ys).__name__
        ('ndarray', 'list')
    """
    if not isinstance(args, tuple):
        return args
    return tuple(np.asarray(a) if isinstance(a, list) and a and all(
        isinstance(v, (bool, int, float)) for v in jax.tree.leaves(a)) else a for a in args)


def check_array_leaves(args) -> None:
    """``args`` reach the residual through ``jit``: every leaf must be an array or a
    number (scipy's ``least_squares`` passes anything; a str there failed inside JAX with
    "Error interpreting argument ... as an abstract array": newcomer audit).

    Example:
        >>> from adaptprec.nlsq._inputs import check_array_leaves
        >>> check_array_leaves(([1.0], 2))
        >>> try:
        ...     check_array_leaves((1.0, "fast"))
        ... except TypeError as e:
        ...     str(e)[:22]
        'args[1] is a str, not '
    """
    for path, leaf in jax.tree_util.tree_flatten_with_path(args)[0]:
        # (tracers are jax.Array instances too)
        if isinstance(leaf, (jax.Array, np.ndarray, np.generic, bool, int, float, complex)) \
                or hasattr(leaf, "__jax_array__"):
            continue
        try:  # array-likes (memoryviews, lists of numbers) are fine
            if np.asarray(leaf).dtype.kind in "biufc":
                continue
        except Exception:  # noqa: BLE001 - any failure means "not an array"
            pass
        raise TypeError(
            f"args{jax.tree_util.keystr(path)} is a {type(leaf).__name__}, not an array or a "
            "number: args are passed to the residual through jax.jit, so they must be "
            "arrays (or pytrees of arrays). Pass other settings through a closure or "
            "functools.partial, e.g. solve_nlsq(functools.partial(residual, mode='a'), x0, "
            "args=(x, y)).")


def as_data(x, name: str, dtype=float):
    """Data (``xdata``/``ydata``/``sigma``) as arrays: JAX arrays and tracers pass through,
    pytrees (dicts) pass through, and lists, tuples, NumPy arrays and any array-like
    (pandas Series, xarray DataArray, memoryview) become NumPy arrays of ``dtype``.

    Example:
        >>> from adaptprec.nlsq._inputs import as_data
        >>> as_data(memoryview(bytearray(b"\\x01\\x02")), "xdata").tolist()
        [1.0, 2.0]
    """
    if x is None or isinstance(x, (jax.Array, dict)) or not is_concrete(x):
        return x
    if isinstance(x, (str, bytes)):
        raise ValueError(f"{name} must be numbers, got a string")
    if isinstance(x, (list, tuple, np.ndarray, memoryview, numbers.Number, np.generic)) \
            or hasattr(x, "__array__") or hasattr(x, "__array_interface__"):
        try:
            a = np.asarray(x)
        except Exception as exc:  # noqa: BLE001 - re-raised with context
            raise ValueError(f"{name} could not be read as an array: {exc}") from exc
        if a.dtype.kind in "USO":
            raise ValueError(f"{name} must be numbers, got dtype {a.dtype}")
        if a.dtype.kind == "c":
            return a
        if dtype is not None and a.dtype.kind in "biuf":
            a = a.astype(dtype) if a.dtype.kind != "f" else a
        return a
    return x


def check_jac_option(jac, *, allow_none: bool = False):
    """``jac``: an autodiff scheme (``"fwd"``/``"rev"``), a finite-difference scheme
    (``"2-point"``, ``"3-point"``, ``"cs"``) or a callable; anything else raises
    ``ValueError`` naming the choices.

    Example:
        >>> from adaptprec.nlsq._inputs import check_jac_option
        >>> check_jac_option("3-point")
        '3-point'
    """
    if jac is None and allow_none:
        return jac
    if callable(jac):
        return jac
    if isinstance(jac, str) and (jac in AD_METHODS or jac in FD_METHODS):
        return jac
    if isinstance(jac, (np.ndarray, jax.Array, list, tuple)):
        raise ValueError("`jac` must be a callable returning the Jacobian, not an array "
                         "of values; use jac=lambda x, *args: J or leave jac unset "
                         "(automatic differentiation).")
    raise ValueError(f"`jac` must be 'fwd' or 'rev' (automatic differentiation), "
                     f"'2-point', '3-point' or 'cs' (finite differences) or a callable, "
                     f"got {jac!r}")


def normalize_jac_output(J, m: int, n: int):
    """A user Jacobian's output as ``(m, n)``: a 1-D ``(m,)`` array is accepted for one
    parameter and ``(n,)`` for one residual (scipy's ``atleast_2d``); other shapes raise
    ``ValueError`` with the expected shape.

    Example:
        >>> import numpy as np
        >>> from adaptprec.nlsq._inputs import normalize_jac_output
        >>> normalize_jac_output(np.ones(3), 3, 1).shape
        (3, 1)
    """
    shape = check_jac_shape(tuple(np.shape(J)), m, n)
    return J if shape == (m, n) else jnp.reshape(J, (m, n))


def check_jac_shape(shape: tuple, m: int, n: int) -> tuple:
    """Raise ``ValueError`` unless a Jacobian of ``shape`` can be read as ``(m, n)``.

    Example:
        >>> from adaptprec.nlsq._inputs import check_jac_shape
        >>> check_jac_shape((4,), 4, 1)
        (4,)
    """
    if shape == (m, n):
        return shape
    if len(shape) == 1 and ((n == 1 and shape[0] == m) or (m == 1 and shape[0] == n)):
        return shape
    if len(shape) == 0 and m == 1 and n == 1:
        return shape
    raise ValueError(f"The return value of `jac` has wrong shape: expected {(m, n)} "
                     f"(residuals x parameters), actual {shape}. Return the Jacobian of "
                     "the residual with one row per residual and one column per parameter.")


@functools.lru_cache(maxsize=256)
def wrap_jac(jac, m: int, n: int):
    """``jac`` with its output reshaped to ``(m, n)`` (stable per ``(jac, m, n)`` so the
    compiled-solver cache hits)."""
    def J(x, *args):
        return normalize_jac_output(jnp.asarray(jac(x, *args)), m, n)
    return J


#: scipy options adaptprec does not offer, with the alternative to name in the error.
_UNSUPPORTED = {
    "workers": "adaptprec vectorises evaluations itself (vmap); for many fits use "
               "ap.solve_nlsq_batch",
    "verbose": "inspect the result instead: res.message, res.nfev, res.trace()",
}


def check_unsupported(**options):
    """Raise for scipy options that are set to something adaptprec does not offer.

    ``workers`` (any value but ``None``/``map``-like builtins) and ``verbose > 0`` raise
    ``NotImplementedError`` naming the alternative; ``tr_solver`` must be ``None``,
    ``"exact"`` or ``"lsmr"`` (its options are read by :func:`._lsmr.check_tr_options`).

    Example:
        >>> from adaptprec.nlsq._inputs import check_unsupported
        >>> check_unsupported(workers=None, verbose=0, tr_solver="exact")
    """
    workers = options.get("workers")
    if workers is not None and workers is not map:
        raise OptionNotOffered(f"workers={workers!r} is not offered: "
                                  f"{_UNSUPPORTED['workers']}.")
    verbose = options.get("verbose", 0)
    if verbose not in (0, 1, 2, False, None):
        raise ValueError("`verbose` must be in [0, 1, 2].")
    if verbose:
        raise OptionNotOffered(f"verbose={verbose!r} is not offered: "
                                  f"{_UNSUPPORTED['verbose']}.")
    tr_solver = options.get("tr_solver")
    if tr_solver not in (None, "exact", "lsmr"):
        raise ValueError("`tr_solver` must be None, 'exact' or 'lsmr'.")
    tr_options = options.get("tr_options")
    if tr_options is not None and not isinstance(tr_options, dict):
        raise TypeError(f"tr_options must be a dict, got {type(tr_options).__name__}")


#: leastsq keyword arguments (curve_fit with method="lm" forwards them in scipy) and
#: their adaptprec equivalents.
def leastsq_kwargs(kwargs: dict) -> dict:
    """Translate scipy ``leastsq`` keyword arguments (which scipy's ``curve_fit`` passes
    through for ``method="lm"``) to :func:`~adaptprec.solve_nlsq` options: ``maxfev`` ->
    ``max_nfev``, ``epsfcn`` -> ``diff_step = sqrt(epsfcn)`` (finite differences only),
    ``diag`` -> ``x_scale = 1 / diag``; ``factor`` and ``col_deriv`` raise naming the
    alternative.

    Example:
        >>> from adaptprec.nlsq._inputs import leastsq_kwargs
        >>> leastsq_kwargs({"maxfev": 10})
        {'max_nfev': 10}
    """
    kw = dict(kwargs)
    if "maxfev" in kw:
        v = kw.pop("maxfev")
        if "max_nfev" in kw and kw["max_nfev"] is not None and v is not None:
            raise TypeError("give max_nfev or maxfev, not both")
        if kw.get("max_nfev") is None:
            kw["max_nfev"] = None if v in (None, 0) else v
    if "epsfcn" in kw:
        v = kw.pop("epsfcn")
        if v is not None and kw.get("diff_step") is None:
            kw["diff_step"] = float(np.sqrt(max(float(v), EPS)))
    if "diag" in kw:
        v = kw.pop("diag")
        if v is not None:
            kw["x_scale"] = 1.0 / np.asarray(v, float)
    if kw.pop("col_deriv", 0):
        raise OptionNotOffered("col_deriv is not offered: return the Jacobian with one "
                                  "row per data point (transpose it in your jac).")
    if "factor" in kw:
        v = kw.pop("factor")
        if v not in (None, 100):
            raise OptionNotOffered("factor (MINPACK's initial step bound) is not "
                                      "offered; use x_scale to change the initial radius.")
    if "Dfun" in kw:
        raise TypeError("Dfun is leastsq's name; pass the Jacobian as jac=...")
    return kw


def all_finite(a) -> bool:
    """Whether every entry of the array ``a`` is finite (``True`` for non-float dtypes).

    One pass and no temporary where it can: a finite sum means every term is finite (an
    Inf or NaN propagates into it); only a sum that is not finite (a non-finite entry, or
    finite entries that overflow) is decided by ``np.isfinite`` entry by entry. At 1e6
    float64 points the sum reads the data once (~0.3-0.6 ms) where ``isfinite`` also
    writes and reads a boolean temporary (~0.7-0.8 ms; benchmarks/RESULTS.md, issue 31).

    Example:
        >>> import numpy as np
        >>> from adaptprec.nlsq._inputs import all_finite
        >>> big = np.array([1e308, 1e308])   # the sum overflows: decided entry by entry
        >>> all_finite(np.ones(3)), all_finite(np.array([1.0, np.nan])), all_finite(big)
        (True, False, True)
    """
    a = np.asarray(a)
    if not np.issubdtype(a.dtype, np.inexact):
        return True
    with np.errstate(over="ignore", invalid="ignore"):
        if a.dtype.kind in "fc" and np.isfinite(np.add.reduce(a, axis=None)):
            return True
    return bool(np.all(np.isfinite(a)))


#: (issue 31) Arrays an entry point (``curve_fit``) has just checked with
#: :func:`all_finite`: :func:`_check_finite_tree` does not read them again inside
#: :func:`checked_finite` (at 1e6 points each check reads 8 MB).
_CHECKED: contextvars.ContextVar = contextvars.ContextVar("adaptprec_checked_finite",
                                                           default=())


@contextlib.contextmanager
def checked_finite(*arrays):
    """Inside, :func:`_check_finite_tree` skips ``arrays`` (by identity): the caller has
    checked them (and raised its own error had they not been finite)."""
    token = _CHECKED.set(_CHECKED.get() + tuple(a for a in arrays if a is not None))
    try:
        yield
    finally:
        _CHECKED.reset(token)


def _check_finite_tree(tree, what: str, fix: str = "clean the data first (curve_fit can "
                       "drop NaN points with nan_policy='omit')") -> None:
    if not is_concrete(tree):
        return
    checked = _CHECKED.get()
    for leaf in jax.tree.leaves(tree):
        if any(leaf is c for c in checked):
            continue
        if not all_finite(leaf):
            a = np.asarray(leaf)
            raise ValueError(f"{what} contains NaN or Inf ({int(np.sum(~np.isfinite(a)))} "
                             f"non-finite value(s)); {fix}.")


def _broadcast_bounds(bounds, n, dtype):
    """``(lb, ub)`` as ``(n,)`` arrays, validated when concrete (numpy) or broadcast as
    traced values (``jnp``; bounds under ``jit``/``vmap`` cannot be checked here)."""
    if not isinstance(bounds, (tuple, list)) or len(bounds) != 2:
        raise ValueError(f"bounds must be a pair (lb, ub), got {bounds!r}")
    if not is_concrete(bounds):
        out = []
        for b in bounds:
            if isinstance(b, (dict, list, tuple)):
                b = ravel_pytree(b)[0]
            b = jnp.asarray(b, dtype)
            try:
                out.append(jnp.broadcast_to(b.ravel() if b.ndim else b, (n,)))
            except ValueError as exc:
                raise ValueError(f"a bound of shape {b.shape} does not broadcast to the "
                                 f"{n} parameters") from exc
        return tuple(out)
    out = []
    for b, name in zip(bounds, ("lower", "upper")):
        try:
            if isinstance(b, (dict, list, tuple)):
                # ravel_pytree's order, in NumPy: under a user's jit ravel_pytree would
                # make concrete lists tracers (newcomer audit 4)
                b = np.concatenate([np.ravel(np.asarray(v, np.float64))
                                    for v in jax.tree.leaves(b)] or [np.zeros(0)])
            arr = np.asarray(b, dtype=np.float64)
            arr = np.broadcast_to(arr.ravel() if arr.ndim else arr, (n,)).copy()
        except Exception as exc:  # noqa: BLE001 - re-raised with context
            raise ValueError(f"{name} bound of shape {np.shape(b)} does not broadcast to "
                             f"the {n} parameters") from exc
        out.append(arr)
    lb, ub = out
    if np.any(np.isnan(lb)) or np.any(np.isnan(ub)):
        raise ValueError("bounds contain NaN; use -inf/inf for no bound")
    if np.any(lb >= ub):
        i = int(np.argmax(lb >= ub))
        raise ValueError(f"each lower bound must be strictly less than its upper bound; "
                         f"parameter {i} has lb={lb[i]} >= ub={ub[i]}")
    return lb, ub


def check_scipy_options(jac, method, *, diff_step, jac_sparsity, tr_solver, tr_options,
                        verbose, workers, callback, max_nfev):
    """scipy's rules for ``jac`` (its default, finite differences with ``diff_step`` and
    ``jac_sparsity``), ``callback`` and ``max_nfev``, and the options adaptprec does not
    offer; returns ``(jac, max_nfev)`` normalised (``solve_nlsq``'s boundary).

    Example:
        >>> from adaptprec.nlsq._inputs import check_scipy_options
        >>> check_scipy_options(None, None, diff_step=1e-6, jac_sparsity=None,
        ...                     tr_solver=None, tr_options=None, verbose=0, workers=None,
        ...                     callback=None, max_nfev=None)
        ('2-point', 0)
    """
    if jac is None:  # scipy's default is "2-point": diff_step / jac_sparsity ask for it
        jac = "2-point" if (diff_step is not None or jac_sparsity is not None) else "fwd"
    jac = check_jac_option(jac)
    check_unsupported(tr_solver=tr_solver, tr_options=tr_options, verbose=verbose,
                      workers=workers)
    if jac_sparsity is not None and callable(jac):
        # scipy: jac_sparsity describes finite differences; a callable jac gives the
        # Jacobian itself, so the pattern is unused (its shape is checked below)
        pass
    elif jac_sparsity is not None:
        if method == "lm":
            raise ValueError("method='lm' does not support `jac_sparsity`; use "
                             "method='trf' or 'dogbox'.")
        if tr_solver == "exact":
            raise ValueError("tr_solver='exact' is incompatible with `jac_sparsity` (as in "
                             "scipy); leave tr_solver unset.")
        if not (isinstance(jac, str) and jac in FD_METHODS):
            raise OptionNotOffered(
                "jac_sparsity applies to finite-difference Jacobians (it groups the "
                "perturbed evaluations); pass jac='2-point', '3-point' or 'cs' with it, or "
                "drop it: automatic differentiation (jac='fwd') needs no sparsity.")
    if callback is not None and not callable(callback):
        raise TypeError(f"callback must be callable, got {type(callback).__name__}")
    max_nfev = check_max_nfev(max_nfev)
    if diff_step is not None and not (isinstance(jac, str) and jac in FD_METHODS):
        raise ValueError("diff_step only applies to finite-difference Jacobians; pass "
                         "jac='2-point', '3-point' or 'cs' with it.")
    return jac, max_nfev
