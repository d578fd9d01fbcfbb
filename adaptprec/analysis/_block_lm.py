"""Levenberg-Marquardt for block-structured least squares: shared parameters ``theta``
and per-block parameters ``phi_d`` (``d = 1..D``), each block's residual
``r_d(theta, phi_d)`` depending on its own ``phi_d`` only.

The Jacobian is ``J = [J_s | blockdiag(J_1, ..., J_D)]``, so the damped normal equations

    [ U + lam D_s     W_1 ... W_D          ] [dtheta]     [g_s]
    [ W_d^T           V_d + lam D_d (diag)  ] [dphi_d] = - [g_d]

(``U = sum_d J_s,d^T J_s,d``, ``V_d = J_d^T J_d``, ``W_d = J_s,d^T J_d``, ``g`` the
gradient) are solved through the Schur complement of the block-diagonal part, as in
bundle adjustment (Triggs et al. 2000) and ODRPACK (Boggs et al. 1987):

    S = U + lam D_s - sum_d W_d (V_d + lam D_d)^{-1} W_d^T
    S dtheta = -g_s + sum_d W_d (V_d + lam D_d)^{-1} g_d
    dphi_d = -(V_d + lam D_d)^{-1} (g_d + W_d^T dtheta)

Every per-block product runs under ``vmap`` over ``d``: a step costs ``O(D)`` work and
memory, where a dense solve of all ``n_s + D n_l`` parameters costs ``O(D^3)``.
``D_s``, ``D_d`` are Marquardt's scaling, the largest diagonal of ``J^T J`` seen so far
(Moré 1978); ``lam`` follows Nielsen's rule (Madsen, Nielsen and Tingleff 2004, eq.
3.16: ``lam *= max(1/3, 1 - (2 rho - 1)^3)`` on success, ``lam *= nu, nu *= 2`` on
failure), starting at ``LAMBDA0 * max diag(J^T J)``. The stopping tests are scipy's
(``ftol`` on the cost's relative decrease with ``rho > 1/4``, ``xtol`` on the step,
``gtol`` on the largest gradient entry scaled by the diagonal), run by
:func:`adaptprec.nlsq.solver.iterate`.

Example:
    >>> import jax.numpy as jnp, numpy as np
    >>> from adaptprec.analysis._block_lm import solve_blocks
    >>> t = jnp.linspace(0.0, 2.0, 10)
    >>> amps = jnp.array([1.0, 2.0, 3.0])
    >>> y = amps[:, None] * jnp.exp(-1.5 * t)            # three decays, one rate
    >>> fun = lambda th, ph, y: ph[0] * jnp.exp(-th[0] * t) - y
    >>> out = solve_blocks(fun, jnp.array([1.0]), jnp.ones((3, 1)), (y,))
    >>> round(float(out.theta[0]), 6), [round(float(a), 6) for a in out.phi[:, 0]]
    (1.5, [1.0, 2.0, 3.0])
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp

from .._pytree import Module
from .._status import Status

__all__ = ["BlockLM", "BlockState", "solve_blocks", "block_covariance", "LAMBDA0"]

#: the initial damping relative to the largest diagonal of ``J^T J`` (Madsen, Nielsen
#: and Tingleff 2004, section 3.2: 1e-6 for a good start, up to 1 otherwise)
LAMBDA0 = 1e-3


class BlockState(Module):
    theta: Any
    phi: Any
    cost: Any
    r: Any
    Js: Any
    Jl: Any
    lam: Any
    nu: Any
    Ds: Any
    Dl: Any
    nit: Any
    nfev: Any
    status: Any


def _evaluate(fun, theta, phi, args, in_axes):
    """Per block: the residual ``(D, m)`` and its Jacobians in ``theta`` ``(D, m, n_s)``
    and in ``phi_d`` ``(D, m, n_l)`` (forward mode)."""
    def one(ph, *a):
        def r(th, p):
            return jnp.ravel(fun(th, p, *a))
        out = r(theta, ph)
        Js, Jl = jax.jacfwd(r, argnums=(0, 1))(theta, ph)
        return out, Js, Jl
    return jax.vmap(one, in_axes=(0, *in_axes))(phi, *args)


def _normal(r, Js, Jl):
    U = jnp.einsum("dmi,dmj->ij", Js, Js)
    V = jnp.einsum("dmi,dmj->dij", Jl, Jl)
    W = jnp.einsum("dmi,dmj->dij", Js, Jl)
    gs = jnp.einsum("dmi,dm->i", Js, r)
    gl = jnp.einsum("dmi,dm->di", Jl, r)
    return U, V, W, gs, gl


def _solve_spd(A, b):
    """``A^{-1} b`` for small symmetric positive semi-definite ``A`` (batched), by an
    eigendecomposition that drops directions below rounding (a block that does not
    determine a parameter gets no step along it)."""
    lam, Q = jnp.linalg.eigh(A)
    keep = lam > A.shape[-1] * jnp.finfo(A.dtype).eps * jnp.max(lam, axis=-1,
                                                                 keepdims=True)
    inv = jnp.where(keep, 1.0 / jnp.where(keep, lam, 1.0), 0.0)
    if b.ndim == A.ndim - 1:
        return jnp.einsum("...ij,...j,...kj,...k->...i", Q, inv, Q, b)
    return jnp.einsum("...ij,...j,...kj,...kl->...il", Q, inv, Q, b)


class BlockLM:
    """The solver (``init / step / terminate``); ``ctx`` is the data ``args``."""

    def __init__(self, fun: Callable, in_axes, *, ftol=1e-15, xtol=1e-10, gtol=1e-10,
                 max_steps=200):
        self.fun, self.in_axes = fun, tuple(in_axes)
        self.ftol, self.xtol, self.gtol, self.max_steps = ftol, xtol, gtol, max_steps

    def _at(self, theta, phi, args):
        r, Js, Jl = _evaluate(self.fun, theta, phi, args, self.in_axes)
        return 0.5 * jnp.sum(r * r), r, Js, Jl

    def init(self, x0, args) -> BlockState:
        theta, phi = x0
        cost, r, Js, Jl = self._at(theta, phi, args)
        Ds = jnp.einsum("dmi,dmi->i", Js, Js)
        Dl = jnp.einsum("dmi,dmi->di", Jl, Jl)
        lam = LAMBDA0 * jnp.maximum(jnp.max(Ds, initial=0.0), jnp.max(Dl, initial=0.0))
        zi = jnp.zeros((), jnp.int32)
        status = jnp.where(jnp.isfinite(cost), Status.RUNNING, Status.NONFINITE_RESIDUAL)
        return BlockState(theta, phi, cost, r, Js, Jl, jnp.maximum(lam, 1e-300),
                          jnp.asarray(2.0, cost.dtype), Ds, Dl, zi, zi + 1,
                          status.astype(jnp.int32))

    def step(self, st: BlockState, args) -> BlockState:
        U, V, W, gs, gl = _normal(st.r, st.Js, st.Jl)
        Ds = jnp.maximum(st.Ds, jnp.diagonal(U))
        Dl = jnp.maximum(st.Dl, jnp.diagonal(V, axis1=1, axis2=2))
        Ds, Dl = jnp.where(Ds > 0, Ds, 1.0), jnp.where(Dl > 0, Dl, 1.0)
        Vd = V + st.lam * jax.vmap(jnp.diag)(Dl)
        VinvWt = _solve_spd(Vd, jnp.swapaxes(W, 1, 2))          # (D, n_l, n_s)
        Vinvg = _solve_spd(Vd, gl)                              # (D, n_l)
        S = U + st.lam * jnp.diag(Ds) - jnp.einsum("dij,djk->ik", W, VinvWt)
        b = -gs + jnp.einsum("dij,dj->i", W, Vinvg)
        dth = _solve_spd(S, b) if S.shape[0] else jnp.zeros_like(st.theta)
        dph = -(Vinvg + jnp.einsum("dij,j->di", VinvWt, dth))
        Jd = jnp.einsum("dmi,i->dm", st.Js, dth) + jnp.einsum("dmi,di->dm", st.Jl, dph)
        predicted = -jnp.sum(st.r * Jd) - 0.5 * jnp.sum(Jd * Jd)
        theta, phi = st.theta + dth, st.phi + dph
        cost, r, Js, Jl = self._at(theta, phi, args)
        actual = st.cost - cost
        ok = jnp.isfinite(cost) & (predicted > 0)
        rho = jnp.where(ok, actual / jnp.where(predicted > 0, predicted, 1.0), -1.0)
        accept = rho > 1e-4
        lam = jnp.where(accept, st.lam * jnp.maximum(1.0 / 3.0, 1.0 - (2.0 * rho - 1.0) ** 3),
                        st.lam * st.nu)
        nu = jnp.where(accept, 2.0, 2.0 * st.nu)
        pick = lambda a, b: jnp.where(accept, a, b)  # noqa: E731
        new = BlockState(pick(theta, st.theta), pick(phi, st.phi), pick(cost, st.cost),
                         pick(r, st.r), pick(Js, st.Js), pick(Jl, st.Jl), lam, nu, Ds, Dl,
                         st.nit + 1, st.nfev + 1, st.status)
        return self._stopping(new, st, accept, actual, rho, dth, dph)

    def _stopping(self, new, old, accept, actual, rho, dth, dph) -> BlockState:
        """scipy's tests: ``ftol`` (relative decrease with ``rho > 1/4``), ``xtol`` (the
        step against the parameters), ``gtol`` (the scaled gradient)."""
        _, _, _, gs, gl = _normal(new.r, new.Js, new.Jl)
        gnorm = jnp.maximum(jnp.max(jnp.abs(gs) / jnp.sqrt(new.Ds), initial=0.0),
                            jnp.max(jnp.abs(gl) / jnp.sqrt(new.Dl), initial=0.0))
        xnorm = jnp.sqrt(jnp.sum(old.theta ** 2) + jnp.sum(old.phi ** 2))
        dnorm = jnp.sqrt(jnp.sum(dth ** 2) + jnp.sum(dph ** 2))
        f_ok = accept & (actual <= self.ftol * old.cost) & (rho > 0.25)
        x_ok = dnorm <= self.xtol * (self.xtol + xnorm)
        g_ok = gnorm <= self.gtol * jnp.sqrt(2.0 * jnp.maximum(new.cost, 0.0)) + \
            jnp.finfo(gnorm.dtype).tiny
        status = jnp.where(g_ok, Status.GTOL, jnp.where(
            f_ok & x_ok, Status.FTOL_XTOL, jnp.where(f_ok, Status.FTOL, jnp.where(
                x_ok, Status.XTOL, jnp.where(new.nit >= self.max_steps,
                                             Status.MAX_EVALUATIONS, Status.RUNNING)))))
        return BlockState(new.theta, new.phi, new.cost, new.r, new.Js, new.Jl, new.lam,
                          new.nu, new.Ds, new.Dl, new.nit, new.nfev,
                          status.astype(jnp.int32))

    def terminate(self, st: BlockState):
        return st.status != Status.RUNNING


class BlockSolution(Module):
    theta: Any
    phi: Any
    cost: Any
    r: Any
    cov_shared: Any
    cov_local: Any
    cov_cross: Any
    nit: Any
    nfev: Any
    status: Any


def block_covariance(Js, Jl):
    """``(J^T J)^{-1}`` of the block Jacobian by its blocks: ``C_s = S^{-1}`` (``S`` the
    undamped Schur complement), ``C_d = V_d^{-1} + V_d^{-1} W_d^T C_s W_d V_d^{-1}``, and
    the cross blocks ``C_sd = -C_s W_d V_d^{-1}``."""
    U, V, W, _, _ = _normal(jnp.zeros(Js.shape[:2], Js.dtype), Js, Jl)
    VinvWt = _solve_spd(V, jnp.swapaxes(W, 1, 2))
    S = U - jnp.einsum("dij,djk->ik", W, VinvWt)
    Cs = _solve_spd(S, jnp.eye(S.shape[0], dtype=S.dtype)) if S.shape[0] else S
    Vinv = _solve_spd(V, jnp.broadcast_to(jnp.eye(V.shape[-1], dtype=V.dtype), V.shape))
    cross = -jnp.einsum("ij,djk->dik", Cs, jnp.swapaxes(VinvWt, 1, 2))
    local = Vinv + jnp.einsum("dij,jk,dlk->dil", VinvWt, Cs, VinvWt)
    return Cs, local, cross


def solve_blocks(fun: Callable, theta0, phi0, args, in_axes=None, **options) -> BlockSolution:
    """Minimise ``0.5 sum_d ||fun(theta, phi_d, *args_d)||^2`` from ``(theta0, phi0)``
    (``phi0`` of shape ``(D, n_l)``; ``args`` batched along axis 0 unless ``in_axes``
    says ``None`` for an argument): the solution, its cost and the unscaled covariance
    blocks (:func:`block_covariance`). Traceable (``jit``, ``vmap``)."""
    from ..nlsq.solver import iterate

    args = tuple(args)
    in_axes = (0,) * len(args) if in_axes is None else tuple(in_axes)
    solver = BlockLM(fun, in_axes, **options)
    st = iterate(solver, (jnp.asarray(theta0), jnp.asarray(phi0)), args)
    Cs, Cl, Cx = block_covariance(st.Js, st.Jl)
    return BlockSolution(st.theta, st.phi, st.cost, st.r, Cs, Cl, Cx, st.nit, st.nfev,
                         st.status)
