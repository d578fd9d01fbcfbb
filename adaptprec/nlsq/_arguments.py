"""scipy's rules for the arguments of the least-squares entry points, one argument at a
time: lenient where scipy is lenient (a scalar or list ``x0``,
``scipy.optimize.Bounds``, ``None`` tolerances, a 1-D Jacobian for one parameter), an
error of scipy's type where scipy errors, and an error naming the alternative for every
scipy option adaptprec does not offer (the differences that remain: ``docs/scipy.md``).

Example:
    >>> from adaptprec.nlsq._arguments import as_x0, check_tolerances
    >>> as_x0([1, 2]).tolist(), check_tolerances(None, 1e-8, 1e-8, "trf")
    ([1.0, 2.0], (0.0, 1e-08, 1e-08))
"""

from __future__ import annotations

import functools
import numbers
import warnings

import jax
import jax.numpy as jnp
import numpy as np

from .._tracing import is_concrete
from ..precision import Ladder, canonical_dtype, is_adaptive, x64_enabled

__all__ = ["OptionNotOffered", "as_x0", "as_bounds", "check_tolerances", "check_max_nfev",
           "check_array_leaves", "check_jac_option", "check_jac_shape",
           "normalize_jac_output", "wrap_jac", "check_unsupported", "check_scipy_options",
           "resolve_ladder", "float64_alone", "EPS", "METHODS", "FD_METHODS", "AD_METHODS",
           "check_method_loss", "top_rungs", "method_for_bounds", "check_x0_inside",
           "step_budget", "schedule_for"]

EPS = float(np.finfo(np.float64).eps)
#: finite-difference schemes (scipy's names; :mod:`._finite_diff`) and autodiff modes
FD_METHODS = ("2-point", "3-point", "cs")
AD_METHODS = ("fwd", "rev")
#: the trust-region methods (scipy's three and Gauss-Newton)
METHODS = ("lm", "gn", "trf", "dogbox")



class OptionNotOffered(ValueError, NotImplementedError):
    """A scipy option adaptprec does not offer; the message names the alternative."""


def _is_number_like(leaf) -> bool:
    return isinstance(leaf, (numbers.Number, np.generic, str, bytes)) or (
        isinstance(leaf, (np.ndarray, jax.Array)) and np.ndim(leaf) == 0)


def as_x0(x0):
    """``x0`` as scipy reads it: a scalar, list or tuple of numbers becomes a 1-D float
    array; complex or non-numeric raises ``ValueError``; arrays and pytrees pass through.

    Example:
        >>> from adaptprec.nlsq._arguments import as_x0
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
            dt = np.asarray(leaf).dtype
        if np.dtype(dt).kind == "c":
            raise ValueError("`x0` must be real. Split a complex parameter into its real "
                             "and imaginary parts (two real parameters).")
        if np.dtype(dt).kind in "USO":
            raise ValueError(f"x0 must be numbers, got a leaf of dtype {dt}.")
    return x0


def as_bounds(bounds, n: int):
    """``bounds`` as ``(lb, ub)``: a ``scipy.optimize.Bounds`` (anything with ``lb``/``ub``)
    is unpacked; each bound is a scalar or has ``n`` entries (scipy's shape rule).

    Example:
        >>> from scipy.optimize import Bounds
        >>> from adaptprec.nlsq._arguments import as_bounds
        >>> lb, ub = as_bounds(Bounds([0.0, 1.0], [2.0, 3.0]), 2)
        >>> lb.tolist(), ub.tolist()
        ([0.0, 1.0], [2.0, 3.0])
    """
    if hasattr(bounds, "lb") and hasattr(bounds, "ub") and not isinstance(
            bounds, (tuple, list)):
        lb, ub = bounds.lb, bounds.ub
        lb = np.full(n, float(lb)) if np.ndim(lb) == 0 else lb
        ub = np.full(n, float(ub)) if np.ndim(ub) == 0 else ub
        bounds = (lb, ub)
    if not isinstance(bounds, (tuple, list)) or len(bounds) != 2:
        raise ValueError("`bounds` must contain 2 elements: (lb, ub) or a "
                         "scipy.optimize.Bounds.")
    for b, name in zip(bounds, ("lower", "upper")):
        if isinstance(b, dict) or (isinstance(b, (list, tuple)) and not all(
                _is_number_like(v) for v in jax.tree.leaves(b))) or not is_concrete(b):
            continue   # a pytree of bounds (checked flattened), or traced
        a = np.asarray(b)
        if np.iscomplexobj(a):
            raise ValueError(f"the {name} bound must be real.")
        if a.ndim and a.size != n:
            raise ValueError(f"Inconsistent shapes between bounds and `x0`: the {name} "
                             f"bound has shape {a.shape}, x0 has {n} parameter(s). Give a "
                             f"scalar (the same bound for every parameter) or {n} values.")
    return tuple(bounds)


def check_tolerances(ftol, xtol, gtol, method):
    """scipy's ``check_tolerance``: ``None`` disables a test (0), a tolerance below
    machine epsilon warns, all three below it raise (any, for ``"lm"``).

    Example:
        >>> from adaptprec.nlsq._arguments import check_tolerances
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
                          UserWarning, stacklevel=5)
        out.append(tol)
    if method == "lm" and min(out) < EPS:
        raise ValueError(f"All tolerances must be higher than machine epsilon ({EPS:.2e}) "
                         "for method 'lm'. Use method='trf' to disable a test with None.")
    if max(out) < EPS:
        raise ValueError(f"At least one of the tolerances must be higher than machine "
                         f"epsilon ({EPS:.2e}); otherwise the solve could never stop on "
                         "convergence.")
    return tuple(out)


def check_max_nfev(max_nfev) -> int:
    """``max_nfev``: ``None`` (0: no cap) or a positive integer.

    Example:
        >>> from adaptprec.nlsq._arguments import check_max_nfev
        >>> check_max_nfev(None), check_max_nfev(5)
        (0, 5)
    """
    if max_nfev is None:
        return 0
    if isinstance(max_nfev, bool) or not isinstance(max_nfev, (numbers.Integral,
                                                               np.integer)) and not (
            isinstance(max_nfev, float) and float(max_nfev).is_integer()) \
            or int(max_nfev) <= 0:
        raise ValueError(f"`max_nfev` must be None or positive integer, got {max_nfev!r}")
    return int(max_nfev)


def check_array_leaves(args) -> None:
    """Every leaf of ``args`` must be an array or a number: they reach the residual
    through ``jit``.

    Example:
        >>> from adaptprec.nlsq._arguments import check_array_leaves
        >>> try:
        ...     check_array_leaves((1.0, "fast"))
        ... except TypeError as e:
        ...     str(e)[:22]
        'args[1] is a str, not '
    """
    for path, leaf in jax.tree_util.tree_flatten_with_path(args)[0]:
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


def check_jac_option(jac, *, allow_none: bool = False):
    """``jac``: ``"fwd"``/``"rev"``, ``"2-point"``/``"3-point"``/``"cs"`` or a callable.

    Example:
        >>> from adaptprec.nlsq._arguments import check_jac_option
        >>> check_jac_option("3-point")
        '3-point'
    """
    if (jac is None and allow_none) or callable(jac):
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


def check_jac_shape(shape: tuple, m: int, n: int) -> tuple:
    """Raise ``ValueError`` unless a Jacobian of ``shape`` can be read as ``(m, n)`` (a
    1-D one for one parameter or one residual, scipy's ``atleast_2d``).

    Example:
        >>> from adaptprec.nlsq._arguments import check_jac_shape
        >>> check_jac_shape((4,), 4, 1)
        (4,)
    """
    if shape == (m, n) or (len(shape) == 1 and ((n == 1 and shape[0] == m) or
                                                 (m == 1 and shape[0] == n))) \
            or (len(shape) == 0 and m == 1 and n == 1):
        return shape
    raise ValueError(f"The return value of `jac` has wrong shape: expected {(m, n)} "
                     f"(residuals x parameters), actual {shape}. Return the Jacobian of "
                     "the residual with one row per residual and one column per parameter.")


def normalize_jac_output(J, m: int, n: int):
    """A user Jacobian's output as ``(m, n)`` (:func:`check_jac_shape`)."""
    shape = check_jac_shape(tuple(np.shape(J)), m, n)
    return J if shape == (m, n) else jnp.reshape(J, (m, n))


@functools.lru_cache(maxsize=256)
def wrap_jac(jac, m: int, n: int):
    """``jac`` with its output read as ``(m, n)`` (one function per ``(jac, m, n)``)."""
    def J(x, *args):
        return normalize_jac_output(jnp.asarray(jac(x, *args)), m, n)
    return J


def check_unsupported(*, workers=None, verbose=0, tr_solver=None, tr_options=None):
    """scipy options adaptprec does not offer raise, naming the alternative.

    Example:
        >>> from adaptprec.nlsq._arguments import check_unsupported
        >>> check_unsupported(workers=None, verbose=0, tr_solver="exact")
    """
    if workers is not None and workers is not map:
        raise OptionNotOffered(f"workers={workers!r} is not offered: adaptprec vectorises "
                               "evaluations itself (vmap); for many fits use "
                               "ap.solve_nlsq_batch.")
    if verbose not in (0, 1, 2, False, None):
        raise ValueError("`verbose` must be in [0, 1, 2].")
    if verbose:
        raise OptionNotOffered(f"verbose={verbose!r} is not offered: inspect the result "
                               "instead: res.message, res.nfev, res.trace().")
    if tr_solver not in (None, "exact", "lsmr"):
        raise ValueError("`tr_solver` must be None, 'exact' or 'lsmr'.")
    if tr_options is not None and not isinstance(tr_options, dict):
        raise TypeError(f"tr_options must be a dict, got {type(tr_options).__name__}")


def check_scipy_options(jac, method, *, diff_step, jac_sparsity, tr_solver, tr_options,
                        verbose, workers, callback, max_nfev):
    """scipy's rules for ``jac`` (its default; finite differences with ``diff_step`` and
    ``jac_sparsity``), ``callback`` and ``max_nfev``: ``(jac, max_nfev)`` normalised.

    Example:
        >>> from adaptprec.nlsq._arguments import check_scipy_options
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
    if jac_sparsity is not None and not callable(jac):
        # (with a callable jac the pattern is unused, as in scipy: only its shape counts)
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


def resolve_ladder(precision) -> Ladder:
    """The ladder of ``precision=`` (the one parser of every fitting entry point):
    ``"adaptive"`` is ``f32 -> f64`` (bf16 is not faster than f32 on CPU and loses too
    much for a Jacobian), a :class:`~adaptprec.Ladder` or ``"f32,f64"`` as given, one
    dtype a fixed precision. ``"adaptive"`` needs ``jax_enable_x64`` (the eager entry
    points run inside ``jax.enable_x64(True)``).

    Example:
        >>> from adaptprec.nlsq._arguments import resolve_ladder
        >>> str(resolve_ladder("f32,f64")), str(resolve_ladder("f32"))
        ('f32,f64', 'f32')
    """
    if isinstance(precision, Ladder):
        return precision
    if is_adaptive(precision):
        if not x64_enabled():
            raise ValueError(
                "precision='adaptive' ends on float64, but jax_enable_x64 is off here: "
                "call it inside jax.enable_x64(True) (as the eager entry points do), or "
                "ask for float32 explicitly with precision='f32'.")
        return Ladder(["f32", "f64"])
    if isinstance(precision, str) and ("," in precision or ">" in precision):
        return Ladder.parse(precision)
    if isinstance(precision, (list, tuple)):
        return Ladder(list(precision))
    return Ladder([canonical_dtype(precision)])


def float64_alone(precision, schedule, m: int, n: int) -> bool:
    """Whether an ``"adaptive"`` solve runs float64 alone: the default ladder and no
    schedule, on CPU, with ``m n <`` :data:`.common.SMALL_F64_MN`."""
    from . import common

    return (is_adaptive(precision) and schedule is None and m * n < common.SMALL_F64_MN
            and jax.default_backend() == "cpu")


# ------------------------------------------------------ shared by the in-memory and streamed
def check_method_loss(method, loss):
    """``method`` one of :data:`METHODS` (or ``None``), ``loss`` checked; ``"lm"`` takes
    the linear loss only (scipy's rule). Returns the loss."""
    from .common import check_loss

    if method is not None and method not in METHODS:
        raise ValueError(f"method={method!r} is not supported; use one of {METHODS}")
    loss = check_loss(loss)
    if method == "lm" and loss != "linear":
        raise ValueError("method='lm' supports only 'linear' loss function; use "
                         "method='trf' for a robust loss.")
    return loss


def top_rungs(precision) -> tuple:
    """The ladder's rungs; the top one must be float32 or float64 (the iterate, the trust
    region and the factored model live there, and LAPACK has no half precision)."""
    from ..precision import unit_roundoff

    rungs = resolve_ladder(precision).rungs
    top_dt = np.dtype(rungs[-1])
    if unit_roundoff(top_dt) > unit_roundoff(np.float32):
        raise ValueError(
            f"precision={precision!r} ends on {top_dt.name}: the iterate, the trust region "
            "and the factored model live in the top rung's dtype, which must be float32 or "
            "float64 (LAPACK has no half precision). Start low and end on one of them, "
            "e.g. precision='bf16,f32'.")
    return tuple(rungs)


def method_for_bounds(method, has_bounds: bool, x_scale):
    """scipy's defaults: ``"trf"`` with bounds, ``"lm"`` without; ``x_scale`` ``"jac"``
    for ``lm``/``gn``, 1 otherwise; ``lm``/``gn`` refuse bounds."""
    method = method or ("trf" if has_bounds else "lm")
    if x_scale is None:
        x_scale = "jac" if method in ("lm", "gn") else 1.0
    if has_bounds and method in ("lm", "gn"):
        raise ValueError(f"method={method!r} does not support bounds; use method='trf' "
                         "(or leave method unset)")
    return method, x_scale


def check_x0_inside(x0, lb, ub) -> None:
    """``lb <= x0 <= ub`` (concrete values)."""
    xv = np.asarray(x0, np.float64)
    if np.any(xv < lb) or np.any(xv > ub):
        i = int(np.argmax((xv < lb) | (xv > ub)))
        raise ValueError(f"x0 is outside the bounds: x0[{i}]={xv[i]} not in "
                         f"[{lb[i]}, {ub[i]}]")


def step_budget(max_steps, n: int, max_nfev: int = 0):
    """``(max_steps, portfolio)``: the default is ``100 (n + 1)`` steps per strategy of
    ``lm``'s portfolio; an explicit ``max_steps`` (or ``max_nfev``) caps the whole solve,
    and ``max_nfev`` is then the cap (each step costs at least one evaluation)."""
    from .common import PORTFOLIO, default_max_steps

    portfolio = (2 if max_steps is None and not max_nfev else 1) if PORTFOLIO else 0
    if max_steps is not None and int(max_steps) < 1:
        raise ValueError(f"max_steps must be a positive integer, got {max_steps!r}")
    if max_steps is None:
        return max(default_max_steps(n), max_nfev), portfolio
    return int(max_steps), portfolio


def schedule_for(schedule, rungs):
    """The default schedule for a ladder (none for one rung), or the user's, checked."""
    from ._step_schedule import default_schedule

    if schedule is None and len(rungs) > 1:
        return default_schedule()
    if schedule is not None and not (hasattr(schedule, "init") and
                                     hasattr(schedule, "update")):
        raise TypeError(f"schedule must be an adaptprec.schedule.PrecisionSchedule, got "
                        f"{type(schedule).__name__}")
    return schedule
