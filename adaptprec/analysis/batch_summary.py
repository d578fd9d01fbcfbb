"""The fit report's figures for every fit of a :func:`~adaptprec.solve_nlsq_batch`
result, vectorised: one ``vmap`` over the batch axis inside one compiled program (no
Python loop over fits).

Per fit: standard errors, covariance and correlations on the identifiable subspace
(:mod:`.identifiability`), χ², degrees of freedom (``m - rank``), reduced χ², R² (model
form), the runs test and lag-1 autocorrelation of the residuals (data order), and flags.
The Jacobian is recomputed at each solution by forward-mode autodiff (``BatchResult``
does not keep it), in the working precision of ``res.x`` (float64 after an adaptive solve).

Example:
    >>> import jax.numpy as jnp
    >>> import adaptprec as ap
    >>> t = jnp.linspace(0.0, 1.0, 8)
    >>> y = 3.0 * jnp.exp(-jnp.array([0.5, 1.0])[:, None] * t) + jnp.array([1, -1] * 4) * 1e-3
    >>> model = lambda p, t: p[0] * jnp.exp(-p[1] * t)
    >>> res = ap.solve_nlsq_batch(model, jnp.ones((2, 2)), (t,), in_axes=None, ydata=y)
    >>> s = ap.summarize_batch(res, model, (t,), in_axes=None, ydata=y)
    >>> s.stderr.shape, [int(d) for d in s.dof], [int(f) for f in s.flags]
    ((2, 2), [6, 6], [0, 0])
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from .._pytree import Module
from .._tracing import is_concrete
from ..modeling.likelihood import deviance_residual
from .identifiability import subspace_covariance
from .residual_tests import lag1_autocorrelation, runs_test
from ._quantiles import two_sided_quantile

__all__ = ["BatchSummary", "summarize_batch", "FLAGS"]

#: bit of each flag in ``BatchSummary.flags``
FLAGS = {"failed": 1, "not_identifiable": 2, "sloppy": 4, "strong_correlation": 8,
         "at_bound": 16, "residual_runs": 32, "no_dof": 64}


class BatchSummary(Module):
    """Per-fit summaries, batch axis first (a pytree; jnp arrays).

    ``stderr`` ``(B, n)`` (``inf`` where not identifiable), ``pcov``/``correl``
    ``(B, n, n)``, ``chi2``/``redchi``/``r2`` ``(B,)``, ``dof``/``rank`` ``(B,)`` int,
    ``singular_values`` ``(B, n)`` of the log-scaled Jacobian, ``identifiable``
    ``(B, n)``, ``runs_pvalue``/``autocorrelation`` ``(B,)``, and ``flags`` ``(B,)`` int:
    a bit per problem (:data:`FLAGS`; 0 for a clean fit). ``absolute_sigma`` picks the
    normal quantile in :meth:`wald_intervals`.
    """

    stderr: jax.Array
    pcov: jax.Array
    correl: jax.Array
    chi2: jax.Array
    redchi: jax.Array
    r2: jax.Array
    dof: jax.Array
    rank: jax.Array
    singular_values: jax.Array
    identifiable: jax.Array
    runs_pvalue: jax.Array
    autocorrelation: jax.Array
    flags: jax.Array
    x: jax.Array
    absolute_sigma: Any

    def has(self, flag: str):
        """``(B,)`` bool: the fits with ``flag`` (a key of :data:`FLAGS`)."""
        return (self.flags & FLAGS[flag]) != 0

    def wald_intervals(self, level: float = 0.95):
        """``(B, n, 2)`` Wald intervals, Student's t with each fit's ``dof`` (normal with
        ``absolute_sigma=True``); jit-safe (NumPy float64 for an eager summary)."""
        if is_concrete(self.x) and isinstance(self.x, np.ndarray):
            with _float64(self.x):
                return np.asarray(self._wald(level), np.float64)
        return self._wald(level)

    def _wald(self, level):
        if self.absolute_sigma:
            q = two_sided_quantile(level, None) * jnp.ones_like(self.chi2)
        else:
            q = two_sided_quantile(level, jnp.maximum(self.dof, 1).astype(self.chi2.dtype))
        half = q[:, None] * self.stderr
        return jnp.stack([self.x - half, self.x + half], axis=-1)

    def counts(self) -> dict:
        """``{flag: number of fits}`` (host)."""
        f = np.asarray(self.flags)
        return {k: int(np.sum((f & b) != 0)) for k, b in FLAGS.items()}


def _one(x, args, y, w, mask, status, lb, ub, fixed, *, fun, model_form, absolute_sigma,
         poisson):
    """The summary of one fit (vmapped over the batch by :func:`summarize_batch`); the
    points outside ``mask`` (padding) enter nothing: not the residuals, the Jacobian,
    the degrees of freedom or the residual tests. A ``fixed`` parameter's Jacobian column
    is zero, so it is one exact null direction: the others' covariance and the rank
    (hence ``dof``) are the reduced model's; it reports error 0. A Poisson fit's
    residuals are the deviance residuals and its covariance the inverse Fisher
    information (the Jacobian of ``2 sqrt(f)``), unscaled."""
    def residual(p):
        out = jnp.ravel(fun(p, *args))
        if poisson:
            out = deviance_residual(out, y)
        elif model_form:
            out = (out - y) * w
        return jnp.where(mask, out, 0.0)

    def fisher(p):
        return jnp.where(mask, 2.0 * jnp.sqrt(jnp.ravel(fun(p, *args))), 0.0)

    r = residual(x)
    J = jnp.where(fixed[None, :], 0.0, jax.jacfwd(fisher if poisson else residual)(x))
    n = J.shape[1]
    m = jnp.sum(mask)
    sub = subspace_covariance(J, x)
    chi2 = jnp.sum(r * r)
    dof = m - sub.rank
    redchi = chi2 / jnp.where(dof > 0, dof, jnp.nan)
    factor = 1.0 if absolute_sigma or poisson else redchi
    cov = sub.cov * factor
    known = sub.identifiable | fixed
    both = known[:, None] & known[None, :]
    pcov = jnp.where(both, cov, jnp.inf)
    stderr = jnp.sqrt(jnp.where(known, jnp.diag(cov), jnp.inf))
    correl = jnp.where(both, cov / (stderr[:, None] * stderr[None, :]), jnp.nan)
    if model_form:
        f = jnp.ravel(fun(x, *args))
        ym = jnp.sum(jnp.where(mask, y, 0.0)) / jnp.maximum(m, 1)
        ss_tot = jnp.sum(jnp.where(mask, (y - ym) ** 2, 0.0))
        ss_res = jnp.sum(jnp.where(mask, (y - f) ** 2, 0.0))
        r2 = 1.0 - ss_res / jnp.where(ss_tot > 0, ss_tot, jnp.nan)
    else:
        r2 = jnp.nan * chi2
    runs = runs_test(r, mask)
    ac = lag1_autocorrelation(r, mask)
    s = sub.singular_values
    sloppy = jnp.any(~sub.null & (jnp.sqrt(factor) / jnp.where(s > 0, s, 1.0) > 1.0))
    off = ~jnp.eye(n, dtype=bool)
    strong = jnp.any(off & both & (jnp.abs(jnp.nan_to_num(correl)) > 0.99))
    tol = 1e-8 * (1.0 + jnp.abs(x))
    at_bound = jnp.any((x - lb <= tol) | (ub - x <= tol))
    free = n - jnp.sum(fixed)
    bits = [(status <= 0, "failed"), (sub.rank < free, "not_identifiable"), (sloppy, "sloppy"),
            (strong, "strong_correlation"), (at_bound, "at_bound"),
            (runs.pvalue < 0.01, "residual_runs"), (dof <= 0, "no_dof")]
    flags = sum(jnp.where(c, FLAGS[k], 0) for c, k in bits).astype(jnp.int32)
    return (stderr, pcov, correl, chi2, redchi, r2, dof, sub.rank, s, known,
            runs.pvalue, ac, flags)


@functools.lru_cache(maxsize=64)
def _program(fun, arg_axes, y_axis, w_axis, mask_axis, bound_axes, fixed_axis, model_form,
             absolute_sigma, poisson):
    one = functools.partial(_one, fun=fun, model_form=model_form,
                            absolute_sigma=absolute_sigma, poisson=poisson)
    return jax.jit(jax.vmap(one, in_axes=(0, arg_axes, y_axis, w_axis, mask_axis, 0)
                            + bound_axes + (fixed_axis,)))


def summarize_batch(res, fun: Callable, args=(), *, in_axes=0, ydata=None, sigma=None,
                    absolute_sigma: bool = False, bounds=None, mask=None, fixed=None,
                    likelihood: str = "gaussian") -> BatchSummary:
    """Per-fit summaries of a :class:`~adaptprec.BatchResult` (vectorised, jit-safe).

    Pass the same ``fun``, ``args``, ``in_axes``, ``ydata``, ``sigma``, ``bounds``,
    ``mask``, ``fixed`` and ``likelihood`` as to :func:`~adaptprec.solve_nlsq_batch`
    (``res.x`` must be a ``(B, n)`` array; uneven lists are padded the same way). With
    ``absolute_sigma=False`` the covariance is scaled by each fit's reduced χ², as
    ``curve_fit`` does. Padded fits: ``mask`` (``(m,)`` or ``(B, m)`` bool, the real
    points) or padding by ``sigma=inf`` (or NaN ``ydata``): padded points count
    nowhere, so each fit's ``dof`` is its own ``m_real - rank`` and ``pcov`` is scaled by
    its own reduced chi-square. ``fixed`` parameters (``(n,)`` or ``(B, n)`` bool) report
    error 0 and are not counted in the rank. ``likelihood="poisson"``: ``chi2`` is the
    deviance and ``pcov`` the inverse Fisher information (unscaled). An eager summary of
    an eager (NumPy) result is NumPy in the result's precision (float64 after an adaptive
    solve, also with ``jax_enable_x64`` off); a traced one stays traced.
    """
    from ..batch._points import pad_uneven

    if getattr(res, "dependent", ()):
        raise ValueError(
            f"summarize_batch: this result has parameters set by ties or constraints "
            f"({', '.join(res.dependent)}); a summary would count them as free and "
            f"understate every error. Read the errors from the solve itself: "
            f"solve_nlsq_batch(..., return_pcov=True) gives res.pcov (the tied ones by "
            f"propagation) and res.dof (free parameters only)")
    ydata, sigma, args, padded = pad_uneven(ydata, sigma, args, in_axes, mask)
    mask = padded if mask is None else mask
    poisson = likelihood == "poisson"
    if likelihood not in ("gaussian", "poisson"):
        raise ValueError(f"likelihood must be 'gaussian' or 'poisson', got {likelihood!r}")
    x = res.x
    inputs = (args, ydata, sigma, bounds, mask, fixed)
    if is_concrete((x,) + inputs) and isinstance(x, np.ndarray):
        with _float64(x):
            out = _summarize(res, fun, in_axes, absolute_sigma, poisson, *inputs)
        return jax.tree.map(np.asarray, out)
    return _summarize(res, fun, in_axes, absolute_sigma, poisson, *inputs)


def _real_points(mask, model_form, y, y_axis, w, w_axis):
    """``(mask, its vmap axis)``: the given mask, and for model-form fits the points with
    a finite ``ydata`` and a positive finite weight (``sigma=inf`` pads)."""
    real = None if mask is None else jnp.asarray(mask, bool)
    if model_form:
        finite = jnp.isfinite(y) & jnp.isfinite(w) & (w > 0)
        if y_axis is None and w_axis is not None:
            finite = jnp.broadcast_to(finite, w.shape)
        real = finite if real is None else real & finite
    if real is None:
        return jnp.ones((1,), bool)[0], None
    return real, (0 if real.ndim == 2 else None)


@contextlib.contextmanager
def _float64(x):
    """JAX's float64 scope around eager work on float64 NumPy data with x64 off."""
    if x.dtype != np.float64 or jax.config.read("jax_enable_x64"):
        yield
        return
    from .._x64_scope import float64_scope

    with float64_scope():
        yield


def _summarize(res, fun, in_axes, absolute_sigma, poisson, args, ydata, sigma, bounds,
               mask, fixed):
    x = res.x
    if not hasattr(x, "ndim") or x.ndim != 2:
        raise ValueError("summarize_batch needs res.x of shape (B, n) (a pytree x0 is "
                         "not supported: flatten the parameters first)")
    B, n = x.shape
    args = tuple(args) if isinstance(args, (tuple, list)) else (args,)
    if in_axes in (0, None):
        arg_axes = (in_axes,) * len(args)
    else:
        arg_axes = tuple(in_axes)
        if len(arg_axes) != len(args):
            raise ValueError(f"in_axes has {len(arg_axes)} entries for {len(args)} args")
    model_form = ydata is not None
    dtype = x.dtype
    if model_form:
        y = jnp.asarray(ydata, dtype)
        y_axis = 0 if y.ndim == 2 else None
        m = y.shape[-1]
        if sigma is None:
            w, w_axis = jnp.ones((m,), dtype), None
        else:
            s = jnp.asarray(sigma, dtype)
            w, w_axis = 1.0 / s, (0 if s.ndim == 2 else None)
    else:
        y, y_axis, w, w_axis = jnp.zeros(()), None, jnp.zeros(()), None
    if bounds is None:
        lb, ub = jnp.full((n,), -jnp.inf, dtype), jnp.full((n,), jnp.inf, dtype)
    else:
        lb, ub = (jnp.broadcast_to(jnp.asarray(b, dtype), (B, n) if jnp.ndim(b) == 2
                                   else (n,)) for b in bounds)
    bound_axes = tuple(0 if b.ndim == 2 else None for b in (lb, ub))
    real, mask_axis = _real_points(mask, model_form, y, y_axis, w, w_axis)
    if model_form:   # padded entries: finite placeholders (their weight is 0)
        y = jnp.where(jnp.isfinite(y), y, 0.0)
        w = jnp.where(jnp.isfinite(w), w, 0.0)
    held = jnp.zeros((n,), bool) if fixed is None else jnp.asarray(fixed)
    if held.dtype != bool or held.shape not in ((n,), (B, n)):
        raise ValueError(f"fixed must be bool of shape (n,) = ({n},) or (B, n); got "
                         f"{held.dtype} {held.shape}")
    program = _program(fun, arg_axes, y_axis, w_axis, mask_axis, bound_axes,
                       0 if held.ndim == 2 else None, model_form, bool(absolute_sigma),
                       poisson)
    out = program(x, args, y, w, real, res.status, lb, ub, held)
    return BatchSummary(*out, x=x, absolute_sigma=bool(absolute_sigma))
