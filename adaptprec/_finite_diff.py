"""Finite-difference Jacobians (scipy's ``"2-point"``, ``"3-point"``, ``"cs"``) as one
vectorised JAX computation.

For models that are not differentiable by JAX (or when an autodiff Jacobian is not
wanted), the ``n`` perturbed evaluations are a single ``vmap`` over the columns, so they
run in the same compiled program as the solver. Steps follow scipy's ``approx_derivative``:
``h = rel_step * sign(x) * max(1, |x|)`` with ``rel_step = eps**(1/2)`` (``2-point``,
``cs``) or ``eps**(1/3)`` (``3-point``) for the dtype being evaluated; a user
``diff_step`` gives ``h = diff_step * sign(x) * |x|`` (falling back to the default where
that is 0), and ``h`` is rounded so that ``x + h`` is exact. With finite bounds the steps
follow scipy's ``_adjust_scheme_to_bounds``, so the residual is never evaluated outside
the box: a ``2-point`` step that would leave it is taken backwards, or shrunk to the
larger room left where it fits on neither side; ``3-point`` is central where both sides
have room and otherwise one-sided (``x + h``, ``x + 2h``) towards the larger room, with
``h`` shrunk to fit.

Example:
    >>> import jax.numpy as jnp
    >>> from adaptprec._finite_diff import fd_jacobian
    >>> jac = fd_jacobian(lambda x: jnp.array([x[0] ** 2, x[0] * x[1]]), "3-point")
    >>> [[round(float(v), 6) for v in row] for row in jac(jnp.array([1.0, 2.0]))]
    [[2.0, 0.0], [2.0, 1.0]]
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

__all__ = ["fd_jacobian", "default_rel_step"]


def default_rel_step(method: str, dtype) -> float:
    """scipy's default relative step for ``method`` in ``dtype``.

    Example:
        >>> import numpy as np
        >>> from adaptprec._finite_diff import default_rel_step
        >>> default_rel_step("2-point", np.float64) == float(np.finfo(np.float64).eps) ** 0.5
        True
    """
    eps = float(np.finfo(np.dtype(dtype)).eps)
    return eps ** (1.0 / 3.0) if method == "3-point" else eps ** 0.5


def _steps(x, method, diff_step):
    dt = x.dtype
    sign = jnp.where(x >= 0, 1.0, -1.0).astype(dt)
    h_def = default_rel_step(method, dt) * sign * jnp.maximum(1.0, jnp.abs(x))
    if diff_step is None:
        h = h_def
    else:
        h = jnp.asarray(diff_step, dt) * sign * jnp.abs(x)
        h = jnp.where(h == 0, h_def, h)
    return ((x + h) - x).astype(dt)


def _room(x, lb, ub):
    """Distances from ``x`` to the lower and upper bounds (``inf`` where unbounded)."""
    return x - jnp.asarray(lb, x.dtype), jnp.asarray(ub, x.dtype) - x


def _one_sided_in_box(x, h, lb, ub):
    """The ``2-point`` step ``h`` moved into the box as scipy's ``_adjust_scheme_to_bounds``
    ('1-sided') does: reversed where ``x + h`` leaves the box but ``|h|`` fits on one
    side, else set to the larger room left (forwards or backwards)."""
    lower, upper = _room(x, lb, ub)
    xh = x + h
    violated = (xh < jnp.asarray(lb, x.dtype)) | (xh > jnp.asarray(ub, x.dtype))
    fitting = jnp.abs(h) <= jnp.maximum(lower, upper)
    h = jnp.where(violated & fitting, -h, h)
    h = jnp.where(~fitting & (upper >= lower), upper, h)
    return jnp.where(~fitting & (upper < lower), -lower, h)


def _two_sided_in_box(x, h, lb, ub):
    """The ``3-point`` step and scheme in the box (scipy's '2-sided' rule): central with
    ``|h|`` where both sides have room; otherwise one-sided towards the larger room with
    the step shrunk so that ``x + 2h`` stays inside; and central again, with the smaller
    room as step, where that shrunken step would be no longer. Returns ``(step,
    central)``; a one-sided step is signed (its points are ``x + h`` and ``x + 2h``)."""
    lower, upper = _room(x, lb, ub)
    h = jnp.abs(h)
    central = (lower >= h) & (upper >= h)
    forward = ~central & (upper >= lower)
    backward = ~central & (upper < lower)
    h_adj = jnp.where(forward, jnp.minimum(h, 0.5 * upper),
                      jnp.where(backward, -jnp.minimum(h, 0.5 * lower), h))
    min_room = jnp.minimum(upper, lower)
    central_again = ~central & (jnp.abs(h_adj) <= min_room)
    h_adj = jnp.where(central_again, min_room, h_adj)
    return h_adj, central | central_again


def _quotient(D, dx):
    """``D / dx[:, None]`` divided entry by entry, as NumPy (and scipy) divide.

    XLA rewrites a division by a broadcast into a multiplication by the broadcast
    reciprocal (two roundings: the 3-point slope of ``x -> x`` at 1 came out
    ``1 - 2**-53``, so every Gauss-Newton step left the previous remainder squared,
    scipy's ``test_bounds_shape``); behind the barrier the denominator is no broadcast,
    and the division stays one (the barrier itself compiles away).

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from adaptprec._finite_diff import _quotient
        >>> d = jnp.full((2, 3), 1.2110908904627848e-05)
        >>> bool((jax.jit(_quotient)(d, d[:, 0]) == 1.0).all())
        True
    """
    return D / lax.optimization_barrier(jnp.broadcast_to(dx[:, None], D.shape))


def as_sparsity(sparsity, m: int, n: int) -> np.ndarray:
    """``jac_sparsity`` (a dense array, a scipy.sparse matrix or array, anything with
    ``toarray``) as a boolean ``(m, n)`` NumPy array; the wrong shape raises ``ValueError``.

    Example:
        >>> import numpy as np
        >>> from adaptprec._finite_diff import as_sparsity
        >>> as_sparsity(np.eye(2), 2, 2).tolist()
        [[True, False], [False, True]]
    """
    a = sparsity.toarray() if hasattr(sparsity, "toarray") else np.asarray(sparsity)
    a = np.atleast_2d(a)
    if a.shape != (m, n):
        raise ValueError(f"`jac_sparsity` has wrong shape: expected {(m, n)} (residuals x "
                         f"parameters), actual {a.shape}.")
    return a != 0


def group_columns(sparsity: np.ndarray) -> np.ndarray:
    """Greedy column grouping (scipy's ``group_columns``, in order): columns in one group
    share no nonzero row, so one perturbed evaluation serves the whole group.

    Example:
        >>> import numpy as np
        >>> from adaptprec._finite_diff import group_columns
        >>> tri = np.eye(5) + np.eye(5, k=1) + np.eye(5, k=-1)
        >>> group_columns(tri != 0).tolist()
        [0, 1, 2, 0, 1]
    """
    m, n = sparsity.shape
    groups = -np.ones(n, dtype=int)
    used_rows = []
    for j in range(n):
        rows = sparsity[:, j]
        for g, used in enumerate(used_rows):
            if not np.any(used & rows):
                groups[j] = g
                used_rows[g] = used | rows
                break
        else:
            groups[j] = len(used_rows)
            used_rows.append(rows.copy())
    return groups


def fd_jacobian(fun: Callable, method: str = "2-point", diff_step=None, lb=None,
                ub=None, sparsity=None) -> Callable:
    """``jac(x, *args)``: the ``(m, n)`` finite-difference Jacobian of the flat residual
    ``fun(x, *args)`` (one vectorised evaluation of all perturbed points).

    Args:
      fun: ``fun(x, *args)`` returning a 1-D array; for ``"cs"`` it must accept a complex
        ``x`` (complex-step differentiation; ``jax.numpy`` models usually do).
      method: ``"2-point"``, ``"3-point"`` or ``"cs"``.
      diff_step: relative step (scalar or per parameter), or ``None`` for scipy's default.
      lb, ub: concrete bounds (NumPy arrays) the perturbed points must respect, or
        ``None``.
      sparsity: a boolean ``(m, n)`` pattern (see :func:`as_sparsity`), or ``None``.
        Columns are grouped (:func:`group_columns`) and each group costs one perturbed
        evaluation instead of one per column.

    Example:
        >>> import jax.numpy as jnp
        >>> from adaptprec._finite_diff import fd_jacobian
        >>> jac = fd_jacobian(lambda x: jnp.sin(x), "cs")
        >>> round(float(jac(jnp.array([0.5]))[0, 0]), 12) == round(float(jnp.cos(0.5)), 12)
        True
    """
    if method not in ("2-point", "3-point", "cs"):
        raise ValueError(f"finite-difference method must be '2-point', '3-point' or 'cs', "
                         f"got {method!r}")
    if diff_step is not None:
        diff_step = np.asarray(diff_step, float)
    lb = None if lb is None else np.asarray(lb, float)
    ub = None if ub is None else np.asarray(ub, float)
    bounded = lb is not None and (np.any(np.isfinite(lb)) or np.any(np.isfinite(ub)))

    if sparsity is not None:
        groups = group_columns(np.asarray(sparsity, bool))
        n_groups = int(groups.max()) + 1
        # (n_groups, n): which columns each perturbed evaluation moves
        member = np.zeros((n_groups, groups.size), bool)
        member[groups, np.arange(groups.size)] = True
        mask = np.asarray(sparsity, bool)

    def jac(x, *args):
        x = jnp.asarray(x)
        n = x.shape[0]
        h = _steps(x, method, diff_step)
        if sparsity is None:
            eye = jnp.eye(n, dtype=x.dtype)
        else:
            eye = jnp.asarray(member, x.dtype)  # one row per group

        def at(dx):
            return jnp.ravel(fun(x + dx, *args))

        def spread(D, dx):
            """Per-column differences ``D`` ((groups or n) x m) divided by ``dx`` (n,)
            as the (m, n) Jacobian."""
            if sparsity is None:
                return _quotient(D, dx).T
            Dc = D[jnp.asarray(groups)]  # (n, m): the group's difference for each column
            return jnp.where(jnp.asarray(mask), _quotient(Dc, dx).T, 0.0)

        if method == "cs":
            xc = x.astype(jnp.result_type(x.dtype, jnp.complex64))
            F = jax.vmap(lambda dx: jnp.ravel(fun(xc + 1j * dx, *args)))(eye * h[None, :])
            return spread(jnp.imag(F), h).astype(x.dtype)
        f0 = jnp.ravel(fun(x, *args))
        if method == "2-point":
            if bounded:
                h = _one_sided_in_box(x, h, lb, ub)
            F = jax.vmap(at)(eye * h[None, :])
            return spread(F - f0[None, :], (x + h) - x)
        # 3-point: central, or one-sided (-3 f0 + 4 f1 - f2) / (2 h) next to a bound
        if bounded:
            hs, central = _two_sided_in_box(x, h, lb, ub)
        else:
            hs, central = h, jnp.ones(x.shape, bool)
        d1 = jnp.where(central, -hs, hs)   # central: x - h; one-sided: x + h
        d2 = jnp.where(central, hs, 2 * hs)  # central: x + h; one-sided: x + 2h
        F1 = jax.vmap(at)(eye * d1[None, :])
        F2 = jax.vmap(at)(eye * d2[None, :])
        # denominators as scipy forms them: (x + h) - (x - h) and (x + 2h) - x
        dx_cen = (x + d2) - (x + d1)
        dx_one = (x + d2) - x
        cen = spread(F2 - F1, dx_cen)
        one = spread(-3 * f0[None, :] + 4 * F1 - F2, dx_one)
        return jnp.where(central[None, :], cen, one)

    jac.finite_diff = method
    return jac
