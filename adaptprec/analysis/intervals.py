"""Profile-likelihood confidence intervals, all profile fits at once on the batched engine.

For parameter ``j`` fixed at a value ``v`` the other parameters are re-fitted; the
profile is ``Δχ²(v) = χ²_min(p_j = v) - χ²_min``. The interval at ``level`` is where the
profile stays below a threshold:

- ``absolute_sigma=False`` (the noise level estimated from the residuals; the default):
  the F test lmfit's ``conf_interval`` uses, ``Δχ² = χ²_min · F_{1,dof}(level) / dof``
  (``F_{1,dof}(level) = t_{dof}((1 + level)/2)²``). For a model linear in its parameters
  this reproduces the Wald-t interval exactly.
- ``absolute_sigma=True`` (known noise): the likelihood-ratio threshold
  ``Δχ² = χ²_1(level)`` (1 for 68.3 %, 3.84 for 95 %).

The profile fits (every parameter, ``points`` values on each side of the optimum, out to
``span`` Wald half-widths) run in one :func:`~adaptprec.solve_nlsq_batch` call in float64
(the top rung), each started at the Gaussian conditional mean of the other parameters
(a failed start is retried from the optimum). The crossing is interpolated in the
signed root ``±sqrt(Δχ²)``, which is linear in ``v`` for a linear model, then refined by
regula falsi (``refine`` rounds, each one more batched solve of every crossing at once).
A profile that never reaches the threshold gives an open end: the bound if the grid
reached one, else ``±inf``; ``lower_open``/``upper_open`` say which.

Example:
    >>> import numpy as np, jax.numpy as jnp
    >>> import adaptprec as ap
    >>> x = np.linspace(0.0, 1.0, 10)
    >>> y = 2.0 * x + 1.0 + np.array([1, -1, 1, 1, -1, -1, 1, -1, -1, 1]) * 0.05
    >>> res = ap.fit(lambda x, a, b: a * x + b, x, y)
    >>> prof = res.profile_intervals(0.95)
    >>> wald = res.wald_intervals(0.95)
    >>> bool(np.allclose(prof.lower[:, 0], wald[:, 0], rtol=1e-6))   # linear: equal
    True
"""

from __future__ import annotations

import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.linalg import solve_triangular

from .._pytree import Module, field
from ..precision import x64_enabled
from ._quantiles import two_sided_quantile

__all__ = ["ProfileIntervals", "profile_intervals", "profile_threshold"]


class ProfileIntervals(Module):
    """Profile-likelihood intervals of a fit (NumPy arrays).

    ``lower``/``upper`` ``(n, L)`` per parameter and level (``levels``); ``thresholds``
    ``(L,)`` the Δχ² crossed; ``lower_open``/``upper_open`` ``(n, L)`` the profile did not
    reach the threshold on that side; ``grid``/``dchi2`` ``(n, G)`` the profile itself
    (sorted values of the parameter, the optimum included), for plotting;
    ``min_dchi2`` the lowest profile value found (below ``-1e-6 χ²_min``: the fit was not
    at the minimum); ``rule`` ``"F"`` or ``"chi2"``.
    """

    popt: Any
    lower: Any
    upper: Any
    thresholds: Any
    lower_open: Any
    upper_open: Any
    grid: Any
    dchi2: Any
    min_dchi2: Any
    names: tuple = field(static=True)
    levels: tuple = field(static=True)
    rule: str = field(static=True)

    def interval(self, name: str, level=None):
        """``(lower, upper)`` of one parameter (the first level by default)."""
        i = self.names.index(name)
        k = 0 if level is None else self.levels.index(level)
        return float(self.lower[i, k]), float(self.upper[i, k])

    def __str__(self) -> str:
        head = "".join(f"  {lv:>8.2%} lower   upper" for lv in self.levels)
        w = max(len(n) for n in self.names)
        out = [f"profile-likelihood intervals ({self.rule} threshold)",
               f"    {'':<{w}} {'best':>11}{head}"]
        for i, n in enumerate(self.names):
            cells = ""
            for k in range(len(self.levels)):
                lo = f"{self.lower[i, k]:.6g}" + ("*" if self.lower_open[i, k] else "")
                hi = f"{self.upper[i, k]:.6g}" + ("*" if self.upper_open[i, k] else "")
                cells += f"  {lo:>12} {hi:>12}"
            out.append(f"    {n:<{w}} {self.popt[i]:>11.6g}{cells}")
        if self.lower_open.any() or self.upper_open.any():
            out.append("    * the profile did not reach the threshold on this side "
                       "(bound, or beyond span)")
        return "\n".join(out)


def profile_threshold(level: float, chi2_min: float, dof: int, absolute_sigma: bool):
    """The Δχ² a profile crosses at ``level`` (module docstring: F or χ²₁ rule)."""
    if absolute_sigma:
        return float(two_sided_quantile(level, None)) ** 2
    return chi2_min * float(two_sided_quantile(level, dof)) ** 2 / dof


@functools.lru_cache(maxsize=64)
def _residual_fn(model, kind):
    """One residual function per model (the batched solve's compiled program is reused
    across calls)."""
    def residual(q, E, e, v, x, y, W):
        p = E @ q + e * v
        f = jnp.ravel(model(x, *[p[i] for i in range(p.shape[0])])) - y
        if kind == "2d":
            return solve_triangular(W, f, lower=True)
        return f * W
    return residual


def _whitening(res):
    """``("1d", weights)`` or ``("2d", L)`` as curve_fit builds its residual."""
    m = res.nobs
    if res.sigma is None:
        return "1d", np.ones(m)
    s = np.asarray(res.sigma, np.float64)
    if s.size == 1 or s.shape == (m,):
        return "1d", np.broadcast_to(1.0 / s.reshape(-1), (m,)).copy()
    return "2d", np.linalg.cholesky(s)


class _Profiler:
    """Evaluates ``Δχ²`` at ``(parameter index, value)`` pairs with one batched solve."""

    def __init__(self, res):
        from ..batch import solve_nlsq_batch

        self.solve = solve_nlsq_batch
        self.res = res
        self.n = res.nparams
        self.p = np.asarray(res.popt, np.float64)
        self.cov = np.asarray(res.cov_identifiable, np.float64)
        self.lb = np.asarray(res.lower_bounds, np.float64)
        self.ub = np.asarray(res.upper_bounds, np.float64)
        kind, self.W = _whitening(res)
        self.fun = _residual_fn(res.model, kind)
        self.x = res.xdata
        self.y = np.asarray(res.ydata, np.float64)
        self.chi2 = float(res.chi2)
        self.size = None   # the batch size of the first call (the grid)

    def _embed(self, j):
        others = [i for i in range(self.n) if i != j]
        E = np.zeros((self.n, self.n - 1))
        E[others, np.arange(self.n - 1)] = 1.0
        e = np.zeros(self.n)
        e[j] = 1.0
        return others, E, e

    def _inside(self, q, lo, hi):
        width = np.where(np.isfinite(hi - lo), hi - lo, 1.0)
        return np.clip(q, lo + 1e-10 * width, hi - 1e-10 * width)

    def __call__(self, js, vs):
        js = np.asarray(js, int)
        vs = np.asarray(vs, np.float64)
        B = js.size
        if B == 0:
            return np.zeros(0)
        if self.size is None:
            self.size = B
        if B < self.size:  # one batch size for every call: one compiled solve
            pad = self.size - B
            return self(np.r_[js, np.repeat(js[-1:], pad)], np.r_[vs, np.repeat(vs[-1:], pad)]
                        )[:B]
        if self.n == 1:  # nothing to re-fit: chi-square at the value
            p = vs[:, None]
            r = jax.vmap(lambda q: self.fun(jnp.zeros(0), jnp.ones((1, 0)), jnp.ones(1), q[0],
                                            self.x, self.y, self.W))(p)
            return np.asarray(jnp.sum(r * r, axis=1)) - self.chi2
        Es, es, Q_cond, Q_best, LB, UB = [], [], [], [], [], []
        for j, v in zip(js, vs):
            others, E, e = self._embed(j)
            Es.append(E)
            es.append(e)
            lo, hi = self.lb[others], self.ub[others]
            slope = self.cov[others, j] / self.cov[j, j] if self.cov[j, j] > 0 else 0.0
            Q_cond.append(self._inside(self.p[others] + slope * (v - self.p[j]), lo, hi))
            Q_best.append(self._inside(self.p[others], lo, hi))
            LB.append(lo)
            UB.append(hi)
        args = (np.stack(Es), np.stack(es), vs, self.x, self.y, self.W)
        bounded = np.isfinite(self.lb).any() or np.isfinite(self.ub).any()
        bounds = (np.stack(LB), np.stack(UB)) if bounded else None
        out = self._solve(np.stack(Q_cond), args, bounds)
        retry = ~np.isfinite(out)
        if retry.any():  # a start that failed: again from the optimum's values (the
            # whole batch, to keep its size; only the failed fits are taken)
            again = self._solve(np.where(retry[:, None], np.stack(Q_best),
                                         np.stack(Q_cond)), args, bounds)
            out[retry] = again[retry]
        return out

    def _solve(self, Q0, args, bounds):
        r = self.solve(self.fun, Q0, args, in_axes=(0, 0, 0, None, None, None),
                       bounds=bounds, precision="f64")
        cost = np.asarray(r.cost, np.float64)
        ok = np.asarray(r.status) > 0
        return np.where(ok & np.isfinite(cost), 2.0 * cost - self.chi2, np.nan)


def profile_intervals(result, level=0.95, *, points: int = 8, span: float = 4.0,
                      refine: int = 2, params=None) -> ProfileIntervals:
    """Profile-likelihood intervals of a :class:`~adaptprec.FitResult`.

    Args:
        result: the fit.
        level: a coverage or a sequence of them (0.95; ``0.6827`` is "1 sigma").
        points: profile values per side of the optimum (the grid).
        span: the grid reaches ``span`` Wald half-widths (at the largest level) from the
            optimum, clipped to the bounds; widen it for strongly asymmetric profiles.
        refine: regula-falsi rounds at each crossing (one batched solve each).
        params: names of the parameters to profile (default: every identifiable one;
            the others get ``(-inf, inf)``, open).

    Returns:
        :class:`ProfileIntervals`.
    """
    if x64_enabled():
        return _profile(result, level, points, span, refine, params)
    from .._x64_scope import float64_scope

    with float64_scope():
        return _profile(result, level, points, span, refine, params)


def _profile(res, level, points, span, refine, params) -> ProfileIntervals:
    levels = tuple(float(v) for v in np.atleast_1d(level))
    if not all(0.0 < lv < 1.0 for lv in levels):
        raise ValueError(f"level must be in (0, 1), got {level!r}")
    if int(points) < 2:
        raise ValueError(f"points must be at least 2, got {points!r}")
    n, L = res.nparams, len(levels)
    if res.dof <= 0:
        raise ValueError("no degrees of freedom: profile intervals need more data points "
                         "than identifiable parameters")
    names = res.names
    want = list(names) if params is None else list(params)
    unknown = [w for w in want if w not in names]
    if unknown:
        raise ValueError(f"unknown parameter(s) {unknown}; the fit's are {list(names)}")
    ident = np.asarray(res.identifiable)
    which = [names.index(w) for w in want if ident[names.index(w)]]
    p = np.asarray(res.popt, np.float64)
    se = np.asarray(res.stderr, np.float64)
    lb, ub = np.asarray(res.lower_bounds), np.asarray(res.upper_bounds)
    thr = np.array([profile_threshold(lv, float(res.chi2), res.dof, res.absolute_sigma)
                    for lv in levels])
    half = max(float(two_sided_quantile(lv, None if res.absolute_sigma else res.dof))
               for lv in levels) * se
    prof = _Profiler(res)

    # the grid: `points` values per side, out to `span` half-widths, clipped to the bounds
    steps = np.arange(1, points + 1) / points * span
    js, vs = [], []
    for j in which:
        for sign in (-1.0, 1.0):
            v = np.clip(p[j] + sign * steps * half[j], lb[j], ub[j])
            js += [j] * points
            vs += list(v)
    js, vs = np.array(js, int), np.array(vs)
    d = prof(js, vs)

    lower = np.full((n, L), -np.inf)
    upper = np.full((n, L), np.inf)
    lower_open = np.ones((n, L), bool)
    upper_open = np.ones((n, L), bool)
    grids = np.full((n, 2 * points + 1), np.nan)
    dchi = np.full((n, 2 * points + 1), np.nan)
    brackets = []   # (j, side, level k, v_in, z_in, v_out, z_out)
    for a, j in enumerate(which):
        sl = slice(2 * a * points, 2 * (a + 1) * points)
        vj, dj = vs[sl], d[sl]
        order = np.argsort(np.r_[vj, p[j]], kind="stable")
        grids[j] = np.r_[vj, p[j]][order]
        dchi[j] = np.r_[dj, 0.0][order]
        for s, side in enumerate((-1, 1)):
            v_side = np.r_[p[j], vj[s * points:(s + 1) * points]]
            z_side = np.sqrt(np.maximum(np.r_[0.0, dj[s * points:(s + 1) * points]], 0.0))
            for k in range(L):
                zt = math.sqrt(thr[k])
                above = np.flatnonzero(np.nan_to_num(z_side, nan=-1.0) >= zt)
                if above.size == 0:
                    end = v_side[-1]
                    at_bound = (side < 0 and end <= lb[j]) or (side > 0 and end >= ub[j])
                    if at_bound:
                        (lower if side < 0 else upper)[j, k] = end
                    continue
                i = above[0]
                brackets.append([j, side, k, v_side[i - 1], z_side[i - 1], v_side[i],
                                 z_side[i]])

    def crossing(b, zt):
        _, _, _, v0, z0, v1, z1 = b
        t = (zt - z0) / (z1 - z0) if z1 != z0 else 0.5
        return v0 + t * (v1 - v0)

    for _ in range(int(refine)):
        if not brackets:
            break
        zts = [math.sqrt(thr[b[2]]) for b in brackets]
        vnew = np.array([crossing(b, zt) for b, zt in zip(brackets, zts)])
        dnew = prof(np.array([b[0] for b in brackets]), vnew)
        for b, zt, v, dv in zip(brackets, zts, vnew, dnew):
            if not np.isfinite(dv):
                continue
            z = math.sqrt(max(dv, 0.0))
            if z < zt:
                b[3], b[4] = v, z
            else:
                b[5], b[6] = v, z
    for b in brackets:
        j, side, k = b[0], b[1], b[2]
        v = crossing(b, math.sqrt(thr[k]))
        if side < 0:
            lower[j, k], lower_open[j, k] = v, False
        else:
            upper[j, k], upper_open[j, k] = v, False
    min_d = float(np.nanmin(d)) if d.size and np.isfinite(d).any() else 0.0
    return ProfileIntervals(popt=p, lower=lower, upper=upper, thresholds=thr,
                            lower_open=lower_open, upper_open=upper_open, grid=grids,
                            dchi2=dchi, min_dchi2=min_d, names=names, levels=levels,
                            rule="chi2" if res.absolute_sigma else "F")
