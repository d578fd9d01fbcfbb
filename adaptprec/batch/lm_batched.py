r"""Levenberg–Marquardt with an explicit batch axis.

:class:`LMState` and the public functions have the batch (fit) axis first. Inside
:func:`lm_run`'s loop the same state is carried with the batch axis LAST (fits on the
minor, contiguous axis): every per-fit scalar of the iteration (an entry of
:math:`J^\top J`, a Cholesky pivot, a damping factor) is then one contiguous vector over
the fits, so the sums over residuals, the unrolled Cholesky and the selections run as
full-width vector operations. Measured on Gpufit's 2-D Gaussian (2500 fits, float32):
1.5x faster than the same iteration with the fits first, bit-identical iterates. One
iteration, for all ``B`` fits at once:

1. solve the damped normal equations
   :math:`(J^\top J + \lambda\,\mathrm{diag}(d^2))\,\delta = -J^\top f` per fit with a
   batched (unrolled for small ``n``) Cholesky, where :math:`d^2` is the running maximum
   of :math:`\mathrm{diag}(J^\top J)` (MINPACK's scaling);
2. evaluate residual and Jacobian at the trial point :math:`x+\delta` (forward mode:
   ``vmap`` of ``jvp`` over the unit tangents, as ``jacfwd``, under ``vmap`` over fits;
   the residual is the shared primal of the same pass);
3. gain ratio :math:`\rho = (C(x) - C(x+\delta)) / \mathrm{pred}` with
   :math:`\mathrm{pred} = \tfrac12\,\delta^\top(\lambda d^2\delta - J^\top f)`; accept when
   :math:`\rho > 10^{-4}` and the trial is finite;
4. damping update of Nielsen (1999): on acceptance
   :math:`\lambda \leftarrow \lambda \max(1/3, 1-(2\rho-1)^3)`, :math:`\nu = 2`; on
   rejection :math:`\lambda \leftarrow \lambda\nu`, :math:`\nu \leftarrow 2\nu`; the
   floor of :math:`\lambda` is ``eps`` times :func:`curvature_ratio` (the smallest
   :math:`\mathrm{diag}(J^\top J)_i / d_i^2`), so the damping can always fall below every
   parameter's current curvature (the step then becomes Gauss–Newton's);
5. MINPACK/scipy termination tests per fit (``ftol`` on actual and predicted relative
   reduction, ``xtol`` on the scaled step, ``gtol`` on the largest cosine between the
   residual and a Jacobian column), which set that fit's ``status`` and clear its
   ``active`` bit;
6. a Gauss–Newton test at every newly accepted point: with
   :math:`\delta_{GN} = -(J^\top J + \epsilon\,\mathrm{diag}(d^2))^{-1}J^\top f`
   (:math:`\epsilon = 8u\,r`, :math:`r` the :func:`curvature_ratio`), the reduction still available,
   :math:`\tfrac12 |J^\top f \cdot \delta_{GN}|`, is at most ``ftol * cost`` (status 2,
   or 4 when also :math:`\|d\,\delta_{GN}\| \le` ``xtol`` :math:`\|d\,x\|`). Unlike the
   MINPACK tests it does not depend on the *actual* reduction, which on a float32 rung is
   swamped by rounding near the minimum: without it, noisy gain ratios reject steps, the
   damping grows and ``xtol`` stops the fit early along flat directions;
7. on a lower rung of a ladder (unbounded, the linear loss), the contraction record the
   top rung's hand-off reads (:func:`record_contraction`), and a stop (status 3) at a
   point whose Gauss–Newton step is below the rung's resolution of it,
   :math:`\|J\,\delta_{GN}\| < u\,\|d\,x\|`: further steps there are rounding, and the
   hand-off's float64 step takes the rest.

With box constraints (the residual's ``bounds(bargs)``; see
:class:`~adaptprec.batch._problem.Residual`) the iteration is projected LM: a variable on
a bound whose gradient points out of the box is *held* (identity row and column in the
damped system, zero step), the trial point is clipped into the box, :math:`\mathrm{pred}`
is the Gauss–Newton model's reduction along the step actually taken, and the state keeps
the *projected* gradient (held components zero), which the ``gtol`` test, the escalation
guards and the reported optimality read.

Fits whose ``active`` bit is clear are *frozen*: every field is selected from the old
state with ``jnp.where``, so a converged fit does not change while others iterate. The
state keeps :math:`J^\top J`, :math:`J^\top f` and the cost instead of ``J`` and ``f``, so
its memory is :math:`O(B n^2)` not :math:`O(B m n)`. The loop runs until at most
``stop_count`` fits are active (so :mod:`~adaptprec.batch.compaction` can regroup the
stragglers); there is no host synchronisation inside it.

Arithmetic: the residual is evaluated at the rung's dtype (the caller's ``fj``); it is
returned in the accumulation dtype (float32 or wider) in which all sums, the normal
equations and the Cholesky run.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from .._policy import cast_floating
from ..precision import unit_roundoff
from . import _status as st
from ..nlsq._rules import handoff_code
from ._model import (ResidualJacobian, curvature_ratio, damped_solve_fits_last, finite_fits,
                     gauss_newton_fits_last, gradient_cosine_last, make_fj, materialised,
                     move_batch_axis, normal_equations, project_gradient)

# (make_fj and move_batch_axis are re-exported: the iteration's public helpers)
__all__ = ["LMOptions", "LMState", "make_fj", "move_batch_axis", "rung_ftol", "lm_init",
           "lm_step", "lm_run", "to_fits_last", "to_fits_first", "init_fits_last",
           "gauss_newton_code", "measures_contraction", "record_contraction",
           "contraction_rate"]

_ACCEPT = 1e-4
_LAMBDA_MAX = 1e16
#: The rounding level of a cost evaluation, relative to the cost, in ``eps sqrt(m)``
#: (a sum of ``m`` squares each rounded at ``eps``; a margin of 16).
QUIET_STEP = 16.0
#: A lower rung's Gauss–Newton step length is the denominator of a contraction ratio
#: (:func:`record_contraction`) only when it is at least this many times the rung's
#: resolution ``u ||D x||``: float32's ``||J dx||`` differed from float64's at the same
#: point by at most 4.6 (99th percentile 1.8) times it on 2,000 decays at noise 1e-4
#: (benchmarks/RESULTS.md, "Batched decays: the contraction record").
RESOLVED_STEP = 10.0


class LMOptions(NamedTuple):
    """Static options of one LM stage (hashable). Tolerances are already rung-adjusted.

    Example:
        >>> from adaptprec.batch.lm_batched import LMOptions
        >>> LMOptions(ftol=1e-8, xtol=1e-8, gtol=1e-8, max_steps=100).lam0
        0.001
    """

    ftol: float
    xtol: float
    gtol: float
    max_steps: int
    lam0: float = 1e-3
    loss: object = "linear"   # a name from adaptprec.nlsq.common.LOSSES or a callable rho(z)
    f_scale: float = 1.0
    gram: str = "packed"      # "packed" (_gram) or "einsum" (batched dots; XLA defaults)
    # Adaptive ladders judge steps against the standard errors (batch/verify.py): a
    # lower rung stops only once its Gauss-Newton step is below se_below standard errors
    # (its ftol at most se_below^2 / (m - n)); the top rung also accepts a Gauss-Newton
    # step below se_accept standard errors.
    se_below: float = 0.0
    se_accept: float = 0.0


def rung_ftol(opts: LMOptions, m: int, n: int) -> float:
    r"""The ``ftol`` of a rung's tests for ``m`` residuals, ``n`` parameters.

    A Gauss–Newton step :math:`\delta` of ``c`` standard errors in the covariance's metric
    (:math:`\delta^\top J^\top J\delta = c^2 s^2`, :math:`s^2 = 2\,\mathrm{cost}/(m-n)`)
    has the available reduction :math:`c^2\,\mathrm{cost}/(m-n)`: ``se_below`` caps
    ``ftol`` at that, so a lower rung stops only once its steps are that small. Without
    degrees of freedom (``m <= n``) the cap is off. (``se_accept``, the top rung's
    standard-error acceptance, is a clause of the Gauss–Newton test itself:
    :func:`gauss_newton_code`.)

    Example:
        >>> from adaptprec.batch.lm_batched import LMOptions, rung_ftol
        >>> o = LMOptions(1e-6, 1e-6, 1e-6, 9)
        >>> rung_ftol(o, 25, 5), rung_ftol(o._replace(se_below=1e-3), 25, 5)
        (1e-06, 5e-08)
        >>> rung_ftol(o._replace(se_below=1e-3), 5, 5)
        1e-06
    """
    if m <= n or opts.se_below <= 0:
        return opts.ftol
    return min(opts.ftol, opts.se_below ** 2 / (m - n))


class LMState(NamedTuple):
    """Per-fit LM state; every leaf has the batch axis first (inside :func:`lm_run`'s loop
    the same fields are carried with it last).

    Example:
        >>> from adaptprec.batch.lm_batched import LMState
        >>> LMState._fields[:4]
        ('x', 'cost', 'jtj', 'jtf')
    """

    x: jax.Array        # (B, n)
    cost: jax.Array     # (B,)    0.5 * ||f||^2
    jtj: jax.Array      # (B, n, n)
    jtf: jax.Array      # (B, n)
    d2: jax.Array       # (B, n)  running max of diag(J^T J)
    lam: jax.Array      # (B,)
    nu: jax.Array       # (B,)
    active: jax.Array   # (B,) bool
    status: jax.Array   # (B,) int32
    nit: jax.Array      # (B,) int32
    nfev: jax.Array     # (B,) int32
    njev: jax.Array     # (B,) int32
    gn_rate: jax.Array  # (B, 3)  the contraction record (:func:`record_contraction`)




# Fits last from here to lm_run (layout: :mod:`adaptprec.batch._model`).


def to_fits_last(s: LMState) -> LMState:
    """A fits-first :class:`LMState` in the layout of :func:`lm_run`'s loop (fits last)."""
    return move_batch_axis(s, 0, -1)


def to_fits_first(s: LMState) -> LMState:
    """The inverse of :func:`to_fits_last`: the public, fits-first layout."""
    return move_batch_axis(s, -1, 0)



def gauss_newton_code(x, cost, jtj, jtf, d2, bounds, opts: LMOptions, m: int,
                      rate=jnp.inf):
    """Fits last: the Gauss–Newton step at ``x`` and the verdict on it, the single fit's
    hand-off test (:func:`~adaptprec.nlsq._rules.handoff_code`, with :func:`rung_ftol`,
    the standard-error fraction ``opts.se_accept`` and the contraction ``rate`` a lower
    rung measured, ``inf``: not measured): ``(dx, code, length, xnorm)``, ``code`` 0
    where the step is not yet small enough to stop on, ``length`` the step's
    ``||J dx||`` (``NaN`` where not finite) and ``xnorm = ||D x||``
    (:func:`record_contraction` reads both)."""
    dx, q2, dxn, xnorm = gauss_newton_fits_last(jtj, jtf, d2, x, bounds)
    finite = jnp.isfinite(dx).all(axis=0) & jnp.isfinite(q2)
    n = x.shape[0]
    code = handoff_code(q2, dxn, xnorm, cost, rung_ftol(opts, m, n), opts.xtol, m, n,
                        rate, opts.se_accept, finite)
    return dx, code, jnp.where(finite, jnp.sqrt(q2), jnp.nan), xnorm


def init_fits_last(fj: ResidualJacobian, x, bargs, sargs, opts: LMOptions, active) -> LMState:
    """:func:`lm_init` in the fits-last layout: ``x`` ``(n, B)``, batched args with a
    trailing ``B``; returns the fits-last state (``active=None``: every fit). The first
    evaluation of a rung, also :mod:`~adaptprec.batch.verify`'s one top-rung evaluation.
    """
    b = x.shape[-1]
    bounds = fj.bounds(bargs)
    if bounds is not None:    # infeasible starts are rejected at the boundary when concrete
        x = jnp.clip(x.astype(bounds[0].dtype), *bounds)
    else:
        x = materialised(x)
    # the data too: each entry is read once, so XLA may still fuse the copy; measured
    # about 5% faster with it (three round-robin A/B rounds, 1e4 fits, three seeds)
    bargs = jax.tree.map(lambda a: materialised(a) if jnp.issubdtype(a.dtype, jnp.floating)
                         else a, bargs)
    f, jac = fj.fits_last(x, bargs, sargs)
    acc = f.dtype
    x = x.astype(acc)
    cost, jtj, jtf, d2 = normal_equations(f, jac, opts)
    jtf = project_gradient(x, jtf, bounds)
    finite_f = finite_fits(x, cost)
    finite = finite_f & finite_fits(jtj, jtf)
    d2 = jnp.where(d2 > 0, d2, 1).astype(acc)
    if active is None:
        active = jnp.ones((b,), bool)
    gconv = gradient_cosine_last(cost, jtj, jtf) <= opts.gtol
    status = jnp.where(~finite_f, st.NONFINITE_RESIDUAL,
                       jnp.where(~finite, st.NONFINITE_JACOBIAN,
                                 jnp.where(gconv, st.GTOL, st.RUNNING)))
    status = status.astype(jnp.int32)
    run = active & finite & ~gconv
    ones = jnp.ones((b,), jnp.int32)
    gn_rate = jnp.full((3, b), jnp.inf, acc)
    if measures_contraction(opts, bounds):   # the start: the first point a lower rung takes
        _, _, length, xnorm = gauss_newton_code(x, cost, jtj, jtf, d2, bounds, opts,
                                                f.shape[0])
        gn_rate = record_contraction(gn_rate, length, xnorm, active & finite,
                                     unit_roundoff(fj.rung_dtype))
    return LMState(x=x, cost=cost, jtj=jtj, jtf=jtf, d2=d2,
                   lam=jnp.full((b,), opts.lam0, acc), nu=jnp.full((b,), 2.0, acc),
                   active=run, status=jnp.where(active, status, st.RUNNING),
                   nit=jnp.zeros((b,), jnp.int32), nfev=ones * active,
                   njev=ones * active, gn_rate=gn_rate)


def _rounding_level(s: LMState, pred, actred, m: int):
    """Fits last: the steps at the rounding level of the rung's cost, taken as model steps
    (gain ratio 1) on a rung whose answer the top rung verifies (``se_below``).

    Below its rounding-level ``ftol`` the cost's change is rounding noise and the gain
    ratio a coin flip; rejected, such steps would grow the damping until the fit crawls.
    A step predicted and measured to change the cost by at most ``QUIET_STEP eps sqrt(m)``
    of the cost is taken; the Gauss–Newton test and, at the end, the top rung's
    one-evaluation check judge it. (The single fit's rule,
    :func:`adaptprec.nlsq._rules.rounding_level`, judges by the evaluation error
    ``u (|cost| + ||f|| ||J x||)``; ``||J x||`` costs every batched iteration a quadratic
    form per fit, for no fewer iterations: docs/architecture.md, "The batched engine".)"""
    pos = s.cost > 0
    safe_cost = jnp.where(pos, s.cost, 1)
    level = QUIET_STEP * float(np.finfo(s.x.dtype).eps) * float(np.sqrt(m))
    return pos & (pred / safe_cost <= level) & (jnp.abs(actred) / safe_cost <= level)


def measures_contraction(opts: LMOptions, bounds) -> bool:
    """Whether a rung keeps a contraction record (static): a lower rung of a ladder
    (``se_below``), unbounded, the linear loss -- the single fit's conditions for the
    :data:`~adaptprec.nlsq._rules.SE_TAKEN` clause (a clipped step or a reweighted robust
    cost changes the Gauss–Newton step for reasons other than its contraction)."""
    return (opts.se_below > 0 and bounds is None and isinstance(opts.loss, str)
            and opts.loss == "linear")


def record_contraction(gn_rate, length, xnorm, taken, u: float):
    r"""Fits last: the contraction record ``gn_rate`` ``(3, B)`` after the points
    ``taken`` (``(B,)``), whose Gauss–Newton steps have ``length`` :math:`g = \|J\,dx\|`
    at ``xnorm`` :math:`= \|D x\|` (:func:`gauss_newton_code`): ``(g, r, r_prev)``, the
    last length and the last two contraction ratios (``inf``: not measured).

    Near a minimum the Gauss–Newton step is the error :math:`x - x^*` to first order, so
    :math:`r = g_k / g_{k-1}` measures how fast Gauss–Newton contracts it, from above
    (damped steps contract less; further out the contraction is slower, the quadratic
    term). :math:`g` is measured in the metric of the standard errors without the cost's
    scale :math:`s`, which shrinks with the cost (the single fit's :math:`g / s` is about
    :math:`\sqrt{m-n}` at every point far from the minimum: its ratios are ~1 until the
    last step). A rung resolves :math:`g` to :math:`\eta = u\,\|D x\|` (rounding ``x``
    to the rung moves :math:`J x` by at most :math:`u\,\|J\,\mathrm{diag}(x)\|_F \le
    u\,\|D x\|`, ``D^2`` the running maximum of :math:`\mathrm{diag}(J^\top J)`): a ratio
    is recorded only when its denominator is at least :data:`RESOLVED_STEP` :math:`\eta`,
    and its numerator counts as :math:`g_k + \eta` (a step at the rounding level is
    rounding, not contraction). :func:`contraction_rate` reads the larger of the last two,
    as the single fit's (``adaptprec.nlsq.solver``)."""
    prev = gn_rate[0]
    eta = u * xnorm
    ok = taken & jnp.isfinite(length)
    resolved = ok & jnp.isfinite(prev) & (prev >= RESOLVED_STEP * eta) & (prev > 0)
    ratio = (length + eta) / jnp.where(resolved, prev, 1)
    return jnp.stack([jnp.where(ok, length, prev),
                      jnp.where(resolved, ratio, gn_rate[1]),
                      jnp.where(resolved, gn_rate[1], gn_rate[2])])


def contraction_rate(gn_rate):
    """The rate a contraction record ``gn_rate`` ``(3, ...)`` measured: the larger of
    its last two ratios (``inf``: fewer than two measured)."""
    return jnp.maximum(gn_rate[1], gn_rate[2])


def _step(fj: ResidualJacobian, s: LMState, bargs, sargs, opts: LMOptions) -> LMState:
    acc = s.x.dtype
    active = s.active
    damp = s.lam[None] * s.d2
    bounds = fj.bounds(bargs)
    dx = damped_solve_fits_last(s.jtj, s.jtf, damp, s.x, bounds)
    xn = s.x + dx
    if bounds is not None:   # projected step: back into the box, then the step taken
        xn = jnp.clip(xn, *bounds)
        dx = xn - s.x
    f, jac = fj.fits_last(xn, bargs, sargs)
    cost_n, jtj_n, jtf_n, d2_n = normal_equations(f, jac, opts)
    finite = finite_fits(xn, cost_n, jtj_n, jtf_n)
    jtf_n = project_gradient(xn, jtf_n, bounds)

    if bounds is None:   # the damped system's solution: pred in closed form
        pred = 0.5 * jnp.sum(dx * (damp * dx - s.jtf), axis=0)
    else:                # the Gauss–Newton model's reduction along the step taken
        jdx = jnp.sum(s.jtj * dx[None, :, :], axis=1)
        pred = -jnp.sum(dx * (s.jtf + 0.5 * jdx), axis=0)
    actred = s.cost - cost_n
    pos = s.cost > 0
    safe_cost = jnp.where(pos, s.cost, 1)
    rel_act = jnp.where(finite & pos, actred / safe_cost, -1)
    rel_pred = jnp.where(pos, pred / safe_cost, 0)
    rho = jnp.where(finite & (pred > 0), actred / jnp.where(pred > 0, pred, 1), -1)
    rho = jnp.where(jnp.isfinite(rho), rho, -1)
    tiny = float(np.finfo(acc).eps)
    if opts.se_below > 0:
        rho = jnp.where(finite & _rounding_level(s, pred, actred, f.shape[0]) &
                        ~(rho > _ACCEPT), 1.0, rho)
    accept = active & finite & (rho > _ACCEPT)

    # Nielsen damping update
    shrink = jnp.maximum(1.0 / 3.0, 1.0 - (2.0 * rho - 1.0) ** 3)
    # the floor eps, relative to the curvature left (see curvature_ratio)
    floor = tiny * curvature_ratio(d2_n, jnp.maximum(s.d2, d2_n))
    lam_n = jnp.where(accept, jnp.maximum(s.lam * shrink, floor), s.lam * s.nu)
    nu_n = jnp.where(accept, 2.0, 2.0 * s.nu)

    # termination tests (MINPACK lmder / scipy)
    m, n = f.shape[0], s.x.shape[0]
    ftol = rung_ftol(opts, m, n)
    ftol_ok = (jnp.abs(rel_act) <= ftol) & (rel_pred <= ftol) & (rho <= 2.0)
    dxn = jnp.sqrt(jnp.sum(s.d2 * dx * dx, axis=0))
    xnew = jnp.where(accept, xn, s.x)
    xnorm = jnp.sqrt(jnp.sum(s.d2 * xnew * xnew, axis=0))
    xtol_ok = jnp.isfinite(dxn) & (dxn <= opts.xtol * (opts.xtol + xnorm))

    def pick(new, old):   # the fit axis is last: (B,) broadcasts against (..., B)
        return jnp.where(accept, new, old)

    cost = pick(cost_n, s.cost)
    jtj = pick(jtj_n, s.jtj)
    jtf = pick(jtf_n, s.jtf)
    d2 = pick(jnp.maximum(s.d2, d2_n), s.d2)
    gtol_ok = accept & (gradient_cosine_last(cost, jtj, jtf) <= opts.gtol)
    _, gn, length, xnorm_gn = gauss_newton_code(xnew, cost, jtj, jtf, d2, bounds, opts, m)
    gn_f = accept & ((gn == st.FTOL) | (gn == st.FTOL_XTOL))
    gn_x = accept & ((gn == st.XTOL) | (gn == st.FTOL_XTOL))
    records = measures_contraction(opts, bounds)
    u = unit_roundoff(fj.rung_dtype)
    if records:
        # a Gauss-Newton step below the rung's resolution of it (record_contraction) is
        # rounding: the rung stops, its answer's last digits are the hand-off's step
        xtol_ok = xtol_ok | (accept & (length < u * xnorm_gn))
    nit = s.nit + active.astype(jnp.int32)

    code = jnp.where((ftol_ok & xtol_ok) | (gn_f & gn_x), st.FTOL_XTOL,
           jnp.where(ftol_ok | gn_f, st.FTOL,
           jnp.where(xtol_ok, st.XTOL,
           jnp.where(gtol_ok, st.GTOL,
           jnp.where(lam_n > _LAMBDA_MAX, jnp.where(finite, st.STALLED, st.NO_FINITE_STEP),
           jnp.where(nit >= opts.max_steps, st.MAX_STEPS, st.RUNNING))))))
    status = jnp.where(active, code, s.status).astype(jnp.int32)
    inc = active.astype(jnp.int32)
    return LMState(
        x=xnew, cost=cost, jtj=jtj, jtf=jtf, d2=d2,
        lam=jnp.where(active, lam_n, s.lam), nu=jnp.where(active, nu_n, s.nu),
        active=active & (code == st.RUNNING), status=status, nit=nit,
        nfev=s.nfev + inc, njev=s.njev + inc,
        gn_rate=record_contraction(s.gn_rate, length, xnorm_gn, accept, u)
        if records else s.gn_rate)


# ---------------------------------------------------------------------------------------
# Public entry points: fits first.

def lm_init(fj, x, bargs, sargs, opts: LMOptions, active=None) -> LMState:
    """Evaluate the starts and build the initial state (non-finite starts get status -3 or -4).

    Example:
        >>> import jax.numpy as jnp
        >>> from adaptprec.batch.lm_batched import LMOptions, lm_init, make_fj
        >>> fj = make_fj(lambda x, b, s: x - b[0], jnp.float32, jnp.float32)
        >>> s = lm_init(fj, jnp.zeros((2, 1)), (jnp.ones((2, 1)),), (), LMOptions(1e-8, 1e-8, 1e-8, 10))
        >>> s.cost.tolist(), s.active.tolist()
        ([0.5, 0.5], [True, True])
    """
    return to_fits_first(init_fits_last(fj, x.T, move_batch_axis(bargs, 0, -1), sargs, opts,
                                        active))


def lm_step(fj, s: LMState, bargs, sargs, opts: LMOptions) -> LMState:
    """One LM iteration for every active fit; inactive fits are returned unchanged.

    Example:
        >>> import jax.numpy as jnp
        >>> from adaptprec.batch.lm_batched import LMOptions, lm_init, lm_step, make_fj
        >>> fj = make_fj(lambda x, b, s: x - b[0], jnp.float64, jnp.float64)
        >>> o = LMOptions(1e-8, 1e-8, 1e-8, 10)
        >>> s = lm_init(fj, jnp.zeros((1, 1)), (jnp.ones((1, 1)),), (), o)
        >>> s = lm_step(fj, s, (jnp.ones((1, 1)),), (), o)
        >>> round(float(s.x[0, 0]), 3)
        0.999
    """
    return to_fits_first(_step(fj, to_fits_last(s), move_batch_axis(bargs, 0, -1), sargs, opts))


def lm_run(fj, s: LMState, bargs, sargs, opts: LMOptions, stop_count: int = 0) -> LMState:
    """Iterate :func:`lm_step` until at most ``stop_count`` fits are still active.

    Every fit stops by ``opts.max_steps`` (status 0), so the loop terminates.

    Example:
        >>> import jax.numpy as jnp
        >>> from adaptprec.batch.lm_batched import LMOptions, lm_init, lm_run, make_fj
        >>> fj = make_fj(lambda x, b, s: jnp.exp(x) - b[0], jnp.float64, jnp.float64)
        >>> o = LMOptions(1e-10, 1e-10, 1e-10, 50)
        >>> y = (jnp.array([[2.0], [3.0]]),)
        >>> s = lm_run(fj, lm_init(fj, jnp.zeros((2, 1)), y, (), o), y, (), o)
        >>> [round(float(v), 6) for v in s.x[:, 0]], s.active.any().item()
        ([0.693147, 1.098612], False)
    """
    def cond(s):
        return jnp.sum(s.active.astype(jnp.int32)) > stop_count

    bargs = _rung_data(fj, move_batch_axis(bargs, 0, -1))
    s = jax.lax.while_loop(cond, lambda s: _step(fj, s, bargs, sargs, opts), to_fits_last(s))
    return to_fits_first(s)


def _rung_data(fj: ResidualJacobian, bargs_last):
    """The batched data (fits last) cast once to a lower rung's dtype and materialised
    there: the cast the residual makes at every evaluation is then a no-op. (Left to XLA,
    the float64 -> float32 cast hoisted out of the loop wrote the fits-first layout and
    copied it again: two passes over the data per block.) Same values."""
    def cast(a):
        if not jnp.issubdtype(a.dtype, jnp.floating):
            return a
        low = jnp.asarray(cast_floating(a, fj.rung_dtype))
        return a if low.dtype == a.dtype else materialised(low)
    return jax.tree.map(cast, bargs_last)
