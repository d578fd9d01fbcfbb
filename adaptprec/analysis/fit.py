"""`ap.fit`: fit a model and report it (:class:`~adaptprec.FitResult`).

The decision tree of one call:

1. **Parameters** (:mod:`adaptprec.modeling.parameters`): ``fixed=``, ``expr=``,
   ``constraints=`` and ``p0``/``bounds`` by name give the free coordinates ``q`` and
   the reduced model ``g(x, *q) = model(x, *expand(q))``; without them ``g`` is the
   model.
2. **Likelihood**:

   - ``"gaussian"`` (default): :func:`~adaptprec.curve_fit` of ``g`` (least squares,
     ``sigma`` and ``absolute_sigma`` as scipy's); a complex ``ydata`` fits the real
     and imaginary parts together;
   - ``"poisson"``: ``curve_fit(likelihood="poisson")``, the deviance minimised on the
     same engine, the covariance the inverse Fisher information;
   - a callable ``nll(ydata, f)`` (the negative log-likelihood of the data given the
     model's values, per point or summed): the trust-region Newton solver
     (:mod:`._newton`), the covariance the inverse Hessian (observed information).

3. **Report** (:mod:`._statistics`): the statistics on ``q``, then the table over every
   parameter (fixed: error 0; tied: error propagated).

Example:
    >>> import numpy as np, jax.numpy as jnp
    >>> import adaptprec as ap
    >>> x = np.linspace(0.0, 4.0, 30)
    >>> y = 2.0 * np.exp(-1.2 * x) + 0.5 + 0.01 * np.cos(7 * x)
    >>> res = ap.fit(lambda x, a, k, c: a * jnp.exp(-k * x) + c, x, y, fixed={"c": 0.5})
    >>> [round(float(v), 2) for v in res.popt], float(res.stderr[2]), res.dof
    ([2.0, 1.2, 0.5], 0.0, 28)
"""

from __future__ import annotations

import functools
import warnings
from typing import Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np

from .._user_fn import positional_model
from ..precision import x64_enabled

__all__ = ["fit", "omit_nan"]


def omit_nan(xdata, ydata, sigma):
    """``nan_policy="omit"``: the data without the points holding NaN in ``ydata`` or in
    ``xdata`` (along its last axis); ``sigma`` (per point) follows."""
    y = np.asarray(ydata)
    bad = np.isnan(y.real if np.iscomplexobj(y) else y).ravel()
    x = np.asarray(xdata)
    if x.ndim and x.shape[-1] == bad.size and x.dtype.kind in "fc":
        bad = bad | np.isnan(x.reshape(-1, bad.size)).any(axis=0)
    if not bad.any():
        return xdata, ydata, sigma
    keep = ~bad
    if sigma is not None and np.ndim(sigma) == 1 and np.size(sigma) == bad.size:
        sigma = np.asarray(sigma)[keep]
    elif sigma is not None and np.ndim(sigma) == 2:
        sigma = np.asarray(sigma)[np.ix_(keep, keep)]
    x = x[..., keep] if x.ndim and x.shape[-1] == bad.size else x
    return x, y.ravel()[keep], sigma


def _check(curve_fit_kwargs, likelihood, sigma, nan_policy):
    if curve_fit_kwargs.get("full_output") is not None:
        raise ValueError("fit does not take full_output=: it always asks curve_fit for "
                         "its full output (res.solver is the solve's result)")
    curve_fit_kwargs.pop("full_output", None)
    if curve_fit_kwargs.get("loss", "linear") == "poisson":
        raise ValueError("loss= is a robust loss on residuals; a Poisson likelihood is "
                         "likelihood='poisson'")
    if curve_fit_kwargs.get("loss", "linear") != "linear":
        raise ValueError("fit reports least-squares or likelihood statistics: loss must "
                         "be 'linear'; use curve_fit for a robust loss")
    if nan_policy not in (None, "raise", "omit"):
        raise ValueError("nan_policy must be None, 'raise' or 'omit'")
    if callable(likelihood):
        if sigma is not None:
            raise ValueError("a likelihood fit takes no sigma: put the noise model in "
                             "nll(ydata, f)")
        return
    from ..modeling.likelihood import check_likelihood

    check_likelihood(likelihood, sigma)


def fit(model: Callable, xdata, ydata, p0=None, sigma=None, absolute_sigma: bool = False,
        bounds=(-np.inf, np.inf), method: Optional[str] = None, *, names=None,
        fixed=None, expr=None, constraints=None, likelihood="gaussian", nan_policy=None,
        **curve_fit_kwargs):
    """Fit ``model(xdata, *params)`` to ``ydata`` and return a :class:`FitResult`.

    Args:
        model, xdata, ydata, p0, sigma, absolute_sigma, bounds, method: as
            :func:`~adaptprec.curve_fit` (which runs the solve; its own return is
            untouched). ``p0`` and ``bounds`` may be dicts by parameter name
            (``bounds={"k": (0, None)}``).
        names: the parameter names (default: ``model``'s signature).
        fixed: ``{name: value}``: held at the value (lmfit's ``vary=False``).
        expr: ``{name: "2*a"}`` or ``{name: callable(params)}``: tied to the others
            (lmfit's ``expr``); its error is propagated.
        constraints: ``["a < b", ...]``: inequalities (:mod:`adaptprec.modeling.
            parameters`).
        likelihood: ``"gaussian"`` (least squares), ``"poisson"`` (counts: Gpufit's
            MLE, covariance from the Fisher information) or a callable ``nll(ydata,
            f)`` returning the negative log-likelihood (per point or summed).
        nan_policy: ``"omit"`` drops the points holding NaN; ``None``/``"raise"``
            refuse them.
        **curve_fit_kwargs: :func:`~adaptprec.curve_fit`'s other options.

    A fit that fails raises ``RuntimeError`` as ``curve_fit`` does.

    Example:
        >>> import numpy as np, jax.numpy as jnp
        >>> import adaptprec as ap
        >>> x = np.linspace(0.0, 1.0, 12)
        >>> y = 3.0 * x + 1.0 + np.array([1, -1] * 6) * 0.01
        >>> res = ap.fit(lambda x, slope, icpt: slope * x + icpt, x, y)
        >>> res.names, res.dof, [round(float(v), 4) for v in res.stderr]
        (('slope', 'icpt'), 10, [0.01, 0.0059])
    """
    from ..modeling.parameters import model_names, parameter_spec, reduced_model

    model = positional_model(model)
    _check(curve_fit_kwargs, likelihood, sigma, nan_policy)
    if nan_policy == "omit":
        xdata, ydata, sigma = omit_nan(xdata, ydata, sigma)
    n_hint = None if p0 is None or isinstance(p0, dict) else int(np.size(p0))
    names = tuple(names) if names is not None else model_names(model, n_hint)
    spec, values = parameter_spec(names, p0=p0, bounds=bounds, fixed=fixed, expr=expr,
                                  constraints=constraints)
    g = model if spec.trivial else reduced_model(model, spec, values.fixed)
    if not callable(likelihood):
        q, solver = _least_squares(g, xdata, ydata, p0, sigma, absolute_sigma, bounds,
                                   method, spec, values, likelihood, curve_fit_kwargs)
    from ._build import build

    def finish():
        if callable(likelihood):
            s = _likelihood_fit(g, likelihood, xdata, ydata, values, curve_fit_kwargs)
        else:
            s = _solved(g, xdata, ydata, q, solver, likelihood, absolute_sigma)
        return build(model, g, spec, values, xdata, ydata, sigma, absolute_sigma, method,
                     likelihood, s)

    if x64_enabled():
        return finish()
    from .._x64_scope import float64_scope

    with float64_scope():
        return finish()


def _least_squares(g, xdata, ydata, p0, sigma, absolute_sigma, bounds, method, spec,
                   values, likelihood, kw):
    """``curve_fit`` on the free coordinates: ``(q, NLSQResult)``."""
    from ..nlsq.curve_fit import OptimizeWarning, curve_fit

    if spec.trivial:   # the call as given (curve_fit's own defaults and memo)
        start = values.q0 if p0 is None or isinstance(p0, dict) else p0
        qb = (values.lower, values.upper) if isinstance(bounds, dict) else bounds
    else:
        start, qb = values.q0, (values.lower, values.upper)
    with warnings.catch_warnings():
        # curve_fit warns about an inf pcov; the report names the cause instead
        warnings.simplefilter("ignore", OptimizeWarning)
        warnings.filterwarnings("ignore", "Covariance of the parameters could not")
        q, _, info, _, _ = curve_fit(g, xdata, ydata, start, sigma, absolute_sigma,
                                     bounds=qb, method=method, full_output=True,
                                     likelihood=likelihood, **kw)
    return np.asarray(q, np.float64), info["result"]


def _solved(g, xdata, ydata, q, solver, likelihood, absolute_sigma):
    """The statistics' view of a least-squares or Poisson solve (float64 scope)."""
    from ._statistics import Solved

    x = np.asarray(xdata) if not isinstance(xdata, jax.Array) else xdata
    f = np.asarray(g(x, *[jnp.asarray(v) for v in q]))
    f = f.astype(np.complex128 if np.iscomplexobj(f) else np.float64).ravel()
    y = np.asarray(ydata).ravel()
    r = np.asarray(solver.fun, np.float64).ravel()
    if likelihood == "poisson":
        from ..modeling.likelihood import fisher_jacobian, poisson_nll

        J = np.asarray(fisher_jacobian(g, x, jnp.asarray(q)), np.float64)
        f = np.broadcast_to(f, y.shape)
        return Solved(q, solver, J, r, f, float(r @ r), poisson_nll(f, y), y.size, False)
    J = np.asarray(solver.jac, np.float64).reshape(r.size, -1)
    f = np.broadcast_to(f, y.shape)
    return Solved(q, solver, J, r, f, float(r @ r), None, r.size, not absolute_sigma)


@functools.lru_cache(maxsize=32)
def _nll_program(g, nll, max_steps):
    from ._newton import minimize_nll

    def objective(q, x, y):
        return jnp.sum(nll(y, jnp.ravel(g(x, *[q[i] for i in range(q.shape[0])]))))

    return jax.jit(lambda q0, x, y, lb, ub: minimize_nll(objective, q0, lb, ub,
                                                         args=(x, y),
                                                         max_steps=max_steps))


def _likelihood_fit(g, nll, xdata, ydata, values, kw):
    """A user's likelihood minimised by the Newton solver (float64 scope)."""
    from ..nlsq.result import NLSQResult
    from ._statistics import Solved

    unknown = sorted(set(kw) - {"max_nfev", "max_steps"})
    if unknown:
        raise ValueError(f"a likelihood fit (likelihood=callable) does not take {unknown}")
    x = np.asarray(xdata) if not isinstance(xdata, jax.Array) else xdata
    y = np.asarray(ydata, np.float64).ravel()
    st = _nll_program(g, nll, kw.get("max_steps") or kw.get("max_nfev"))(
        jnp.asarray(values.q0), x, y, jnp.asarray(values.lower), jnp.asarray(values.upper))
    q = np.asarray(st.x, np.float64)
    status = int(st.status)
    if status <= 0:
        from ..nlsq.common import STATUS_MESSAGES

        raise RuntimeError("Optimal parameters not found: " + STATUS_MESSAGES.get(
            status, f"status {status}"))
    lam, V = np.linalg.eigh(np.asarray(st.H, np.float64))
    J = np.sqrt(np.maximum(lam, 0.0))[:, None] * V.T       # J^T J = H
    f = np.asarray(g(x, *[jnp.asarray(v) for v in q]), np.float64).ravel()
    f = np.broadcast_to(f, y.shape)
    active = np.where(q <= values.lower, -1, np.where(q >= values.upper, 1, 0))
    zi = np.int32(0)
    solver = NLSQResult(
        x=q, cost=float(st.f), fun=None, jac=None, grad=np.asarray(st.g),
        optimality=float(np.max(np.abs(np.asarray(st.g)))), active_mask=active,
        nfev=int(st.nfev), njev=int(st.nfev), nit=int(st.nit), status=np.int32(status),
        rung=zi, escalations=zi, rung_entered=np.zeros(1, np.int32),
        rung_nfev=np.array([int(st.nfev)], np.int32), escalation_reason=np.zeros(
            1, np.int32), ladder=(np.dtype(np.float64),))
    return Solved(q, solver, J, y - f, f, 2.0 * float(st.f), float(st.f), y.size, False)
