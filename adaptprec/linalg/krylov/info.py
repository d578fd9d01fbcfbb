"""What a Krylov solve reports: :class:`KrylovInfo`.

The codes are the one :class:`adaptprec.Status` / :class:`adaptprec.Reason` vocabulary;
:data:`KRYLOV_MESSAGES` words the codes a Krylov solve can end with for this kind of solve
(the generic ``Status.message`` of ``SINGULAR`` talks about LU pivots, for instance).

Example:
    >>> import jax.numpy as jnp
    >>> import adaptprec as ap
    >>> x, info = ap.linalg.cg(jnp.diag(jnp.array([1.0, 2.0, 4.0])), jnp.ones(3), rtol=1e-12)
    >>> ap.Status(int(info.status)).name, bool(info.success)
    ('CONVERGED', True)
    >>> bool(info.residual_norm <= 1e-12)
    True
"""

from __future__ import annotations

import numpy as np

import jax
import jax.numpy as jnp

from ..._pytree import Module, field
from ..._status import Status
from .._common import show_field

__all__ = ["KrylovInfo", "KRYLOV_MESSAGES"]

KRYLOV_MESSAGES = {
    int(Status.CONVERGED): "Converged: the float64 (top-rung) true residual "
                           "||b - A x|| / ||b|| is below the tolerance.",
    int(Status.MAX_EVALUATIONS): "maxiter iterations were used before the true residual "
                                 "reached the tolerance. If residual_trace shows it "
                                 "stuck at one level, b may not be in the range of a "
                                 "singular A.",
    int(Status.STALLED): "Stalled: the true residual stopped decreasing on the top "
                         "rung (it did not halve in two checks). A may be "
                         "singular with b outside its range, or too "
                         "ill-conditioned for the working precision (try a "
                         "preconditioner); x is the best iterate, not a solution.",
    int(Status.NOT_POSITIVE_DEFINITE): "Not positive definite: CG met a direction p with "
                                       "p^T A p <= 0 on the top rung: A (or M) is "
                                       "indefinite or singular, and CG needs both "
                                       "symmetric positive definite. Use gmres or "
                                       "bicgstab; x is the best iterate.",
    int(Status.NONFINITE_INPUT): "Non-finite input: b, x0 or A x0 holds NaN/Inf; x is NaN.",
    int(Status.NONFINITE_RESIDUAL): "The iteration produced NaN/Inf on the top rung (the "
                                    "operator or the preconditioner returned non-finite "
                                    "values); x is the last finite iterate.",
    int(Status.RUNNING): "Still running.",
}
"""``{code: message}`` for the codes a Krylov solve ends with: ``CONVERGED`` (5),
``MAX_EVALUATIONS`` (0), ``STALLED`` (-6), ``NOT_POSITIVE_DEFINITE`` (-12, CG only),
``NONFINITE_INPUT`` (-8) and ``NONFINITE_RESIDUAL`` (-3)."""

#: cycles (true-residual checks) recorded in ``rung_trace`` / ``residual_trace``
TRACE_LENGTH = 128


class KrylovInfo(Module):
    """Diagnostics of :func:`~adaptprec.linalg.cg`, :func:`~adaptprec.linalg.gmres` and
    :func:`~adaptprec.linalg.bicgstab`, one entry per right-hand side.

    A solve runs in *cycles*: iterations on one rung of the ladder, then a float64 check
    of the true residual ``b - A x`` (a reliable update). Every field is an array (with
    the leading shape of the right-hand sides), so the info works under ``jit``/``vmap``.

    Attributes:
        status: :class:`adaptprec.Status` code (see :data:`KRYLOV_MESSAGES`); ``success``
            only for ``CONVERGED``, which means the top-rung residual was computed and
            is below ``max(rtol ||b||, atol)``.
        residual_norm: ``||b - A x||_2 / ||b||_2`` of the returned ``x``, computed in the
            top rung's dtype (``||b - A x||`` when ``b = 0``).
        iterations: iterations on all rungs (matrix-vector products of the iteration; a
            BiCGStab iteration has two; the cycles' residual checks are not counted).
        iterations_per_rung: ``(n_rungs,)`` iterations on each rung.
        cycles: number of cycles (true-residual checks).
        rung: index of the rung the last cycle ran on.
        escalations: how often the rung went up.
        reason: :class:`adaptprec.Reason` of the last climb (``NONE`` if none):
            ``SCHEDULE`` (the schedule saw the true residual stall), ``NONFINITE``
            (NaN/Inf on a lower rung), ``MATRIX_ILL_CONDITIONED`` (CG: ``p^T A p <= 0``
            on a lower rung, i.e. not positive definite to that precision), ``STAGNATION``
            (a breakdown of the lower rung's recurrences).
        rung_trace: ``(128,)`` rung of each of the first 128 cycles, ``-1`` after.
        residual_trace: ``(128,)`` true relative residual after each of those cycles.
        ladder: names of the rungs' dtypes (static).
        method: ``"cg"``, ``"gmres"`` or ``"bicgstab"`` (static).

    Example:
        >>> import jax.numpy as jnp
        >>> import adaptprec as ap
        >>> A = jnp.array([[4.0, 1.0], [1.0, 3.0]])
        >>> x, info = ap.linalg.cg(A, jnp.array([1.0, 2.0]), rtol=1e-12)
        >>> info.message
        'Converged: the float64 (top-rung) true residual ||b - A x|| / ||b|| is below the tolerance.'
        >>> info.ladder, int(info.iterations_per_rung.sum()) == int(info.iterations)
        (('float32', 'float64'), True)
    """

    status: jax.Array
    residual_norm: jax.Array
    iterations: jax.Array
    iterations_per_rung: jax.Array
    cycles: jax.Array
    rung: jax.Array
    escalations: jax.Array
    reason: jax.Array
    rung_trace: jax.Array = field(repr=False)
    residual_trace: jax.Array = field(repr=False)
    ladder: tuple[str, ...] = field(static=True, default=())
    method: str = field(static=True, default="cg")

    @property
    def success(self) -> jax.Array:
        """Boolean array: converged, verified by the top-rung residual."""
        return self.status == int(Status.CONVERGED)

    @property
    def message(self):
        """Text for ``status`` (a string, or a nested list for several right-hand
        sides). Needs concrete values: read it outside ``jit``."""
        if isinstance(self.status, jax.core.Tracer):
            raise TypeError("KrylovInfo.message needs a concrete status; return the info "
                            "from jit and read .message outside")
        codes = np.asarray(self.status)
        text = lambda c: KRYLOV_MESSAGES.get(int(c), Status(int(c)).message)
        if codes.ndim == 0:
            return text(codes)
        return np.vectorize(text, otypes=[object])(codes).tolist()

    def trace(self) -> str:
        """The cycles as a table: rung, dtype and true relative residual after each
        (one right-hand side; needs concrete values).

        Example:
            >>> import jax.numpy as jnp
            >>> import adaptprec as ap
            >>> x, info = ap.linalg.cg(jnp.eye(3) * 2.0, jnp.ones(3), rtol=1e-12)
            >>> print(info.trace())
            cycle  rung  dtype    residual
                1     0  float32  1.79e-08
                2     0  float32  3.33e-16
        """
        rungs, res = np.asarray(self.rung_trace), np.asarray(self.residual_trace)
        if rungs.ndim != 1:
            raise ValueError("trace() shows one right-hand side: index the info first, "
                             "e.g. jax.tree.map(lambda f: f[0], info).trace()")
        lines = ["cycle  rung  dtype    residual"]
        for i, (k, r) in enumerate(zip(rungs, res)):
            if k < 0:
                break
            lines.append(f"{i + 1:5d}  {int(k):4d}  {self.ladder[int(k)]:<7s}  {float(r):.3g}")
        if int(np.asarray(self.cycles)) > len(rungs):
            lines.append(f"... ({int(np.asarray(self.cycles)) - len(rungs)} more cycles)")
        return "\n".join(lines)

    def __repr__(self) -> str:
        values = {f: getattr(self, f) for f in ("status", "residual_norm", "iterations",
                                                "iterations_per_rung", "cycles", "rung",
                                                "escalations", "reason")}
        if any(isinstance(v, jax.core.Tracer) for v in values.values()):
            return "KrylovInfo(" + ", ".join(f"{k}={v!r}" for k, v in values.items()) + ")"

        return (f"KrylovInfo(method={self.method!r}, ladder={self.ladder}, "
                + ", ".join(show_field(k, v) for k, v in values.items()) + ")")


def empty_trace(dtype):
    """The traces before the first cycle."""
    return (jnp.full((TRACE_LENGTH,), -1, jnp.int32),
            jnp.full((TRACE_LENGTH,), jnp.nan, dtype))
