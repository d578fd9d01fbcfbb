r"""The hand-off to the top rung: verify a lower rung's answer in ONE evaluation.

Once the bottom rung (float32) has converged, the top rung (float64) evaluates every fit's
residual and Jacobian once, at the lower rung's answer :math:`x_\ell`. That evaluation gives

* the gradient test (scipy's ``gtol`` on the largest cosine, in float64), and
* the Gauss–Newton step :math:`\delta = -(J^\top J + \epsilon D^2)^{-1} J^\top f`
  (:math:`\epsilon = 8u\,r`, :func:`~adaptprec.batch._model.gauss_newton_shift`;
  projected with bounds), the remaining distance to the
  minimum to first order, with its available reduction
  :math:`a = \tfrac12 |J^\top f\cdot\delta| \approx \tfrac12\,\delta^\top J^\top J\,\delta`.

The verdict is the single fit's (:func:`adaptprec.nlsq._rules.handoff_code`, one test for
both engines). The fit is accepted, and the step taken (:math:`x = x_\ell + \delta`,
clipped into the box), when the step passes the top rung's own tests (``ftol``:
:math:`a \le` ``ftol`` ``cost``; ``xtol`` on :math:`\|D\delta\|`), or the
**standard-error test**: with
:math:`s^2 = 2\,\mathrm{cost}/(m-n)` (``curve_fit``'s covariance
:math:`s^2 (J^\top J)^{-1}`),

.. math:: \delta^\top J^\top J\,\delta \;\le\; c^2 s^2,\qquad c = \texttt{SE\_FRACTION} = 10^{-3},

which by Cauchy–Schwarz gives :math:`|\delta_i| \le c\,\mathrm{se}_i` for every parameter
(:math:`|e_i^\top\delta|^2 \le (e_i^\top C e_i)(\delta^\top C^{-1}\delta)`), in the same
quantity as the ``ftol`` test: :math:`a \le c^2\,\mathrm{cost}/(m-n)` (the top rung's
``LMOptions.se_accept``; its own iterations stop by the same test). The single fit's
second clause holds too: a step of up to ``SE_TAKEN`` :math:`= 10^{-2}` standard errors
(:data:`adaptprec.nlsq._rules.SE_TAKEN`) is accepted when the lower rung measured
Gauss–Newton contracting fast enough that the step, taken, leaves at most a tenth of
``SE_FRACTION``: ``rate * q <= SE_FRACTION / 10``, ``rate`` the larger of the lower rung's
last two contraction ratios (its record, :func:`~adaptprec.batch.lm_batched.
record_contraction`; ``inf`` where it measured none: exact data, bounds, a robust loss,
fewer than two resolved steps). Where the data's noise is small (1e-4 of the signal) float32
resolves ``x`` only to ~1e-3 to 1e-2 of its standard errors, and this clause is what spares
most fits a float64 iteration. Such a fit ends with status ``FTOL`` (2;
``FTOL_XTOL``/``XTOL`` when the plain tolerances pass); ``nfev``/``njev``/``nit`` count the
evaluation and the step once, so ``njev == nit + 1`` over both rungs.

A fit that fails the check (or has ``m <= n``, no standard errors; or a zero residual,
where only the top rung's tolerances can accept) iterates on the top rung from
:math:`x_\ell` with the lower rung's damping carried over (clipped to
``[eps, lam0]``: a converged fit's small damping makes the first top-rung steps
Gauss–Newton steps instead of restarting at ``lam0``).

The lower rung stops below 3/4 of that (``LMOptions.se_below``, set in
``batch/_options.py``). Why: iterating float64 to its own ``ftol=1e-15`` cost as many float64
iterations as float64 alone (9.2 vs 9.3 on Gpufit's 2-D Gaussian before this module),
while one evaluation and one Gauss–Newton step settle the digits a fit's statistics see.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from ..nlsq._rules import SE_TAKEN
from ..nlsq.common import SE_FRACTION
from . import _status as st
from ._model import ResidualJacobian, move_batch_axis
from .compaction import gather, run_compacted, scatter, select
from .lm_batched import (LMOptions, LMState, contraction_rate, gauss_newton_code,
                         init_fits_last, lm_run, to_fits_first)

__all__ = ["SE_FRACTION", "SE_TAKEN", "verify_handoff", "finish_on_top"]


def verify_handoff(fj: ResidualJacobian, low: LMState, bargs, sargs,
                   opts: LMOptions) -> LMState:
    """Evaluate every fit once on the top rung (``fj``) at the lower rung's answer ``low``
    (fits first, in the lower or the top rung's dtype) and accept those the check passes.

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
    bounds = fj.bounds(b_last)
    rate = contraction_rate(low.gn_rate.T).astype(s.cost.dtype)
    dx, code, *_ = gauss_newton_code(s.x, s.cost, s.jtj, s.jtf, s.d2, bounds, opts, m,
                                     rate)
    accept = s.active & (code > 0)
    xn = s.x + dx
    if bounds is not None:
        xn = jnp.clip(xn, *bounds)
    cost_n, jtf_n = _model_after(s, xn - s.x)
    tiny = float(np.finfo(s.x.dtype).eps)
    lam = jnp.clip(low.lam.astype(s.lam.dtype), tiny, opts.lam0)
    lam = jnp.where(jnp.isfinite(lam), lam, opts.lam0)
    one = jnp.ones_like(s.nit)
    s = s._replace(
        x=jnp.where(accept, xn, s.x), status=jnp.where(accept, code, s.status),
        cost=jnp.where(accept, cost_n, s.cost), jtf=jnp.where(accept, jtf_n, s.jtf),
        active=s.active & ~accept, lam=lam,
        nit=low.nit + accept.astype(jnp.int32), nfev=low.nfev + one, njev=low.njev + one)
    return to_fits_first(s)


def _model_after(s: LMState, dx):
    """Fits last: the Gauss–Newton model's cost and gradient after the step ``dx``,
    ``max(cost + g.dx + dx^T J^T J dx / 2, 0)`` and ``g + J^T J dx`` (components held
    by a bound, zero in the projected ``g``, stay zero). An accepted hand-off returns
    ``x + dx`` with these, as the single fit's does: they describe the returned point to
    second order in a step of at most a hundredth of a standard error."""
    jdx = jnp.sum(s.jtj * dx[None, :, :], axis=1)
    cost = jnp.maximum(s.cost + jnp.sum(dx * (s.jtf + 0.5 * jdx), axis=0), 0.0)
    return cost, jnp.where(s.jtf == 0, 0, s.jtf + jdx)


def _astype_floating(s: LMState, dtype) -> LMState:
    return jax.tree.map(
        lambda a: a.astype(dtype) if jnp.issubdtype(a.dtype, jnp.floating) else a, s)


def finish_on_top(fj: ResidualJacobian, low: LMState, bargs, sargs, opts: LMOptions,
                  capacities: tuple[int, ...], few: int = 64) -> LMState:
    """:func:`verify_handoff`, then iterate on the top rung the fits it did not accept.

    When at most ``few`` fits (static) are left, they are gathered into a ``few``-lane
    buffer and iterated there (typical: the check accepts nearly every fit, and a
    full-width compaction stage would cost as much as the check); more go through
    :func:`~adaptprec.batch.compaction.run_compacted` with ``capacities``; none costs
    nothing.
    """
    # A block whose every fit started at NaN (bucket padding) has nothing to verify:
    # the lower rung found a non-finite residual at that very x, and so would the top.
    padding = jnp.all(jnp.isnan(low.x).any(axis=-1) & (low.status == st.NONFINITE_RESIDUAL))
    acc = fj.acc_dtype
    # x in the top rung's dtype before the check: a float32 x converted inside it was
    # fused into every Jacobian entry of the float64 evaluation (that kernel 1.8x slower)
    low = low._replace(x=low.x.astype(acc))
    s = jax.lax.cond(padding, lambda low: _astype_floating(low, acc),
                     lambda low: verify_handoff(fj, low, bargs, sargs, opts), low)
    # ``max_steps`` is per rung: the top rung's iterations count from zero, else a fit
    # that used the lower rung's budget (Arrhenius from ones crawling on float32) got one
    # float64 step
    low_nit = low.nit.astype(s.nit.dtype)
    s = s._replace(nit=s.nit - low_nit)
    few = int(min(few, s.x.shape[0]))

    def some(s):
        idx, valid = select(s.active, few)
        sub = gather(s, idx)
        sub = lm_run(fj, sub._replace(active=sub.active & valid), gather(bargs, idx), sargs,
                     opts)
        return scatter(s, idx, sub)

    def many(s):
        return run_compacted(fj, s, bargs, sargs, opts, capacities)

    count = jnp.sum(s.active, dtype=jnp.int32)
    branch = jnp.where(count == 0, 0, jnp.where(count <= few, 1, 2))
    s = jax.lax.switch(branch, (lambda s: s, some, many), s)
    return s._replace(nit=s.nit + low_nit)
