"""``starts="auto"``: a global search only when the local fit asks for one.

The local fit from ``x0`` (as ``starts=1``) is accepted unless it failed (or the residual
is not finite at ``x0``), a Jacobian column is all zero (a parameter the data never saw),
or the cost is far above the noise (:func:`noise_test`: with absolute ``sigma``, ``chi^2``
beyond its ``1e-6`` tail; else the residual variance more than :data:`NOISE_RATIO` times
the noise variance of its successive differences, von Neumann's ratio ``2 / DW``: a
wrong minimum leaves a smooth, correlated misfit). Otherwise further local fits run one
after another from Latin-hypercube starts across decades (:func:`auto_starts`), lowest
screened cost first, until one would be accepted, ``max_starts`` have run or the budget
is spent; the best fit (a success first, then the lower cost), the local one included,
is returned as a :class:`SearchResult`.

**The budget is in residual evaluations** (the answer depends on the inputs alone):
``max(SEARCH_FACTOR * nfev_local, SEARCH_MIN_NFEV * (n + 1))``, or ``nfev_budget``. A
user's ``AutoStarts(seconds=...)`` (without ``nfev_budget``) replaces it by a wall-time
budget, not reproducible under load.
With ``throw=True`` the answer raises only if it failed after the search. Eager only
(``starts=K`` runs traced).

Example:
    >>> import numpy as np
    >>> import jax.numpy as jnp
    >>> import adaptprec as ap
    >>> x = np.linspace(0.0, 10.0, 200)
    >>> noise = 0.1 * np.random.default_rng(0).standard_normal(200)
    >>> y = 4.0 * np.exp(-0.5 * ((x - 6.2) / 0.7) ** 2) + 1.0 + noise
    >>> def r(p, x, y):
    ...     return p[0] * jnp.exp(-0.5 * ((x - p[1]) / p[2]) ** 2) + p[3] - y
    >>> res = ap.solve_nlsq(r, np.ones(4), args=(x, y), starts="auto")
    >>> round(float(res.x[1]), 2), res.starts_run > 0
    (6.2, True)
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, NamedTuple

import jax
import numpy as np
from jax.flatten_util import ravel_pytree

from .._pytree import field
from .._tracing import is_concrete
from . import _caches
from ._inputs import broadcast_bounds
from ._arguments import as_bounds
from ._multistart import latin_hypercube
from ._start import NonFiniteStartError
from .result import NLSQResult

__all__ = ["AutoStarts", "SearchResult", "auto_starts", "noise_test", "needs_search",
           "solve_auto", "for_curve_fit"]

#: residual variance over its successive-difference noise estimate beyond which the fit
#: is judged far above the noise (no sigma given): ``2 / DW > 4``
NOISE_RATIO = 4.0
#: the chi-square upper tail (with absolute sigma) judged "far above": ``1e-6``
CHI2_TAIL_Z = 4.753
#: degrees of freedom ``m - n`` below which the noise is not judged (too few points)
MIN_DOF = 6
#: the search's evaluation budget: this many times the local fit's ``nfev`` ...
SEARCH_FACTOR = 10
#: ... and at least this many per parameter (plus one): a cheap local fit (a few steps
#: to a wrong minimum) must still leave room for several starts
SEARCH_MIN_NFEV = 100
#: with an explicit ``seconds`` budget, these first fits run whatever the clock says
MIN_STARTS = 4


class AutoStarts(NamedTuple):
    """Options of ``starts="auto"`` (``solve_nlsq(starts=AutoStarts(...))``).

    ``noise``: ``"diff"`` (successive differences estimate the noise) or ``"chi2"``
    (residuals whitened by absolute sigma); ``order``: the data order for ``"diff"``;
    ``max_starts``: fits beyond the local one (``None``: ``10 (n + 1)``);
    ``nfev_budget``: evaluations of the search's fits (``None``: the module's default);
    ``seconds``: a wall-time budget checked between fits, the first :data:`MIN_STARTS`
    regardless (makes the answer depend on the machine's load); ``seed``."""

    noise: str = "diff"
    order: Any = None
    max_starts: int | None = None
    seconds: float | None = None
    nfev_budget: int | None = None
    seed: int = 0


class SearchResult(NLSQResult):
    """:class:`~adaptprec.NLSQResult` of ``starts="auto"``: ``starts_run`` (fits beyond
    the one from ``x0``) and ``search`` (what the search did, appended to ``message``);
    ``nfev``/``njev``/``nit`` count every fit."""

    starts_run: int = field(static=True, default=0)
    search: str = field(static=True, default="")

    @property
    def message(self) -> str:
        base = NLSQResult.message.fget(self)
        return f"{base} [{self.search}]" if self.search else base


def as_auto(starts) -> AutoStarts | None:
    """``AutoStarts`` for ``"auto"`` or an ``AutoStarts``; ``None`` for anything else."""
    if isinstance(starts, AutoStarts):
        return starts
    if isinstance(starts, str) and starts == "auto":
        return AutoStarts()
    return None


def _chi2_quantile(dof: int, z: float = CHI2_TAIL_Z) -> float:
    """Wilson-Hilferty: the chi-square quantile of ``dof`` degrees at normal score z."""
    a = 2.0 / (9.0 * dof)
    return dof * (1.0 - a + z * np.sqrt(a)) ** 3


def noise_test(fun, cost, n: int, noise: str = "diff", order=None, jx=None) -> str:
    """Why the cost is far above the noise (module docstring), or ``""``."""
    r = np.ravel(np.asarray(fun, np.float64))
    m = r.size
    dof = m - n
    if dof < MIN_DOF or not np.isfinite(cost):
        return ""
    if noise == "chi2":
        chi2 = 2.0 * float(cost)
        q = _chi2_quantile(dof)
        if chi2 > q:
            return (f"chi^2/(m-n) = {chi2 / dof:.3g}, beyond its 1e-6 tail "
                    f"({q / dof:.3g}) for sigma as given")
        return ""
    if order is not None:
        r = r[np.asarray(order)]
    ss = float(r @ r)
    if jx is not None and ss <= (1e-10 * float(np.linalg.norm(jx))) ** 2:
        return ""  # a zero-residual fit: rounding noise has no structure to judge
    d = np.diff(r)
    noise2 = float(d @ d) / (2.0 * (m - 1))
    s2 = ss / dof
    if noise2 == 0.0:
        return "" if s2 == 0.0 else "the residual is constant and not zero"
    if s2 > NOISE_RATIO * noise2:
        return (f"residual variance {s2 / noise2:.3g}x the noise estimated from its "
                f"successive differences (a smooth misfit left)")
    return ""


def needs_search(res, auto: AutoStarts) -> str:
    """Why ``res`` (an eager result) is not accepted as the answer, or ``""``."""
    status = int(np.asarray(res.status))
    if status <= 0:
        return f"the local fit did not succeed (status {status})"
    if res.jac is None or res.fun is None:
        return ""
    J = np.asarray(res.jac, np.float64)
    if J.ndim == 2:
        zero = np.flatnonzero(~np.any(J != 0.0, axis=0))
        if zero.size:
            return (f"parameter(s) {zero.tolist()} have all-zero Jacobian columns (the "
                    "data never saw them)")
    x = np.ravel(np.asarray(ravel_pytree(res.x)[0], np.float64))
    jx = J @ x if J.ndim == 2 and J.shape[1] == x.size else None
    return noise_test(res.fun, res.cost, x.size, auto.noise, auto.order, jx)


def auto_starts(x0, k: int, lb, ub, seed: int = 0) -> np.ndarray:
    """``(k, n)`` starts for the search (module docstring; ``x0`` itself not included)."""
    x0 = np.asarray(x0, np.float64)
    n = x0.size
    lb = np.broadcast_to(np.asarray(lb, np.float64), (n,))
    ub = np.broadcast_to(np.asarray(ub, np.float64), (n,))
    u = latin_hypercube(k, 2 * n, seed)
    mag_u, sign_u = u[:, :n], u[:, n:]
    decades = 1.0 + (np.arange(k) % 4)[:, None]          # 1, 2, 3, 4, 1, ... decades
    boxed = np.isfinite(lb) & np.isfinite(ub)
    wide = boxed & (lb > 0) & (ub >= 1e3 * np.where(lb > 0, lb, 1.0))
    out = np.empty((k, n))
    inside = 0.001 + 0.998 * mag_u
    if np.any(boxed):
        out[:, boxed] = lb[boxed] + (ub[boxed] - lb[boxed]) * inside[:, boxed]
    if np.any(wide):
        llb, lub = np.log10(lb[wide]), np.log10(ub[wide])
        out[:, wide] = 10.0 ** (llb + (lub - llb) * inside[:, wide])
    free = ~boxed
    if np.any(free):
        # from a one-sided bound: the distance to it; otherwise around x0's magnitude
        ref = np.where(np.isfinite(lb), lb, np.where(np.isfinite(ub), ub, 0.0))
        dist = np.abs(x0 - ref)
        scale = np.where(dist > 0, dist, np.where(x0 != 0, np.abs(x0), 1.0))
        mag = scale * 10.0 ** (decades * (2.0 * mag_u - 1.0))
        sign0 = np.where(np.isfinite(lb), 1.0, np.where(np.isfinite(ub), -1.0,
                                                        np.where(x0 < 0, -1.0, 1.0)))
        keep = np.where((x0 == 0) & ~np.isfinite(lb) & ~np.isfinite(ub), 0.5, 0.75)
        flip = ~np.isfinite(lb) & ~np.isfinite(ub) & (sign_u > keep)
        sign = np.where(flip, -sign0, sign0)
        vals = ref + sign * mag
        out[:, free] = vals[:, free]
    eps = 1e-9 * (1.0 + np.abs(out))
    return np.clip(out, lb + eps, ub - eps)


def _screen_costs(residual, x0, X, args, kwargs) -> np.ndarray:
    """``0.5 ||r(x)||^2`` at every row of ``X`` (one vmapped program per residual and
    structure, :data:`._caches.RESIDUALS`; ``inf`` where not finite)."""
    leaves = jax.tree.leaves(x0)
    key = ("screen", residual, jax.tree.structure(x0),
           tuple((np.shape(v), str(np.result_type(v))) for v in leaves), len(args),
           tuple(sorted(kwargs or {})))
    unravel = ravel_pytree(x0)[1]

    def build():
        def cost(x, a, kw):
            f = ravel_pytree(residual(unravel(x), *a, **kw))[0]
            return 0.5 * jax.numpy.sum(f * f)
        return jax.jit(jax.vmap(cost, in_axes=(0, None, None)))

    program = _caches.RESIDUALS.get_or_build(key, build)
    c = np.asarray(program(X, args, kwargs or {}), np.float64)
    return np.where(np.isfinite(c), c, np.inf)


def _better(a, b) -> bool:
    """``a`` before ``b``: a success before a failure, then the lower cost."""
    sa, sb = int(np.asarray(a.status)) > 0, int(np.asarray(b.status)) > 0
    ca, cb = float(np.asarray(a.cost)), float(np.asarray(b.cost))
    ca = ca if np.isfinite(ca) else np.inf
    cb = cb if np.isfinite(cb) else np.inf
    return (sa and not sb) or (sa == sb and ca < cb)


def _counts(results, out):
    return {k: np.asarray(sum(int(np.asarray(getattr(r, k))) for r in results),
                          np.asarray(getattr(out, k)).dtype)
            for k in ("nfev", "njev", "nit") if getattr(out, k) is not None}


def _as_search(res, **fields) -> SearchResult:
    names = [f.name for f in dataclasses.fields(NLSQResult)]
    return SearchResult(**{k: getattr(res, k) for k in names}, **fields)


def solve_auto(solve_one, residual, x0, args, kw: dict, *, auto: AutoStarts,
               throw: bool = False):
    """``starts="auto"`` (module docstring); ``solve_one`` is the in-memory solve
    (:func:`.solve.solve_in_memory`, passed by the dispatch)."""
    if not (is_concrete(jax.tree.leaves(x0)) and is_concrete(jax.tree.leaves(args))
            and is_concrete(jax.tree.leaves(kw.get("bounds")))):
        raise ValueError(
            "starts='auto' runs its fits one after another and judges them on the host, "
            "so it needs concrete inputs; inside jit/vmap use starts=K (K starts on the "
            "batched engine, traceable) or call solve_nlsq(starts='auto') outside jit.")
    if auto.noise not in ("diff", "chi2"):
        raise ValueError(f"AutoStarts.noise must be 'diff' or 'chi2', got {auto.noise!r}")

    def fit(start, raise_start):
        return solve_one(residual, start, args, kw, raise_start=raise_start)[0]

    local_error = None
    try:
        local = fit(x0, True)
    except NonFiniteStartError as exc:  # look for a finite start instead
        local, local_error = None, exc
    why = "the residual is not finite at x0" if local is None else needs_search(local, auto)
    if not why:
        return _raise_if_failed(_as_search(local), throw)
    flat, unravel = ravel_pytree(x0)
    x0_flat = np.ravel(np.asarray(flat, np.float64))
    plain = isinstance(x0, (np.ndarray, jax.Array)) and np.ndim(x0) == 1
    n = x0_flat.size
    lb, ub = broadcast_bounds(as_bounds(kw.get("bounds", (-np.inf, np.inf)), n), n,
                              np.float64)
    lb, ub = np.asarray(lb, np.float64), np.asarray(ub, np.float64)
    k = auto.max_starts if auto.max_starts is not None else 10 * (n + 1)
    starts = auto_starts(x0_flat, k, lb, ub, auto.seed)
    costs = _screen_costs(residual, x0, starts, args, kw.get("kwargs"))
    order = np.argsort(costs, kind="stable")[:int(np.isfinite(costs).sum())]
    skipped = k - order.size
    local_nfev = 0 if local is None else int(np.asarray(local.nfev))
    if auto.nfev_budget is not None:
        budget = auto.nfev_budget
    elif auto.seconds is not None:   # the user's time budget alone
        budget = float("inf")
    else:
        budget = max(SEARCH_FACTOR * local_nfev, SEARCH_MIN_NFEV * (n + 1))
    deadline = None if auto.seconds is None else time.perf_counter() + auto.seconds
    results = [] if local is None else [local]
    best, best_i, run, nfev = local, 0, 0, 0
    stop = f"every start with a finite cost run (max_starts={k})"
    for i in order + 1:
        if nfev >= budget:
            stop = f"the budget of {budget} evaluations spent"
            break
        if deadline is not None and run >= MIN_STARTS and time.perf_counter() > deadline:
            stop = f"the time budget of {auto.seconds:g} s spent"
            break
        run += 1
        s = starts[i - 1]
        try:
            res = fit(s if plain else unravel(s), False)
        except (ArithmeticError, ValueError):  # a start the model rejects: next one
            continue
        results.append(res)
        nfev += int(np.asarray(res.nfev))
        if int(np.asarray(res.status)) in (-3, -4):  # not finite there: no fit
            continue
        if best is None or _better(res, best):
            best, best_i = res, i
        if not needs_search(res, auto):
            stop = f"start {i} passed the tests"
            break
    if best is None:   # (with throw=True too: the same error as without the search)
        raise NonFiniteStartError(
            f"{local_error} starts='auto' found no start with finite residuals among "
            f"{k} tried.") from None
    won = "the local fit kept" if best is local else f"the best from start {best_i}"
    search = (f"starts='auto': {why}; {run} start(s) run with {nfev} evaluations (of {k}, "
              f"ranked by their cost, {skipped} not finite), {won}; stopped: {stop}")
    return _raise_if_failed(_as_search(dataclasses.replace(best, **_counts(results, best)),
                                       starts_run=run, search=search), throw)


def _raise_if_failed(res: SearchResult, throw: bool) -> SearchResult:
    """``res``; with ``throw=True`` and a failed answer, ``solve_nlsq(throw=True)``'s
    ``equinox.EquinoxRuntimeError``, its message ending with what the search did."""
    if throw and not int(np.asarray(res.status)) > 0:
        import equinox as eqx  # only on this path: its import is slow
        from .._status import status_message
        code = int(np.asarray(res.status))
        raise eqx.EquinoxRuntimeError(
            f"solve_nlsq failed (status {code}): {status_message(code)}"
            + (f" [{res.search}]" if res.search else ""))
    return res


def for_curve_fit(starts, kind: str, absolute_sigma: bool, xdata) -> AutoStarts | None:
    """curve_fit's ``starts="auto"``: the chi-square test with absolute ``sigma`` (``kind``
    ``"1d"``/``"2d"``), else the successive-difference test in ``xdata``'s order (1-D
    ``xdata``; as given otherwise). ``None`` when ``starts`` is not ``"auto"``.

    Example:
        >>> import numpy as np
        >>> from adaptprec.nlsq._auto_starts import for_curve_fit
        >>> a = for_curve_fit("auto", "none", False, np.array([3.0, 1.0, 2.0]))
        >>> a.noise, a.order.tolist(), for_curve_fit(1, "none", False, None)
        ('diff', [1, 2, 0], None)
    """
    auto = as_auto(starts)
    if auto is None or isinstance(starts, AutoStarts):
        return auto
    if kind != "none" and absolute_sigma:
        return auto._replace(noise="chi2")
    order = None
    if isinstance(xdata, (np.ndarray, jax.Array)) and np.ndim(xdata) == 1 and \
            is_concrete(xdata):
        order = np.argsort(np.asarray(xdata), kind="stable")
    return auto._replace(order=order)
