"""`MoreLM`: our Levenberg–Marquardt (Moré trust region, MINPACK scaling, scipy status
codes) as an ``optimistix.AbstractLeastSquaresSolver``, so optimistix users can pass it to
``optx.least_squares``.

Precision adaptivity does not survive the optimistix interface: ``optx.least_squares``
closure-converts the residual (``equinox.filter_closure_convert``) into a jaxpr whose input
and output dtypes are fixed and checked at every call, so a solver cannot re-evaluate it
in float32. ``MoreLM`` therefore runs a one-rung ladder in ``y0``'s dtype; for the
f32 -> f64 ladder call :func:`adaptprec.solve_nlsq` (same algorithm, same state).

Tolerance mapping: ``rtol`` is used as scipy's ``ftol`` and ``xtol``, ``atol`` as
``gtol``. ``optx.least_squares``' ``max_steps`` bounds the iterations (each iteration
evaluates residual and Jacobian once).

Example:
    >>> import jax.numpy as jnp
    >>> import optimistix as optx
    >>> from adaptprec.nlsq import MoreLM
    >>> fn = lambda y, args: jnp.array([10 * (y[1] - y[0] ** 2), 1 - y[0]])
    >>> sol = optx.least_squares(fn, MoreLM(rtol=1e-12, atol=1e-12), jnp.array([-1.2, 1.0]))
    >>> [round(float(v), 8) for v in sol.value], int(sol.stats["status"]) > 0
    ([1.0, 1.0], True)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optimistix as optx
from jax.flatten_util import ravel_pytree

from ._state import Context, Options
from .common import Status
from .solver import TrustRegion

__all__ = ["MoreLM"]


class MoreLM(optx.AbstractLeastSquaresSolver):
    """Moré-style Levenberg–Marquardt for ``optx.least_squares`` (see module docstring).

    Example:
        >>> import jax.numpy as jnp
        >>> import optimistix as optx
        >>> from adaptprec.nlsq import MoreLM
        >>> sol = optx.least_squares(lambda y, a: y - a, MoreLM(1e-10, 1e-10),
        ...                          jnp.zeros(2), args=jnp.array([1.0, 2.0]))
        >>> [float(v) for v in sol.value]
        [1.0, 2.0]
    """

    rtol: float
    atol: float
    norm: Callable = optx.max_norm

    def _setup(self, fn, y, args):
        y_flat, unravel = ravel_pytree(y)
        dt = np.dtype(y_flat.dtype)

        def fun(x, a):
            out, _ = fn(unravel(x), a)
            return ravel_pytree(out)[0]

        m = int(jax.eval_shape(fun, y_flat, args).shape[0])
        n = int(y_flat.size)
        opts = Options(n=n, rungs=(dt,), method="lm", loss="linear", jac="fwd",
                       jac_scale=True, has_bounds=False, max_steps=2 ** 30,
                       linear_solver="qr", max_rejections=4, cond_tol=np.inf,
                       schedule=None, portfolio=0, m=m)
        inf = jnp.full((n,), jnp.inf, dt)
        one = jnp.ones((), dt)
        ctx = Context(((args,),), -inf, inf, jnp.ones((n,), dt), one, one * self.rtol,
                      one * self.rtol, one * self.atol, y_flat, m)
        return TrustRegion(fun, opts), ctx, y_flat, unravel

    def init(self, fn, y, args, options, f_struct, aux_struct, tags):
        solver, ctx, y_flat, _ = self._setup(fn, y, args)
        return solver.init(y_flat, ctx)

    def step(self, fn, y, args, options, state, tags):
        solver, ctx, _, unravel = self._setup(fn, y, args)
        new = solver.step(state, ctx)
        y_new = unravel(new.x)
        _, aux = fn(y_new, args)
        return y_new, new, aux

    def terminate(self, fn, y, args, options, state, tags):
        done = state.status != Status.RUNNING
        result = optx.RESULTS.where(
            (state.status > 0) | (state.status == Status.RUNNING),
            optx.RESULTS.successful, optx.RESULTS.nonlinear_divergence)
        return done, result

    def postprocess(self, fn, y, aux, args, options, state, tags, result):
        stats: dict[str, Any] = {"status": state.status, "nfev": state.nfev,
                                 "cost": state.cost}
        return y, aux, stats
