r"""The result of :func:`~adaptprec.linalg.solve` and :func:`~adaptprec.linalg.lstsq`:
:class:`SolveInfo`, and the measures it reports.

For a batch of systems ``(m, n, n)`` with right-hand sides ``(m, n, k)``, every measure is
per column (``(m, k)``) and then maximised over the columns (``(m,)``):

* normwise backward error ``\eta = \|b - A x\|_\infty / (\|A\|_\infty \|x\|_\infty +
  \|b\|_\infty)`` (:func:`backward_error`);
* relative residual ``\|b - A x\|_\infty / \|b\|_\infty`` (:func:`relative_residual`).
"""

from __future__ import annotations

import numpy as np

import jax
import jax.numpy as jnp

from .._first_order import nan_max_abs
from .._pytree import Module, field
from .._status import Reason, Status
from ..precision import unit_roundoff
from ._common import show_field
from ._factors import deferred_kappa

__all__ = ["SolveInfo", "STATUS_MESSAGES", "CondFactors", "backward_error",
           "relative_residual", "colnorm", "inaccurate_above"]

STATUS_MESSAGES = {int(s): s.message for s in Status}
"""``{code: message}`` of the unified :class:`adaptprec.Status` (the same table as
``adaptprec.nlsq.STATUS_MESSAGES``). Linear solves end with ``CONVERGED`` (5),
``SINGULAR`` (-7), ``NONFINITE_INPUT`` (-8), ``ILL_CONDITIONED`` (-9),
``NOT_POSITIVE_DEFINITE`` (-12) or ``INACCURATE`` (-13)."""

#: SolveInfo.huge_x: residual_norm / backward_error (about ||A|| ||x|| / ||b||) above
#: this says x is huge for its data
HUGE_X = 1e6


class CondFactors(Module):
    """What the deferred condition estimate needs (:attr:`SolveInfo.cond_factors`)."""

    f: jax.Array            # (..., n, n) low-precision factor, transposed (row-major view)
    perm: jax.Array | None  # (..., n) LU row permutation; None for Cholesky
    scale: jax.Array        # (...,) the factors are of scale * A
    anorm: jax.Array        # (...,) ||A||_inf in the working precision


class SolveInfo(Module):
    """Diagnostics of :func:`solve` / :func:`lstsq`, one entry per system.

    All fields are arrays with the leading batch shape of ``A`` (scalars for one system),
    so the info works under ``jit``/``vmap`` and can be returned from compiled code.

    Attributes:
        iterations: refinement steps after the initial low-precision solve (dsgesv's
            ``ITER``); for ``refine="gmres"`` these are outer steps.
        backward_error: normwise backward error of the returned ``x``, maximised over
            right-hand sides: ``||b - A x||_inf / (||A||_inf ||x||_inf + ||b||_inf)``
            (for :func:`lstsq`: ``||A^T r||_inf / (||A||_1 (||A||_inf ||x||_inf + ...))``,
            see its docstring). ``inf`` whenever ``x`` (or its residual) is not finite.
        fell_back: True when the answer comes from the working-precision factorization.
        cond_estimate: estimate of ``kappa_inf(A)`` (:func:`solve`) from the factors
            that produced ``x`` (a property): on the refinement path two Hager–Higham
            steps on the low-precision factors, after a fallback the full estimator on
            the working-precision factors (computed in the call: it decides
            ``ILL_CONDITIONED``). With ``estimate_cond="lazy"`` (the default) the
            refinement-path estimate is *deferred*: the info carries the low-precision
            factors (:attr:`cond_factors`) and the four single-column solves run when
            ``cond_estimate`` is read (inside ``jit`` they are traced there and then;
            unread, they never run). NaN with ``estimate_cond=False`` on the refinement
            path.
        cond_value: the estimate computed in the call (after a fallback, or with
            ``estimate_cond=True``); NaN where it is deferred or disabled.
        cond_factors: the low-precision factors kept for the deferred estimate
            (``estimate_cond="lazy"``), else None. They hold ``n^2`` entries of the
            factor precision per system (64 MB at n = 4096 in float32); pass
            ``estimate_cond=True`` or ``False`` to not keep them.
        status: :class:`adaptprec.Status` code (``int32``): ``CONVERGED`` (5) when ``x``
            has working-precision backward error, else ``SINGULAR``, ``NONFINITE_INPUT``,
            ``ILL_CONDITIONED`` or ``NOT_POSITIVE_DEFINITE``.
        reason: :class:`adaptprec.Reason` code of the fallback (``NONE`` when the
            low-precision factors sufficed): ``OVERFLOW`` (the cast to the factor
            precision overflowed), ``SINGULAR_FACTOR`` (zero pivot or Cholesky breakdown
            in the factor precision), ``STAGNATION`` (refinement stagnated or reached
            ``max_iters``), ``NONFINITE`` (NaN/Inf input).
        residual_norm: relative residual of the returned ``x`` in the working precision,
            maximised over right-hand sides: ``||b - A x||_inf / ||b||_inf`` (``inf``
            for a nonzero residual of ``b = 0``). For :func:`lstsq` the least-squares
            residual ``||b - A x|| / ||b||``, which is not 0 at the solution of an
            inconsistent system.

    A small ``backward_error`` is not a certificate by itself. It says that ``x`` solves
    a nearby system, relative to ``||A|| ||x||``: when ``x`` is huge (a singular or
    nearly singular ``A``: ``ILL_CONDITIONED``), the backward error is tiny even though
    ``A x`` is far from ``b``. ``residual_norm`` shows that directly: the rank-deficient
    ``A = [[.1, .2, .3], [.4, .5, .6], [.5, .7, .9]]`` (row 0 + row 1 = row 2) with the
    inconsistent ``b = [1, 2, 4]`` returns ``x`` with entries near ``4.5e15``,
    ``backward_error`` 2e-17 and ``residual_norm`` 0.1. The info's ``repr`` and
    :attr:`message` then say that the backward error is small only because ``||x||`` is
    huge (see :attr:`huge_x`). Trust ``x`` when ``success`` is True.

    Example:
        >>> import jax.numpy as jnp
        >>> import adaptprec as ap
        >>> x, info = ap.linalg.solve(jnp.eye(3) * 2.0, jnp.ones(3))  # float64: x64 on
        >>> ap.Status(int(info.status)).name, bool(info.success), bool(info.fell_back)
        ('CONVERGED', True, False)
        >>> info.message
        'Converged: iterative refinement reached working-precision accuracy.'
    """

    iterations: jax.Array
    backward_error: jax.Array
    fell_back: jax.Array
    cond_value: jax.Array
    status: jax.Array
    reason: jax.Array
    residual_norm: jax.Array | None = None
    cond_factors: "CondFactors | None" = field(default=None, repr=False)
    #: "solve" or "lstsq" (static): an lstsq residual is not 0 at the solution
    kind: str = field(static=True, default="solve")

    @property
    def huge_x(self) -> jax.Array:
        """Boolean array: the backward error is small only because ``||x||`` is huge.

        True where ``residual_norm`` exceeds ``sqrt(eps)`` of the working precision *and*
        ``HUGE_X`` times ``backward_error``: ``residual_norm / backward_error`` is about
        ``||A|| ||x|| / ||b||``, at most ``kappa(A)`` for a system with a solution
        near ``x``, so a ratio this large with a visible residual means ``x`` grew to
        make the backward error small (a singular or nearly singular ``A``). Always
        False for :func:`lstsq` (its residual need not vanish)."""
        if self.residual_norm is None or self.kind != "solve":
            return jnp.zeros_like(self.status, dtype=bool)
        rn = self.residual_norm
        eps = jnp.finfo(rn.dtype).eps
        return (rn > jnp.sqrt(eps)) & (rn > HUGE_X * self.backward_error)

    def _note(self, huge) -> str:
        which = "" if huge.ndim == 0 else f"system(s) {np.argwhere(huge).tolist()}: "
        return (which + "backward_error is small only because ||x|| is huge: x solves a nearby "
                "system relative to ||A|| ||x||, but ||b - A x|| / ||b|| is "
                f"{float(np.max(np.asarray(self.residual_norm)[huge])):.3g}; "
                "A is (nearly) singular, x is not a solution of A x = b.")

    def __repr__(self) -> str:
        fields = ("status", "backward_error", "residual_norm", "fell_back", "iterations",
                  "reason", "cond_value")
        values = {f: getattr(self, f) for f in fields}
        if any(isinstance(v, jax.core.Tracer) for v in values.values()):
            inner = ", ".join(f"{f}={v!r}" for f, v in values.items())
            return f"SolveInfo({inner})"

        text = "SolveInfo(" + ", ".join(show_field(f, v) for f, v in values.items()) + ")"
        huge = np.asarray(self.huge_x)
        if huge.any():
            text += "\n  note: " + self._note(huge)
        return text

    @property
    def cond_estimate(self) -> jax.Array:
        """Estimate of ``kappa_inf(A)``; see the class docstring (deferred by default)."""
        cf = self.cond_factors
        if cf is None:
            return self.cond_value
        deferred = deferred_kappa(cf.f, cf.perm, cf.scale, cf.anorm)
        return jnp.where(self.fell_back, self.cond_value, deferred)

    @property
    def success(self) -> jax.Array:
        """Boolean array: ``x`` is a trustworthy answer (``Status(status).success``)."""
        return (self.status > 0) & (self.status < int(Status.RUNNING))

    @property
    def message(self):
        """Text for ``status`` and, after a fallback, its ``reason`` (a string, or a nested
        list for a batch). Needs concrete values: call it outside ``jit``."""
        if isinstance(self.status, jax.core.Tracer) or isinstance(self.reason,
                                                                  jax.core.Tracer):
            raise TypeError(
                "SolveInfo.message needs a concrete status; return the info from jit and "
                "read .message outside, or use ap.status_message(int(status))"
            )

        def text(code, why, huge, rn):
            msg = Status(int(code)).message
            if int(why) != int(Reason.NONE):
                msg += f" Fell back to the working precision: {Reason(int(why)).describe()}."
            if huge:
                msg += (" The backward error is small only because ||x|| is huge: "
                        f"||b - A x|| / ||b|| = {float(rn):.3g}.")
            return msg

        codes, whys = np.asarray(self.status), np.asarray(self.reason)
        huge = np.asarray(self.huge_x)
        rn = (np.asarray(self.residual_norm) if self.residual_norm is not None
              else np.zeros(codes.shape))
        if codes.ndim == 0:
            return text(codes, whys, huge, rn)
        return np.vectorize(text, otypes=[object])(codes, whys, huge, rn).tolist()


def colnorm(x):
    """inf-norm of every column of a batch ``(m, n, k)`` -> ``(m, k)``; a NaN entry gives
    ``inf`` (a plain max drops it from 4096 entries on under XLA:CPU), so
    :func:`backward_error` and :func:`relative_residual` see a NaN ``x`` or residual."""
    return nan_max_abs(x, axis=1)


def relative_residual(rn, bn):
    """``max_k rn_k / bn_k`` over right-hand sides ``(m, k) -> (m,)``: 0 for a zero
    residual, ``inf`` for a nonzero residual of ``b = 0`` or a non-finite residual.

    Example:
        >>> import jax.numpy as jnp
        >>> from adaptprec.linalg._solve_info import relative_residual
        >>> relative_residual(jnp.array([[1.0, 0.0]]), jnp.array([[4.0, 0.0]])).tolist()
        [0.25]
    """
    rel = jnp.where(bn > 0, rn / jnp.where(bn > 0, bn, 1), jnp.where(rn > 0, jnp.inf, 0))
    rel = jnp.where(jnp.isfinite(rn), rel, jnp.inf)
    return jnp.max(rel, axis=-1)


def backward_error(anrm, xn, rn, bn):
    """The normwise backward error ``rn / (anrm xn + bn)``, formed as
    ``(rn / anrm) / (xn + bn / anrm)`` so that ``anrm xn`` cannot overflow
    (at 1e307 the product is inf and the error would read 0); ``inf`` where ``x`` or
    the residual is not finite, and for a nonzero residual of a zero problem.

    Example:
        >>> import jax.numpy as jnp
        >>> from adaptprec.linalg._solve_info import backward_error
        >>> float(backward_error(jnp.asarray(1e308), jnp.asarray(1.0), jnp.asarray(1e300),
        ...                      jnp.asarray(0.0)))
        1e-08
    """
    anrm = jnp.asarray(anrm)
    anrm = anrm.reshape(anrm.shape + (1,) * (jnp.ndim(xn) - anrm.ndim))
    pos = anrm > 0
    a = jnp.where(pos, anrm, 1)
    denom = jnp.where(pos, xn + bn / a, bn)
    num = jnp.where(pos, rn / a, rn)
    eta = jnp.where(denom > 0, num / jnp.where(denom > 0, denom, 1),
                    jnp.where(rn > 0, jnp.inf, 0))
    # honest: a non-finite x (or residual) has no meaningful backward error
    return jnp.where(jnp.isfinite(xn) & jnp.isfinite(rn), eta, jnp.inf)


def inaccurate_above(tol, n: int, dtype) -> float:
    """The backward error above which a finished solve is ``INACCURATE``: far above both
    the refinement's ``tol`` and what a backward-stable working-precision solve gives
    (``n u`` up to modest growth), so only a solve that is not backward stable trips it."""
    return 64.0 * max(float(tol), n * float(unit_roundoff(dtype)))
