"""Multi-start for :func:`adaptprec.solve_nlsq` (``starts=K``).

``K - 1`` extra starts are spread by a Latin hypercube: uniformly inside the box when every
parameter has two finite bounds, otherwise around ``x0`` by ``spread`` times the variable
scale (``|x0|`` per parameter, or ``1 / x_scale`` when ``x_scale`` is an array; ``1`` where
``x0`` is zero), clipped into the bounds. All ``K`` starts (``x0`` first) run at once on the
batched engine (:func:`adaptprec.solve_nlsq_batch`, one compiled program for the batch);
the start with the lowest cost among those that converged (the lowest finite cost if none
did) is polished by :func:`solve_nlsq` (so the answer carries solve_nlsq's top-rung
verification and status), and the plain solve from ``x0`` is kept instead when it ends
at a lower cost. So ``starts=K`` is never worse than ``starts=1``; it costs one batched
solve of ``K`` fits plus one extra ``solve_nlsq``. ``nfev``, ``njev`` and ``nit`` of the
result count all of that work (the plain solve, every start, the polish).

Example:
    >>> import jax.numpy as jnp
    >>> import adaptprec as ap
    >>> t = jnp.arange(1.0, 11.0)
    >>> y = 2.0 * (1.0 - jnp.exp(-0.5 * t))
    >>> res = ap.solve_nlsq(lambda p, t, y: p[0] * (1 - jnp.exp(-p[1] * t)) - y,
    ...                     jnp.array([1.0, 1.0]), args=(t, y), starts=4)
    >>> [round(float(v), 6) for v in res.x], bool(res.success)
    ([2.0, 0.5], True)
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

from .._tracing import is_concrete
from . import _caches
from ._inputs import broadcast_bounds
from ._arguments import OptionNotOffered, resolve_ladder
from ._rules import runaway as runaway_test
from ._state import Outputs
from .common import Status

__all__ = ["latin_hypercube", "spread_starts", "solve_multistart"]


def latin_hypercube(k: int, n: int, seed: int = 0) -> np.ndarray:
    """``k`` points in ``[0, 1)^n``, one per row, each column a stratified permutation.

    Example:
        >>> from adaptprec.nlsq._multistart import latin_hypercube
        >>> u = latin_hypercube(4, 2, seed=1)
        >>> sorted((u[:, 0] * 4).astype(int).tolist())
        [0, 1, 2, 3]
    """
    rng = np.random.default_rng(seed)
    u = (np.arange(k)[:, None] + rng.uniform(size=(k, n))) / k
    for j in range(n):
        u[:, j] = u[rng.permutation(k), j]
    return u


def spread_starts(x0, k: int, *, lb=None, ub=None, scale=None, spread: float = 0.5,
                  seed: int = 0):
    """``(k, n)`` starts: row 0 is ``x0``; the others a Latin hypercube in the box (both
    bounds finite everywhere) or ``x0 + spread * scale * (2 u - 1)`` clipped into it.

    Example:
        >>> import numpy as np
        >>> from adaptprec.nlsq._multistart import spread_starts
        >>> X = spread_starts(np.array([10.0, 0.0]), 3, spread=0.5, seed=0)
        >>> X.shape, X[0].tolist(), bool(np.all(np.abs(X[1:, 0] - 10.0) <= 5.0))
        ((3, 2), [10.0, 0.0], True)
    """
    # the box is decided on the bounds as given: converted with jnp inside a trace they
    # would be tracers, and jit/vmap would spread the starts differently
    boxed = (lb is not None and ub is not None and is_concrete((lb, ub))
             and bool(np.all(np.isfinite(np.asarray(lb)))
                      and np.all(np.isfinite(np.asarray(ub)))))
    x0 = jnp.asarray(x0)
    n = x0.shape[0]
    u = jnp.asarray(latin_hypercube(k - 1, n, seed), x0.dtype)
    lb = jnp.full((n,), -jnp.inf, x0.dtype) if lb is None else jnp.asarray(lb, x0.dtype)
    ub = jnp.full((n,), jnp.inf, x0.dtype) if ub is None else jnp.asarray(ub, x0.dtype)
    if scale is None:
        scale = jnp.where(x0 != 0, jnp.abs(x0), 1.0)
    around = x0 + spread * jnp.asarray(scale, x0.dtype) * (2.0 * u - 1.0)
    if boxed:
        width = ub - lb
        others = lb + width * (0.001 + 0.998 * u)  # strictly inside
    else:
        eps = 1e-9 * (1.0 + jnp.abs(around))
        others = jnp.clip(around, lb + eps, ub - eps)
    return jnp.concatenate([x0[None], others])


def _flat_residual(residual, unravel, treedef, shapes):
    """One flat-vector wrapper per (residual, x0 structure) (:data:`._caches.RESIDUALS`),
    so the batched engine's compiled program is reused across calls."""
    def flat(x, *a):
        return ravel_pytree(residual(unravel(x), *a))[0]

    try:
        return _caches.RESIDUALS.get_or_build(("starts", residual, treedef, shapes),
                                              lambda: flat)
    except TypeError:   # an unhashable residual
        return flat


def check_starts_options(starts, *, verbose, **options) -> None:
    """Refuse the options the batched engine behind ``starts=`` does not carry (never
    drop one silently): any of ``options`` given (not ``None``), or ``verbose``."""
    given = [k for k, v in options.items() if v is not None] + (
        ["verbose"] if verbose else [])
    if given:
        raise OptionNotOffered(
            f"solve_nlsq(starts={starts}) runs the starts on the batched engine, which "
            f"does not take {', '.join(given)}; drop them, or call solve_nlsq once per "
            "start (starts=1) with those options.")


def solve_multistart(solve_one, residual, x0, args, kw: dict, *, starts: int,
                     throw: bool = False, seed: int = 0, spread: float = 0.5):
    """``starts`` starts of one fit (module docstring). ``solve_one`` is the in-memory
    solve (:func:`.solve.solve_in_memory`, passed by the dispatch so that this module
    imports nothing of it): the plain solve from ``x0`` and the polish run through it,
    the starts on the batched engine.

    Example:
        >>> import jax.numpy as jnp
        >>> import adaptprec as ap
        >>> res = ap.solve_nlsq(lambda x: jnp.array([x[0] ** 2 - 4.0, x[1] - 1.0]),
        ...                     jnp.array([1.0, 0.0]), starts=3, precision="f64")
        >>> [round(abs(float(v)), 6) for v in res.x]
        [2.0, 1.0]
    """
    if not isinstance(starts, (int, np.integer)) or starts < 1:
        raise ValueError(f"starts must be a positive integer or 'auto', got {starts!r}")
    check_starts_options(starts, verbose=kw.get("verbose"), **{
        k: kw.get(k) for k in ("max_nfev", "diff_step", "kwargs", "tr_solver",
                               "tr_options", "jac_sparsity", "callback")})

    def one(x_start):
        return solve_one(residual, x_start, args, kw, outputs=Outputs(throw=throw))[0]

    return _solve_multistart(one, residual, x0, args, kw, starts=starts, seed=seed,
                             spread=spread)


def _solve_multistart(solve_from, residual, x0, args, kw, *, starts, seed, spread):
    from ..batch import solve_nlsq_batch  # (batch's engine loads only with starts=)

    if not isinstance(args, tuple):
        args = (args,)
    single = solve_from(x0)
    if starts == 1:
        return single
    x0_flat, unravel = ravel_pytree(x0)
    top = np.dtype(resolve_ladder(kw.get("precision", "adaptive")).rungs[-1])
    x0_flat = jnp.asarray(x0_flat, top)
    n = x0_flat.shape[0]
    bounds = kw.get("bounds", (-np.inf, np.inf))
    lb, ub = broadcast_bounds(bounds, n, top)
    x_scale = kw.get("x_scale")
    scale = None if x_scale is None or isinstance(x_scale, str) else \
        1.0 / jnp.broadcast_to(jnp.asarray(x_scale, top), (n,))
    X0 = spread_starts(x0_flat, starts, lb=lb, ub=ub, scale=scale, spread=spread, seed=seed)

    flat = _flat_residual(residual, unravel, jax.tree.structure(x0),
                          tuple((np.shape(v), str(jnp.result_type(v)))
                                for v in jax.tree.leaves(x0)))

    has_bounds = (not is_concrete((lb, ub))) or bool(
        np.any(np.isfinite(np.asarray(lb))) or np.any(np.isfinite(np.asarray(ub))))
    batch = solve_nlsq_batch(flat, X0, args, in_axes=None,
                             bounds=(lb, ub) if has_bounds else None,
                             precision=kw.get("precision", "adaptive"),
                             loss=kw.get("loss", "linear"), f_scale=kw.get("f_scale", 1.0),
                             max_steps=kw.get("max_steps"))
    cost = jnp.where(jnp.isfinite(batch.cost), batch.cost, jnp.inf)
    pick = jnp.argmin(jnp.where(batch.success, cost, jnp.inf))
    pick = jnp.where(jnp.any(batch.success), pick, jnp.argmin(cost))
    polished = solve_from(unravel(batch.x[pick].astype(top)))
    # "run off" is judged against the user's x0, not the polish's start (which may have
    # run off already)
    x_pol = ravel_pytree(polished.x)[0]
    # (with the flatness evidence of the polished end's Jacobian, as the loop's test)
    J_pol = jnp.reshape(jnp.asarray(polished.jac), (-1, n)).astype(top)
    R_pol = jnp.linalg.qr(J_pol, mode="r")[:n] if J_pol.shape[0] >= n else jnp.linalg.qr(
        jnp.concatenate([J_pol, jnp.zeros((n - J_pol.shape[0], n), top)]), mode="r")
    runaway = runaway_test(polished.status, x_pol, jnp.linalg.norm(x0_flat), R_pol,
                       jnp.linalg.norm(jnp.ravel(jnp.asarray(polished.fun))))
    status = jnp.asarray(polished.status)
    polished = dataclasses.replace(polished, status=jnp.where(
        runaway, jnp.asarray(int(Status.RUNAWAY), status.dtype), status))
    better = (polished.success & ~single.success) | (
        (polished.success == single.success) & (polished.cost < single.cost))
    out = jax.tree.map(lambda a, b: jnp.where(better, a, b), polished, single)
    # the work done is every solve's, not the returned one's
    # (njev is None for lm, in both solves alike; the batch counts every field)
    return dataclasses.replace(out, **{
        k: jnp.asarray(getattr(single, k) + jnp.sum(getattr(batch, k)) + getattr(polished, k),
                       jnp.asarray(getattr(out, k)).dtype)
        for k in ("nfev", "njev", "nit") if getattr(out, k) is not None})
