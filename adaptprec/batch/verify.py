r"""The hand-off to the top rung: verify a lower rung's answer in ONE evaluation.

Once the bottom rung (float32) has converged, the top rung (float64) evaluates every fit's
residual and Jacobian once, at the lower rung's answer :math:`x_\ell`. That evaluation gives

* the gradient test (scipy's ``gtol`` on the largest cosine, in float64), and
* the Gauss–Newton step :math:`\delta = -(J^\top J + \epsilon D^2)^{-1} J^\top f`
  (:math:`\epsilon = 8u\,r`, :func:`~adaptprec.batch.lm_batched.gauss_newton_shift`;
  projected with bounds), the remaining distance to the
  minimum to first order, with its available reduction
  :math:`a = \tfrac12 |J^\top f\cdot\delta| \approx \tfrac12\,\delta^\top J^\top J\,\delta`.

The fit is accepted, and the step taken (:math:`x = x_\ell + \delta`, clipped into the box),
when the step passes the top rung's own tests (``ftol``: :math:`a \le` ``ftol`` ``cost``;
``xtol`` on :math:`\|D\delta\|`), or the **standard-error test**: with
:math:`s^2 = 2\,\mathrm{cost}/(m-n)` (``curve_fit``'s covariance
:math:`s^2 (J^\top J)^{-1}`),

.. math:: \delta^\top J^\top J\,\delta \;\le\; c^2 s^2,\qquad c = \texttt{SE\_FRACTION} = 10^{-3},

which by Cauchy–Schwarz gives :math:`|\delta_i| \le c\,\mathrm{se}_i` for every parameter
(:math:`|e_i^\top\delta|^2 \le (e_i^\top C e_i)(\delta^\top C^{-1}\delta)`), in the same
quantity as the ``ftol`` test: :math:`a \le c^2\,\mathrm{cost}/(m-n)` (the top rung's
``LMOptions.se_accept``, :func:`~adaptprec.batch.lm_batched.rung_ftol`; its own iterations
stop by the same test). The answer after the step is closer still (Gauss–Newton contracts
the error by the residual-curvature factor). Such a fit ends with status ``FTOL`` (2;
``FTOL_XTOL``/``XTOL`` when the plain tolerances pass); ``nfev``/``njev``/``nit`` count the
evaluation and the step once, so ``njev == nit + 1`` over both rungs.

A fit that fails the check (or has ``m <= n``, no standard errors; or a zero residual,
where only the top rung's tolerances can accept) iterates on the top rung from
:math:`x_\ell` with the lower rung's damping carried over (clipped to
``[eps, lam0]``: a converged fit's small damping makes the first top-rung steps
Gauss–Newton steps instead of restarting at ``lam0``).

The lower rung stops below 3/4 of that (``LMOptions.se_below``, set in
``batch/api.py``). Why: iterating float64 to its own ``ftol=1e-15`` cost as many float64
iterations as float64 alone (9.2 vs 9.3 on Gpufit's 2-D Gaussian before this module),
while one evaluation and one Gauss–Newton step settle the digits a fit's statistics see.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from . import _status as st
from .compaction import gather, run_compacted, scatter, select
from .._policy import cast_floating
from .lm_batched import (LMOptions, LMState, ResidualJacobian, _diagonal, _gradient_cosine,
                         _project_gradient, damped_solve_fits_last, gauss_newton_shift,
                         init_fits_last, lm_run, move_batch_axis, rung_ftol, to_fits_first,
                         to_fits_last)

__all__ = ["SE_FRACTION", "verify_handoff", "gradient_check", "finish_on_top"]

#: A fit is accepted when its Gauss–Newton step is at most this fraction of every
#: parameter's standard error (in the covariance's metric, which bounds each parameter):
#: the top rung's ``LMOptions.se_accept`` on an adaptive ladder.
SE_FRACTION = 1e-3


def _step_tests(s: LMState, fj: ResidualJacobian, bargs, opts: LMOptions, m: int):
    """Fits-last: the Gauss–Newton step at ``s`` and its (ftol, xtol) verdicts, with the
    top rung's Gauss–Newton ``ftol`` (:func:`~adaptprec.batch.lm_batched.rung_ftol`:
    with ``opts.se_accept``, at least the standard-error test's)."""
    bounds = fj.bounds(bargs)
    dx = damped_solve_fits_last(s.jtj, s.jtf, gauss_newton_shift(s.jtj, s.d2), s.x, bounds)
    avail = 0.5 * jnp.abs(jnp.sum(s.jtf * dx, axis=0))
    f_ok = avail <= rung_ftol(opts, m, s.x.shape[0]) * s.cost
    dxn = jnp.sqrt(jnp.sum(s.d2 * dx * dx, axis=0))
    xnorm = jnp.sqrt(jnp.sum(s.d2 * s.x * s.x, axis=0))
    x_ok = dxn <= opts.xtol * (opts.xtol + xnorm)
    finite = jnp.isfinite(dx).all(axis=0) & jnp.isfinite(avail)
    return dx, f_ok & finite, x_ok & finite, bounds


def verify_handoff(fj: ResidualJacobian, low: LMState, bargs, sargs,
                   opts: LMOptions) -> LMState:
    """Evaluate every fit once on the top rung (``fj``) at the lower rung's answer ``low``
    (fits first, in the top rung's dtype) and accept those the check passes.

    Returns the top rung's state (fits first): accepted fits (and fits whose top-rung
    gradient test already passes, or whose evaluation is non-finite) inactive with their
    status; the others active, ready for :func:`~adaptprec.batch.lm_batched.lm_run`, with
    the lower rung's damping carried. Counters include ``low``'s.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from adaptprec.batch.lm_batched import LMOptions, lm_init, lm_run, make_fj
        >>> from adaptprec.batch.verify import verify_handoff
        >>> t = jnp.linspace(0.0, 1.0, 20)
        >>> noise = 0.01 * jnp.sin(37.0 * t)                  # a noisy fit: s > 0
        >>> y = (jnp.stack([2.0 * jnp.exp(-t) + noise, 3.1 * jnp.exp(-2.3 * t)]),)
        >>> res = lambda x, b, s: x[0] * jnp.exp(-x[1] * t) - b[0]
        >>> f32, f64 = make_fj(res, jnp.float32, jnp.float32), make_fj(res, jnp.float64, jnp.float64)
        >>> o32 = LMOptions(1e-6, 1e-6, 1e-6, 50, se_below=2.5e-4)
        >>> o64 = LMOptions(1e-15, 1e-10, 1e-10, 50, se_accept=1e-3)
        >>> low = lm_run(f32, lm_init(f32, jnp.ones((2, 2)), y, (), o32), y, (), o32)
        >>> low = jax.tree.map(lambda a: a.astype(jnp.float64) if a.dtype == jnp.float32 else a, low)
        >>> top = verify_handoff(f64, low, y, (), o64)
        >>> top.status.tolist(), top.active.tolist()   # noisy fit accepted; exact fit iterates
        ([2, 99], [False, True])
    """
    b_last = move_batch_axis(bargs, 0, -1)
    x = low.x.T
    m = jax.eval_shape(fj.fits_last, x, b_last, sargs)[0].shape[0]
    s = init_fits_last(fj, x, b_last, sargs, opts, None)
    dx, f_ok, x_ok, bounds = _step_tests(s, fj, b_last, opts, m)
    accept = s.active & (f_ok | x_ok)
    xn = s.x + dx
    if bounds is not None:
        xn = jnp.clip(xn, *bounds)
    code = jnp.where(f_ok & x_ok, st.FTOL_XTOL,
                     jnp.where(f_ok, st.FTOL, st.XTOL)).astype(jnp.int32)
    tiny = float(np.finfo(s.x.dtype).eps)
    lam = jnp.clip(low.lam.astype(s.lam.dtype), tiny, opts.lam0)
    lam = jnp.where(jnp.isfinite(lam), lam, opts.lam0)
    one = jnp.ones_like(s.nit)
    s = s._replace(
        x=jnp.where(accept, xn, s.x), status=jnp.where(accept, code, s.status),
        active=s.active & ~accept, lam=lam,
        nit=low.nit + accept.astype(jnp.int32), nfev=low.nfev + one, njev=low.njev + one)
    return to_fits_first(s)



def gradient_check(fj: ResidualJacobian, low: LMState, bargs, sargs, opts: LMOptions):
    """The hand-off check with float64's gradient and the lower rung's curvature.

    Fits first. The top rung evaluates the residual and its gradient ``J^T f`` (one
    ``vjp``: about 0.4x of the residual-and-Jacobian evaluation, measured on the 2-D
    Gaussian) at ``low.x``; the metric ``J^T J`` is the lower rung's, at the same ``x``.
    Only for a linear loss and fits no escalation guard flagged (the caller's ``trusted``):
    there the scaled condition number is below ``cond_tol / u_low``, so ``J^T J``'s
    rounding moves the Gauss-Newton step by a few per cent of itself at most, while the
    gradient, the quantity the standard-error test is about, is float64's.

    Returns ``(accept, x, status)``: the fits the check accepts (finite, and the gradient
    test or the step tests of :func:`_step_tests` pass), their answers (the Gauss-Newton
    step taken unless the gradient test passed) and status codes.
    """
    def residual(x, b):
        b_r, s_r = cast_floating(b, fj.rung_dtype), cast_floating(sargs, fj.rung_dtype)
        out = fj.residual(x.astype(fj.rung_dtype), b_r, s_r)
        return jnp.asarray(out).astype(fj.acc_dtype)

    def one(x, b):
        f, vjp = jax.vjp(lambda p: residual(p, b), x.astype(fj.acc_dtype))
        return 0.5 * jnp.sum(f * f), vjp(f)[0]

    b_last = move_batch_axis(bargs, 0, -1)
    s = to_fits_last(low)
    bounds = fj.bounds(b_last)
    x = s.x if bounds is None else jnp.clip(s.x, *bounds)
    cost, g = jax.vmap(one)(x.T, bargs)
    m = jax.eval_shape(jax.vmap(residual), x.T, bargs).shape[1]
    jtf = _project_gradient(x, g.T, bounds)
    d2 = _diagonal(s.jtj)
    s = s._replace(x=x, cost=cost, jtf=jtf, d2=jnp.where(d2 > 0, d2, 1).astype(x.dtype))
    gconv = _gradient_cosine(cost, s.jtj, jtf) <= opts.gtol
    dx, f_ok, x_ok, _ = _step_tests(s, fj, b_last, opts, m)
    finite = jnp.isfinite(cost) & jnp.isfinite(jtf).all(axis=0) \
        & jnp.isfinite(s.jtj).all(axis=(0, 1))
    accept = finite & (gconv | f_ok | x_ok)
    xn = x + dx
    if bounds is not None:
        xn = jnp.clip(xn, *bounds)
    code = jnp.where(gconv, st.GTOL, jnp.where(f_ok & x_ok, st.FTOL_XTOL,
                                               jnp.where(f_ok, st.FTOL, st.XTOL)))
    return accept, jnp.where(gconv, x, xn).T, code.astype(jnp.int32), gconv


def finish_on_top(fj: ResidualJacobian, low: LMState, bargs, sargs, opts: LMOptions,
                  capacities: tuple[int, ...], few: int = 64, trusted=None) -> LMState:
    """Verify every fit on the top rung, then iterate there the fits the check did not
    accept.

    Fits ``trusted`` (per fit, optional; a linear loss only) are checked first by
    :func:`gradient_check` (float64's gradient, the lower rung's ``J^T J``); the others,
    and trusted fits it does not accept, by :func:`verify_handoff` (float64's residual
    and Jacobian), then iterated. When at most ``few`` fits (static) are left, they are
    gathered into a ``few``-lane buffer and checked and iterated there (typical: the
    check accepts nearly every fit, and a full-width compaction stage would cost as much
    as the check); more go through :func:`~adaptprec.batch.compaction.run_compacted`
    with ``capacities``; none costs nothing. A fit's result does not depend on the
    branch its block takes.
    """
    # A block whose every fit started at NaN (the padding of a bucketed batch: whole
    # blocks of it, a quarter of the lanes at 1e5 fits) has nothing to verify: float32
    # found a non-finite residual at that very x, and so would float64. Skipping it saved
    # 2.04 -> 1.85 us/fit (1e5 fits, one process, load 1.8; issue 31).
    padding = jnp.all(jnp.isnan(low.x).any(axis=-1) & (low.status == st.NONFINITE_RESIDUAL))
    # ``max_steps`` is per rung: the top rung's iterations count from zero, else a fit
    # that used the lower rung's budget (Arrhenius from ones crawling on float32) got one
    # float64 step
    low_nit = low.nit
    few = int(min(few, low.x.shape[0]))
    linear = isinstance(opts.loss, str) and opts.loss == "linear"
    use_check = trusted is not None and linear
    if not use_check:
        trusted = jnp.zeros(low.status.shape, bool)

    def check(low):
        if not use_check:   # (static) every fit to verify_handoff
            return low._replace(nit=jnp.zeros_like(low.nit)), jnp.ones(low.active.shape, bool)
        accept, xn, code, gconv = gradient_check(fj, low, bargs, sargs, opts)
        accept = accept & trusted
        one = jnp.ones_like(low.nit)
        done = low._replace(
            x=jnp.where(accept[:, None], xn, low.x), status=jnp.where(accept, code, low.status),
            active=jnp.zeros_like(low.active), nit=(accept & ~gconv).astype(low.nit.dtype),
            nfev=low.nfev + trusted.astype(one.dtype), njev=low.njev + trusted.astype(one.dtype))
        return done, ~accept

    def full(low, bargs, low_nit):
        s = verify_handoff(fj, low, bargs, sargs, opts)
        return s._replace(nit=s.nit - low_nit)

    def some(done, rest):
        idx, valid = select(rest, few)
        sub = full(gather(low, idx), gather(bargs, idx), gather(low_nit, idx))
        # (the trusted fits' gradient check counted once more; see check's nfev)
        sub = sub._replace(nfev=sub.nfev + gather(trusted, idx).astype(sub.nfev.dtype),
                           njev=sub.njev + gather(trusted, idx).astype(sub.njev.dtype))
        sub = lm_run(fj, sub._replace(active=sub.active & valid), gather(bargs, idx), sargs,
                     opts)
        return scatter(done, idx, sub)

    def many(done, rest):
        s = full(low, bargs, low_nit)
        s = s._replace(nfev=s.nfev + trusted.astype(s.nfev.dtype),
                       njev=s.njev + trusted.astype(s.njev.dtype))
        s = jax.tree.map(lambda a, b: jnp.where(
            rest.reshape(rest.shape + (1,) * (a.ndim - 1)), a, b), s, done)
        return run_compacted(fj, s, bargs, sargs, opts, capacities)

    def padded(low):
        return low._replace(nit=jnp.zeros_like(low.nit)), jnp.zeros(low.active.shape, bool)

    done, rest = jax.lax.cond(padding, padded, check, low)
    count = jnp.sum(rest, dtype=jnp.int32)
    branch = jnp.where(count == 0, 0, jnp.where(count <= few, 1, 2))
    s = jax.lax.switch(branch, (lambda d, r: d, some, many), done, rest)
    return s._replace(nit=s.nit + low_nit)
