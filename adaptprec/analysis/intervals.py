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
from typing import Any, NamedTuple

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
    across calls): least squares whitened by ``W``, or Poisson's deviance residuals."""
    def residual(q, E, e, v, x, y, W):
        p = E @ q + e * v
        f = jnp.ravel(model(x, *[p[i] for i in range(p.shape[0])]))
        if kind == "poisson":
            from ..modeling.likelihood import deviance_residual

            return deviance_residual(f, y)
        f = f - y
        if kind == "2d":
            return solve_triangular(W, f, lower=True)
        return f * W
    return residual


@functools.lru_cache(maxsize=16)
def _nll_profile(model, nll):
    """``2 nll`` minimised over the other parameters, vmapped over the profile points
    (a user's likelihood: the Newton solver, :mod:`._newton`)."""
    from ._newton import minimize_nll

    def objective(q, E, e, v, x, y):
        p = E @ q + e * v
        return jnp.sum(nll(y, jnp.ravel(model(x, *[p[i] for i in range(p.shape[0])]))))

    def one(q0, E, e, v, x, y, lb, ub):
        st = minimize_nll(objective, q0, lb, ub, args=(E, e, v, x, y))
        return 2.0 * st.f, st.status

    return jax.jit(jax.vmap(one, in_axes=(0, 0, 0, 0, None, None, 0, 0)))


class FreeView(NamedTuple):
    """A fit on its free coordinates (:mod:`adaptprec.modeling.parameters`): what the
    profile re-fits. ``model`` is ``g(x, *q)``; ``index[i]`` is parameter ``i``'s free
    coordinate (``-1`` for a fixed or tied one)."""

    model: Any
    popt: Any
    cov: Any
    lower: Any
    upper: Any
    names: tuple
    identifiable: Any
    index: tuple


def free_view(res) -> FreeView:
    """The free coordinates of a :class:`~adaptprec.FitResult`."""
    spec = res.parameters
    if spec is None or spec.trivial:
        return FreeView(res.model, np.asarray(res.popt, np.float64),
                        np.asarray(res.cov_identifiable, np.float64),
                        np.asarray(res.lower_bounds), np.asarray(res.upper_bounds),
                        tuple(res.names), np.asarray(res.identifiable),
                        tuple(range(res.nparams)))
    from ..modeling.parameters import reduced_model

    if res.model is None:
        raise ValueError("profile intervals need the model: pass model= to "
                         "FitResult.from_json")
    return FreeView(reduced_model(res.model, spec, res.fixed_values),
                    spec.free_values(res.popt, res.fixed_values),
                    np.asarray(res.free_cov, np.float64), np.asarray(res.free_lower),
                    np.asarray(res.free_upper), spec.free,
                    np.asarray(res.free_identifiable),
                    tuple(spec.free.index(n) if n in spec.free else -1
                          for n in spec.names))


def _data(res, model):
    """``(model, kind, x, y, W)`` of the profile's residual: least squares whitened as
    curve_fit does, Poisson's deviance, a complex model as its real parts."""
    y = np.asarray(res.ydata)
    if res.likelihood == "poisson":
        return model, "poisson", res.xdata, y.astype(np.float64), np.ones(1)
    m = y.size
    sigma = res.sigma
    if res.complex_points:
        from ..modeling.complex_model import real_data, real_model, real_sigma

        model, y, sigma = real_model(model), np.asarray(real_data(y)), real_sigma(sigma, m)
        m = y.size
    y = y.astype(np.float64)
    if sigma is None:
        return model, "1d", res.xdata, y, np.ones(m)
    s = np.asarray(sigma, np.float64)
    if s.size == 1 or s.shape == (m,):
        return model, "1d", res.xdata, y, np.broadcast_to(1.0 / s.reshape(-1), (m,)).copy()
    return model, "2d", res.xdata, y, np.linalg.cholesky(s)


class _Profiler:
    """Evaluates ``Δχ²`` (or the deviance's, or ``2 Δnll``'s) at ``(coordinate index,
    value)`` pairs of the free coordinates, with one batched solve."""

    def __init__(self, res, view: FreeView):
        from ..batch import solve_nlsq_batch

        self.solve = solve_nlsq_batch
        self.n = len(view.names)
        self.p = np.asarray(view.popt, np.float64)
        self.cov = np.asarray(view.cov, np.float64)
        self.lb = np.asarray(view.lower, np.float64)
        self.ub = np.asarray(view.upper, np.float64)
        self.chi2 = float(res.chi2)
        self.size = None   # the batch size of the first call (the grid)
        self.nll = res.likelihood if callable(res.likelihood) else None
        if self.nll is not None:
            self.x, self.y = res.xdata, np.asarray(res.ydata, np.float64)
            self.model = view.model
            self.fun = _nll_profile(view.model, self.nll)
            return
        model, kind, self.x, self.y, self.W = _data(res, view.model)
        self.fun = _residual_fn(model, kind)

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

    def _at(self, vs):
        """Δ at each value of the single coordinate (nothing to re-fit)."""
        if self.nll is not None:
            model, x, y = self.model, self.x, self.y
            total = jax.vmap(lambda v: 2.0 * jnp.sum(self.nll(y, jnp.ravel(model(x, v)))))
            return np.asarray(total(jnp.asarray(vs)), np.float64) - self.chi2
        E, e = jnp.ones((1, 0)), jnp.ones(1)
        r = jax.vmap(lambda v: self.fun(jnp.zeros(0), E, e, v, self.x, self.y, self.W))(
            jnp.asarray(vs))
        return np.asarray(jnp.sum(r * r, axis=1)) - self.chi2

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
        if self.n == 1:  # nothing to re-fit
            return self._at(vs)
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
        Es, es, LB, UB = np.stack(Es), np.stack(es), np.stack(LB), np.stack(UB)
        out = self._solve(np.stack(Q_cond), Es, es, vs, LB, UB)
        retry = ~np.isfinite(out)
        if retry.any():  # a start that failed: again from the optimum's values (the
            # whole batch, to keep its size; only the failed fits are taken)
            again = self._solve(np.where(retry[:, None], np.stack(Q_best),
                                         np.stack(Q_cond)), Es, es, vs, LB, UB)
            out[retry] = again[retry]
        return out

    def _solve(self, Q0, Es, es, vs, LB, UB):
        if self.nll is not None:
            val, status = self.fun(jnp.asarray(Q0), Es, es, vs, self.x, self.y, LB, UB)
            val, ok = np.asarray(val, np.float64), np.asarray(status) > 0
            return np.where(ok & np.isfinite(val), val - self.chi2, np.nan)
        bounded = np.isfinite(self.lb).any() or np.isfinite(self.ub).any()
        r = self.solve(self.fun, Q0, (Es, es, vs, self.x, self.y, self.W),
                       in_axes=(0, 0, 0, None, None, None),
                       bounds=(LB, UB) if bounded else None, precision="f64")
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
    if res.dof <= 0:
        raise ValueError("no degrees of freedom: profile intervals need more data points "
                         "than identifiable parameters")
    want = list(res.names) if params is None else list(params)
    unknown = [w for w in want if w not in res.names]
    if unknown:
        raise ValueError(f"unknown parameter(s) {unknown}; the fit's are {list(res.names)}")
    view = free_view(res)
    n, L = len(view.names), len(levels)
    ident = np.asarray(view.identifiable)
    which = [view.index[res.names.index(w)] for w in want]
    which = [j for j in which if j >= 0 and ident[j]]
    p = np.asarray(view.popt, np.float64)
    se = np.sqrt(np.where(ident, np.maximum(np.diag(view.cov), 0.0), np.inf))
    lb, ub = np.asarray(view.lower), np.asarray(view.upper)
    thr = np.array([profile_threshold(lv, float(res.chi2), res.dof, res.absolute_sigma)
                    for lv in levels])
    half = max(float(two_sided_quantile(lv, None if res.absolute_sigma else res.dof))
               for lv in levels) * se
    prof = _Profiler(res, view)

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
    return _on_parameters(res, view, thr, lower, upper, lower_open, upper_open, grids,
                          dchi, min_d, levels)


def _on_parameters(res, view, thr, lower, upper, lower_open, upper_open, grids, dchi,
                   min_d, levels) -> ProfileIntervals:
    """The free coordinates' intervals as the parameters': a fixed parameter's interval
    is its value (closed); a tied one is not profiled (NaN, open: see its Wald
    interval)."""
    n, L = res.nparams, len(levels)
    idx = np.asarray(view.index)
    pick = np.maximum(idx, 0)
    free = (idx >= 0)[:, None]
    fixed = np.array([d == "fixed" for d in res.described])[:, None]
    popt = np.asarray(res.popt, np.float64)
    value = np.broadcast_to(popt[:, None], (n, L))
    lo = np.where(free, lower[pick], np.where(fixed, value, np.nan))
    hi = np.where(free, upper[pick], np.where(fixed, value, np.nan))
    lo_open = np.where(free, lower_open[pick], ~fixed)
    hi_open = np.where(free, upper_open[pick], ~fixed)
    G = grids.shape[1]
    grid = np.where(free, grids[pick], np.full((n, G), np.nan))
    dch = np.where(free, dchi[pick], np.full((n, G), np.nan))
    return ProfileIntervals(popt=popt, lower=lo, upper=hi, thresholds=thr,
                            lower_open=lo_open, upper_open=hi_open, grid=grid,
                            dchi2=dch, min_dchi2=min_d, names=tuple(res.names),
                            levels=levels, rule="chi2" if res.absolute_sigma else "F")
