"""`curve_fit`: scipy's ``curve_fit`` semantics on :func:`adaptprec.solve_nlsq`, in
memory (the problem from :mod:`._model`) or streamed (:func:`curve_fit_stream`)."""

from __future__ import annotations

import functools
import inspect
import sys
import warnings
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.linalg import qr

from .._tracing import is_concrete
from .._user_fn import positional_model
from .._x64_rule import float64_entry
from ._auto_starts import for_curve_fit
from ._inputs import broadcast_bounds
from ._arguments import as_bounds, as_x0, check_jac_option
from ._model import (_call, _jac_for, _n_params, _residual_for, initialize_feasible,
                     leastsq_kwargs, prepare_curve_fit)
from ._sharded import point_sharding
from ._state import Outputs
from . import _stream
from ._stream import Chunks, covariance_from_gram, solve_stream
from .common import covariance_at, scale_pcov
from .result import result_to_host
from .solve import route, solve_in_memory, solve_nlsq

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


def __getattr__(name):
    # the subclass pickles by reference: created on first use, here as in the sender
    if name == "OptimizeWarningBoth":
        return _both_warning_classes()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@float64_entry("curve_fit", ("xdata", "ydata", "p0", "sigma", "bounds", "kwargs"),
               always_host=True)
def curve_fit(f: Callable, xdata, ydata, p0=None, sigma=None, absolute_sigma: bool = False,
              check_finite=None, bounds=(-np.inf, np.inf), method=None, jac=None, *,
              full_output: bool = False, nan_policy=None, **kwargs):
    """Fit ``f(xdata, *params)`` to ``ydata``; returns ``(popt, pcov)`` (scipy semantics).

    Args:
      f: model ``f(xdata, *params)`` written with ``jax.numpy``.
      xdata, ydata: data (``ydata`` 1-D; ``xdata`` any array, last axis the points), any
        array-like. Larger than memory (docs/nlsq.md): ``chunk_size=N`` streams host or
        memory-mapped arrays, ``xdata`` may be a :class:`~adaptprec.Chunks` source
        (``ydata=None``); host ``ydata`` of 2^22 points and data sharded over a mesh
        stream by themselves.
      p0: initial guess (default: ones, sized from ``f``'s signature; with bounds,
        scipy's feasible point).
      sigma: ``None``, 1-D standard deviations (or a scalar), or an ``(m, m)`` covariance.
      absolute_sigma: if false, ``pcov`` is scaled by the reduced chi-square.
      check_finite, nan_policy: scipy's (``nan_policy="omit"`` drops NaN points).
      bounds, method: as :func:`~adaptprec.solve_nlsq` (``"lm"`` without bounds, ``"trf"``
        with).
      jac: ``None`` (autodiff, where scipy would use ``"2-point"``), ``"fwd"``/``"rev"``,
        a callable ``jac(xdata, *params)`` returning the ``(m, n)`` Jacobian of ``f``, or
        scipy's finite differences.
      full_output: also return ``infodict`` (``nfev``, ``fvec``, MINPACK's ``fjac``,
        ``ipvt`` (0-based), ``qtf``, ``result``), ``mesg`` and ``ier``.
      fixed, expr, constraints: parameters held at a value (``{"c": 0.0}``), tied
        (``{"b": "2*a"}`` or a callable of the parameters by name) or held by an
        inequality (``["a < b"]``); ``p0`` and ``bounds`` may then be dicts by name.
        ``popt``/``pcov`` cover every parameter, ``pcov`` propagated from the free
        ones (:mod:`adaptprec.modeling.parameters`).
      Complex ``ydata`` (and a complex model): the real and imaginary parts are fitted
        together (:mod:`adaptprec.modeling.complex_model`).
      likelihood: ``"gaussian"`` (least squares, the default) or ``"poisson"``
        (counts: the deviance minimised, ``pcov`` the inverse Fisher information;
        :mod:`adaptprec.modeling.likelihood`).
      **kwargs: :func:`~adaptprec.solve_nlsq`'s options (``precision``, ``loss``,
        ``ftol``, ``max_nfev``, ``starts``...); ``leastsq``'s ``maxfev``, ``epsfcn`` and
        ``diag`` are translated.

    ``pcov`` is ``(J^T J)^+`` of the whitened Jacobian at the solution (scipy's SVD rule;
    parameters that are not identifiable get ``inf``), times the reduced chi-square
    ``2 cost / (m - n)`` unless ``absolute_sigma``. Raises ``RuntimeError`` (concrete
    inputs) when the fit does not succeed; under ``jit`` a failed fit returns NaN. Eager
    calls return NumPy float64, also with ``jax_enable_x64`` off.

    Example:
        >>> import jax.numpy as jnp
        >>> import adaptprec as ap
        >>> x = jnp.arange(5.0)
        >>> popt, pcov = ap.curve_fit(lambda x, a, b: a * x + b, x, 2 * x + 1,
        ...                           sigma=jnp.full(5, 0.1), absolute_sigma=True)
        >>> [round(float(v), 8) for v in popt], round(float(pcov[1, 1]), 6)
        ([2.0, 1.0], 0.006)
    """
    if "args" in kwargs:
        raise ValueError("'args' is not a supported keyword argument (curve_fit passes "
                         "the parameters to f as f(xdata, *params)).")
    kwargs = leastsq_kwargs(kwargs)
    code = getattr(f, "__code__", None)
    if code is None or code.co_kwonlyargcount:   # a partial's keyword-only parameters
        f = positional_model(f)                   # are passed by name
    named = {k: kwargs.pop(k) for k in ("fixed", "expr", "constraints") if k in kwargs}
    if isinstance(p0, dict) or isinstance(bounds, dict) or any(
            v is not None for v in named.values()):
        from ..modeling.parameters import curve_fit_free   # fixed, tied, constrained

        return curve_fit_free(curve_fit, f, xdata, ydata, p0, sigma, absolute_sigma,
                              check_finite, bounds, method, jac, full_output, nan_policy,
                              kwargs, **named)
    if kwargs.get("likelihood", "gaussian") != "gaussian":   # counts: the deviance
        from ..modeling.likelihood import curve_fit_poisson

        kwargs.pop("likelihood")
        return curve_fit_poisson(curve_fit, covariance_at, f, xdata, ydata, p0, sigma,
                                 check_finite, bounds, method, jac, full_output,
                                 nan_policy, kwargs)
    kwargs.pop("likelihood", None)
    if np.iscomplexobj(ydata):   # real and imaginary parts as residuals
        from ..modeling.complex_model import curve_fit_complex

        return curve_fit_complex(curve_fit, f, xdata, ydata, p0, sigma, absolute_sigma,
                                 check_finite, bounds, method, jac, full_output,
                                 nan_policy, kwargs)
    jac = None if jac is None else check_jac_option(jac)
    if wants_curve_fit_stream(xdata, ydata, kwargs):  # larger than memory
        out = curve_fit_stream(f, xdata, ydata, p0, sigma, absolute_sigma, check_finite,
                               bounds, method, jac, full_output, nan_policy, kwargs)
        if out is not None:
            return out
    cf = prepare_curve_fit(f, xdata, ydata, p0, sigma, check_finite, bounds, method,
                           nan_policy)
    starts = kwargs.pop("starts", 1)
    auto = None if starts == 1 else for_curve_fit(starts, cf.kind, absolute_sigma,
                                                  cf.args[0])
    # a string jac as given (None: autodiff, or 2-point where diff_step asks for it)
    jac_arg = _jac_for(jac, cf.kind) if callable(jac) else jac
    kw = dict(_SOLVE_DEFAULTS, **kwargs, bounds=cf.bounds, method=method, jac=jac_arg)
    throw = kw.pop("throw", False)
    kw.pop("chunk_size", None)
    try:
        if starts == 1 and auto is None:
            res, cov = solve_in_memory(cf.residual, cf.p0, cf.args, kw, checked=cf.checked,
                                       outputs=Outputs(fun_jac=full_output,
                                                       covariance=True, throw=throw))
        else:
            res = route(cf.residual, cf.p0, cf.args, kw, starts=auto or starts,
                        throw=throw, chunk_size=False)
            cov = covariance_at(res.jac)
    except ValueError as exc:
        if "x0 is outside the bounds" in str(exc):
            raise ValueError("Initial guess is outside of provided bounds: "
                             + str(exc).replace("x0", "p0")) from None
        raise
    return _fit_outputs(res, cov, cf, absolute_sigma, full_output)


#: solve_nlsq's defaults, for the options curve_fit does not set
_SOLVE_DEFAULTS = {k: p.default for k, p in inspect.signature(solve_nlsq).parameters.items()
                   if p.kind is p.KEYWORD_ONLY and k not in (
                       "method", "bounds", "jac", "throw", "starts", "chunk_size")}


def _fit_outputs(res, cov, cf, absolute_sigma, full_output):
    """``(popt, pcov)`` (and scipy's ``infodict``, ``mesg``, ``ier``) of a fit."""
    popt = np.array(res.x) if isinstance(res.x, np.ndarray) else res.x  # writable
    concrete = is_concrete(res.status, res.cost, cov)
    # the point count is the residual's size (a scalar ydata broadcasts against f)
    m = int(res.fun.size) if res.fun is not None else cf.m
    pcov = scale_pcov(cov, res.cost, m, cf.n, lm_rule=cf.lm_rule,
                      absolute_sigma=bool(absolute_sigma), xnp=np if concrete else jnp)
    if not concrete and not full_output:
        # under a trace nothing can raise scipy's RuntimeError: a failed fit returns NaN
        failed = ~(jnp.asarray(res.status) > 0)
        popt, pcov = jnp.where(failed, jnp.nan, popt), jnp.where(failed, jnp.nan, pcov)
    if concrete:
        if cf.concrete and not int(res.status) > 0:
            raise RuntimeError("Optimal parameters not found: " + res.message)
        if np.count_nonzero(np.isinf(pcov)):
            warnings.warn("Covariance of the parameters could not be estimated (inf "
                          "where a parameter is not identifiable)", _warning_class(),
                          stacklevel=4)
    if not full_output:
        return popt, pcov
    if is_concrete(res.status):  # scipy's types: int nfev and ier
        res = result_to_host(res)
    infodict = {"nfev": res.nfev, "fvec": res.fun, "result": res,
                **minpack_fields(res.jac, res.fun)}
    # under a trace the message is unknown, and a str could not leave jit: None
    return popt, pcov, infodict, res.message if is_concrete(res.status) else None, \
        res.status


def minpack_fields(J, f) -> dict:
    """scipy ``leastsq``'s ``infodict`` fields ``{"fjac", "ipvt", "qtf"}`` for the
    Jacobian ``J`` (m, n) and residual ``f`` (m,), by a column-pivoted QR (also under
    ``jit``): ``fjac`` is ``(n, m)`` with ``R`` in the upper triangle of ``fjac.T[:n]``
    (zeros where MINPACK keeps Householder vectors), ``ipvt`` 0-based (scipy >= 1.15),
    ``J[:, ipvt] = Q R`` and ``qtf = Q^T f``, so scipy's covariance recipe applies.

    Example:
        >>> import numpy as np, jax.numpy as jnp
        >>> from adaptprec.nlsq.curve_fit import minpack_fields
        >>> J = jnp.array([[1.0, 0.0], [0.0, 3.0], [1.0, 1.0]])
        >>> d = minpack_fields(J, jnp.array([1.0, 2.0, 3.0]))
        >>> d["fjac"].shape, d["ipvt"].tolist()
        ((2, 3), [1, 0])
        >>> R = np.triu(np.asarray(d["fjac"]).T[:2])
        >>> bool(np.allclose(R.T @ R, (J[:, d["ipvt"]].T @ J[:, d["ipvt"]])))
        True
    """
    J = jnp.asarray(J)
    f = jnp.asarray(f)
    m, n = J.shape
    k = min(m, n)
    Q, R, P = qr(J, pivoting=True, mode="economic")
    fjac = jnp.zeros((m, n), J.dtype).at[:k, :].set(R[:k])
    qtf = jnp.zeros((n,), J.dtype).at[:k].set((Q.T @ f)[:k])
    return {"fjac": fjac.T, "ipvt": P.astype(jnp.int32), "qtf": qtf}


# ----------------------------------------------------------------------------- streamed
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
            (isinstance(ydata, np.ndarray) and not isinstance(ydata, jax.Array)
             and ydata.size >= _stream.STREAM_MIN_POINTS) or
            (isinstance(xdata, jax.Array) or isinstance(ydata, jax.Array)) and
            point_sharding((xdata, ydata)) is not None)


def curve_fit_stream(f, xdata, ydata, p0, sigma, absolute_sigma, check_finite, bounds,
                     method, jac, full_output, nan_policy, kwargs):
    """:func:`adaptprec.curve_fit` over streamed data; ``None`` when large host data
    turn out not streamable (the caller fits in memory). ``pcov`` comes from the summed
    Gram matrix ``J^T J`` (:func:`covariance_from_gram`)."""
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
        lb, ub = broadcast_bounds(as_bounds(bounds, n), n, np.float64)
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
    pcov = scale_pcov(covariance_from_gram(A, m), float(res.cost), m, n, lm_rule=False,
                      absolute_sigma=bool(absolute_sigma))
    if not bool(res.success):
        raise RuntimeError("Optimal parameters not found: " + res.message)
    if np.any(np.isinf(pcov)):
        warnings.warn("Covariance of the parameters could not be estimated (inf where a "
                      "parameter is not identifiable)", _warning_class(), stacklevel=3)
    popt = np.asarray(res.x)
    if full_output:
        return popt, pcov, {"nfev": res.nfev, "result": res}, res.message, res.status
    return popt, pcov
