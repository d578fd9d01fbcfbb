"""`curve_fit`: scipy's ``curve_fit`` semantics on :func:`adaptprec.solve_nlsq`.

``f(xdata, *params)`` is fitted to ``ydata``. ``sigma`` is either the 1-D standard
deviations of ``ydata`` (residuals divided by ``sigma``) or the ``(m, m)`` covariance
matrix of ``ydata`` (residuals whitened by its Cholesky factor, ``r = L^{-1} (f - y)``).
``pcov`` is ``(J^T J)^+`` of the whitened, undamped Jacobian at the solution, by SVD
with scipy's rank threshold ``eps * max(m, n) * s_max``; parameters with a component in
the numerical null space (not identifiable) get ``inf`` rows and columns. Unless
``absolute_sigma``, ``pcov`` is multiplied by the reduced chi-square ``2 cost / (m - n)``.

Example:
    >>> import jax.numpy as jnp
    >>> import adaptprec as ap
    >>> x = jnp.linspace(0.0, 4.0, 50)
    >>> y = 2.5 * jnp.exp(-1.3 * x) + 0.5 + 0.01 * jnp.sin(7 * x)
    >>> popt, pcov = ap.curve_fit(lambda x, a, b, c: a * jnp.exp(-b * x) + c, x, y,
    ...                           p0=[1.0, 1.0, 0.0])
    >>> [round(float(v), 1) for v in popt], pcov.shape
    ([2.5, 1.3, 0.5], (3, 3))
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import sys
import warnings
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from .._tracing import is_concrete
from ._inputs import (all_finite, as_bounds, as_data, as_x0, check_jac_option,
                      checked_finite, initialize_feasible, leastsq_kwargs)
from ._minpack import minpack_fields
from .result import result_to_host
from . import _fused, _promote
from ._auto_starts import for_curve_fit
from ._model import _call, _jac_for, _n_params, _residual_for, check_p0_arity
from ._sharded import point_sharding
from . import _stream
from ._stream import Chunks, _is_host_array, covariance_from_gram, solve_stream
from .common import _covariance_svd, covariance_from_jac
from ._x64 import float64_entry
from .._x64_scope import float64_scope
from ..precision import x64_enabled
from ._inputs import _broadcast_bounds
from .solve import solve_nlsq

__all__ = ["curve_fit", "OptimizeWarning"]


class OptimizeWarning(UserWarning):
    """Warned when the covariance of the parameters cannot be estimated."""


@functools.lru_cache(maxsize=1)
def _both_warning_classes():
    import scipy.optimize

    class OptimizeWarningBoth(OptimizeWarning, scipy.optimize.OptimizeWarning):
        """adaptprec's and scipy's ``OptimizeWarning`` at once."""

    return OptimizeWarningBoth


def _warning_class():
    """:class:`OptimizeWarning`; when scipy.optimize is already imported, a subclass of
    both it and scipy's, so code that filters scipy's warning keeps working."""
    if "scipy.optimize" in sys.modules:
        return _both_warning_classes()
    return OptimizeWarning


#: Below this many points an eager curve_fit's pcov is scipy's SVD route on the host
#: driver: in its final program (``_host._final_program``), or in NumPy where the solve
#: did not run there (no compilation per data length either way).
_NUMPY_COVARIANCE_MAX_M = 4096


def covariance_numpy(J):
    """:func:`adaptprec.nlsq.common.covariance_from_jac`'s SVD route in NumPy (scipy's
    ``curve_fit`` rule): ``(J^T J)^+`` with the rank threshold ``eps * max(m, n) *
    s_max``; parameters with a component in the numerical null space get ``inf``.

    Example:
        >>> import numpy as np
        >>> from adaptprec.nlsq.curve_fit import covariance_numpy
        >>> covariance_numpy(np.array([[2.0, 0.0], [0.0, 0.0]]))[0, 0]
        np.float64(0.25)
    """
    m, n = J.shape
    if m > 2 * n and J.dtype == np.float64 and n > 0:
        # the common case without the general path's masking (same bits: every singular
        # value kept, so nothing is masked and no parameter is flagged)
        _, s, VT = np.linalg.svd(np.linalg.qr(J, mode="r")[:n], full_matrices=False)
        if s[-1] > _EPS64 * m * s[0]:
            return (VT.T * (1.0 / s ** 2)) @ VT
    return _covariance_svd(J, np.sqrt(np.finfo(J.dtype).eps), xnp=np)[0]


_EPS64 = float(np.finfo(np.float64).eps)


def _pcov_numpy(J, cost, n: int, lm_rule: bool, absolute_sigma: bool):
    """pcov from the Jacobian at the solution, in NumPy (scipy's rules: lm's all-inf
    pcov, the reduced chi-square scaling unless ``absolute_sigma``)."""
    return _scale_pcov(covariance_numpy(J), cost, J.shape[0], n, lm_rule, absolute_sigma)


def _scale_pcov(pcov, cost, m: int, n: int, lm_rule: bool, absolute_sigma: bool, xnp=np):
    """scipy's rules on ``(J^T J)^+``: lm's all-inf pcov where a parameter is not
    identifiable, the reduced chi-square scaling unless ``absolute_sigma``. An inf entry
    stays inf under the scaling, also for an exact fit (cost 0), as scipy leaves an
    indeterminate pcov unscaled (inf * 0 gave NaN: newcomer audit, ``a * b * x``).
    ``xnp``: ``numpy``, or ``jax.numpy`` for traced values."""
    if lm_rule:
        pcov = xnp.where(xnp.any(xnp.isinf(pcov)), xnp.inf, pcov)
    dof = m - n
    if absolute_sigma:
        return pcov
    if dof > 0:
        with np.errstate(invalid="ignore"):  # inf * 0, discarded
            return xnp.where(xnp.isinf(pcov), pcov, pcov * (2.0 * xnp.asarray(cost) / dof))
    return xnp.full_like(pcov, xnp.inf)


def _plan_key(f, xdata, ydata, p0, sigma, absolute_sigma, check_finite, bounds, method,
              jac, full_output, nan_policy, kwargs):
    """A hashable key of everything but the data values and ``p0``'s values, for the
    repeat path (:class:`_Plan`); ``None`` when the call is not of the common kind (NumPy
    data, 1-D ``ydata``, no or 1-D/scalar ``sigma``, numeric ``p0``, hashable options)."""
    if full_output or nan_policy is not None or not (jac is None or isinstance(jac, str)):
        return None
    if type(xdata) is not np.ndarray or type(ydata) is not np.ndarray or ydata.ndim != 1 \
            or xdata.dtype.kind not in "fiu" or ydata.dtype.kind not in "fiu":
        return None
    if sigma is None:
        sk = None
    elif type(sigma) is np.ndarray and sigma.shape == ydata.shape and \
            sigma.dtype.kind in "fiu":
        sk = ("1d", sigma.dtype.str)
    elif type(sigma) in (float, int):
        sk = "scalar"
    else:
        return None
    if p0 is None:
        pk = None
    elif type(p0) in (list, tuple) and all(type(v) in (float, int) for v in p0):
        pk = len(p0)
    elif type(p0) is np.ndarray and p0.ndim == 1 and p0.dtype.kind in "fiu":
        pk = p0.shape
    else:
        return None
    if not (isinstance(bounds, tuple) and len(bounds) == 2 and
            all(type(b) in (float, int) for b in bounds)):
        return None
    try:
        key = (f, xdata.shape, xdata.dtype.str, ydata.shape, ydata.dtype.str, sk, pk,
               bounds, method, jac, bool(absolute_sigma), check_finite,
               tuple(sorted(kwargs.items())), x64_enabled())
        hash(key)
    except TypeError:
        return None
    return key


class _Plan:
    """The repeat path of :func:`curve_fit`: a call with the same model, shapes and
    options as one whose solve ran promoted (:mod:`._promote`) skips validation of the
    shapes, tracing and lookups: it checks the values (finite data, positive ``sigma``,
    ``p0`` finite and inside the bounds), runs the promoted program once
    (:class:`._host.FastSolve`) and computes ``pcov`` as :func:`curve_fit` does. Any
    value it would reject, and any failed or unidentifiable fit, go the full way instead
    (which raises or warns as usual): the fast path never answers differently."""

    def __init__(self, fast, n, m, kind, lm_rule, absolute_sigma, bounds, p0, scope):
        self.fast, self.n, self.m, self.kind = fast, n, m, kind
        self.lm_rule, self.absolute_sigma, self.scope = lm_rule, absolute_sigma, scope
        self.lb, self.ub = bounds
        self.p0 = np.array(p0, np.float64)

    def __call__(self, xdata, ydata, p0, sigma):
        if self.scope:
            with float64_scope():
                return self._run(xdata, ydata, p0, sigma)
        return self._run(xdata, ydata, p0, sigma)

    def _run(self, xdata, ydata, p0, sigma):
        x = xdata if xdata.dtype.kind == "f" else xdata.astype(float)
        y = ydata if ydata.dtype == np.float64 else ydata.astype(np.float64)
        if not (all_finite(x) and all_finite(y)):
            return None
        if self.kind == "1d":
            s = np.asarray(sigma, np.float64)
            if not (s > 0).all():
                return None
            args = (x, y, np.broadcast_to(1.0 / s.reshape(-1), (self.m,)))
        else:
            args = (x, y)
        x0 = self.p0 if p0 is None else np.asarray(p0, np.float64)
        if x0.shape != (self.n,) or not np.isfinite(x0).all() or \
                (x0 < self.lb).any() or (x0 > self.ub).any():
            return None
        x, cost, cov, status = self.fast(x0, args)  # (J^T J)^+ from the program
        if not int(status) > 0:
            return None
        pcov = _scale_pcov(cov, cost, self.m, self.n, self.lm_rule, self.absolute_sigma)
        if np.isinf(pcov).any():
            return None
        return np.array(x), pcov


def curve_fit(f: Callable, xdata, ydata, p0=None, sigma=None, absolute_sigma: bool = False,
              check_finite=None, bounds=(-np.inf, np.inf), method=None, jac=None, *,
              full_output: bool = False, nan_policy=None, **kwargs):
    """Fit ``f(xdata, *params)`` to ``ydata``; returns ``(popt, pcov)`` (scipy semantics).

    Args:
      f: model ``f(xdata, *params)`` written with ``jax.numpy``.
      xdata, ydata: data (``ydata`` 1-D); ``xdata`` may be any array (last axis = points).
        Larger than memory (docs/nlsq.md): ``chunk_size=N`` streams host or
        memory-mapped arrays, ``xdata`` may be an :class:`~adaptprec.Chunks` source
        (``ydata=None``); host NumPy ``ydata`` of at least 2^22 points (without
        ``full_output``) and data sharded over a mesh are streamed by themselves.
      p0: initial guess (default: ones, sized from ``f``'s signature).
      sigma: ``None``, 1-D standard deviations (or a scalar), or an ``(m, m)`` covariance.
      absolute_sigma: if false, ``pcov`` is scaled by the reduced chi-square.
      check_finite, nan_policy: as scipy: by default non-finite data raise ``ValueError``;
        ``nan_policy="omit"`` drops points with NaN in ``xdata``/``ydata``.
      bounds, method: as :func:`~adaptprec.solve_nlsq` (``method=None``: ``"lm"`` without
        bounds, ``"trf"`` with).
      jac: ``None`` (autodiff), ``"fwd"``/``"rev"``, a callable ``jac(xdata, *params)``
        returning the ``(m, n)`` Jacobian of ``f``, or scipy's finite differences ``"2-point"``, ``"3-point"``, ``"cs"`` (as
        :func:`~adaptprec.solve_nlsq`; ``None`` means automatic differentiation, where
        scipy would use ``"2-point"``). A 1-D return is accepted for one parameter.
      full_output: also return ``infodict`` (``nfev``, ``fvec``, MINPACK's ``fjac``,
        ``ipvt`` (0-based), ``qtf`` for every method, and ``result``), ``mesg`` and
        ``ier`` (the status).
      **kwargs: passed to :func:`~adaptprec.solve_nlsq` (``precision``, ``loss``,
        ``ftol``, ``max_nfev``, ``max_steps``...); scipy ``leastsq``'s ``maxfev``,
        ``epsfcn`` and ``diag`` are translated (``max_nfev``, ``diff_step``,
        ``x_scale``).

    Without ``p0`` and with bounds the start is scipy's feasible point (midpoints of
    finite bounds, one inside a one-sided bound). xdata, ydata and sigma may be any
    array-like (pandas Series, xarray DataArray, lists, memoryviews).

    Raises ``RuntimeError`` (concrete inputs only) when the fit does not succeed, like
    scipy; under ``jit`` check ``ier``/the result instead. Eager calls return NumPy
    ``popt``/``pcov`` (float64 by default, also with ``jax_enable_x64`` off: the fit then
    runs inside ``jax.enable_x64(True)``).

    Example:
        >>> import jax.numpy as jnp
        >>> import adaptprec as ap
        >>> x = jnp.arange(5.0)
        >>> popt, pcov = ap.curve_fit(lambda x, a, b: a * x + b, x, 2 * x + 1,
        ...                           sigma=jnp.full(5, 0.1), absolute_sigma=True)
        >>> [round(float(v), 8) for v in popt], round(float(pcov[1, 1]), 6)
        ([2.0, 1.0], 0.006)
    """
    key = _plan_key(f, xdata, ydata, p0, sigma, absolute_sigma, check_finite, bounds,
                    method, jac, full_output, nan_policy, kwargs)
    if key is not None:
        plan = _promote.plans.get(key)
        if plan is not None and _promote.mode() != "off":
            out = plan(xdata, ydata, p0, sigma)
            if out is not None:
                return out
    return _curve_fit(f, xdata, ydata, p0, sigma, absolute_sigma, check_finite, bounds,
                      method, jac, full_output=full_output, nan_policy=nan_policy,
                      _plan_key=key, **kwargs)


@float64_entry("curve_fit", ("xdata", "ydata", "p0", "sigma", "bounds", "kwargs"),
               always_host=True)
def _curve_fit(f, xdata, ydata, p0=None, sigma=None, absolute_sigma=False,
               check_finite=None, bounds=(-np.inf, np.inf), method=None, jac=None, *,
               full_output=False, nan_policy=None, _plan_key=None, **kwargs):
    """:func:`curve_fit` after its fast path (a repeat with a plan) missed."""
    if "args" in kwargs:
        raise ValueError("'args' is not a supported keyword argument (curve_fit passes "
                         "the parameters to f as f(xdata, *params)).")
    kwargs = leastsq_kwargs(kwargs)
    jac = check_jac_option(jac, allow_none=True)
    if wants_curve_fit_stream(xdata, ydata, kwargs):  # larger than memory
        out = curve_fit_stream(f, xdata, ydata, p0, sigma, absolute_sigma,
                                       check_finite, bounds, method, jac, full_output,
                                       nan_policy, kwargs)
        if out is not None:
            return out
    xdata = as_data(xdata, "xdata")
    ydata = as_data(ydata, "ydata")
    sigma = as_data(sigma, "sigma")
    concrete = is_concrete((xdata, ydata, sigma))
    if check_finite is None:
        check_finite = nan_policy is None
    if nan_policy == "propagate":
        raise ValueError("`nan_policy='propagate'` is not supported by this function.")
    if nan_policy not in (None, "raise", "omit"):
        raise ValueError("nan_policy must be one of {None, 'raise', 'omit'}")
    checked = ()   # data found finite here: solve_nlsq does not read them again
    if concrete:
        ydata = np.asarray(ydata, dtype=np.float64) if not isinstance(ydata, jax.Array) \
            else ydata
        if check_finite:
            for arr, name in ((xdata, "xdata"), (ydata, "ydata")):
                if not all_finite(arr):
                    raise ValueError(f"{name} contains NaN or Inf (array must not contain "
                                     "infs or NaNs); remove those points or pass "
                                     "nan_policy='omit'.")
            checked = (xdata, ydata)
        elif nan_policy is not None:
            xa, ya = np.asarray(xdata, np.float64), np.asarray(ydata, np.float64)
            has_nan = np.isnan(xa)
            has_nan = has_nan.any(axis=tuple(range(has_nan.ndim - 1))) if xa.ndim else \
                np.zeros(ya.shape, bool)
            has_nan = has_nan | np.isnan(ya)
            if np.any(has_nan):
                if nan_policy == "raise":
                    raise ValueError("The input contains nan values")
                xdata = jnp.asarray(xa[..., ~has_nan])
                ydata = jnp.asarray(ya[~has_nan])
                if sigma is not None:
                    s = np.asarray(sigma)
                    if s.ndim == 1 and s.size > 1:
                        sigma = s[~has_nan]
                    elif s.ndim == 2:
                        sigma = s[~has_nan][:, ~has_nan]
    # Eager calls prepare the data with NumPy: an eager jnp operation compiles for every
    # new data length (see the host driver in solve_nlsq).
    xnp = np if concrete and not isinstance(ydata, jax.Array) else jnp
    ydata = xnp.asarray(ydata)
    if ydata.ndim != 1:
        ydata = xnp.ravel(ydata)
    if ydata.size == 0:
        raise ValueError("`ydata` must not be empty!")
    if isinstance(xdata, (list, tuple, np.ndarray)):
        xdata = np.asarray(xdata) if concrete else jnp.asarray(xdata)
    m = int(ydata.size)
    if p0 is None:
        n = _n_params(f)
        lb, ub = _broadcast_bounds(as_bounds(bounds, n), n, np.float64)
        p0 = initialize_feasible(lb, ub)
    else:
        p0 = as_x0(p0)
    if is_concrete(p0):
        p0 = np.atleast_1d(np.asarray(p0, dtype=jnp.result_type(float)))
    else:
        p0 = jnp.atleast_1d(jnp.asarray(p0, dtype=jnp.result_type(float)))
    n = int(p0.size)
    check_p0_arity(f, n)
    bounds = as_bounds(bounds, n)
    unbounded = is_concrete(bounds) and all(
        np.all(np.isinf(np.asarray(b, float))) for b in bounds
        if not isinstance(b, dict))
    if (method == "lm" or (method is None and unbounded)) and m != 1 and n > m:
        raise TypeError(f"The number of func parameters={n} must not exceed the number "
                        f"of data points={m}")

    if sigma is None:
        kind, extra = "none", ()
    else:
        s = xnp.asarray(sigma, dtype=ydata.dtype if jnp.issubdtype(ydata.dtype,
                                                                  jnp.floating) else float)
        if s.size == 1 or s.shape == (m,):
            if concrete and np.any(np.asarray(s) <= 0):
                raise ValueError("1-D `sigma` must be positive (standard deviations).")
            kind, extra = "1d", (xnp.broadcast_to(1.0 / s.reshape(-1), (m,)),)
        elif s.shape == (m, m):
            L = jnp.linalg.cholesky(s)
            if concrete and not np.all(np.isfinite(np.asarray(L))):
                raise ValueError("`sigma` must be positive definite (a covariance matrix).")
            kind, extra = "2d", (L,)
        else:
            raise ValueError(f"`sigma` has incorrect shape {tuple(s.shape)}: expected a "
                             f"scalar, ({m},) standard deviations or a ({m}, {m}) "
                             "covariance matrix.")

    residual = _residual_for(f, kind)
    # starts="auto" (issue 32): its noise test knows what sigma means here
    auto = for_curve_fit(kwargs.get("starts", 1), kind, absolute_sigma, xdata)
    if auto is not None:
        kwargs = {**kwargs, "starts": auto}
    if callable(jac):  # its shape is checked by solve_nlsq, which traces it once
        jac_arg = _jac_for(jac, kind)
    else:  # a string as given; None is solve_nlsq's default: forward-mode autodiff, or
        # scipy's 2-point where diff_step / epsfcn / jac_sparsity ask for differences
        jac_arg = jac
    try:
        # a host-driver solve hands back its covariance (computed in its final program)
        # and, when promoted, its fast path
        # (issue 31) without full_output, an eager call and one start: a large blocked
        # fit may hand back the covariance from its loop's last model instead of
        # fun/jac (_fused.lean_final; traced, pcov keeps its derivatives through jac)
        lean = (_fused.lean_final() if concrete and is_concrete((p0, bounds))
                and not full_output and auto is None and kwargs.get("starts", 1) == 1
                else contextlib.nullcontext({}))
        with _promote.capture(covariance=m < _NUMPY_COVARIANCE_MAX_M) as box, \
                lean as lean_box, checked_finite(*checked):
            res = solve_nlsq(residual, p0, args=(xdata, ydata, *extra), bounds=bounds,
                             method=method, jac=jac_arg, **{**kwargs, "chunk_size": False})
    except ValueError as exc:
        if "x0 is outside the bounds" in str(exc):
            raise ValueError("Initial guess is outside of provided bounds: "
                             + str(exc).replace("x0", "p0")) from None
        raise
    if "cov" in lean_box:   # a lean fused solve: no fun/jac, (J^T J)^+ from the loop
        box = {**box, "cov": lean_box["cov"]}
    elif hasattr(res.jac, "toarray"):  # jac_sparsity: res.jac is scipy's csr_array; pcov
        # needs it dense (scipy 1.17's own curve_fit fails here on the sparse array)
        res = dataclasses.replace(res, jac=res.jac.toarray())
    popt = res.x
    if isinstance(popt, np.ndarray):  # writable, as scipy's (a view of a result buffer)
        popt = np.array(popt)
    # scipy's rule for lm (MINPACK's cov_x is None for a singular R): an all-inf pcov
    # when a parameter is not identifiable. trf/dogbox: only the rows and columns of the
    # parameters that are not identifiable are inf (scipy's pseudo-inverse gives them a
    # finite, misleading variance; an intentional difference, docs/scipy.md)
    lm_rule = method == "lm" or (method is None and unbounded)
    # the point count is the residual's size (a scalar ydata broadcasts against f)
    m = int(res.fun.size) if res.fun is not None else lean_box["m"]
    if "cov" in box:  # the host driver's final program computed (J^T J)^+
        pcov = _scale_pcov(box["cov"], res.cost, m, n, lm_rule, absolute_sigma)
    elif is_concrete((res.jac, res.cost)) and m < _NUMPY_COVARIANCE_MAX_M:
        # NumPy: no compilation per data length
        pcov = _pcov_numpy(np.asarray(res.jac), res.cost, n, lm_rule, absolute_sigma)
    else:
        pcov = _scale_pcov(covariance_from_jac(res.jac)[0], res.cost, m, n, lm_rule,
                           absolute_sigma, xnp=jnp)
    # a plan only where the first fit's pcov came from the program too (the same bits)
    # (a fast path is offered with its covariance only: _host.host_solve)
    # (not with starts="auto": a repeat through the plan would skip its noise test)
    if _plan_key is not None and "fast" in box and not full_output and auto is None:
        _promote.remember_plan(_plan_key, _Plan(
            box["fast"], n, m, kind, lm_rule, bool(absolute_sigma),
            _broadcast_bounds(bounds, n, np.float64), p0,
            x64_enabled() and not _plan_key[-1]))  # in the x64 scope, as this call
    if not is_concrete(res.status) and not full_output:
        # under a trace nothing can raise scipy's RuntimeError: a failed fit returns NaN
        # (without full_output there is no ier to check, and popt would look like an
        # answer: newcomer audit)
        failed = ~(jnp.asarray(res.status) > 0)
        popt = jnp.where(failed, jnp.nan, popt)
        pcov = jnp.where(failed, jnp.nan, pcov)
    if is_concrete(pcov):
        # the status on the host (res.success would compile an eager comparison)
        if concrete and not int(np.asarray(res.status)) > 0:
            raise RuntimeError("Optimal parameters not found: " + res.message)
        if np.any(np.isinf(np.asarray(pcov))):
            warnings.warn("Covariance of the parameters could not be estimated (inf "
                          "where a parameter is not identifiable)", _warning_class(),
                          stacklevel=2)
    if full_output:
        if is_concrete(res.status):  # scipy's types: int nfev and ier
            res = result_to_host(res)
        infodict = {"nfev": res.nfev, "fvec": res.fun, "result": res,
                    **minpack_fields(res.jac, res.fun)}
        # under a trace the message is unknown, and a str could not leave jit: None
        mesg = res.message if is_concrete(res.status) else None
        return popt, pcov, infodict, mesg, res.status
    return popt, pcov


# ----------------------------------------------------------------------------- streamed
# ----------------------------------------------------------------------------- curve_fit
@functools.lru_cache(maxsize=256)
def _sigma_residual(f: Callable) -> Callable:
    """``(f(x, *p) - y) / sigma``: sigma a scalar or streamed with the points."""
    def residual(p, xdata, ydata, sigma):
        return jnp.ravel((_call(f, xdata, p) - ydata) / sigma)

    return residual


def wants_curve_fit_stream(xdata, ydata, kwargs) -> bool:
    """``curve_fit``'s switch: a :class:`Chunks` ``xdata``, ``chunk_size=`` or host
    NumPy ``ydata`` of at least :data:`._stream.STREAM_MIN_POINTS` points."""
    if kwargs.get("chunk_size") is False and not isinstance(xdata, Chunks):
        return False      # "never stream", as solve_nlsq's chunk_size=False
    return (isinstance(xdata, Chunks) or kwargs.get("chunk_size") is not None or
            (_is_host_array(ydata) and ydata.size >= _stream.STREAM_MIN_POINTS) or
            point_sharding((xdata, ydata)) is not None)


def curve_fit_stream(f, xdata, ydata, p0, sigma, absolute_sigma, check_finite, bounds,
                     method, jac, full_output, nan_policy, kwargs):
    """:func:`adaptprec.curve_fit` over streamed data; ``None`` when large host data
    turn out not streamable (the caller fits in memory). ``pcov`` comes from the summed
    Gram matrix ``J^T J`` (:func:`covariance_from_gram`)."""
    import warnings

    asked = isinstance(xdata, Chunks) or kwargs.get("chunk_size") is not None
    if full_output and not asked:   # infodict's fvec/fjac: as large as the data
        return None
    if not is_concrete(xdata if not isinstance(xdata, Chunks) else (), ydata, sigma, p0):
        raise ValueError(_stream.TRACED_MESSAGE.format(entry="curve_fit",
                                                      min_points=_stream.STREAM_MIN_POINTS))
    if nan_policy not in (None, "raise"):
        if not asked:
            return None
        raise ValueError("streamed curve_fit does not drop NaN points "
                         "(nan_policy='omit'); clean the chunks first.")
    if jac is not None and jac != "fwd":
        if not asked:
            return None
        raise ValueError("streamed curve_fit differentiates the model with JAX (jac=None);"
                         f" jac={jac!r} cannot be combined with chunk_size/Chunks.")
    if isinstance(xdata, Chunks):
        if ydata is not None or sigma is not None:
            raise ValueError("with a Chunks source, pass ydata=None and sigma=None: each "
                             "chunk is (xdata, ydata) or (xdata, ydata, sigma)")
        first = next(iter(xdata), None)
        if first is None or len(first) not in (2, 3):
            raise ValueError("curve_fit's Chunks must give (xdata, ydata) or "
                             "(xdata, ydata, sigma) tuples")
        residual = _residual_for(f, "none") if len(first) == 2 else _sigma_residual(f)
        args = xdata
    elif point_sharding((xdata, ydata)) is not None:   # sharded jax.Arrays: as they are
        if sigma is None:
            residual, args = _residual_for(f, "none"), (xdata, ydata)
        else:
            if np.ndim(sigma) > 1:
                raise ValueError("a sharded curve_fit takes sigma as standard deviations "
                                 "(a scalar or one per point), not an (m, m) covariance")
            residual, args = _sigma_residual(f), (xdata, ydata, sigma)
    else:
        ydata = np.asarray(ydata)
        if ydata.ndim != 1:
            raise ValueError(f"streamed curve_fit needs a 1-D ydata, got shape "
                             f"{ydata.shape}")
        xdata = np.asarray(xdata)
        if sigma is None:
            residual, args = _residual_for(f, "none"), (xdata, ydata)
        else:
            s = np.asarray(sigma)
            if s.ndim == 2:
                if not asked:
                    return None
                raise ValueError("streamed curve_fit takes sigma as standard deviations "
                                 "(a scalar or one per point), not an (m, m) covariance")
            if np.any(s <= 0):
                raise ValueError("1-D `sigma` must be positive (standard deviations).")
            residual, args = _sigma_residual(f), (xdata, ydata, s.reshape(()) if s.size
                                                  == 1 else s)
    if p0 is None:
        n = _n_params(f)
        lb, ub = _broadcast_bounds(as_bounds(bounds, n), n, np.float64)
        p0 = initialize_feasible(lb, ub)
    p0 = np.atleast_1d(np.asarray(as_x0(p0), np.float64))
    out = solve_stream(residual, p0, args, bounds=bounds, method=method, auto=not asked,
                       entry="curve_fit", with_gram=True,
                       check_finite=True if check_finite is None else bool(check_finite),
                       **kwargs)
    if out is None:
        return None
    res, A, m = out
    n = p0.size
    pcov = covariance_from_gram(A, m)
    if not absolute_sigma:
        pcov = pcov * (2.0 * float(res.cost) / (m - n)) if m > n else \
            np.full_like(pcov, np.inf)
    if not bool(res.success):
        raise RuntimeError("Optimal parameters not found: " + res.message)
    if np.any(np.isinf(pcov)):
        warnings.warn("Covariance of the parameters could not be estimated (inf where a "
                      "parameter is not identifiable)", _warning_class(), stacklevel=3)
    popt = np.asarray(res.x)
    if full_output:
        return popt, pcov, {"nfev": res.nfev, "result": res}, res.message, res.status
    return popt, pcov
