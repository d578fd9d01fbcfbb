"""Trust-region reflective step for bound constraints (Branch, Coleman & Li 1999; scipy's
``trf`` with ``tr_solver="exact"``).

Iterates stay strictly feasible. With the Coleman–Li scaling vector ``v`` (distance to the
bound the gradient points at, 1 for free directions) the step solves a trust-region
problem in the variables ``x_h = x / d``, ``d = v^(1/2) * x_scale``, for the augmented
model ``[J d; diag(g dv x_scale)^(1/2)]``; if the step leaves the box the best of three
candidates is taken: the step truncated at the bound (pulled back by ``theta``), its
reflection off the bound, and the scaled anti-gradient, each minimising the quadratic
model along its line (:func:`select_step`).

Example:
    >>> import jax.numpy as jnp
    >>> from adaptprec.nlsq.trf import cl_scaling
    >>> v, dv = cl_scaling(jnp.array([0.5, 0.5]), jnp.array([1.0, -1.0]),
    ...                    jnp.array([0.0, -jnp.inf]), jnp.array([jnp.inf, 2.0]))
    >>> [float(a) for a in v], [float(a) for a in dv]
    ([0.5, 1.5], [1.0, -1.0])
"""

from __future__ import annotations

import jax.numpy as jnp

from .common import solve_lsq_trust_region
from .lm import Step

__all__ = ["cl_scaling", "make_strictly_feasible", "active_constraints", "trf_delta0",
           "trf_step", "trf_lsmr_step", "select_step", "step_size_to_bound"]


def cl_scaling(x, g, lb, ub):
    """Coleman–Li scaling vector ``v`` and its derivative ``dv`` (scipy's
    ``CL_scaling_vector``).

    Example:
        >>> import jax.numpy as jnp
        >>> from adaptprec.nlsq.trf import cl_scaling
        >>> [float(a) for a in cl_scaling(jnp.ones(1), jnp.ones(1), jnp.zeros(1),
        ...                               jnp.full(1, jnp.inf))[0]]
        [1.0]
    """
    up = (g < 0) & jnp.isfinite(ub)
    lo = (g > 0) & jnp.isfinite(lb)
    v = jnp.where(lo, x - lb, jnp.where(up, ub - x, 1.0))
    dv = jnp.where(lo, 1.0, jnp.where(up, -1.0, 0.0))
    return v, dv


def active_constraints(x, lb, ub, rtol=1e-10):
    """-1 / 0 / +1 per parameter: at the lower bound, free, at the upper bound (scipy's
    ``find_active_constraints``).

    Example:
        >>> import jax.numpy as jnp
        >>> from adaptprec.nlsq.trf import active_constraints
        >>> [int(a) for a in active_constraints(jnp.array([0.0, 0.5, 1.0]), jnp.zeros(3),
        ...                                     jnp.ones(3))]
        [-1, 0, 1]
    """
    lower_dist = x - lb
    upper_dist = ub - x
    lt = rtol * jnp.maximum(1.0, jnp.abs(lb))
    ut = rtol * jnp.maximum(1.0, jnp.abs(ub))
    lower = jnp.isfinite(lb) & (lower_dist <= jnp.minimum(upper_dist, lt))
    upper = jnp.isfinite(ub) & (upper_dist <= jnp.minimum(lower_dist, ut))
    return jnp.where(upper, 1, jnp.where(lower, -1, 0)).astype(jnp.int32)


def make_strictly_feasible(x, lb, ub, rstep=1e-10):
    """Move points on or outside a bound strictly inside (scipy's
    ``make_strictly_feasible``; ``rstep=0`` moves by one ulp).

    Example:
        >>> import jax.numpy as jnp
        >>> from adaptprec.nlsq.trf import make_strictly_feasible
        >>> float(make_strictly_feasible(jnp.zeros(1), jnp.zeros(1), jnp.ones(1))[0]) > 0
        True
    """
    x = jnp.clip(x, lb, ub)
    active = active_constraints(x, lb, ub, rstep)
    if rstep == 0:
        lo_new = jnp.nextafter(lb, ub)
        up_new = jnp.nextafter(ub, lb)
    else:
        lo_new = lb + rstep * jnp.maximum(1.0, jnp.abs(lb))
        up_new = ub - rstep * jnp.maximum(1.0, jnp.abs(ub))
    x_new = jnp.where(active == -1, lo_new, jnp.where(active == 1, up_new, x))
    tight = (x_new < lb) | (x_new > ub)
    return jnp.where(tight, 0.5 * (lb + ub), x_new)


def trf_delta0(x, scale_inv, g, lb, ub):
    """Initial radius ``||x0 * scale_inv / v^(1/2)||`` (1 if zero), as scipy.

    Example:
        >>> import jax.numpy as jnp
        >>> from adaptprec.nlsq.trf import trf_delta0
        >>> float(trf_delta0(jnp.zeros(2), jnp.ones(2), jnp.ones(2), jnp.full(2, -1.0),
        ...                  jnp.ones(2)))
        1.0
    """
    v, dv = cl_scaling(x, g, lb, ub)
    v = jnp.where(dv != 0, v * scale_inv, v)
    d = jnp.linalg.norm(x * scale_inv / jnp.sqrt(v))
    return jnp.where((d > 0) & jnp.isfinite(d), d, 1.0)


def step_size_to_bound(x, s, lb, ub):
    """Largest ``t`` with ``x + t s`` in the box, and which bounds are hit (+-1/0).

    Example:
        >>> import jax.numpy as jnp
        >>> from adaptprec.nlsq.trf import step_size_to_bound
        >>> t, hits = step_size_to_bound(jnp.zeros(2), jnp.array([1.0, 2.0]),
        ...                              -jnp.ones(2), jnp.ones(2))
        >>> float(t), [int(h) for h in hits]
        (0.5, [0, 1])
    """
    nz = s != 0
    s_safe = jnp.where(nz, s, 1.0)
    steps = jnp.where(nz, jnp.maximum((lb - x) / s_safe, (ub - x) / s_safe), jnp.inf)
    t = jnp.min(steps)
    return t, jnp.where(steps == t, jnp.sign(s), 0.0).astype(jnp.int32)


def _intersect_trust_region(x, s, Delta):
    a = jnp.dot(s, s)
    a = jnp.where(a > 0, a, 1.0)
    b = jnp.dot(x, s)
    c = jnp.minimum(jnp.dot(x, x) - Delta ** 2, 0.0)
    d = jnp.sqrt(jnp.maximum(b * b - a * c, 0.0))
    q = -(b + jnp.where(b >= 0, d, -d))
    q = jnp.where(q != 0, q, -jnp.finfo(x.dtype).tiny)
    t1, t2 = q / a, c / q
    return jnp.minimum(t1, t2), jnp.maximum(t1, t2)


def _quad(Rh, g, s, diag, s0=None):
    v = Rh @ s
    a = 0.5 * (jnp.dot(v, v) + jnp.dot(s * diag, s))
    b = jnp.dot(g, s)
    if s0 is None:
        return a, b, 0.0
    u = Rh @ s0
    b = b + jnp.dot(u, v) + jnp.dot(s0 * diag, s)
    c = 0.5 * jnp.dot(u, u) + jnp.dot(g, s0) + 0.5 * jnp.dot(s0 * diag, s0)
    return a, b, c


def _min_quad_1d(a, b, lo, hi, c=0.0):
    ext = -0.5 * b / jnp.where(a != 0, a, 1.0)
    ext_ok = (a != 0) & (lo < ext) & (ext < hi)
    ts = jnp.stack([lo, hi, jnp.where(ext_ok, ext, lo)])
    ys = ts * (a * ts + b) + c
    i = jnp.argmin(ys)
    return ts[i], ys[i]


def _eval_quad(Rh, g, s, diag):
    v = Rh @ s
    return 0.5 * (jnp.dot(v, v) + jnp.dot(s * diag, s)) + jnp.dot(s, g)


def select_step(x, Rh, diag_h, g_h, p, p_h, d, Delta, lb, ub, theta):
    """scipy's ``select_step``: the Newton-type step if it stays inside the box, otherwise
    the best of the truncated step, its reflection and the scaled anti-gradient.
    Returns ``(step, step_h, predicted_reduction)``.

    Example:
        >>> import jax.numpy as jnp
        >>> from adaptprec.nlsq.trf import select_step
        >>> one = jnp.ones(1)
        >>> st, st_h, pred = select_step(0 * one, one[:, None], 0 * one, -one, one, one,
        ...                              one, 2.0, -2 * one, 2 * one, 0.995)
        >>> float(st[0]), float(pred)
        (1.0, 0.5)
    """
    inside = jnp.all((x + p >= lb) & (x + p <= ub))
    p_value_full = _eval_quad(Rh, g_h, p_h, diag_h)

    p_stride, hits = step_size_to_bound(x, p, lb, ub)
    p_stride = jnp.where(jnp.isfinite(p_stride), p_stride, 1.0)
    r_h = jnp.where(hits != 0, -p_h, p_h)
    r = d * r_h
    p_b = p * p_stride
    p_hb = p_h * p_stride
    x_on_bound = x + p_b
    _, to_tr = _intersect_trust_region(p_hb, r_h, Delta)
    to_bound, _ = step_size_to_bound(x_on_bound, r, lb, ub)
    r_stride = jnp.minimum(to_bound, to_tr)
    pos = r_stride > 0
    r_l = jnp.where(pos, (1 - theta) * p_stride / jnp.where(pos, r_stride, 1.0), 0.0)
    r_u = jnp.where(pos, jnp.where(r_stride == to_bound, theta * to_bound, to_tr), -1.0)
    a, b, c = _quad(Rh, g_h, r_h, diag_h, s0=p_hb)
    rs, r_value = _min_quad_1d(a, b, r_l, jnp.maximum(r_u, r_l), c)
    r_avail = r_l <= r_u
    r_value = jnp.where(r_avail, r_value, jnp.inf)
    r_h2 = rs * r_h + p_hb
    r2 = r_h2 * d

    p_t = p_b * theta
    p_ht = p_hb * theta
    p_value = _eval_quad(Rh, g_h, p_ht, diag_h)
    ag_h = -g_h
    ag = d * ag_h
    gn = jnp.linalg.norm(ag_h)
    to_tr_ag = Delta / jnp.where(gn > 0, gn, 1.0)
    to_bound_ag, _ = step_size_to_bound(x, ag, lb, ub)
    ag_stride = jnp.where(to_bound_ag < to_tr_ag, theta * to_bound_ag, to_tr_ag)
    a2, b2, _ = _quad(Rh, g_h, ag_h, diag_h)
    ag_stride, ag_value = _min_quad_1d(a2, b2, jnp.zeros_like(ag_stride), ag_stride)
    ag_h = ag_h * ag_stride
    ag = ag * ag_stride

    use_p = (p_value < r_value) & (p_value < ag_value)
    use_r = (~use_p) & (r_value < p_value) & (r_value < ag_value)
    step = jnp.where(use_p, p_t, jnp.where(use_r, r2, ag))
    step_h = jnp.where(use_p, p_ht, jnp.where(use_r, r_h2, ag_h))
    value = jnp.where(use_p, p_value, jnp.where(use_r, r_value, ag_value))
    return (jnp.where(inside, p, step), jnp.where(inside, p_h, step_h),
            jnp.where(inside, -p_value_full, -value))


def _scaled_model(x, R, g, scale_inv, lb, ub):
    """The model in Coleman-Li's scaled variables ``x = d * x_h`` (both step solvers):
    ``(gnorm, d, diag_h, g_h, R_h)`` with the bound curvature ``diag_h = g dv scale``."""
    scale = 1.0 / scale_inv
    v, dv = cl_scaling(x, g, lb, ub)
    gnorm = jnp.max(jnp.abs(g * v))
    v = jnp.where(dv != 0, v * scale_inv, v)
    d = jnp.sqrt(v) * scale
    return gnorm, d, g * dv * scale, d * g, R * d[None, :]


def trf_step(x, R, qtf, g, scale_inv, Delta, alpha, lb, ub, *, m: int) -> Step:
    """One trust-region-reflective step from the factored model ``(R, qtf)``.

    Example:
        >>> import jax.numpy as jnp
        >>> from adaptprec.nlsq.trf import trf_step
        >>> # J = 1, f = x - 3 at x = 0 with x <= 1: the Coleman-Li scaled step (the
        >>> # bound adds curvature g dv = 3 to the model) is 3 / (1 + 3) = 0.75
        >>> st = trf_step(jnp.zeros(1), jnp.eye(1), jnp.array([-3.0]), jnp.array([-3.0]),
        ...               jnp.ones(1), 10.0, 0.0, jnp.array([-jnp.inf]), jnp.ones(1), m=1)
        >>> round(float(st.x_new[0]), 12)
        0.75
    """
    gnorm, d, diag_h, g_h, Rh = _scaled_model(x, R, g, scale_inv, lb, ub)
    n = x.shape[0]
    A = jnp.concatenate([Rh, jnp.diag(jnp.sqrt(jnp.maximum(diag_h, 0.0)))])
    f_aug = jnp.concatenate([qtf, jnp.zeros((n,), qtf.dtype)])
    U, s, VT = jnp.linalg.svd(A, full_matrices=False)
    suf = s * (U.T @ f_aug)
    theta = jnp.maximum(0.995, 1.0 - gnorm)
    p_h, alpha_new, _ = solve_lsq_trust_region(s, VT.T, suf, Delta, alpha, m)
    p = d * p_h
    step, step_h, pred = select_step(x, Rh, diag_h, g_h, p, p_h, d, Delta, lb, ub, theta)
    x_new = make_strictly_feasible(x + step, lb, ub, rstep=0)
    hn = jnp.linalg.norm(step_h)
    s_model = jnp.linalg.svd(Rh, compute_uv=False)
    return Step(x_new, pred, hn, hn > 0.95 * Delta, alpha_new, s_model)


def _tr_1d(b, g, Delta):
    """``min 0.5 b p^2 + g p`` for ``|p| <= Delta`` (the 2-D subproblem when ``n = 1``)."""
    newton_ok = (b > 0) & (jnp.abs(g) <= b * Delta)
    p_newton = -g / jnp.where(b > 0, b, 1.0)
    p_edge = jnp.where(g > 0, -Delta, Delta)
    return jnp.where(newton_ok, p_newton, p_edge)


def trf_lsmr_step(x, R, qtf, g, scale_inv, Delta, alpha, lb, ub, *, m: int,
                  opts: tuple) -> Step:
    """One trust-region-reflective step with ``tr_solver="lsmr"`` (scipy's): LSMR on the
    regularised least-squares problem ``[J_h; diag(diag_h + reg)^(1/2)]`` (``reg`` from
    the Cauchy point's model value when ``regularize``), then the quadratic model is
    minimised over the 2-D subspace of the scaled gradient and the LSMR direction, and
    :func:`select_step` handles the bounds as for the exact step. ``opts`` is
    :func:`._lsmr.check_tr_options`'s tuple. The operator is the factored model
    ``R`` (see :mod:`._lsmr`).

    Example:
        >>> import jax.numpy as jnp
        >>> from adaptprec.nlsq._lsmr import check_tr_options
        >>> from adaptprec.nlsq.trf import trf_lsmr_step
        >>> inf = jnp.full(2, jnp.inf)
        >>> st = trf_lsmr_step(jnp.zeros(2), jnp.eye(2), jnp.array([-1.0, -2.0]),
        ...                    jnp.array([-1.0, -2.0]), jnp.ones(2), 10.0, 0.0, -inf, inf,
        ...                    m=2, opts=check_tr_options({}, "trf"))
        >>> [round(float(v), 6) for v in st.x_new]
        [1.0, 2.0]
    """
    from ..linalg._lsmr import lsmr
    from ._lsmr import solve_trust_region_2d

    o = dict(opts)
    gnorm, d, diag_h, g_h, Rh = _scaled_model(x, R, g, scale_inv, lb, ub)
    n = x.shape[0]
    if o.get("regularize", True):
        a, b, _ = _quad(Rh, g_h, -g_h, diag_h)
        ghn = jnp.linalg.norm(g_h)
        to_tr = Delta / jnp.where(ghn > 0, ghn, 1.0)
        _, ag_value = _min_quad_1d(a, b, jnp.zeros_like(to_tr), to_tr)
        reg = -ag_value / Delta ** 2
    else:
        reg = 0.0
    sq = jnp.sqrt(jnp.maximum(diag_h + reg, 0.0))
    gn_h, _, _ = lsmr(lambda p: jnp.concatenate([Rh @ p, sq * p]),
                      lambda u: Rh.T @ u[:n] + sq * u[n:],
                      jnp.concatenate([qtf, jnp.zeros((n,), qtf.dtype)]), n,
                      damp=o["damp"], atol=o["atol"], btol=o["btol"],
                      conlim=o["conlim"], maxiter=o["maxiter"])
    if n == 1:
        B = jnp.sum(Rh[:, 0] ** 2) + diag_h[0]
        p_h = jnp.reshape(_tr_1d(B, g_h[0], Delta), (1,))
    else:
        S, _ = jnp.linalg.qr(jnp.stack([g_h, gn_h], axis=1))
        JS = Rh @ S
        B_S = JS.T @ JS + (S.T * diag_h) @ S
        p_h = S @ solve_trust_region_2d(B_S, S.T @ g_h, Delta)
    p = d * p_h
    theta = jnp.maximum(0.995, 1.0 - gnorm)
    step, step_h, pred = select_step(x, Rh, diag_h, g_h, p, p_h, d, Delta, lb, ub, theta)
    x_new = make_strictly_feasible(x + step, lb, ub, rstep=0)
    hn = jnp.linalg.norm(step_h)
    s_model = jnp.linalg.svd(Rh, compute_uv=False)
    return Step(x_new, pred, hn, hn > 0.95 * Delta, jnp.asarray(alpha, x.dtype), s_model)
