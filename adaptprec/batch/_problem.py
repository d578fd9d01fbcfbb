"""Boundary validation and the per-fit residual built from the user's model or residual."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np

from .._tracing import is_traced
from .._user_fn import returns_arrays
from ..nlsq._inputs import lists_as_arrays
from ..nlsq._arguments import check_array_leaves
from ._pytree import BatchedTreeSpec, TreeResidual, is_array_like

__all__ = ["Residual", "Problem", "build_problem"]


@dataclasses.dataclass(frozen=True)
class Residual:
    """Per-fit residual ``r(x, bargs, sargs)`` (hashable: it keys the compile cache).

    ``fun(x, *args)`` is called with the user's args re-assembled in their original order
    from the batched (``bargs``) and shared (``sargs``) parts. With ``has_ydata`` the two
    last batched entries are ``ydata`` and the weights ``1/sigma`` (shared when
    ``sigma_shared``) and the residual is ``(fun(x, *args) - ydata) * w``.
    """

    fun: Callable
    batched_pos: tuple[int, ...]
    shared_pos: tuple[int, ...]
    has_ydata: bool = False
    has_weights: bool = False
    weights_shared: bool = False
    #: the two last batched entries are the lower and upper bounds ``(B, n)`` (after
    #: ``ydata``/weights); the residual ignores them, the solver reads them via bounds()
    has_bounds: bool = False

    def bounds(self, bargs):
        """``(lower, upper)`` from the batched args (any batch layout), or ``None``."""
        return (bargs[-2], bargs[-1]) if self.has_bounds else None

    def __call__(self, x, bargs, sargs):
        nargs = len(self.batched_pos) + len(self.shared_pos)
        full: list[Any] = [None] * nargs
        for p, a in zip(self.batched_pos, bargs):
            full[p] = a
        for p, a in zip(self.shared_pos, sargs):
            full[p] = a
        user = self.fun.fun if isinstance(self.fun, TreeResidual) else self.fun
        out = jnp.asarray(returns_arrays(user, self.fun(x, *full),
                                         "model" if self.has_ydata else "residual"))
        if not self.has_ydata:
            return out
        extra_b = list(bargs[len(self.batched_pos):])
        extra_s = list(sargs[len(self.shared_pos):])
        y = extra_b.pop(0)
        r = out - y.astype(out.dtype)
        if self.has_weights:
            w = extra_s.pop(0) if self.weights_shared else extra_b.pop(0)
            r = r * w.astype(out.dtype)
        return r


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


@functools.lru_cache(maxsize=256)
def _output_shape(res, one_x, leaves_b, tree_b, leaves_s, tree_s):
    """Shape of one fit's residual (traces the model once per residual and input shapes,
    not on every call)."""
    return jax.eval_shape(res, one_x, jax.tree.unflatten(tree_b, leaves_b),
                          jax.tree.unflatten(tree_s, leaves_s))


def _bounds_matrix(limit, size: int, n: int, dtype, spec, which: str):
    """One bound as a ``(B, n)`` array: a scalar, ``(n,)`` (shared), ``(B, n)`` (per fit),
    or for a pytree ``x0`` a pytree of x0's structure with scalar, per-fit or batched
    leaves."""
    if spec is not None and not is_array_like(limit):
        leaves, treedef = jax.tree.flatten(limit)
        if treedef != spec.treedef:
            raise ValueError(f"bounds: the {which} bound is a pytree of structure {treedef}, "
                             f"but x0 has structure {spec.treedef}; give a scalar or a pytree "
                             "like x0")
        cols = []
        for leaf, shape in zip(leaves, spec.shapes):
            a = jnp.asarray(numeric_data(leaf, f"bounds: the {which} bound"), dtype)
            if a.shape not in ((), shape, (size,) + shape):
                raise ValueError(f"bounds: a {which}-bound leaf of shape {a.shape} does not "
                                 f"fit a parameter of per-fit shape {shape} (give (), "
                                 f"{shape} or {(size,) + shape})")
            cols.append(jnp.broadcast_to(a, (size,) + shape).reshape(size, -1))
        return jnp.concatenate(cols, axis=1)
    a = jnp.asarray(numeric_data(limit, f"bounds: the {which} bound"), dtype)
    if a.shape not in ((), (n,), (size, n)):
        raise ValueError(f"bounds: the {which} bound has shape {a.shape}; give a scalar, "
                         f"(n,) = ({n},) shared by all fits, or (B, n) = ({size}, {n}) per fit")
    return jnp.broadcast_to(a, (size, n))


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
    dates raise ``ValueError`` naming the argument, as ``curve_fit`` does (they failed
    inside JAX with "Error interpreting argument ... at path bargs[0]": issue 34).

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


def build_problem(fun, x0, args, in_axes, ydata, sigma, bounds=None) -> Problem:
    """Validate shapes at the boundary and split args into batched and shared parts."""
    if not callable(fun):
        raise TypeError(f"solve_nlsq_batch needs a callable model or residual, got {fun!r}")
    spec = None
    if isinstance(x0, (str, bytes)):
        raise ValueError(f"x0 must be numbers of shape (B, n), got the string {x0!r}")
    if not is_array_like(x0):  # a pytree of (B, ...) leaves: solve on the flat (B, n)
        spec, x0 = BatchedTreeSpec.ravel(x0)
        fun = TreeResidual(fun, spec)
    if not isinstance(x0, jax.Array):
        if isinstance(x0, (str, bytes)):
            raise ValueError(f"x0 must be numbers of shape (B, n), got the string {x0!r}")
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
    size, n = x0.shape
    if size == 0:
        raise ValueError("empty batch: x0 has shape (0, n); pass at least one fit")
    if n == 0:
        raise ValueError("x0 has zero parameters per fit (shape (B, 0))")
    if not jnp.issubdtype(x0.dtype, jnp.floating):
        x0 = x0.astype(np.float64 if jax.config.read("jax_enable_x64") else np.float32)
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
    weights_shared = False
    if ydata is not None:
        ydata = numeric_data(ydata, "ydata")
        if ydata.ndim != 2 or ydata.shape[0] != size:
            raise ValueError(f"ydata must have shape (B, m) with B = {size} (the rows of "
                             f"x0); got {ydata.shape}")
        bargs.append(ydata)
        if sigma is not None:
            sigma = numeric_data(sigma, "sigma")
            if sigma.shape == ydata.shape[1:]:
                weights_shared = True
                sargs.append(1.0 / sigma)
            elif sigma.shape == ydata.shape:
                bargs.append(1.0 / sigma)
            else:
                raise ValueError(f"sigma must have shape (m,) = {ydata.shape[1:]} or (B, m) "
                                 f"= {ydata.shape}; got {sigma.shape}")
    elif sigma is not None:
        raise ValueError("sigma needs ydata: pass the data as ydata=(B, m) so the model "
                         "residual (model - ydata) / sigma can be formed")
    bounded = bounds is not None
    if bounded:
        if not (isinstance(bounds, (tuple, list)) and len(bounds) == 2):
            raise ValueError("bounds must be a pair (lb, ub); each a scalar, (n,) shared by "
                             "all fits, or (B, n) per fit (-inf/inf for no bound)")
        dt = x0.dtype
        lo = _bounds_matrix(bounds[0], size, n, dt, spec, "lower")
        hi = _bounds_matrix(bounds[1], size, n, dt, spec, "upper")
        _check_bounds(x0, lo, hi)
        bargs.extend([lo, hi])
    res = Residual(fun, tuple(bpos), tuple(spos), ydata is not None,
                   sigma is not None, weights_shared, bounded)
    bargs_t, sargs_t = tuple(bargs), tuple(sargs)
    one_b = jax.tree.map(lambda a: jax.ShapeDtypeStruct(_shape_of(a)[1:], a.dtype), bargs_t)
    one_s = jax.tree.map(lambda a: jax.ShapeDtypeStruct(_shape_of(a), _dtype_of(a)), sargs_t)
    one_x = jax.ShapeDtypeStruct((n,), x0.dtype)
    (lb, tb), (ls, ts) = (jax.tree.flatten(t) for t in (one_b, one_s))
    try:
        out = _output_shape(res, one_x, tuple(lb), tb, tuple(ls), ts)
    except Exception:
        if ydata is not None:  # name the mismatch instead of JAX's broadcasting error
            _check_ydata_length(fun, bpos, spos, bargs_t[:len(bpos)], sargs_t, one_x,
                                ydata.shape[1])
        raise
    if not hasattr(out, "shape") or len(out.shape) != 1:
        raise ValueError(f"the residual of one fit must be a 1-D array (m,), got "
                         f"{getattr(out, 'shape', type(out))}")
    if not jnp.issubdtype(out.dtype, jnp.floating):
        # as solve_nlsq (a complex residual was cast to its real part and "converged":
        # newcomer audit 4)
        raise TypeError(f"residual must return floating arrays, got {out.dtype}: split a "
                        "complex residual into its real and imaginary parts, e.g. "
                        "jnp.concatenate([r.real, r.imag])")
    m = out.shape[0]
    if m < n:
        raise ValueError(f"Levenberg–Marquardt needs at least as many residuals as "
                         f"parameters per fit; got m = {m} < n = {n}")
    return Problem(res, x0, bargs_t, sargs_t, size, n, m, spec)


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
