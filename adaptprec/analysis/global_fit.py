"""Global fits: several datasets, one model, some parameters shared by every dataset and
the others per dataset, in one least-squares fit with one report.

``fit_global(model, xdata, ydata, shared=["k"])`` minimises
``sum_d sum_i ((model(x_di, *p_d) - y_di) / sigma_di)^2`` where ``p_d`` holds the
shared parameters (one value for all datasets), dataset ``d``'s own parameters and any
fixed ones. The Jacobian has one dense column block for the shared parameters and a
block diagonal for the others, which the solver (:mod:`._block_lm`) exploits through the
Schur complement: a step costs work and memory linear in the number of datasets (10,000
decays sharing one rate fit in about a second; ``benchmarks/bench_global.py``).

Datasets of different lengths are given as lists (padded and masked: a padded point
contributes nothing, and the degrees of freedom count the real points only). The
covariance is ``(J^T J)^{-1}`` by its blocks, scaled by the reduced chi-square
``chi2 / (N - n_shared - D n_local)`` unless ``absolute_sigma``.

Example:
    >>> import numpy as np, jax.numpy as jnp
    >>> import adaptprec as ap
    >>> t = np.linspace(0.0, 3.0, 20)
    >>> amps = np.array([1.0, 2.0, 4.0])
    >>> y = amps[:, None] * np.exp(-0.8 * t) + 0.01 * np.cos(9 * t)
    >>> res = ap.fit_global(lambda t, a, k: a * jnp.exp(-k * t), t, y, shared=["k"])
    >>> round(float(res.shared_values[0]), 2), res.local_values[:, 0].round(2).tolist()
    (0.8, [1.0, 2.0, 4.0])
"""

from __future__ import annotations

import functools
import math
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from .._pytree import Module, field
from .._status import Status

__all__ = ["GlobalFitResult", "fit_global"]


class GlobalFitResult(Module):
    """A global fit (NumPy float64).

    Tables: ``shared_values``/``shared_stderr`` ``(n_shared,)`` for ``shared`` names;
    ``local_values``/``local_stderr`` ``(D, n_local)`` for ``local`` names;
    ``popt``/``stderr`` ``(D, n)`` every dataset's full parameter vector (``names``
    order; a fixed parameter's error is 0). Covariances: ``cov_shared``,
    ``cov_local`` ``(D, n_local, n_local)``, ``cov_cross`` ``(D, n_shared, n_local)``
    (scaled). Goodness of fit: ``chi2``, ``dof``, ``redchi``, ``aic``, ``bic`` (lmfit's
    forms with every fitted value counted), ``chi2_per_dataset``, ``npoints`` per
    dataset. Solver: ``status``, ``success``, ``message``, ``nit``, ``nfev``.
    """

    popt: Any
    stderr: Any
    shared_values: Any
    shared_stderr: Any
    local_values: Any
    local_stderr: Any
    cov_shared: Any
    cov_local: Any
    cov_cross: Any
    chi2: Any
    redchi: Any
    aic: Any
    bic: Any
    chi2_per_dataset: Any
    npoints: Any
    status: Any
    nit: Any
    nfev: Any
    names: tuple = field(static=True)
    shared: tuple = field(static=True)
    local: tuple = field(static=True)
    fixed: tuple = field(static=True)
    dof: int = field(static=True)
    nobs: int = field(static=True)
    absolute_sigma: bool = field(static=True)
    model: Callable = field(static=True)

    @property
    def ndatasets(self) -> int:
        return int(np.shape(self.popt)[0])

    @property
    def nvarys(self) -> int:
        """Fitted values: the shared parameters once, the local ones per dataset."""
        return len(self.shared) + self.ndatasets * len(self.local)

    @property
    def success(self) -> bool:
        return int(self.status) > 0

    @property
    def message(self) -> str:
        from ..nlsq.common import STATUS_MESSAGES

        return STATUS_MESSAGES.get(int(self.status), f"status {int(self.status)}")

    def predict(self, d: int, x):
        """Dataset ``d``'s fitted model at ``x``."""
        p = jnp.asarray(self.popt[d])
        return self.model(x, *[p[i] for i in range(p.shape[0])])

    def to_dataframe(self):
        """The per-dataset table (``pandas``): one row per dataset, value and stderr
        columns per parameter, and each dataset's chi-square and points."""
        import pandas as pd

        cols = {}
        for i, n in enumerate(self.names):
            cols[n] = self.popt[:, i]
            cols[n + "_stderr"] = self.stderr[:, i]
        cols["chi2"] = self.chi2_per_dataset
        cols["npoints"] = self.npoints
        return pd.DataFrame(cols)

    def __str__(self) -> str:
        g = lambda v, d=7: f"{float(v):.{d}g}"  # noqa: E731
        lines = ["[[Global Fit]]",
                 f"    # datasets         = {self.ndatasets}",
                 f"    # data points      = {self.nobs}",
                 f"    # variables        = {self.nvarys} ({len(self.shared)} shared, "
                 f"{len(self.local)} per dataset"
                 + (f", {len(self.fixed)} fixed" if self.fixed else "") + ")",
                 f"    # dof              = {self.dof}",
                 f"    chi-square         = {g(self.chi2)}",
                 f"    reduced chi-square = {g(self.redchi)}",
                 f"    Akaike info crit   = {g(self.aic)}",
                 f"    Bayesian info crit = {g(self.bic)}",
                 f"    status             = {int(self.status)} "
                 f"({'success' if self.success else 'FAILED'}: {self.message})",
                 "[[Shared]]  (± 1 standard error)"]
        for i, n in enumerate(self.shared):
            lines.append(f"    {n + ':':<12} {g(self.shared_values[i]):>13} +/- "
                         f"{g(self.shared_stderr[i], 5)}")
        lines.append("[[Per dataset]]  (value ± 1 standard error)")
        w = max((len(n) for n in self.local), default=4)
        show = range(min(self.ndatasets, 10))
        lines.append("    " + f"{'#':>5}  " + "  ".join(f"{n:>{w + 22}}" for n in self.local)
                     + f"  {'chi2':>10}")
        for d in show:
            cells = "  ".join(f"{g(self.local_values[d, i]):>{w + 9}} +/- "
                              f"{g(self.local_stderr[d, i], 3):<9}"
                              for i in range(len(self.local)))
            lines.append(f"    {d:>5}  {cells}  {g(self.chi2_per_dataset[d], 4):>10}")
        if self.ndatasets > 10:
            lines.append(f"    ... {self.ndatasets - 10} more (to_dataframe() has them "
                         "all); over all datasets:")
            for i, n in enumerate(self.local):
                v = self.local_values[:, i]
                lines.append(f"    {n}: median {g(np.median(v), 5)}, range "
                             f"[{g(v.min(), 5)}, {g(v.max(), 5)}]")
        return "\n".join(lines)


def _padded(values, name):
    """A list of 1-D arrays (or a 2-D array) as ``(D, M)`` float64 plus the mask."""
    if isinstance(values, (list, tuple)) and values and np.ndim(values[0]) >= 1:
        arrs = [np.asarray(v, np.float64).ravel() for v in values]
        M = max(a.size for a in arrs)
        out = np.stack([np.pad(a, (0, M - a.size), mode="edge") if a.size else
                        np.zeros(M) for a in arrs])
        mask = np.stack([np.arange(M) < a.size for a in arrs])
        return out, mask
    a = np.asarray(values, np.float64)
    if a.ndim != 2:
        raise ValueError(f"{name} must hold one row per dataset: a 2-D array (D, m) or "
                         f"a list of D 1-D arrays, got shape {a.shape}")
    return a, np.ones(a.shape, bool)


def _data(xdata, ydata, sigma):
    Y, mask = _padded(ydata, "ydata")
    D, M = Y.shape
    if isinstance(xdata, (list, tuple)) and len(xdata) == D and np.ndim(xdata[0]) >= 1:
        X, xmask = _padded(xdata, "xdata")
        if X.shape != Y.shape or not np.array_equal(xmask, mask):
            raise ValueError("each dataset's xdata must have as many points as its ydata")
        x_axis = 0
    else:
        X = np.asarray(xdata, np.float64)
        if X.ndim == 2 and X.shape == (D, M):
            x_axis = 0
        elif X.shape[-1:] == (M,) and X.ndim == 1:
            x_axis = None
        else:
            raise ValueError(f"xdata must be shared (shape ({M},)), one row per dataset "
                             f"({D}, {M}), or a list of arrays; got shape {X.shape}")
    if sigma is None:
        S = np.ones_like(Y)
    elif isinstance(sigma, (list, tuple)):
        S, smask = _padded(sigma, "sigma")
        if S.shape != Y.shape or not np.array_equal(smask, mask):
            raise ValueError("each dataset's sigma must have as many points as its ydata")
    else:
        S = np.broadcast_to(np.asarray(sigma, np.float64), Y.shape)
    S = np.where(mask, S, 1.0)
    if np.any(S[mask] <= 0) or not np.all(np.isfinite(S[mask])):
        raise ValueError("sigma must be positive and finite")
    for arr, what in ((Y[mask], "ydata"), (X, "xdata")):
        if not np.all(np.isfinite(arr)):
            raise ValueError(f"{what} contains NaN or Inf: remove those points (give "
                             "datasets of different lengths as lists)")
    return X, Y, np.where(mask, 1.0 / S, 0.0), mask, x_axis


def _starts(p0, names, shared, local, D):
    """``theta0`` ``(n_s,)`` and ``phi0`` ``(D, n_l)`` from ``p0`` (dict or sequence
    over ``names``; a local entry may be one value per dataset)."""
    if p0 is None:
        p0 = {}
    if not isinstance(p0, dict):
        if len(p0) != len(names):
            raise ValueError(f"p0 has {len(p0)} entries for the parameters {list(names)}")
        p0 = dict(zip(names, p0))
    unknown = [k for k in p0 if k not in names]
    if unknown:
        raise ValueError(f"p0 names {unknown}; the parameters are {list(names)}")
    theta = []
    for n in shared:
        v = np.asarray(p0.get(n, 1.0), np.float64)
        if v.size != 1:
            raise ValueError(f"{n!r} is shared: give p0 one value for it")
        theta.append(float(v))
    phi = np.ones((D, len(local)))
    for i, n in enumerate(local):
        phi[:, i] = np.broadcast_to(np.asarray(p0.get(n, 1.0), np.float64), (D,))
    return np.asarray(theta), phi


@functools.lru_cache(maxsize=16)
def _program(model, layout, x_axis, options):
    from ._block_lm import solve_blocks

    n, shared_idx, local_idx, fixed_idx = layout

    def residual(theta, phi, x, y, w, fixed):
        p = jnp.zeros(n, theta.dtype)
        p = p.at[jnp.asarray(shared_idx, int)].set(theta) if shared_idx else p
        p = p.at[jnp.asarray(local_idx, int)].set(phi) if local_idx else p
        p = p.at[jnp.asarray(fixed_idx, int)].set(fixed) if fixed_idx else p
        f = jnp.ravel(model(x, *[p[i] for i in range(n)]))
        return (f - y) * w

    def solve(theta0, phi0, X, Y, Wt, F):
        return solve_blocks(residual, theta0, phi0, (X, Y, Wt, F),
                            in_axes=(x_axis, 0, 0, 0), **dict(options))

    return jax.jit(solve)


def fit_global(model: Callable, xdata, ydata, p0=None, sigma=None, *, shared=(),
               fixed=None, names=None, absolute_sigma: bool = False, ftol: float = 1e-15,
               xtol: float = 1e-10, gtol: float = 1e-10,
               max_steps: int | None = None) -> GlobalFitResult:
    """Fit ``model(x, *params)`` to every dataset at once, ``shared`` parameters common
    to all (module docstring).

    Args:
        model: ``model(x, *params)`` written with ``jax.numpy``.
        xdata: shared ``(m,)``, one row per dataset ``(D, m)``, or a list of arrays.
        ydata: ``(D, m)`` or a list of ``D`` arrays (different lengths allowed).
        p0: a dict by name or a sequence over the parameters; a per-dataset
            parameter's entry may be one value per dataset. Default 1.
        sigma: standard deviations: a scalar, ``(D, m)`` or a list like ``ydata``.
        shared: the names of the parameters shared by every dataset.
        fixed: ``{name: value}`` (a value, or one per dataset) held fixed.
        names: the parameter names (default: ``model``'s signature).
        absolute_sigma: as ``curve_fit``'s.
        ftol, xtol, gtol, max_steps: the solver's tests (scipy's meanings) and budget.
    """
    from ..modeling.parameters import model_names
    from .._user_fn import positional_model
    from ..precision import x64_enabled

    model = positional_model(model)
    names = tuple(names) if names is not None else model_names(
        model, None if p0 is None or isinstance(p0, dict) else len(p0))
    shared = (shared,) if isinstance(shared, str) else tuple(shared)
    fixed = dict(fixed or {})
    unknown = [k for k in (*shared, *fixed) if k not in names]
    if unknown:
        raise ValueError(f"shared/fixed name {unknown}; the parameters are {list(names)}")
    local = tuple(n for n in names if n not in shared and n not in fixed)
    if isinstance(p0, dict):
        p0 = {k: v for k, v in p0.items() if k not in fixed}
    elif p0 is not None:
        p0 = {k: v for k, v in zip(names, p0) if k not in fixed}
    X, Y, Wt, mask, x_axis = _data(xdata, ydata, sigma)
    D = Y.shape[0]
    theta0, phi0 = _starts(p0, tuple(n for n in names if n not in fixed), shared, local, D)
    F = np.stack([np.broadcast_to(np.asarray(fixed[k], np.float64), (D,))
                  for k in fixed], axis=1) if fixed else np.zeros((D, 0))
    layout = (len(names), tuple(names.index(k) for k in shared),
              tuple(names.index(k) for k in local), tuple(names.index(k) for k in fixed))
    n_free = len(shared) + len(local)
    options = (("ftol", ftol), ("xtol", xtol), ("gtol", gtol),
               ("max_steps", 100 * (n_free + 1) if max_steps is None else int(max_steps)))
    program = _program(model, layout, x_axis, options)

    def run():
        sol = program(theta0, phi0, X, Y, Wt, F)
        return jax.tree.map(lambda a: np.asarray(a, np.float64 if np.asarray(
            a).dtype.kind == "f" else None), sol)

    if x64_enabled():
        sol = run()
    else:
        from .._x64_scope import float64_scope

        with float64_scope():
            sol = run()
    return _result(sol, model, names, shared, local, fixed, F, mask, absolute_sigma)


def _result(sol, model, names, shared, local, fixed, F, mask, absolute_sigma):
    D = mask.shape[0]
    N = int(mask.sum())
    nvary = len(shared) + D * len(local)
    dof = N - nvary
    r = np.asarray(sol.r)
    chi2 = float(np.sum(r * r))
    redchi = chi2 / dof if dof > 0 else math.inf
    factor = 1.0 if absolute_sigma else redchi
    Cs, Cl, Cx = (np.asarray(c) * factor for c in (sol.cov_shared, sol.cov_local,
                                                    sol.cov_cross))
    se_s = np.sqrt(np.maximum(np.diag(Cs), 0.0)) if Cs.size else np.zeros(0)
    se_l = np.sqrt(np.maximum(np.diagonal(Cl, axis1=1, axis2=2), 0.0))
    popt = np.zeros((D, len(names)))
    stderr = np.zeros((D, len(names)))
    for i, n in enumerate(shared):
        popt[:, names.index(n)] = sol.theta[i]
        stderr[:, names.index(n)] = se_s[i]
    for i, n in enumerate(local):
        popt[:, names.index(n)] = sol.phi[:, i]
        stderr[:, names.index(n)] = se_l[:, i]
    for i, n in enumerate(fixed):
        popt[:, names.index(n)] = F[:, i]
    logl = N * math.log(chi2 / N) if chi2 > 0 else -math.inf
    status = int(sol.status)
    if status <= 0 and status != Status.MAX_EVALUATIONS:
        raise RuntimeError("Optimal parameters not found (global fit, status "
                           f"{status}): check p0 and the data")
    return GlobalFitResult(
        popt=popt, stderr=stderr, shared_values=np.asarray(sol.theta),
        shared_stderr=se_s, local_values=np.asarray(sol.phi), local_stderr=se_l,
        cov_shared=Cs, cov_local=Cl, cov_cross=Cx, chi2=chi2, redchi=redchi,
        aic=logl + 2 * nvary, bic=logl + math.log(N) * nvary,
        chi2_per_dataset=np.sum(r * r, axis=1), npoints=mask.sum(axis=1),
        status=np.int32(status), nit=int(sol.nit), nfev=int(sol.nfev),
        names=tuple(names), shared=tuple(shared), local=tuple(local),
        fixed=tuple(fixed), dof=dof, nobs=N, absolute_sigma=bool(absolute_sigma),
        model=model)
