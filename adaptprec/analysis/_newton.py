"""Minimising a negative log-likelihood: a trust-region Newton solver with the exact
Hessian (autodiff), for the few parameters of a fitted model.

A user's likelihood is a scalar objective, not a sum of squares, so the least-squares
solvers do not apply. With ``n`` small, the Hessian ``H`` is formed exactly and each
step solves the trust-region subproblem ``min g^T s + s^T H s / 2, ||s|| <= Delta`` in
the eigenbasis of ``H`` (Moré and Sorensen 1983: ``s(lam) = -(H + lam I)^{-1} g`` with
``lam >= max(0, -lam_min)`` chosen by Newton's method on ``1/||s(lam)|| - 1/Delta``),
which handles an indefinite ``H`` far from the optimum. Bounds are kept by projection:
a parameter at a bound whose gradient points outward is held (its row and column of
``H`` replaced by the identity, its gradient by 0), and the step is clipped to the box.
The radius follows the classical rules (Nocedal and Wright, Algorithm 4.1): shrink to a
quarter of the step when the actual decrease is below a quarter of the model's, double
when above three quarters at the boundary. The loop is :func:`adaptprec.nlsq.solver.
iterate`, as for every solver.

Example:
    >>> import jax.numpy as jnp, numpy as np
    >>> from adaptprec.analysis._newton import minimize_nll
    >>> rosen = lambda p: 100.0 * (p[1] - p[0] ** 2) ** 2 + (1.0 - p[0]) ** 2
    >>> out = minimize_nll(rosen, np.array([-1.2, 1.0]), np.full(2, -np.inf),
    ...                    np.full(2, np.inf))
    >>> [round(float(v), 6) for v in out.x], int(out.status) > 0
    ([1.0, 1.0], True)
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp

from .._pytree import Module
from .._status import Status

__all__ = ["NewtonTrustRegion", "NewtonState", "minimize_nll", "ACCEPT", "SECULAR_STEPS"]

#: a step is accepted when the actual decrease is at least this fraction of the model's
ACCEPT = 1e-4
#: Newton iterations on the secular equation per step (quadratic convergence: a few
#: suffice; a fixed count keeps the step traceable)
SECULAR_STEPS = 30


class NewtonState(Module):
    x: Any
    f: Any
    g: Any
    H: Any
    delta: Any
    nit: Any
    nfev: Any
    status: Any


class NewtonTrustRegion:
    """The solver of ``min fun(x)`` within ``[lb, ub]`` (``init / step / terminate /
    postprocess``). Stops when the projected gradient's size times the step scale is
    below ``gtol`` of the objective's scale (``Status.GTOL``), on an accepted step whose
    decrease is below ``ftol`` relative (``Status.FTOL``), when the radius falls below
    ``xtol`` of ``||x||`` (``Status.XTOL``), or after ``max_steps``."""

    def __init__(self, fun: Callable, n: int, *, gtol=1e-10, ftol=1e-14, xtol=1e-12,
                 max_steps=None):
        self.fun, self.n = fun, n
        self.gtol, self.ftol, self.xtol = gtol, ftol, xtol
        self.max_steps = 100 * (n + 1) if max_steps is None else int(max_steps)

    def _derivatives(self, x, ctx):
        f, g = jax.value_and_grad(self.fun)(x, *ctx)
        return f, g, jax.hessian(self.fun)(x, *ctx)

    def init(self, x0, ctx) -> NewtonState:
        f, g, H = self._derivatives(x0, ctx)
        zi = jnp.zeros((), jnp.int32)
        status = jnp.where(jnp.isfinite(f) & jnp.all(jnp.isfinite(g)), Status.RUNNING,
                           Status.NONFINITE_RESIDUAL).astype(jnp.int32)
        return NewtonState(x0, f, g, H, jnp.maximum(1.0, jnp.linalg.norm(x0)).astype(
            x0.dtype), zi, zi + 1, status)

    def _held(self, st, lb, ub):
        return ((st.x <= lb) & (st.g > 0)) | ((st.x >= ub) & (st.g < 0))

    def _subproblem(self, g, H, delta):
        """The trust-region step in the eigenbasis of ``H`` (module docstring)."""
        lam_h, V = jnp.linalg.eigh(H)
        gv = V.T @ g
        tiny = jnp.finfo(g.dtype).tiny
        lo = jnp.maximum(0.0, -lam_h[0]) * (1.0 + 1e-12) + 1e-14 * jnp.max(jnp.abs(lam_h))

        def norm(lam):
            return jnp.linalg.norm(gv / (lam_h + lam))

        newton_ok = (lam_h[0] > 0) & (norm(0.0) <= delta)

        def secular(_, lam):
            d = lam_h + lam
            s2 = jnp.sum(gv * gv / (d * d))
            ds2 = -2.0 * jnp.sum(gv * gv / (d * d * d))
            sn = jnp.sqrt(s2) + tiny
            # Newton on phi(lam) = 1/||s|| - 1/delta (Moré and Sorensen 1983)
            phi = 1.0 / sn - 1.0 / delta
            dphi = -0.5 * ds2 / (sn * s2 + tiny)
            return jnp.maximum(lam - phi / jnp.where(dphi != 0, dphi, 1.0), lo)

        lam = jax.lax.fori_loop(0, SECULAR_STEPS, secular, lo)
        lam = jnp.where(newton_ok, 0.0, lam)
        s = -V @ (gv / (lam_h + lam))
        return jnp.where(jnp.isfinite(s), s, 0.0)

    def step(self, st: NewtonState, ctx) -> NewtonState:
        args, lb, ub = ctx
        held = self._held(st, lb, ub)
        g = jnp.where(held, 0.0, st.g)
        eye = jnp.eye(self.n, dtype=st.H.dtype)
        H = jnp.where(held[:, None] | held[None, :], eye, st.H)
        s = self._subproblem(g, H, st.delta)
        x_new = jnp.clip(st.x + s, lb, ub)
        s = x_new - st.x
        predicted = -(g @ s + 0.5 * s @ (H @ s))
        f_new, g_new, H_new = self._derivatives(x_new, args)
        actual = st.f - f_new
        ok = jnp.isfinite(f_new) & jnp.all(jnp.isfinite(g_new))
        rho = jnp.where(ok & (predicted > 0), actual / jnp.where(predicted > 0, predicted,
                                                                  1.0), -1.0)
        accept = rho > ACCEPT
        snorm = jnp.linalg.norm(s)
        delta = jnp.where(rho < 0.25, 0.25 * snorm,
                          jnp.where((rho > 0.75) & (snorm > 0.99 * st.delta),
                                    2.0 * st.delta, st.delta))
        x = jnp.where(accept, x_new, st.x)
        f = jnp.where(accept, f_new, st.f)
        g_now = jnp.where(accept, g_new, st.g)
        H_now = jnp.where(accept, H_new, st.H)
        nit = st.nit + 1
        scale = jnp.maximum(1.0, jnp.abs(f))
        pg = jnp.where(self._held(NewtonState(x, f, g_now, H_now, delta, nit, st.nfev,
                                               st.status), lb, ub), 0.0, g_now)
        xs = jnp.maximum(1.0, jnp.max(jnp.abs(x)))
        status = jnp.where(
            jnp.max(jnp.abs(pg)) * xs <= self.gtol * scale, Status.GTOL,
            jnp.where(accept & (actual <= self.ftol * scale) & (actual >= 0), Status.FTOL,
                      jnp.where(delta <= self.xtol * xs, Status.XTOL,
                                jnp.where(nit >= self.max_steps, Status.MAX_EVALUATIONS,
                                          Status.RUNNING))))
        return NewtonState(x, f, g_now, H_now, delta, nit, st.nfev + 1,
                           status.astype(jnp.int32))

    def terminate(self, st: NewtonState):
        return st.status != Status.RUNNING

    def postprocess(self, st: NewtonState, ctx) -> NewtonState:
        return st


def minimize_nll(fun: Callable, x0, lb, ub, args=(), **options) -> NewtonState:
    """``fun(x, *args)`` minimised from ``x0`` within ``[lb, ub]``: the final
    :class:`NewtonState` (``x``, ``f``, gradient ``g``, Hessian ``H``, ``nit``, ``nfev``,
    ``status``). Traceable (``jit``, ``vmap``)."""
    from ..nlsq.solver import iterate

    x0 = jnp.asarray(x0)
    solver = NewtonTrustRegion(fun, x0.shape[0], **options)
    lb = jnp.asarray(lb, x0.dtype)
    ub = jnp.asarray(ub, x0.dtype)

    class _Run:
        def init(self, x, ctx):
            return solver.init(x, ctx[0])

        def step(self, st, ctx):
            return solver.step(st, ctx)

        def terminate(self, st):
            return solver.terminate(st)

    st = iterate(_Run(), x0, (tuple(args), lb, ub))
    return solver.postprocess(st, (tuple(args), lb, ub))
