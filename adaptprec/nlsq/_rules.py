"""The trust-region step's stopping and escalation rules, one function each.

Every rule is a pure function of the step's quantities (scalars or arrays of any batch
shape, so the batched engine can call them too) and returns a mask or a code. The
constants are module attributes with the reason for their value; the figures that chose
them are in benchmarks/RESULTS.md ("Nonlinear least squares: robustness").

Notation: ``u`` the unit roundoff of a rung, ``cost = 0.5 ||f||^2`` (robust: ``0.5 sum
rho``), ``R^T R = J^T J`` and ``R^T qtf = J^T f`` the factored model, ``D`` the variable
scaling, ``E = u (|cost| + ||f|| ||J x||)`` the cost's evaluation error (the residual is a
difference of model and data of size ``||J x||``).

Example:
    >>> import jax.numpy as jnp
    >>> from adaptprec.nlsq._rules import conditioning_error
    >>> float(conditioning_error(jnp.array([1.0, 1e-3]), 1.0, 1.0, "qr"))  # kappa = 1e3
    2000.0
"""

from __future__ import annotations

import jax.numpy as jnp

from .._status import Status

__all__ = ["NOISE_STEPS", "NOISE_CONTRACTION", "NOISE_STEPS_MAX", "LOWER_RESOLVE_FACTOR",
           "POST_ESCALATION_NOISE", "SE_TAKEN", "rounding_level", "noise_stop",
           "rounding_floor", "conditioning_error", "out_of_steps",
           "confirming_step", "se_steps", "gauss_newton_step", "one_eval_check",
           "runaway"]

#: Rounding-level steps in a row on the top rung before the solve may end (``ftol``) ...
NOISE_STEPS = 3
#: ... which it does once they stop contracting (``||D dx|| >= NOISE_CONTRACTION`` times
#: the previous one: the steps are rounding noise) or after ``NOISE_STEPS_MAX`` of them:
#: on a large-residual problem Gauss-Newton converges only linearly, and below the cost's
#: rounding level the steps still shrink geometrically (NIST ENSO: by 0.64 a step).
NOISE_CONTRACTION = 0.9
NOISE_STEPS_MAX = 20
#: A rung below the top leaves once the Gauss-Newton decrease left at its point is below
#: this multiple of its evaluation error of the cost (:func:`rounding_floor`).
LOWER_RESOLVE_FACTOR = 10.0
#: After an escalation (or with ``adaptive_stop``), a top-rung step predicted to gain at
#: most this many times ``E``, whose cost rose by less, is a rounding-level step.
POST_ESCALATION_NOISE = 10.0
#: The one-evaluation hand-off also accepts a Gauss-Newton step of at most this many
#: standard errors when the lower rung measured Gauss-Newton contracting fast enough
#: that the step, taken, leaves a tenth of ``SE_FRACTION`` (:func:`one_eval_check`).
SE_TAKEN = 1e-2


def rounding_level(predicted, actual, cost, u, scale, after_escalation):
    r"""Whether a top-rung step is at the rounding level of the cost, so that the cost
    can no longer judge it (the solver takes it and counts it towards :func:`noise_stop`):

    .. math:: \mathrm{pred} \le 100\,u\,|\mathrm{cost}| \ \wedge\ \mathrm{actual} \ge
              -u\,(|\mathrm{cost}| + s)

    (``s = ||f|| ||J x||``), or, after an escalation (``after_escalation``), judged by the
    evaluation error ``E = u (|cost| + s)``: ``pred <= 10 E`` and ``actual >= -10 E``.
    The second form serves a top rung that starts from a lower rung's converged point,
    where the cost is at its minimum to ~1e-14 while x has ~7 digits, so the remaining
    Gauss-Newton corrections predict decreases of about ``E`` and their measured change
    is rounding noise (NIST Misra1b start 2 otherwise stops 2 digits short)."""
    plain = (predicted <= 100.0 * u * jnp.abs(cost)) & (
        actual >= -u * (jnp.abs(cost) + scale))
    err = u * (jnp.abs(cost) + scale)
    late = after_escalation & (predicted <= POST_ESCALATION_NOISE * err) & (
        actual >= -POST_ESCALATION_NOISE * err)
    return plain | late


def noise_stop(at_noise, code, consec, dxn, noise_dx):
    r"""The rounding-level stop: ``(code, noise_dx)``. An ``ftol`` stop (or none) at a
    rounding-level step waits until :data:`NOISE_STEPS` such steps came in a row and they
    stop contracting, ``||D dx|| >= NOISE_CONTRACTION * ||D dx_prev||``, or
    :data:`NOISE_STEPS_MAX` came (then ``FTOL``). ``noise_dx`` carries the last step's
    ``||D dx||`` (``inf`` after an ordinary accepted step)."""
    contracting = dxn < NOISE_CONTRACTION * noise_dx
    stop = (consec >= NOISE_STEPS) & (~contracting | (consec >= NOISE_STEPS_MAX))
    code = jnp.where(at_noise & ((code == 0) | (code == Status.FTOL)),
                     jnp.where(stop, Status.FTOL, 0), code)
    return code, stop


def rounding_floor(qtf, cost, fsn, R, x, u):
    r"""A rung below the top at its resolution: at a point just taken there, the
    Gauss-Newton model predicts the most the rung can still gain, ``0.5 ||qtf||^2``;
    when that is below :data:`LOWER_RESOLVE_FACTOR` times the rung's evaluation error
    ``u (|cost| + ||f|| ||R x||)`` every further step would be judged by rounding noise,
    so the rung hands its point to the next one (NIST Misra1a start 2: eight float32
    rejections of one step otherwise)."""
    return 0.5 * jnp.sum(qtf * qtf) <= LOWER_RESOLVE_FACTOR * u * (
        jnp.abs(cost) + fsn * jnp.linalg.norm(R @ x))


def conditioning_error(s, fsn, qn, linear_solver: str):
    r"""The relative error of a rung's Gauss-Newton step per unit roundoff, Wedin's bound
    for least squares:

    .. math:: 2\kappa / \cos\theta + \kappa^2 \tan\theta,\qquad
              \kappa = s_{max} / s_{min},\ \cos\theta = \|qtf\| / \|f\|

    (``s`` the singular values of the scaled model, ``theta`` the angle between ``f`` and
    the range of ``J``). ``linear_solver="normal"`` squares ``kappa`` in the step itself.
    The rung is left when ``u`` times this exceeds ``cond_tol`` (the guards'
    :func:`adaptprec.guards.conditioned`). The second term is the residual's
    amplification: NIST Bennett5 (``kappa ~ 5e4``, ``tan ~ 1e-4``) gives float32 steps 3%
    off, enough to leave float64's path."""
    tiny = jnp.finfo(s.dtype).tiny
    kappa = s[..., 0] / jnp.maximum(s[..., -1], tiny)
    tan_t = jnp.sqrt(jnp.maximum(fsn * fsn - qn * qn, 0.0)) / jnp.maximum(qn, tiny)
    est = 2.0 * kappa * fsn / jnp.maximum(qn, tiny) + kappa * kappa * tan_t
    est = jnp.where(jnp.isfinite(est), est, jnp.inf)
    if linear_solver == "normal":
        est = jnp.maximum(est, kappa * kappa)
    return est


def out_of_steps(running, on_top, top_steps, used, max_steps):
    """The budget ends a solve on the top rung only, after at least one step there
    (``used``: the steps of the current strategy, or of the whole solve)."""
    return running & on_top & (top_steps >= 1) & (used >= max_steps)


def confirming_step(converged, on_top, after_escalation, confirmed, noise_stopped, nit,
                    max_steps, first_at_top_gtol):
    """Whether a top-rung convergence is deferred for one confirming step: its first
    steps start from a lower rung's converged point, and a test met there (gtol after the
    first Gauss-Newton step) stops a digit short of float64 alone, which meets the same
    test one step further (NIST Misra1d from a perturbed start: LRE 10.0 vs 11.0). Not
    after the noise stop (it has confirmed itself), not into ``max_steps``, not for a
    point that meets ``gtol`` where the top rung first evaluated it."""
    return (on_top & after_escalation & ~confirmed & converged & ~noise_stopped
            & (nit < max_steps) & ~first_at_top_gtol)


def se_steps(qtf, cost, m, n: int):
    r"""The Gauss-Newton step's length in standard errors, ``q = ||qtf|| / s`` with
    ``s^2 = 2 cost / (m - n)``.

    ``curve_fit``'s covariance is ``C = s^2 (R^T R)^{-1}`` and the step ``dx`` solves
    ``R dx = -qtf`` on ``R``'s range, so for every parameter ``i`` (Cauchy-Schwarz,
    ``e_i^T dx = (R^{-T} e_i)^T (R dx)``, ``||R^{-T} e_i|| = sqrt(C_ii) / s``):

    .. math:: |dx_i| \le \sqrt{C_{ii}}\, \|R\,dx\| / s \le q \sqrt{C_{ii}}.

    ``q <= c`` says no parameter moves by more than ``c`` of its standard error. ``cost
    = 0`` gives ``q = inf`` for a nonzero step."""
    s2 = 2.0 * cost / (m - n)
    return jnp.sqrt(jnp.sum(qtf * qtf, axis=-1) /
                    jnp.maximum(s2, jnp.finfo(s2.dtype).tiny))


def gauss_newton_step(R, qtf, scale_inv):
    """The Gauss-Newton step ``dx`` of the model ``(R, qtf)`` (minimum norm on its
    numerical range) and ``||p||`` in the scaled variables (``dx = p / scale_inv``)."""
    d = 1.0 / scale_inv
    U, s, VT = jnp.linalg.svd(R * d[None, :], full_matrices=False)
    keep = s > jnp.finfo(s.dtype).eps * s.shape[0] * s[0]
    p = -VT.T @ jnp.where(keep, (U.T @ qtf) / jnp.where(keep, s, 1.0), 0.0)
    return d * p, jnp.linalg.norm(p)


def one_eval_check(x, R, qtf, cost, scale_inv, ftol, xtol, m, n: int, rate,
                   se_fraction):
    r"""The top rung's verdict on a lower rung's converged point ``x`` from one
    evaluation there: ``(dx, code)``, the Gauss-Newton step and ``FTOL``/``XTOL``/
    ``FTOL_XTOL`` when ``x + dx`` may be returned, 0 when the top rung must iterate.

    Accepted when the step is at most ``se_fraction`` standard errors (:func:`se_steps`;
    ``FTOL``), when it meets the top rung's own tolerances (``0.5 ||qtf||^2 <= ftol cost``,
    ``||D dx|| <= xtol (xtol + ||D x||)``), or when it is at most :data:`SE_TAKEN`
    standard errors and ``rate`` (the contraction the lower rung measured over its last
    Gauss-Newton steps, an upper bound) times it is at most ``se_fraction / 10``: what is
    left after taking it is Gauss-Newton's own error, ``rate`` times the step. A zero
    residual passes only the tolerances."""
    dx, pn = gauss_newton_step(R, qtf, scale_inv)
    q2 = jnp.sum(qtf * qtf)
    q = se_steps(qtf, cost, m, n)
    se_ok = (cost > 0) & ((q <= se_fraction) | (
        (q <= SE_TAKEN) & (rate * q <= 0.1 * se_fraction)))
    f_ok = se_ok | (0.5 * q2 <= ftol * cost)
    x_ok = pn <= xtol * (xtol + jnp.linalg.norm(x * scale_inv))
    finite = jnp.isfinite(q2) & jnp.all(jnp.isfinite(dx))
    code = jnp.where(f_ok & x_ok, Status.FTOL_XTOL, jnp.where(
        f_ok, Status.FTOL, jnp.where(x_ok, Status.XTOL, 0)))
    return dx, jnp.where(finite, code, 0).astype(jnp.int32)


def runaway(status, x, x0_norm, R=None, fnorm=None, triangular=True):
    """A convergence ``status`` at ``||x|| > RUNAWAY_FACTOR ||x0||`` (``x0 != 0``) and,
    given the model ``R`` and ``||f||`` there, only along a flat direction
    (:func:`.lm.flat_direction`): distance alone is not evidence (Arrhenius' pre-factor
    sits at 3.6e11 from ones, well determined)."""
    from .lm import RUNAWAY_FACTOR, flat_direction

    far = ((status > 0) & (status < Status.RUNNING) & (x0_norm > 0)
           & (jnp.linalg.norm(x) > RUNAWAY_FACTOR * x0_norm))
    if R is None:
        return far
    return far & flat_direction(x, R, fnorm, x0_norm, triangular)
