r"""Reverse-mode derivatives of batched solutions by the implicit function theorem.

At a solution :math:`x^*(\theta)` of :math:`\min_x C(x,\theta)` (e.g.
:math:`\tfrac12\|r(x,\theta)\|^2`, or a robust cost)
the gradient vanishes, :math:`\nabla_x C(x^*,\theta) = 0`, so

.. math:: \frac{\partial x^*}{\partial\theta} = -H^{-1}\,\partial_\theta\nabla_x C,
   \qquad H = \nabla^2_x C(x^*,\theta)

with the full Hessian (including the :math:`\sum_i r_i\nabla^2 r_i` term, so the
derivative is exact for non-zero residuals, not a Gauss–Newton approximation). The
cotangent :math:`\bar x` is pulled back per fit as :math:`v = H^{-1}\bar x`,
:math:`\bar\theta = -(\partial_\theta\nabla_x C)^\top v`: one ``n x n`` Hessian and one
VJP per fit, never a differentiation through the solver's ``while_loop``. ``theta`` is
every floating leaf of the batched and shared arguments (data, weights, grids).
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp

from ..nlsq.common import robust_cost

__all__ = ["implicit_solution"]


def _float_mask(tree):
    return jax.tree.map(lambda a: jnp.issubdtype(jnp.result_type(a), jnp.inexact), tree)


def implicit_solution(residual: Callable, x_star, bargs, sargs, loss="linear",
                      f_scale: float = 1.0):
    """Return ``x_star`` with reverse-mode derivatives w.r.t. ``bargs``/``sargs``.

    ``residual(x, bargs_k, sargs)`` is one fit's residual; ``x_star`` ``(B, n)`` must be
    (numerically) a stationary point of each fit's cost
    (:func:`adaptprec.nlsq.common.robust_cost` with ``loss`` and ``f_scale``). Forward-mode (``jvp``) is not
    defined; use ``jax.grad``/``jax.vjp``.

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

    @jax.custom_vjp
    def ident(x, b, s):
        return x

    def fwd(x, b, s):
        return x, (x, b, s)

    def bwd(saved, xbar):
        x, b, s = saved
        hess = jax.vmap(jax.hessian(cost), in_axes=(0, 0, None))(x, b, s)
        v = jnp.linalg.solve(hess, xbar[..., None])[..., 0]
        bmask, smask = _float_mask(b), _float_mask(s)

        def g_of(bf, sf):
            bb = jax.tree.map(lambda m, new, old: new if m else old, bmask, bf, b)
            ss = jax.tree.map(lambda m, new, old: new if m else old, smask, sf, s)
            return jax.vmap(grad_x, in_axes=(0, 0, None))(x, bb, ss)

        _, pull = jax.vjp(g_of, b, s)
        bbar, sbar = pull(-v)
        bbar = jax.tree.map(lambda m, g: g if m else None, bmask, bbar)
        sbar = jax.tree.map(lambda m, g: g if m else None, smask, sbar)
        return jnp.zeros_like(x), bbar, sbar

    ident.defvjp(fwd, bwd)
    return ident(jax.lax.stop_gradient(x_star), bargs, sargs)
