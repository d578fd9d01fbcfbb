"""Dogleg with a rectangular trust region (scipy's ``method="dogbox"``, Voglis & Lagaris
2004), as a step of the shared trust-region driver.

The trust region is the box ``|step_i| <= Delta * scale_i`` intersected with the bounds.
Variables sitting on a bound with the gradient pointing out of the box are held fixed (the
active set); over the free ones the step is the dogleg between the Cauchy point (the
minimiser of the quadratic model along the anti-gradient, inside the box) and the
Gauss–Newton step, cut where it leaves the box. A step that reaches a bound puts the
variable exactly on it, so the active set is read off ``x`` at the next iteration.

The model comes factored, ``R^T R = J^T J`` and ``R^T qtf = J^T f``, so
``||J p + f||^2 = ||R p + qtf||^2 + const`` and every quadratic form uses ``R``.

Example:
    >>> import jax.numpy as jnp
    >>> from adaptprec.nlsq.dogbox import dogbox_step
    >>> # J = I, f = x - 3 at x = 0 with x <= 1: the Gauss-Newton step (3) leaves the
    >>> # box, the dogleg stops on the bound, exactly at 1
    >>> st = dogbox_step(jnp.zeros(1), jnp.eye(1), jnp.array([-3.0]), jnp.array([-3.0]),
    ...                  jnp.ones(1), 10.0, 0.0, jnp.array([-jnp.inf]), jnp.ones(1))
    >>> float(st.x_new[0]), float(st.predicted)
    (1.0, 2.5)
"""

from __future__ import annotations

import jax.numpy as jnp

from .lm import Step

__all__ = ["dogbox_step", "dogbox_gnorm", "dogbox_delta0", "on_bound"]


def on_bound(x, lb, ub):
    """-1 / 0 / +1: ``x`` exactly on its lower bound, free, exactly on its upper bound.

    Example:
        >>> import jax.numpy as jnp
        >>> from adaptprec.nlsq.dogbox import on_bound
        >>> on_bound(jnp.array([0.0, 0.5, 1.0]), jnp.zeros(3), jnp.ones(3)).tolist()
        [-1, 0, 1]
    """
    return jnp.where(x == lb, -1, jnp.where(x == ub, 1, 0)).astype(jnp.int32)


def _free(x, g, lb, ub):
    return ~(on_bound(x, lb, ub) * g < 0)


def dogbox_gnorm(x, g, R, fsn, lb, ub):
    """``||g||_inf`` over the free variables (scipy's first-order measure for dogbox).

    Example:
        >>> import jax.numpy as jnp
        >>> from adaptprec.nlsq.dogbox import dogbox_gnorm
        >>> # x on its lower bound with g > 0 (pushing outwards): held, not counted
        >>> float(dogbox_gnorm(jnp.array([0.0, 0.5]), jnp.array([5.0, 0.1]), None, None,
        ...                    jnp.zeros(2), jnp.ones(2)))
        0.1
    """
    return jnp.max(jnp.abs(jnp.where(_free(x, g, lb, ub), g, 0.0)))


def dogbox_delta0(x, scale_inv, g, lb, ub):
    """scipy's initial radius ``||x / scale||_inf`` (1 when that is 0).

    Example:
        >>> import jax.numpy as jnp
        >>> from adaptprec.nlsq.dogbox import dogbox_delta0
        >>> float(dogbox_delta0(jnp.array([0.0, -3.0]), jnp.ones(2), None, None, None))
        3.0
    """
    d = jnp.max(jnp.abs(x * scale_inv))
    return jnp.where(d > 0, d, 1.0)


def _step_to_bound(x, s, lb, ub):
    """The largest ``t >= 0`` with ``lb <= x + t s <= ub`` and which bound stops it
    (-1/+1 per component that is hit, 0 otherwise); scipy's ``step_size_to_bound``."""
    nz = s != 0
    safe = jnp.where(nz, s, 1.0)
    steps = jnp.where(nz, jnp.maximum((lb - x) / safe, (ub - x) / safe), jnp.inf)
    t = jnp.min(steps)
    hits = jnp.where(steps == t, jnp.sign(s), 0.0).astype(jnp.int32)
    return t, hits


def dogbox_step(x, R, qtf, g, scale_inv, Delta, alpha, lb, ub, *, lsmr_opts=None) -> Step:
    """One dogbox step from the factored model ``(R, qtf)`` (``g = R^T qtf``).

    ``lsmr_opts`` (:func:`._lsmr.check_tr_options`'s tuple) selects scipy's
    ``tr_solver="lsmr"``: the Gauss-Newton step over the free variables is LSMR's
    solution in the variables scaled by ``x_scale`` instead of a dense least-squares
    solve."""
    n = x.shape[0]
    free = _free(x, g, lb, ub)
    fz = free.astype(R.dtype)
    g_f = g * fz
    R_f = R * fz[None, :]
    if lsmr_opts is None:
        newton = jnp.linalg.lstsq(R_f, -qtf)[0] * fz
    else:
        from ..linalg._lsmr import lsmr

        o = dict(lsmr_opts)
        Rs = R_f / scale_inv[None, :]
        newton = -lsmr(lambda p: Rs @ p, lambda u: Rs.T @ u, qtf, n, damp=o["damp"],
                       atol=o["atol"], btol=o["btol"], conlim=o["conlim"],
                       maxiter=o["maxiter"])[0] / scale_inv * fz
    tr = Delta / scale_inv
    lb_c, ub_c = lb - x, ub - x
    lo = jnp.where(free, jnp.maximum(lb_c, -tr), 0.0)
    hi = jnp.where(free, jnp.minimum(ub_c, tr), 0.0)
    orig_l = free & (lo == lb_c)
    orig_u = free & (hi == ub_c)
    tr_l = free & (lo == -tr)
    tr_u = free & (hi == tr)
    newton_in = jnp.all((newton >= lo) & (newton <= hi))
    # Cauchy point: minimise a t^2 + b t along -g within the box
    Rg = R_f @ g_f
    a = 0.5 * jnp.dot(Rg, Rg)
    b = -jnp.dot(g_f, g_f)
    t_max, _ = _step_to_bound(jnp.zeros(n, x.dtype), -g_f, lo, hi)
    t_max = jnp.where(jnp.isfinite(t_max), t_max, 0.0)
    t_star = jnp.where(a > 0, -b / jnp.where(a > 0, 2 * a, 1.0), t_max)
    t = jnp.clip(t_star, 0.0, t_max)
    cauchy = -t * g_f
    diff = newton - cauchy
    t2, hits = _step_to_bound(cauchy, diff, lo, hi)
    t2 = jnp.where(jnp.isfinite(t2), jnp.minimum(t2, 1.0), 1.0)
    dog = cauchy + t2 * diff
    step = jnp.where(newton_in, newton, dog)
    hit_l = (~newton_in) & (hits < 0) & orig_l
    hit_u = (~newton_in) & (hits > 0) & orig_u
    tr_hit = (~newton_in) & jnp.any(((hits < 0) & tr_l) | ((hits > 0) & tr_u))
    x_new = jnp.clip(x + step, lb, ub)
    x_new = jnp.where(hit_l, lb, jnp.where(hit_u, ub, x_new))
    Rs = R @ step
    predicted = -(0.5 * jnp.dot(Rs, Rs) + jnp.dot(g, step))
    step_norm = jnp.max(jnp.abs(step * scale_inv))
    s_model = jnp.linalg.svd(R / scale_inv[None, :], compute_uv=False)
    return Step(x_new, predicted, step_norm, tr_hit, jnp.asarray(alpha, x.dtype), s_model)
