"""Boundary validation and the per-fit residual built from the user's model or residual."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np

from .._tracing import is_traced
from .._user_fn import returns_arrays
from ..nlsq import _caches
from ..nlsq._arguments import check_array_leaves
from ..nlsq._inputs import lists_as_arrays
from ._pytree import BatchedTreeSpec, TiedResidual, TreeResidual, is_array_like

__all__ = ["Residual", "Problem", "build_problem", "read_starts", "per_fit_limits"]


@dataclasses.dataclass(frozen=True)
class Residual:
    """Per-fit residual ``r(x, bargs, sargs)`` (hashable: it keys the compile cache).

    ``fun(x, *args)`` is called with the user's args re-assembled in their original order
    from the batched (``bargs``) and shared (``sargs``) parts. After the user's batched
    args come, in this order and each only when present: ``ydata``, the weights
    ``1/sigma`` (shared when ``weights_shared``), the mask of the real points (shared
    when ``mask_shared``), and the lower and upper bounds. The residual is
    ``(fun(x, *args) - ydata) * w``, or with ``likelihood="poisson"`` the deviance
    residual of the counts ``ydata`` (:func:`adaptprec.modeling.likelihood.
    deviance_residual`), and zero outside the mask (a select).
    """

    fun: Callable
    batched_pos: tuple[int, ...]
    shared_pos: tuple[int, ...]
    has_ydata: bool = False
    has_weights: bool = False
    weights_shared: bool = False
    #: the two last batched entries are the lower and upper bounds ``(B, n)`` (after
    #: ``ydata``/weights/mask); the residual ignores them, the solver reads them via bounds()
    has_bounds: bool = False
    has_mask: bool = False
    mask_shared: bool = False
    #: some parameters are fixed: their lower and upper bounds are equal (a box of width
    #: zero holds them, :func:`adaptprec.batch._model.held_by_bounds`)
    has_fixed: bool = False
    #: ``None`` (least squares) or ``"poisson"`` (deviance residuals)
    likelihood: Optional[str] = None
    #: evaluate ``2 sqrt(f)`` instead: its Jacobian ``g_i / sqrt(f_i)`` is the whitened
    #: one whose ``(J^T J)^{-1}`` is a Poisson fit's inverse Fisher information
    fisher: bool = False

    def bounds(self, bargs):
        """``(lower, upper)`` from the batched args (any batch layout), or ``None``."""
        return (bargs[-2], bargs[-1]) if self.has_bounds else None

    def fixed(self, bargs):
        """Fits first: ``(B, n)`` bool, the fixed parameters, or ``None``."""
        if not self.has_fixed:
            return None
        lo, hi = self.bounds(bargs)
        return lo == hi

    def data(self, bargs, sargs):
        """``(ydata, weights, mask)`` from the entries after the user's args (each
        ``None`` when absent)."""
        b = list(bargs[len(self.batched_pos):])
        s = list(sargs[len(self.shared_pos):])
        y = b.pop(0) if self.has_ydata else None
        w = (s.pop(0) if self.weights_shared else b.pop(0)) if self.has_weights else None
        k = (s.pop(0) if self.mask_shared else b.pop(0)) if self.has_mask else None
        return y, w, k

    def points(self, bargs, sargs, m: int):
        """Fits first: the real points of each fit, ``(B,)`` int32."""
        size = jax.tree.leaves(bargs)[0].shape[0] if bargs else 1
        _, _, k = self.data(bargs, sargs)
        count = m if k is None else jnp.sum(k, axis=-1)
        return jnp.broadcast_to(jnp.asarray(count, jnp.int32), (size,))

    def __call__(self, x, bargs, sargs):
        nargs = len(self.batched_pos) + len(self.shared_pos)
        full: list[Any] = [None] * nargs
        for p, a in zip(self.batched_pos, bargs):
            full[p] = a
        for p, a in zip(self.shared_pos, sargs):
            full[p] = a
        user = self.fun.fun if isinstance(self.fun, (TreeResidual, TiedResidual)) \
            else self.fun
        out = jnp.asarray(returns_arrays(user, self.fun(x, *full),
                                         "model" if self.has_ydata else "residual"))
        y, w, k = self.data(bargs, sargs)
        if self.fisher:
            r = 2.0 * jnp.sqrt(out)
        elif self.likelihood == "poisson":
            from ..modeling.likelihood import deviance_residual

            r = deviance_residual(out, y)
        elif y is not None:
            r = out - y.astype(out.dtype)
            if w is not None:
                r = r * w.astype(out.dtype)
        else:
            r = out
        return r if k is None else jnp.where(k, r, jnp.zeros((), r.dtype))


@dataclasses.dataclass
class Problem:
    residual: Residual
    x0: Any
    bargs: tuple
    sargs: tuple
    size: int
    n: int
    m: int
    #: set when x0 was a pytree: how to turn flat (B, n) parameters back into it
    spec: BatchedTreeSpec | None = None


def _shape_of(a):
    return tuple(getattr(a, "shape", np.shape(a)))


def _dtype_of(a):
    return a.dtype if hasattr(a, "dtype") else jnp.result_type(a)


def _check_ydata_length(fun, bpos, spos, bargs, sargs, one_x, m_y: int) -> None:
    """Raise a ``ValueError`` naming ``ydata`` when the model's output length for one fit
    differs from ``ydata``'s points per fit (returns quietly when it cannot tell)."""
    model = Residual(fun, tuple(bpos), tuple(spos), False, False, False, False)
    one_b = jax.tree.map(lambda a: jax.ShapeDtypeStruct(_shape_of(a)[1:], _dtype_of(a)),
                         tuple(bargs))
    one_s = jax.tree.map(lambda a: jax.ShapeDtypeStruct(_shape_of(a), _dtype_of(a)),
                         tuple(sargs))
    try:
        out = jax.eval_shape(model, one_x, one_b, one_s)
    except Exception:  # noqa: BLE001 - the model itself fails: the caller re-raises
        return
    shape = tuple(getattr(out, "shape", ()))
    if shape and shape[-1] != m_y:
        raise ValueError(f"ydata has {m_y} points per fit (shape (B, {m_y})), but the model "
                         f"returns {shape} for one fit; give ydata one column per model "
                         "output (shape (B, m)), or fix the model's output length.")


def _output_shape(res, one_x, leaves_b, tree_b, leaves_s, tree_s):
    """Shape of one fit's residual (traces the model once per residual and input shapes,
    not on every call: ``BATCH_SHAPES`` of :mod:`adaptprec.nlsq._caches`)."""
    return _caches.BATCH_SHAPES.get_or_build(
        (res, one_x, leaves_b, tree_b, leaves_s, tree_s),
        lambda: jax.eval_shape(res, one_x, jax.tree.unflatten(tree_b, leaves_b),
                               jax.tree.unflatten(tree_s, leaves_s)))


def _bounds_matrix(limit, size: int, n: int, dtype, spec, which: str):
    """One bound (``which``: ``"the lower bound"``, ...) or the ``fixed`` flags as a
    ``(B, n)`` array: a scalar, ``(n,)`` (shared), ``(B, n)`` (per fit), or for a pytree
    ``x0`` a pytree of x0's structure with scalar, per-fit or batched leaves."""
    if spec is not None and not is_array_like(limit):
        leaves, treedef = jax.tree.flatten(limit)
        if treedef != spec.treedef:
            raise ValueError(f"{which} is a pytree of structure {treedef}, but x0 has "
                             f"structure {spec.treedef}; give a scalar or a pytree like x0")
        cols = []
        for leaf, shape in zip(leaves, spec.shapes):
            a = jnp.asarray(_checked(leaf, which, dtype), dtype)
            if a.shape not in ((), shape, (size,) + shape):
                raise ValueError(f"{which}: a leaf of shape {a.shape} does not fit a "
                                 f"parameter of per-fit shape {shape} (give (), "
                                 f"{shape} or {(size,) + shape})")
            cols.append(jnp.broadcast_to(a, (size,) + shape).reshape(size, -1))
        return jnp.concatenate(cols, axis=1)
    a = jnp.asarray(_checked(limit, which, dtype), dtype)
    if a.shape not in ((), (n,), (size, n)):
        raise ValueError(f"{which} has shape {a.shape}; give a scalar, (n,) = ({n},) "
                         f"shared by all fits, or (B, n) = ({size}, {n}) per fit")
    return jnp.broadcast_to(a, (size, n))


def _checked(value, which: str, dtype):
    """A bound as numbers, or the fixed flags as bools (not 0/1: Gpufit's
    ``parameters_to_fit`` means the opposite, 1 for a fitted parameter)."""
    if dtype is not bool:
        return numeric_data(value, which)
    kind = getattr(value, "dtype", np.asarray(value).dtype)
    if kind != bool:
        raise ValueError(f"fixed must be bool, True for a parameter held at its x0 value; "
                         f"got dtype {kind} (from Gpufit's parameters_to_fit p: "
                         "fixed = p == 0)")
    return value


def _check_bounds(x0, lo, hi) -> None:
    """Concrete bounds: lo < hi everywhere and x0 inside the box (scipy's rules)."""
    if is_traced(x0, lo, hi):
        return
    # on arrays spanning processes, each process checks the fits it holds, and all raise
    from .sharding import local_rows, raise_together
    raise_together(_bounds_error(*local_rows(x0), local_rows(lo, like=x0)[1],
                                 local_rows(hi, like=x0)[1]), x0, lo, hi)


def _bounds_error(rows, x_, lo_, hi_) -> Optional[ValueError]:
    if np.isnan(lo_).any() or np.isnan(hi_).any():
        return ValueError("bounds contain NaN; use -inf/inf for an unbounded side")
    bad = np.argwhere(~(lo_ < hi_))
    if bad.size:
        j, i = bad[0]
        return ValueError(f"bounds: each lower bound must be strictly less than the upper "
                          f"bound; fit {rows[j]}, parameter {i} has [{lo_[j, i]}, "
                          f"{hi_[j, i]}] ({len(bad)} such entries)")
    out = np.argwhere((x_ < lo_) | (x_ > hi_))
    if out.size:
        j, i = out[0]
        return ValueError(f"x0 is infeasible: fit {rows[j]}, parameter {i} = {x_[j, i]} lies "
                          f"outside [{lo_[j, i]}, {hi_[j, i]}] ({len(out)} such entries); "
                          "clip the starts into the bounds, e.g. np.clip(x0, lb, ub)")
    return None


#: dtype kinds that are not numbers (str, bytes, objects, dates, void)
_NOT_NUMBERS = "USOMmV"


def numeric_data(x, name: str):
    """``ydata``/``sigma``/a bound as an array of numbers: JAX arrays pass through, NumPy
    arrays and array-likes (lists, memoryviews) become NumPy arrays; strings, objects and
    dates raise ``ValueError`` naming the argument, as ``curve_fit`` does (rather than
    JAX's "Error interpreting argument ... at path bargs[0]").

    Example:
        >>> from adaptprec.batch._problem import numeric_data
        >>> numeric_data([[1, 2]], "ydata").shape
        (1, 2)
        >>> try:
        ...     numeric_data([["x"] * 3], "ydata")
        ... except ValueError as e:
        ...     msg = str(e)
        >>> msg
        'ydata must be numbers, got dtype <U1'
    """
    if x is None or isinstance(x, jax.Array):
        return x
    if isinstance(x, (str, bytes)):
        raise ValueError(f"{name} must be numbers, got the string {x!r}")
    try:
        a = np.asarray(x)
    except Exception as exc:  # noqa: BLE001 - re-raised with the argument's name
        raise ValueError(f"{name} could not be read as an array of numbers: {exc}") from exc
    if a.dtype.kind in _NOT_NUMBERS:
        raise ValueError(f"{name} must be numbers, got dtype {a.dtype}")
    return a


def check_numeric_args(args: tuple) -> None:
    """Every leaf of ``args`` is an array of numbers or a number: ``ValueError`` naming
    the argument for strings and arrays of strings/objects (a list of strings is one
    argument, not a pytree of them), ``TypeError`` for other non-array leaves."""
    for i, a in enumerate(args):
        if isinstance(a, list) and a:
            try:
                kind = np.asarray(a).dtype.kind
            except Exception:  # noqa: BLE001 - a ragged list is a pytree: leaves below
                kind = None
            if kind in ("U", "S"):
                raise ValueError(f"args[{i}] must be numbers, got dtype {np.asarray(a).dtype}")
    for path, leaf in jax.tree_util.tree_flatten_with_path(args)[0]:
        where = f"args{jax.tree_util.keystr(path)}"
        if isinstance(leaf, (str, bytes)):
            raise ValueError(f"{where} must be numbers, got the string {leaf!r}; pass "
                             "settings through a closure or functools.partial")
        if isinstance(leaf, (np.ndarray, np.generic)) and leaf.dtype.kind in _NOT_NUMBERS:
            raise ValueError(f"{where} must be numbers, got dtype {leaf.dtype}")
    check_array_leaves(args)


def read_starts(fun, x0):
    """``(fun, x0, spec)``: ``x0`` validated as a ``(B, n)`` floating array (a pytree of
    ``(B, ...)`` leaves is flattened to one, and ``fun`` re-assembles it)."""
    if not callable(fun):
        raise TypeError(f"solve_nlsq_batch needs a callable model or residual, got {fun!r}")
    spec = None
    if isinstance(x0, (str, bytes)):
        raise ValueError(f"x0 must be numbers of shape (B, n), got the string {x0!r}")
    if not is_array_like(x0):  # a pytree of (B, ...) leaves: solve on the flat (B, n)
        spec, x0 = BatchedTreeSpec.ravel(x0)
        fun = TreeResidual(fun, spec)
    if not isinstance(x0, jax.Array):
        x0 = np.asarray(x0)
    if np.dtype(x0.dtype).kind in "USO":
        raise ValueError(f"x0 must be numbers of shape (B, n), got dtype {x0.dtype}")
    if np.dtype(x0.dtype).kind == "c":
        raise ValueError("x0 must be real; split a complex parameter into its real and "
                         "imaginary parts (two real parameters).")
    if x0.ndim != 2:
        raise ValueError(
            f"x0 must have shape (B, n): one row of n parameters per fit; got shape "
            f"{x0.shape}. For a single fit use adaptprec.solve_nlsq or pass x0[None]; "
            "parameters with structure can be a pytree (dict, namedtuple, list of "
            "arrays) whose leaves all have the leading batch axis.")
    if x0.shape[0] == 0:
        raise ValueError("empty batch: x0 has shape (0, n); pass at least one fit")
    if x0.shape[1] == 0:
        raise ValueError("x0 has zero parameters per fit (shape (B, 0))")
    if not jnp.issubdtype(x0.dtype, jnp.floating):
        x0 = x0.astype(np.float64 if jax.config.read("jax_enable_x64") else np.float32)
    return fun, x0, spec


def _split_args(args, in_axes, size: int):
    """``(bpos, spos, bargs, sargs)``: the positions and values of the batched and the
    shared args (``in_axes`` as in :func:`jax.vmap`: ``0`` or ``None`` per arg)."""
    if not isinstance(args, tuple):
        args = (args,) if not isinstance(args, list) else tuple(args)
    check_numeric_args(args)
    args = lists_as_arrays(args)  # (Y.tolist(): an array, not a pytree of scalars)
    if isinstance(in_axes, (int, type(None))):
        axes = (in_axes,) * len(args)
    else:
        axes = tuple(in_axes)
        if len(axes) != len(args):
            raise ValueError(f"in_axes has {len(axes)} entries but args has {len(args)}; "
                             "give one 0 (batched) or None (shared) per arg")
    bpos, spos, bargs, sargs = [], [], [], []
    for i, (a, ax) in enumerate(zip(args, axes)):
        if ax not in (0, None):
            raise ValueError(f"in_axes[{i}] must be 0 (leading batch axis) or None "
                             f"(shared by all fits), got {ax!r}")
        if ax == 0:
            for leaf in jax.tree.leaves(a):
                shp = _shape_of(leaf)
                if len(shp) == 0 or shp[0] != size:
                    raise ValueError(
                        f"batch size mismatch: x0 has {size} fits but args[{i}] has a leaf "
                        f"of shape {shp}; batched args need leading dimension {size}, or "
                        f"mark shared args with in_axes=None")
            bpos.append(i)
            bargs.append(a)
        else:
            spos.append(i)
            sargs.append(a)
    return bpos, spos, bargs, sargs


def _data(ydata, sigma, size: int):
    """``ydata`` ``(B, m)`` and ``sigma`` (``(m,)`` or ``(B, m)``) validated."""
    if ydata is None:
        if sigma is not None:
            raise ValueError("sigma needs ydata: pass the data as ydata=(B, m) so the "
                             "model residual (model - ydata) / sigma can be formed")
        return None, None
    ydata = numeric_data(ydata, "ydata")
    if ydata.ndim != 2 or ydata.shape[0] != size:
        raise ValueError(f"ydata must have shape (B, m) with B = {size} (the rows of "
                         f"x0); got {ydata.shape}")
    if sigma is not None:
        sigma = numeric_data(sigma, "sigma")
        if sigma.shape not in (ydata.shape[1:], ydata.shape):
            raise ValueError(f"sigma must have shape (m,) = {ydata.shape[1:]} or (B, m) "
                             f"= {ydata.shape}; got {sigma.shape}")
    return ydata, sigma


def per_fit_limits(bounds, fixed, x0, spec):
    """``(lower, upper, held)``: ``bounds=(lb, ub)`` (``None``: the open box) and the
    ``fixed`` flags (``None``: none) as ``(B, n)`` matrices, not yet checked against
    ``x0``."""
    size, n = x0.shape
    if bounds is not None and not (isinstance(bounds, (tuple, list)) and len(bounds) == 2):
        raise ValueError("bounds must be a pair (lb, ub); each a scalar, (n,) shared by "
                         "all fits, or (B, n) per fit (-inf/inf for no bound)")
    dt = x0.dtype
    lb, ub = (np.array(-np.inf), np.array(np.inf)) if bounds is None else bounds
    lo = _bounds_matrix(lb, size, n, dt, spec, "bounds: the lower bound")
    hi = _bounds_matrix(ub, size, n, dt, spec, "bounds: the upper bound")
    held = None if fixed is None else _bounds_matrix(fixed, size, n, bool, spec, "fixed")
    return lo, hi, held


def _box(bounds, fixed, x0, spec):
    """``(lower, upper)`` ``(B, n)`` with the fixed parameters' box of width zero at their
    start, or ``None`` (no bounds, nothing fixed)."""
    if bounds is None and fixed is None:
        return None
    lo, hi, held = per_fit_limits(bounds, fixed, x0, spec)
    _check_bounds(x0, lo, hi)
    if held is None:
        return lo, hi
    return jnp.where(held, x0, lo), jnp.where(held, x0, hi)


def build_problem(fun, x0, args, in_axes, ydata, sigma, bounds=None, *, mask=None,
                  fixed=None, likelihood=None) -> Problem:
    """Validate shapes at the boundary and split args into batched and shared parts;
    ``mask`` (validated by :func:`adaptprec.batch._points.points_mask`, its padded
    ``ydata``/``sigma`` entries already finite) marks each fit's real points, ``fixed``
    holds parameters at their start, ``likelihood="poisson"`` fits counts."""
    fun, x0, spec = read_starts(fun, x0)
    size, n = x0.shape
    bpos, spos, bargs, sargs = _split_args(args, in_axes, size)
    ydata, sigma = _data(ydata, sigma, size)
    weights_shared = sigma is not None and sigma.ndim == 1
    if ydata is not None:
        bargs.append(ydata)
        if sigma is not None:
            (sargs if weights_shared else bargs).append(1.0 / sigma)
    mask_shared = mask is not None and mask.ndim == 1
    if mask is not None:
        (sargs if mask_shared else bargs).append(mask)
    box = _box(bounds, fixed, x0, spec)
    if box is not None:
        bargs.extend(box)
    res = Residual(fun, tuple(bpos), tuple(spos), ydata is not None,
                   sigma is not None, weights_shared, box is not None, mask is not None,
                   mask_shared, fixed is not None, likelihood)
    m = _residual_length(res, fun, x0, bpos, spos, bargs, sargs, ydata)
    if mask is not None and mask.shape[-1] != m:
        raise ValueError(f"mask has {mask.shape[-1]} points per fit, but the residual of "
                         f"one fit has {m}; give mask (m,) or (B, m) with m = {m}")
    if m < n:
        raise ValueError(f"Levenberg–Marquardt needs at least as many residuals as "
                         f"parameters per fit; got m = {m} < n = {n}")
    return Problem(res, x0, tuple(bargs), tuple(sargs), size, n, m, spec)


def _residual_length(res, fun, x0, bpos, spos, bargs, sargs, ydata) -> int:
    """``m``, the length of one fit's residual (traced once per residual and shapes),
    with errors naming a model that does not return a real 1-D array of ydata's length.
    The mask does not change the length: it is traced without (so a mask of the wrong
    length is named by the caller, not by a broadcasting error)."""
    plain = dataclasses.replace(res, has_mask=False, mask_shared=False)
    if res.has_mask:   # drop the mask's entry
        pos = len(bpos) + int(res.has_ydata) + int(res.has_weights and not
                                                   res.weights_shared)
        shared = len(spos) + int(res.has_weights and res.weights_shared)
        bargs, sargs = ((bargs, sargs[:shared] + sargs[shared + 1:]) if res.mask_shared
                        else (bargs[:pos] + bargs[pos + 1:], sargs))
    bargs_t, sargs_t = tuple(bargs), tuple(sargs)
    one_b = jax.tree.map(lambda a: jax.ShapeDtypeStruct(_shape_of(a)[1:], a.dtype), bargs_t)
    one_s = jax.tree.map(lambda a: jax.ShapeDtypeStruct(_shape_of(a), _dtype_of(a)), sargs_t)
    one_x = jax.ShapeDtypeStruct((x0.shape[1],), x0.dtype)
    (lb, tb), (ls, ts) = (jax.tree.flatten(t) for t in (one_b, one_s))
    try:
        out = _output_shape(plain, one_x, tuple(lb), tb, tuple(ls), ts)
    except Exception:
        if ydata is not None:  # name the mismatch instead of JAX's broadcasting error
            _check_ydata_length(fun, bpos, spos, bargs_t[:len(bpos)], sargs_t, one_x,
                                ydata.shape[1])
        raise
    if not hasattr(out, "shape") or len(out.shape) != 1:
        raise ValueError(f"the residual of one fit must be a 1-D array (m,), got "
                         f"{getattr(out, 'shape', type(out))}")
    if not jnp.issubdtype(out.dtype, jnp.floating):
        # as solve_nlsq (cast to its real part, a complex residual would "converge")
        raise TypeError(f"residual must return floating arrays, got {out.dtype}: split a "
                        "complex residual into its real and imaginary parts, e.g. "
                        "jnp.concatenate([r.real, r.imag])")
    return int(out.shape[0])


def nonfinite_fits(problem: Problem) -> np.ndarray:
    """Host-side indices of fits whose start or batched data contain NaN/Inf (concrete
    only). On arrays spanning processes, of the fits this process holds."""
    from .sharding import local_rows
    rows, x = local_rows(problem.x0)
    bad = ~np.isfinite(x).all(axis=1)
    data = problem.bargs[:-2] if problem.residual.has_bounds else problem.bargs  # bounds may be inf
    for leaf in jax.tree.leaves(data):
        a = local_rows(leaf, like=problem.x0)[1]
        if np.issubdtype(a.dtype, np.floating):
            bad |= ~np.isfinite(a.reshape(a.shape[0], -1)).all(axis=1)
    return rows[bad]
