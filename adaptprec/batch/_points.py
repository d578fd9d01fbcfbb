"""Which points of each fit count: a mask, uneven data padded for the user, NaN omitted.

A fit's points are the columns of ``ydata`` (or of the residual). ``mask`` (``(B, m)``
per fit or ``(m,)`` shared, ``True`` on the real points) enters the compiled solve as data:
the residual is ``where(mask, r, 0)``, a select, so a padded point adds nothing to the
cost, its Jacobian row is zero (forward mode carries the select, not the padded value),
and the covariance and degrees of freedom count ``sum(mask)`` points per fit. Padded
entries of ``ydata`` and of a per-fit ``sigma`` are replaced by finite placeholders
(``0`` and ``1``) at the boundary, so no NaN or Inf reaches a derivative either.

A mask rather than per-fit lengths: a length is the mask ``arange(m) < length``, while a
mask also says which points are missing inside a fit (dead pixels, NaN readings, the
``nan_policy="omit"`` of scipy), and one keyword keeps one meaning. Uneven data given as
lists of per-fit arrays are padded here and get that mask.

Example:
    >>> import numpy as np
    >>> from adaptprec.batch._points import pad_uneven
    >>> y, s, args, mask = pad_uneven([np.ones(2), np.ones(3)], None,
    ...                               ([np.arange(2.0), np.arange(3.0)],), 0, None)
    >>> y.tolist(), args[0].tolist(), mask.tolist()
    ([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]], [[0.0, 1.0, 1.0], [0.0, 1.0, 2.0]], [[True, True, False], [True, True, True]])
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from .._tracing import is_concrete

__all__ = ["pad_uneven", "points_mask", "placeholders", "check_poisson_counts"]


def _ragged(a) -> bool:
    """A list/tuple of 1-D array-likes of different lengths."""
    if not isinstance(a, (list, tuple)) or not a:
        return False
    shapes = [np.shape(v) for v in a]
    return all(len(s) == 1 for s in shapes) and len({s[0] for s in shapes}) > 1


def _pad_rows(rows, m: int, fill) -> np.ndarray:
    """``rows`` (1-D array-likes) as one ``(B, m)`` array; ``fill`` a number, or
    ``"edge"`` for each row's last value (finite where the row is)."""
    rows = [np.asarray(r) for r in rows]
    dtype = np.result_type(*rows, np.float32 if fill == "edge" else np.asarray(fill))
    out = np.empty((len(rows), m), dtype)
    for i, r in enumerate(rows):
        out[i, :r.size] = r
        out[i, r.size:] = (r[-1] if r.size else 0) if fill == "edge" else fill
    return out


def pad_uneven(ydata, sigma, args, in_axes, mask):
    """``(ydata, sigma, args, mask)`` with uneven data padded: a ``ydata`` given as a list
    of per-fit 1-D arrays of different lengths becomes ``(B, max length)`` (zeros past each
    fit's end) and ``mask`` marks the real points; a per-fit ``sigma`` and per-fit args
    given as lists of arrays of those same lengths are padded alike (``sigma`` with ones,
    an arg with each fit's last value, so the model sees finite inputs). Even data pass
    through unchanged."""
    if not _ragged(ydata):
        return ydata, sigma, args, mask
    lengths = [int(np.shape(v)[0]) for v in ydata]
    if mask is not None:
        raise ValueError("ydata is a list of per-fit arrays of different lengths (padded "
                         "for you, with its own mask); pass either such lists or a (B, m) "
                         "ydata with mask=, not both")
    m = max(lengths)

    def same(a):   # one array per fit, of ydata's lengths
        return isinstance(a, (list, tuple)) and [np.size(v) for v in a] == lengths

    if sigma is not None and isinstance(sigma, (list, tuple)):
        if not same(sigma):
            raise ValueError(f"sigma is a list, so it must hold one array per fit with "
                             f"ydata's lengths {lengths[:8]}...; or give sigma (m,)/(B, m)")
        sigma = _pad_rows(sigma, m, 1.0)
    tup = args if isinstance(args, tuple) else ((args,) if not isinstance(args, list)
                                                else tuple(args))
    axes = (in_axes,) * len(tup) if isinstance(in_axes, (int, type(None))) else tuple(in_axes)
    out = []
    for i, (a, ax) in enumerate(zip(tup, axes + (0,) * (len(tup) - len(axes)))):
        if ax == 0 and _ragged(a):
            if not same(a):
                raise ValueError(
                    f"args[{i}] is a list of per-fit arrays whose lengths "
                    f"{[np.size(v) for v in a][:8]} differ from ydata's {lengths[:8]}; "
                    "uneven per-fit arguments must match ydata's points one to one (or "
                    "pad them yourself to (B, m) and pass mask=)")
            a = _pad_rows(a, m, "edge")
        out.append(a)
    ends = np.asarray(lengths)[:, None]
    return _pad_rows(ydata, m, 0.0), sigma, tuple(out), np.arange(m)[None, :] < ends


def points_mask(mask, ydata, sigma, size: int, m: int, nan_policy: str):
    """The validated mask (``None``: every point counts): ``mask`` as given (``(m,)`` or
    ``(B, m)``, bool), and with ``nan_policy="omit"`` the points whose ``ydata`` or
    ``sigma`` is not finite left out as well (jit-safe)."""
    if mask is not None:
        if isinstance(mask, jax.Array):
            k = mask
        else:
            k = np.asarray(mask)
        if k.dtype != bool:
            raise ValueError(f"mask must be bool (True on the points that count), got "
                             f"dtype {k.dtype}; for per-fit lengths use "
                             "np.arange(m) < lengths[:, None]")
        if k.shape not in ((m,), (size, m)):
            raise ValueError(f"mask must have shape (m,) = ({m},) shared by all fits or "
                             f"(B, m) = ({size}, {m}); got {k.shape}")
        mask = k
    if nan_policy != "omit":
        return mask
    if ydata is None:
        raise ValueError("nan_policy='omit' leaves out the points whose ydata is NaN; "
                         "without ydata (a residual function) mark them with mask=")
    xnp = np if is_concrete((ydata, sigma, mask)) else jnp
    ok = xnp.isfinite(ydata)
    if sigma is not None:
        ok = ok & xnp.isfinite(sigma)
    return ok if mask is None else ok & mask


def placeholders(ydata, sigma, mask):
    """``(ydata, sigma)`` with finite stand-ins (``0``, ``1``) on the points outside
    ``mask``: the residual there is selected away, and a stand-in keeps NaN/Inf out of
    every derivative. A shared ``sigma`` ``(m,)`` stays as given (its points count in
    some fit)."""
    if mask is None:
        return ydata, sigma
    xnp = np if is_concrete((ydata, sigma, mask)) else jnp
    if ydata is not None:
        ydata = xnp.where(mask, ydata, 0)
    if sigma is not None and ydata is not None and np.ndim(sigma) == 2:
        sigma = xnp.where(mask, sigma, 1)
    return ydata, sigma


def check_poisson_counts(ydata, mask) -> None:
    """``likelihood="poisson"``: the counts of the real points finite and non-negative
    (zero counts allowed, non-integers too, as in Gpufit); concrete data only."""
    if not is_concrete((ydata, mask)):
        return
    y = np.asarray(ydata, np.float64)
    real = np.ones(y.shape, bool) if mask is None else np.broadcast_to(mask, y.shape)
    bad = real & ~(np.isfinite(y) & (y >= 0))
    if bad.any():
        i, j = np.argwhere(bad)[0]
        raise ValueError(f"likelihood='poisson' needs counts (finite, >= 0): fit {i}, "
                         f"point {j} is {y[i, j]} ({int(bad.sum())} such points); pass "
                         "nan_policy='omit' for NaN readings, or mask= them")
