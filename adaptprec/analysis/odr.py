"""Orthogonal distance regression: errors in ``x`` and ``y`` (``scipy.odr``'s problem,
ODRPACK's method).

With ``x`` observed with standard deviations ``sigma_x`` and ``y`` with ``sigma_y``, the
fit finds the parameters ``beta`` and a correction ``delta_i`` of every ``x_i``
minimising

    sum_i ((f(x_i + delta_i; beta) - y_i) / sigma_y,i)^2 + (delta_i / sigma_x,i)^2

(Boggs, Byrd and Schnabel 1987). Each ``delta_i`` enters one point's two residuals
only, so the problem is block structured: ``beta`` shared, one block per point. It runs
on the block Levenberg-Marquardt solver of the global fits (:mod:`._block_lm`), whose
Schur complement is ODRPACK's own elimination of the ``delta``: a step costs ``O(n)``
for ``n`` points.

Results follow ``scipy.odr.Output``: ``beta``, ``sd_beta``, ``cov_beta`` (unscaled:
``sd_beta = sqrt(diag(cov_beta) * res_var)``), ``delta``, ``eps`` (``f(x + delta) -
y``), ``xplus``, ``y``, ``res_var`` (``sum_square / (n - p)``), ``sum_square``,
``sum_square_delta``, ``sum_square_eps``; ``cov_beta`` is the ``beta`` block of the
whole problem's ``(J^T J)^{-1}`` (the corrections accounted for), as ODRPACK's.

Example:
    >>> import numpy as np, jax.numpy as jnp
    >>> import adaptprec as ap
    >>> x = np.array([0.0, 0.9, 1.8, 2.6, 3.3, 4.4, 5.2, 6.1, 6.5, 7.4])
    >>> y = np.array([5.9, 5.4, 4.4, 4.6, 3.5, 3.7, 2.8, 2.8, 2.4, 1.5])
    >>> out = ap.fit_odr(lambda x, a, b: a * x + b, x, y, p0=[-1.0, 5.0],
    ...                  sigma_x=0.1, sigma_y=0.2)
    >>> [round(float(v), 4) for v in out.beta]
    [-0.5414, 5.768]
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from .._pytree import Module, field

__all__ = ["ODRResult", "fit_odr"]


class ODRResult(Module):
    """An orthogonal-distance fit, with ``scipy.odr.Output``'s fields (module docstring)
    and ``names``, ``status``/``success``/``stopreason``, ``nit``."""

    beta: Any
    sd_beta: Any
    cov_beta: Any
    delta: Any
    eps: Any
    xplus: Any
    y: Any
    res_var: Any
    sum_square: Any
    sum_square_delta: Any
    sum_square_eps: Any
    status: Any
    nit: Any
    names: tuple = field(static=True)
    dof: int = field(static=True)

    @property
    def success(self) -> bool:
        return int(self.status) > 0

    @property
    def stopreason(self) -> list:
        from ..nlsq.common import STATUS_MESSAGES

        return [STATUS_MESSAGES.get(int(self.status), f"status {int(self.status)}")]

    def pprint(self) -> None:
        """Print the report (``scipy.odr.Output.pprint``'s name)."""
        print(self)

    def __str__(self) -> str:
        lines = ["[[Orthogonal distance regression]]",
                 f"    # data points      = {np.size(self.eps)}",
                 f"    # parameters       = {len(self.names)}",
                 f"    # dof              = {self.dof}",
                 f"    sum of squares     = {float(self.sum_square):.7g} "
                 f"(delta {float(self.sum_square_delta):.4g}, "
                 f"eps {float(self.sum_square_eps):.4g})",
                 f"    residual variance  = {float(self.res_var):.7g}",
                 f"    status             = {int(self.status)} ({self.stopreason[0]})",
                 "[[Variables]]  (± 1 standard error)"]
        w = max(len(n) for n in self.names)
        for n, b, s in zip(self.names, self.beta, self.sd_beta):
            lines.append(f"    {n + ':':<{w + 1}} {float(b):>13.7g} +/- {float(s):.5g}")
        return "\n".join(lines)


@functools.lru_cache(maxsize=16)
def _program(model, k: int, x_shape_head: tuple, options):
    from ._block_lm import solve_blocks

    def residual(beta, delta, x, y, wx, wy, free):
        # a point whose x is exact (free 0) keeps delta out of the model, and its
        # delta (weight 1, no data) at 0
        xi = (x + delta * free).reshape(x_shape_head + (1,))
        f = jnp.ravel(model(xi, *[beta[i] for i in range(beta.shape[0])]))[0]
        return jnp.concatenate([jnp.atleast_1d((f - y) * wy),
                                delta * (wx * free + (1.0 - free))])

    def solve(beta0, delta0, X, Y, WX, WY, free):
        return solve_blocks(residual, beta0, delta0, (X, Y, WX, WY, free),
                            **dict(options))

    return jax.jit(solve)


def _weights(sigma, shape, name):
    if sigma is None:
        return np.ones(shape)
    s = np.broadcast_to(np.asarray(sigma, np.float64), shape)
    if np.any(s <= 0) or not np.all(np.isfinite(s)):
        raise ValueError(f"{name} must be positive and finite")
    return 1.0 / s


def fit_odr(model: Callable, xdata, ydata, p0, sigma_x=None, sigma_y=None, *,
            fix_x=None, names=None, ftol: float = 1e-15, xtol: float = 1e-10,
            gtol: float = 1e-10, max_steps: int | None = None) -> ODRResult:
    """Fit ``model(x, *params)`` with errors in ``x`` and ``y`` (module docstring).

    Args:
        model: ``model(x, *params)`` written with ``jax.numpy`` (as ``curve_fit``'s; the
            points along ``x``'s last axis).
        xdata: ``(n,)`` or ``(k, n)`` (``k`` inputs per point).
        ydata: ``(n,)``.
        p0: the start of the parameters (``scipy.odr``'s ``beta0``).
        sigma_x, sigma_y: standard deviations of ``x`` and ``y`` (scalars or per point;
            ``scipy.odr.RealData``'s ``sx``, ``sy``); default 1.
        fix_x: ``(n,)`` bool: the points whose ``x`` is exact (no correction;
            ``scipy.odr``'s ``ifixx == 0``).
        names: parameter names (default: ``model``'s signature).
        ftol, xtol, gtol, max_steps: the solver's tests and budget.

    ``scipy.odr.Model(f)`` takes ``f(beta, x)``; here the model is ``curve_fit``'s
    ``model(x, *beta)``: ``fit_odr(lambda x, *b: f(b, x), x, y, p0=beta0, ...)``.
    """
    from ..modeling.parameters import model_names
    from .._user_fn import positional_model
    from ..precision import x64_enabled

    model = positional_model(model)
    p0 = np.atleast_1d(np.asarray(p0, np.float64))
    names = tuple(names) if names is not None else model_names(model, p0.size)
    if len(names) != p0.size:
        raise ValueError(f"p0 has {p0.size} values for the parameters {list(names)}")
    x = np.asarray(xdata, np.float64)
    y = np.asarray(ydata, np.float64).ravel()
    n = y.size
    if x.shape[-1:] != (n,) or x.ndim > 2:
        raise ValueError(f"xdata must be ({n},) or (k, {n}) for {n} points, got shape "
                         f"{x.shape}")
    if not (np.all(np.isfinite(x)) and np.all(np.isfinite(y))):
        raise ValueError("xdata and ydata must be finite")
    k = 1 if x.ndim == 1 else x.shape[0]
    X = x.reshape(k, n).T                     # (n, k): one block per point
    WX = _weights(sigma_x, x.shape, "sigma_x").reshape(k, n).T
    WY = _weights(sigma_y, y.shape, "sigma_y")
    options = (("ftol", ftol), ("xtol", xtol), ("gtol", gtol),
               ("max_steps", 100 * (p0.size + k + 1) if max_steps is None
                else int(max_steps)))
    program = _program(model, k, x.shape[:-1], options)

    def run():
        return jax.tree.map(np.asarray, program(p0, np.zeros((n, k)), X, y, WX, WY,
                                                free))

    free = np.ones((n, k)) if fix_x is None else np.broadcast_to(
        ~np.asarray(fix_x, bool).reshape(-1, n).T, (n, k)).astype(np.float64)
    if x64_enabled():
        sol = run()
    else:
        from .._x64_scope import float64_scope

        with float64_scope():
            sol = run()
    r = np.asarray(sol.r, np.float64)
    eps_w, delta_w = r[:, 0], r[:, 1:] * free
    sum_eps, sum_delta = float(eps_w @ eps_w), float(np.sum(delta_w ** 2))
    dof = n - p0.size
    total = sum_eps + sum_delta
    res_var = total / dof if dof > 0 else np.inf
    cov = np.asarray(sol.cov_shared, np.float64)
    delta = (np.asarray(sol.phi, np.float64) * free).T.reshape(x.shape)
    return ODRResult(
        beta=np.asarray(sol.theta, np.float64), sd_beta=np.sqrt(np.maximum(
            np.diag(cov), 0.0) * res_var), cov_beta=cov, delta=delta,
        eps=eps_w / WY, xplus=x + delta, y=y + eps_w / WY, res_var=res_var,
        sum_square=total, sum_square_delta=sum_delta, sum_square_eps=sum_eps,
        status=np.int32(int(sol.status)), nit=int(sol.nit), names=names, dof=dof)
