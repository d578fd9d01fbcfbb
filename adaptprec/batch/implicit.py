r"""Derivatives of batched solutions by the implicit function theorem.

At a solution :math:`x^*(\theta)` of :math:`\min_x C(x,\theta)` (e.g.
:math:`\tfrac12\|r(x,\theta)\|^2`, or a robust cost)
the gradient vanishes, :math:`\nabla_x C(x^*,\theta) = 0`, so

.. math:: \frac{\partial x^*}{\partial\theta} = -H^{-1}\,\partial_\theta\nabla_x C,
   \qquad H = \nabla^2_x C(x^*,\theta)

with the full Hessian (including the :math:`\sum_i r_i\nabla^2 r_i` term, so the
derivative is exact for non-zero residuals, not a Gauss–Newton approximation). It is a
``custom_jvp``: the tangent is :math:`\dot x = -H^{-1}(\partial_\theta\nabla_x C)\,
\dot\theta` (one ``n x n`` Hessian and one JVP per fit), and reverse mode transposes
that linear map, so ``jvp``/``jacfwd`` and ``grad``/``vjp``/``jacrev`` all work without
differentiating through the solver's ``while_loop``. ``theta`` is every floating leaf of
the batched and shared arguments (data, weights, grids).
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp

from ..nlsq.common import robust_cost
from ._model import held_by_bounds

__all__ = ["implicit_solution"]


def implicit_solution(residual: Callable, x_star, bargs, sargs, loss="linear",
                      f_scale: float = 1.0, bounds_of: Callable | None = None):
    r"""Return ``x_star`` with derivatives (forward and reverse) w.r.t. ``bargs``/``sargs``.

    ``residual(x, bargs_k, sargs)`` is one fit's residual; ``x_star`` ``(B, n)`` must be
    (numerically) a stationary point of each fit's cost
    (:func:`adaptprec.nlsq.common.robust_cost` with ``loss`` and ``f_scale``).

    With box constraints (``bounds_of(bargs) -> (lower, upper)``, each ``(B, n)``) it must
    be a stationary point of the box-constrained problem: a variable held by a bound
    (on it, with the gradient pointing out of the box) moves with that bound
    (:math:`\dot x_i = \dot l_i` or :math:`\dot u_i`), and the free variables solve
    :math:`H_{FF}\dot x_F = -(\partial_\theta\nabla_x C\,\dot\theta + H_{FA}\dot x_A)_F`.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from adaptprec.batch.implicit import implicit_solution
        >>> res = lambda x, b, s: x * s - b[0]           # x* = mean(y) / s
        >>> y = jnp.array([[1.0, 3.0]])
        >>> f = lambda y: implicit_solution(res, (y.mean(1) / 2.0)[:, None], (y,), 2.0)[0, 0]
        >>> [round(float(g), 6) for g in jax.grad(f)(y)[0]]
        [0.25, 0.25]
    """

    def cost(x, b, s):
        return robust_cost(loss, residual(x, b, s), f_scale)

    grad_x = jax.grad(cost)

    @jax.custom_jvp
    def ident(x, b, s):
        return x

    @ident.defjvp
    def _jvp(primals, tangents):
        x, b, s = primals
        _, db, ds = tangents
        hess = jax.vmap(jax.hessian(cost), in_axes=(0, 0, None))(x, b, s)

        def g_of(bb, ss):
            return jax.vmap(grad_x, in_axes=(0, 0, None))(x, bb, ss)

        # integer leaves carry float0 tangents: they drop out of the linear map
        _, rhs = jax.jvp(g_of, (b, s), (db, ds))
        lim = bounds_of(b) if bounds_of is not None else None
        if lim is None:
            dx = -jnp.linalg.solve(hess, rhs[..., None])[..., 0]
            return x, dx
        (lo, hi), (dlo, dhi) = lim, bounds_of(db)
        grad = jax.vmap(grad_x, in_axes=(0, 0, None))(x, b, s)
        held = held_by_bounds(x, grad, lo, hi)
        free = ~held
        dx_held = jnp.where(held, jnp.where(x <= lo, dlo, dhi), 0)
        rhs = rhs + jnp.einsum("bij,bj->bi", hess, dx_held)
        h_free = jnp.where(free[:, :, None] & free[:, None, :], hess,
                           jnp.eye(x.shape[-1], dtype=hess.dtype) * held[:, :, None])
        dx_free = -jnp.linalg.solve(h_free, jnp.where(free, rhs, 0)[..., None])[..., 0]
        return x, jnp.where(held, dx_held, dx_free)

    return ident(jax.lax.stop_gradient(x_star), bargs, sargs)
