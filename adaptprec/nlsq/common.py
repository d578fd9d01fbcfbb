"""Shared pieces of the least-squares solvers: robust losses, scaling, status codes,
the trust-region subproblem and covariance helpers (scipy ``optimize/_lsq/common.py`` in
spirit).

Robust losses follow scipy's convention. With ``z = (f / f_scale)**2`` a loss is a function
``rho(z)`` and the cost is ``0.5 * f_scale**2 * sum(rho(z))``:

==========  ==========================  ===================================
loss        rho(z)                      note
==========  ==========================  ===================================
linear      z                           ordinary least squares
soft_l1     2 ((1 + z)^(1/2) - 1)        smooth l1
huber       z if z <= 1 else 2 z^(1/2) - 1
cauchy      log(1 + z)
arctan      arctan(z)
callable    user ``rho(z)``; derivatives by autodiff, or return a ``(3, m)`` array
==========  ==========================  ===================================

Example:
    >>> import jax.numpy as jnp
    >>> from adaptprec.nlsq.common import loss_rho
    >>> r = loss_rho("soft_l1", jnp.array([0.0, 3.0]))
    >>> [round(float(v), 6) for v in r[0]]
    [0.0, 2.0]
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Union

import jax
import jax.numpy as jnp
import numpy as np

from .._status import Status, status_message

__all__ = ["SE_FRACTION", "LOSSES", "LossLike", "loss_rho", "check_loss", "robust_cost",
           "scale_for_robust_loss", "Status", "STATUS_MESSAGES", "status_message",
           "jac_scale", "solve_lsq_trust_region", "update_tr_radius",
           "check_termination_codes", "lower_rung_budget", "default_max_steps",
           "DEFAULT_FTOL", "DEFAULT_XTOL", "DEFAULT_GTOL", "NORMAL_EQ_MIN_M", "SMALL_F64_MN",
           "PORTFOLIO",
           "covariance", "covariance_at", "gram_covariance", "scale_pcov"]

LossLike = Union[str, Callable]
LOSSES = ("linear", "soft_l1", "huber", "cauchy", "arctan")
"""The robust loss names accepted by ``loss=`` (scipy's: linear, soft_l1, huber, cauchy,
arctan); a callable ``rho(z)`` is accepted too."""


# --------------------------------------------------------------------------- defaults
# The one table of defaults of every fitting entry point (solve_nlsq, curve_fit,
# solve_nlsq_batch); the measurements behind them: docs/nlsq.md, benchmarks/RESULTS.md.

#: Tolerances, tighter than scipy's 1e-8, which stops large-residual problems short of
#: NIST StRD's certified digits (benchmarks/RESULTS.md, "the MGH17 fix").
DEFAULT_FTOL = 1e-15
DEFAULT_XTOL = 1e-10
DEFAULT_GTOL = 1e-10
#: A lower rung's answer verified on the top rung is accepted when the Gauss-Newton step
#: there is at most this fraction of every parameter's standard error (the one-evaluation
#: hand-off of single fits and batches).
SE_FRACTION = 1e-3
#: ``linear_solver="auto"``: the normal equations from this many residuals on (the QR of
#: a tall ``m x (n+1)`` matrix dominates the step there).
NORMAL_EQ_MIN_M = 4096
#: ``precision="adaptive"`` runs float64 alone on CPU below this many ``m n``
#: (docs/architecture.md, "float64 alone for small single solves").
SMALL_F64_MN = 32768
#: ``lm``'s portfolio: when MINPACK's radius rule fails on the top rung (out of steps, no
#: finite step, or a runaway, :func:`._rules.runaway`), the top rung restarts from ``x0``
#: with optimistix's radius rule (:func:`.lm.optx_radius`) and the lower-cost end of the
#: two is returned (docs/nlsq.md, "Robustness").
PORTFOLIO = True
#: A lower rung's share of the trial steps: ``LOWER_RUNG_STEPS_PER_PARAM n``, at least
#: ``LOWER_RUNG_MIN_STEPS``, at most ``1 / n_rungs`` of ``max_steps``.
LOWER_RUNG_STEPS_PER_PARAM = 10
LOWER_RUNG_MIN_STEPS = 10


def default_max_steps(n: int) -> int:
    """The step cap when ``max_steps`` is None: ``100 (n + 1)`` (MINPACK's ``maxfev``)."""
    return 100 * (n + 1)


def lower_rung_budget(max_steps: int, n: int, n_rungs: int) -> int:
    """Trial steps a rung below the top may take before it escalates (``BUDGET``): small,
    so that a lower rung that cannot converge costs little next to the top rung."""
    share = max(LOWER_RUNG_MIN_STEPS, LOWER_RUNG_STEPS_PER_PARAM * n)
    return int(max(1, min(share, max_steps // max(n_rungs, 1))))


# --------------------------------------------------------------------------- losses
def _rho_builtin(name: str, z):
    if name == "linear":
        return jnp.stack([z, jnp.ones_like(z), jnp.zeros_like(z)])
    if name == "soft_l1":
        t = 1.0 + z
        return jnp.stack([2.0 * (jnp.sqrt(t) - 1.0), t ** -0.5, -0.5 * t ** -1.5])
    if name == "huber":
        small = z <= 1.0
        zs = jnp.where(small, 1.0, z)  # keep the unused branch finite
        return jnp.stack([
            jnp.where(small, z, 2.0 * jnp.sqrt(zs) - 1.0),
            jnp.where(small, 1.0, zs ** -0.5),
            jnp.where(small, 0.0, -0.5 * zs ** -1.5),
        ])
    if name == "cauchy":
        t = 1.0 + z
        return jnp.stack([jnp.log1p(z), 1.0 / t, -1.0 / t ** 2])
    if name == "arctan":
        t = 1.0 + z ** 2
        return jnp.stack([jnp.arctan(z), 1.0 / t, -2.0 * z / t ** 2])
    raise ValueError(f"unknown loss {name!r}")


def _rho_callable(fn: Callable, z):
    out = fn(z)
    if jnp.ndim(out) == 2:  # scipy convention: rows rho, rho', rho''
        return jnp.asarray(out, z.dtype)
    d1 = jax.vmap(jax.grad(lambda t: jnp.sum(fn(t))))
    d2 = jax.vmap(jax.grad(jax.grad(lambda t: jnp.sum(fn(t)))))
    return jnp.stack([out, d1(z), d2(z)]).astype(z.dtype)


def loss_rho(loss: LossLike, z):
    """``rho(z)`` and its first two derivatives as a ``(3, m)`` array.

    ``loss`` is one of :data:`LOSSES` or a callable. A callable either returns ``rho(z)``
    elementwise (its derivatives are taken by autodiff) or scipy's ``(3, m)`` array."""
    if isinstance(loss, str):
        return _rho_builtin(loss, z)
    return _rho_callable(loss, z)


def check_loss(loss) -> LossLike:
    """Validate ``loss`` at the boundary: a known name or a callable."""
    if isinstance(loss, str):
        if loss not in LOSSES:
            raise ValueError(f"loss={loss!r} is not supported; use one of {LOSSES} or a "
                             "callable rho(z)")
        return loss
    if callable(loss):
        return loss
    raise TypeError(f"loss must be a string or a callable rho(z), got {type(loss).__name__}")


def check_loss_output(loss: LossLike, m: int, dtype) -> None:
    """A callable ``loss`` traced once at the boundary (``jax.eval_shape``, no compute):
    it must return ``rho(z)`` of shape ``(m,)`` or scipy's ``(3, m)`` array; NumPy or
    Python control flow on ``z`` gets a message with the fix. Named losses pass."""
    if isinstance(loss, str):
        return
    try:   # a repeat fit with the same loss does not trace it again
        _check_loss_traced(loss, m, np.dtype(dtype))
    except TypeError as exc:
        if "unhashable" not in str(exc):
            raise
        _check_loss_traced.__wrapped__(loss, m, np.dtype(dtype))


@functools.lru_cache(maxsize=64)
def _check_loss_traced(loss, m: int, dtype) -> None:
    from .._user_fn import explain_trace_error

    def both(z):   # rho as given, and the (3, m) rows with autodiff derivatives
        return loss(z), _rho_callable(loss, z)

    try:
        out, _ = jax.eval_shape(both, jax.ShapeDtypeStruct((m,), dtype))
    except Exception as exc:
        explained = explain_trace_error(exc, "loss")
        if explained is None:
            raise
        raise explained.with_traceback(None) from exc
    shape = tuple(getattr(out, "shape", ()))
    if shape not in ((m,), (3, m)):
        raise ValueError(f"The return value of `loss` callable has wrong shape: expected "
                         f"{(m,)} or {(3, m)}, actual {shape}.")


def robust_cost(loss: LossLike, f, f_scale):
    """The cost ``0.5 * f_scale**2 * sum(rho((f / f_scale)**2))`` (``0.5 ||f||^2`` if linear)."""
    if isinstance(loss, str) and loss == "linear":
        return 0.5 * jnp.sum(f * f)
    z = (f / f_scale) ** 2
    return 0.5 * f_scale ** 2 * jnp.sum(loss_rho(loss, z)[0])


def scale_for_robust_loss(loss: LossLike, f, J, f_scale):
    """scipy's IRLS-like rescaling: returns ``(f_tilde, J_tilde)`` such that the
    Gauss–Newton model of the robust cost is ``0.5 ||J_tilde p + f_tilde||^2``."""
    if isinstance(loss, str) and loss == "linear":
        return f, J
    z = (f / f_scale) ** 2
    rho = loss_rho(loss, z)
    rho1 = rho[1]
    rho2 = rho[2] / f_scale ** 2
    eps = jnp.finfo(f.dtype).eps
    js = jnp.sqrt(jnp.maximum(rho1 + 2.0 * rho2 * f ** 2, eps))
    return f * rho1 / js, J * js[:, None]


# --------------------------------------------------------------------------- status
STATUS_MESSAGES = {int(s): s.message for s in Status}
"""``{code: message}`` of the unified :class:`adaptprec.Status` (the same table as
``adaptprec.linalg.STATUS_MESSAGES``)."""


# --------------------------------------------------------------------------- scaling
def jac_scale(J, scale_inv_old=None):
    """Column norms of ``J`` (``D`` of Moré 1978), never below the previous ones and with
    zero columns replaced by 1."""
    d = jnp.sqrt(jnp.sum(J * J, axis=0))
    if scale_inv_old is not None:
        d = jnp.maximum(d, scale_inv_old)
    return jnp.where(d > 0, d, 1.0)


# --------------------------------------------------------------------------- trust region
def _phi(alpha, suf, s2, Delta):
    denom = s2 + alpha
    p_norm = jnp.sqrt(jnp.sum((suf / denom) ** 2))
    phi = p_norm - Delta
    phi_prime = -jnp.sum(suf ** 2 / denom ** 3) / jnp.where(p_norm > 0, p_norm, 1.0)
    return phi, phi_prime


def solve_lsq_trust_region(s, V, suf, Delta, alpha0, m: int, *, rtol=0.01, max_iter=10):
    """Solve ``min ||J p + f||`` subject to ``||p|| <= Delta`` (Moré 1978, scipy's
    ``solve_lsq_trust_region``) given ``J = U diag(s) V^T`` and ``suf = s * (U^T f)``.

    Returns ``(p, alpha, gn)``: the step, the Levenberg–Marquardt parameter, and whether
    the undamped Gauss–Newton step was taken. Fixed iteration count; no host sync.

    Example:
        >>> import jax.numpy as jnp
        >>> from adaptprec.nlsq.common import solve_lsq_trust_region
        >>> s, V = jnp.array([2.0, 1.0]), jnp.eye(2)
        >>> p, alpha, gn = solve_lsq_trust_region(s, V, s * jnp.array([-2.0, -1.0]), 10.0,
        ...                                        0.0, 2)
        >>> [float(v) for v in p], bool(gn)
        ([1.0, 1.0], True)
    """
    dt = suf.dtype
    eps = jnp.finfo(dt).eps
    s2 = s * s
    n = s.shape[0]
    # ``m`` may be traced (padded data: the count is a program argument)
    threshold = eps * jnp.maximum(m, n) * s[0]
    full_rank = (s[-1] > threshold) & (jnp.asarray(m) >= n)
    # scipy's rank test is on ``s``, not ``s**2`` (which would drop every direction
    # with s < sqrt(eps max(m, n)) s[0] while calling J full rank)
    keep = s > threshold
    s2_safe = jnp.where(keep, s2, 1.0)
    p_gn = -V @ jnp.where(keep, suf / s2_safe, 0.0)
    gn_ok = full_rank & (jnp.linalg.norm(p_gn) <= Delta)

    suf_norm = jnp.linalg.norm(suf)
    alpha_upper = suf_norm / Delta
    phi0, phi0p = _phi(jnp.zeros((), dt), suf, jnp.where(full_rank, s2, 1.0), Delta)
    alpha_lower = jnp.where(full_rank, -phi0 / phi0p, 0.0)

    def reset(lo, up):
        return jnp.maximum(0.001 * up, jnp.sqrt(jnp.maximum(lo * up, 0.0)))

    alpha = jnp.where(alpha0 > 0, alpha0, reset(alpha_lower, alpha_upper))

    def body(c):
        it, alpha, lo, up, _ = c
        alpha_r = jnp.where((alpha < lo) | (alpha > up), reset(lo, up), alpha)
        phi, phip = _phi(alpha_r, suf, s2, Delta)
        up_n = jnp.where(phi < 0, alpha_r, up)
        ratio = phi / jnp.where(phip != 0, phip, -1.0)
        lo_n = jnp.maximum(lo, alpha_r - ratio)
        alpha_n = alpha_r - (phi + Delta) * ratio / Delta
        conv = jnp.abs(phi) < rtol * Delta
        return it + 1, jnp.where(conv, alpha_r, alpha_n), lo_n, up_n, conv

    # a data-dependent exit: XLA does not unroll it, and it stops at |phi| < rtol Delta
    _, alpha, _, _, _ = jax.lax.while_loop(
        lambda c: (c[0] < max_iter) & ~c[4], body,
        (jnp.zeros((), jnp.int32), alpha, alpha_lower, alpha_upper, jnp.asarray(False)))
    alpha = jnp.maximum(alpha, 0.0)
    p = -V @ (suf / (s2 + jnp.where(alpha > 0, alpha, eps * s2[0] + jnp.finfo(dt).tiny)))
    pn = jnp.linalg.norm(p)
    p = p * (Delta / jnp.where(pn > 0, pn, 1.0))
    return (jnp.where(gn_ok, p_gn, p), jnp.where(gn_ok, 0.0, alpha), gn_ok)


def update_tr_radius(Delta, actual, predicted, step_norm, bound_hit):
    """scipy's trust-radius update: ratio < 1/4 shrinks to ``step_norm / 4``; ratio > 3/4
    with the step on the boundary doubles ``Delta``. Returns ``(Delta, ratio)``."""
    ratio = jnp.where(predicted > 0, actual / jnp.where(predicted > 0, predicted, 1.0),
                      jnp.where((predicted == actual) & (actual == 0), 1.0, 0.0))
    Delta = jnp.where(ratio < 0.25, 0.25 * step_norm,
                      jnp.where((ratio > 0.75) & bound_hit, 2.0 * Delta, Delta))
    return Delta, ratio


def check_termination_codes(dF, F, dx_norm, x_norm, ratio, ftol, xtol):
    """scipy's ``check_termination`` as an int code: 4 (ftol and xtol), 2 (ftol),
    3 (xtol) or 0 (neither). ``ftol``: ``dF < ftol * F`` with ``ratio > 1/4``; ``xtol``:
    ``dx_norm < xtol * (xtol + x_norm)``."""
    f_ok = (dF < ftol * F) & (ratio > 0.25)
    x_ok = dx_norm < xtol * (xtol + x_norm)
    return jnp.where(f_ok & x_ok, 4, jnp.where(f_ok, 2, jnp.where(x_ok, 3, 0))).astype(
        jnp.int32)


# --------------------------------------------------------------------------- covariance
#: From this many rows on, :func:`covariance` tries the Gram matrix first.
GRAM_COVARIANCE_MIN_M = 1024


def covariance(J, *, m=None, null_tol: float | None = None):
    """``(J^T J)^+`` at the solution, the one covariance of every fitting entry point.

    scipy's route: the SVD of ``J`` (through the ``n x n`` triangular factor of its QR
    when ``J`` is tall) with the rank threshold ``eps max(m, n) s_max``; parameters with
    a component larger than ``null_tol`` (default ``sqrt(eps)``) in the numerical null
    space get ``inf`` rows and columns (not identifiable). From
    :data:`GRAM_COVARIANCE_MIN_M` rows on, the column-scaled Gram matrix is inverted
    instead when that is provably as accurate and ``J`` full rank
    (:func:`gram_covariance`), else the SVD route runs. ``m``: the real row count where ``J`` has zero padding rows
    (traced or int). Traceable.

    Example:
        >>> import jax.numpy as jnp
        >>> from adaptprec.nlsq.common import covariance
        >>> cov = covariance(jnp.array([[2.0, 0.0], [0.0, 0.0]]))
        >>> float(cov[0, 0]), bool(jnp.isinf(cov[1, 1]))
        (0.25, True)
    """
    J = jnp.asarray(J)
    rows, n = J.shape
    tol = float(np.sqrt(np.finfo(np.dtype(J.dtype)).eps)) if null_tol is None else null_tol
    if rows < GRAM_COVARIANCE_MIN_M:   # small: under vmap a lax.cond would run both routes
        return _covariance_svd(J, tol, m)
    fast, inv = gram_covariance(J.T @ J, rows if m is None else m)
    return jax.lax.cond(fast, lambda: inv, lambda: _covariance_svd(J, tol, m))


def covariance_at(J):
    """:func:`covariance` of a Jacobian at a solution: compiled once per shape for a
    concrete ``J`` (eagerly, op by op, each operation would compile), traced as is."""
    from .._tracing import is_concrete

    if not is_concrete(J):
        return covariance(J)
    J = jnp.asarray(J)
    return _covariance_program(str(J.dtype))(J)


@functools.lru_cache(maxsize=4)
def _covariance_program(dtype: str):
    from .._backend import cpu_jit

    return cpu_jit(covariance, optimise=False)


def gram_covariance(G, m):
    """``(ok, (J^T J)^{-1})`` from the Gram matrix ``G = J^T J`` of ``m`` rows: ``ok``
    when inverting the column-scaled ``G`` is as accurate as the SVD route (its
    eigenvalues carry an absolute error ``~ n eps lam_max``, so ``lam_min >= n sqrt(eps)
    lam_max`` keeps the covariance's relative error below ``~sqrt(eps)``) and ``J`` is
    full rank by scipy's rule (``s_min > eps max(m, n) s_max``, bounded through the
    column scales); otherwise ``inv`` is not the covariance."""
    n = G.shape[0]
    eps = jnp.finfo(G.dtype).eps
    d = jnp.sqrt(jnp.diag(G))
    d_safe = jnp.where(d > 0, d, 1.0)
    lam, V = jnp.linalg.eigh(G / d_safe[:, None] / d_safe[None, :])
    lam_min, lam_max = lam[0], lam[-1]
    well_conditioned = lam_min >= n * jnp.sqrt(eps) * lam_max
    full_rank = jnp.sqrt(lam_min) * jnp.min(d) > eps * jnp.maximum(m, n) * \
        jnp.sqrt(lam_max) * jnp.max(d)
    ok = well_conditioned & full_rank & jnp.all(jnp.isfinite(G))
    inv = (V / jnp.where(ok, lam, 1.0)) @ V.T
    return ok, inv / d_safe[:, None] / d_safe[None, :]


def _covariance_svd(J, null_tol, m=None):
    """scipy's route: SVD of ``J`` (through the triangular factor of a QR when tall)."""
    M, n = J.shape
    eps = jnp.finfo(J.dtype).eps
    A = J if M >= n else jnp.concatenate([J, jnp.zeros((n - M, n), J.dtype)])
    R = jnp.linalg.qr(A, mode="r")[:n] if M > 2 * n else A
    _, s, VT = jnp.linalg.svd(R, full_matrices=False)
    keep = s > eps * (max(M, n) if m is None else jnp.maximum(m, n)) * s[0]
    inv_s2 = jnp.where(keep, 1.0 / jnp.where(keep, s, 1.0) ** 2, 0.0)
    cov = (VT.T * inv_s2) @ VT
    null_weight = jnp.sum(jnp.where(keep[:, None], 0.0, VT ** 2), axis=0)
    bad = jnp.sqrt(null_weight) > null_tol
    return jnp.where(bad[:, None] | bad[None, :], jnp.inf, cov)


def scale_pcov(cov, cost, m: int, n: int, *, lm_rule: bool, absolute_sigma: bool,
               xnp=np):
    """scipy's ``pcov`` from ``(J^T J)^+``: for ``lm``, all ``inf`` when a parameter is
    not identifiable (MINPACK's ``cov_x`` is ``None`` then); unless ``absolute_sigma``,
    times the reduced chi-square ``2 cost / (m - n)`` (``inf`` everywhere when ``m <=
    n``). An ``inf`` entry stays ``inf`` also for an exact fit (cost 0). ``xnp``:
    ``numpy``, or ``jax.numpy`` for traced values."""
    cov = xnp.asarray(cov)
    inf = xnp.isinf(cov)
    some_inf = xnp.count_nonzero(inf) > 0
    finite = xnp is np and not some_inf   # (known on the host: the wheres are no-ops)
    if not absolute_sigma:
        if m <= n:
            return xnp.full_like(cov, xnp.inf)
        scale = 2.0 * xnp.asarray(cost) / (m - n)
        cov = cov * (scale if finite else xnp.where(inf, 1.0, scale))
    if lm_rule and not finite:
        cov = xnp.where(some_inf, xnp.inf, cov)
    return cov
