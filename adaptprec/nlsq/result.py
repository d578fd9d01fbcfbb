"""`NLSQResult`: scipy's ``OptimizeResult`` fields for least squares, plus the precision
trace of an adaptive solve.

Example:
    >>> import jax.numpy as jnp
    >>> import adaptprec as ap
    >>> res = ap.solve_nlsq(lambda x: x - 2.0, jnp.zeros(1), precision="f64")
    >>> round(float(res.x[0]), 6), bool(res.success), res.rung_name
    (2.0, True, 'f64')
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .._pytree import Module, field
from .._status import Reason
from .common import STATUS_MESSAGES, Status

__all__ = ["NLSQResult", "ESCALATION_REASONS", "result_to_host"]

ESCALATION_REASONS = {int(r): r.describe() for r in Reason}
"""Why the solver went up a rung (``NLSQResult.escalation_reason``): ``{code: text}`` of
:class:`adaptprec.Reason`, with ``0``: "not escalated"."""
ESCALATION_REASONS[0] = "not escalated"


class NLSQResult(Module):
    """Result of :func:`adaptprec.solve_nlsq` (a pytree; works under ``jit``/``vmap``).

    Fields as scipy's ``least_squares``: ``x`` (same pytree structure as ``x0``), ``cost``
    (``0.5 * sum(rho)``), ``fun`` (residual at ``x``, flat), ``jac`` (the Jacobian at
    ``x``, loss-modified as in scipy), ``grad``, ``optimality`` (inf-norm of the scaled
    gradient; first-order optimality), ``active_mask`` (-1 lower bound, 0 free, +1 upper
    bound), ``nfev`` (residual evaluations the solver made, as scipy counts them: the
    final re-evaluation at ``x`` on the top rung, which fills ``fun``/``jac``/``grad``, is
    not counted, so a traced residual runs ``nfev + 1`` times, except with
    ``max_nfev=1``: one run, at ``x0``; docs/scipy.md), ``njev`` (Jacobian evaluations; ``None`` for ``method="lm"`` with a
    finite-difference Jacobian, as scipy), ``nit``, ``status`` (see
    :class:`adaptprec.nlsq.common.Status`), and the properties ``message`` and
    ``success`` (``status > 0``).

    Precision fields: ``rung`` (index into ``ladder`` of the rung that produced ``x``),
    ``escalations``, and the trace per rung: ``rung_entered`` (iteration at which each
    rung was entered, -1 if never), ``rung_nfev`` (residual evaluations on each rung),
    ``escalation_reason`` (why each rung was entered; see :data:`ESCALATION_REASONS`).

    Example:
        >>> import jax.numpy as jnp
        >>> import adaptprec as ap
        >>> res = ap.solve_nlsq(lambda x: jnp.array([x[0] - 1.0, 10 * (x[1] - x[0] ** 2)]),
        ...                     jnp.array([-1.2, 1.0]))
        >>> [round(float(v), 6) for v in res.x], res.status_int in (1, 2, 3, 4)
        ([1.0, 1.0], True)
        >>> res.rung_name, int(res.rung_entered[0])
        ('f64', 0)
    """

    x: Any
    cost: jax.Array
    fun: jax.Array
    jac: jax.Array
    grad: jax.Array
    optimality: jax.Array
    active_mask: jax.Array
    nfev: jax.Array
    njev: jax.Array
    nit: jax.Array
    status: jax.Array
    rung: jax.Array
    escalations: jax.Array
    rung_entered: jax.Array
    rung_nfev: jax.Array
    escalation_reason: jax.Array
    ladder: tuple = field(static=True, default=())

    @property
    def success(self):
        """``status > 0`` (an array; a Python bool only when concrete)."""
        return self.status > 0

    @property
    def status_int(self) -> int:
        """The status as a Python int (needs a concrete, unbatched result)."""
        return int(self.status)

    @property
    def message(self) -> str:
        """Human-readable status, with the rung that produced the answer.

        Needs a concrete (not traced) result; inside ``jit`` use ``status``.
        """
        st = np.asarray(self.status)
        if st.ndim:
            return "; ".join(STATUS_MESSAGES.get(int(s), "?") for s in st.ravel())
        msg = STATUS_MESSAGES.get(int(st), f"Unknown status {int(st)}.")
        return f"{msg} (rung {self.rung_name}, {int(self.escalations)} escalation(s))"

    @property
    def rung_name(self) -> str:
        """Short name of the rung that produced ``x`` (``'f32'``, ``'f64'``...)."""
        from ..precision import dtype_name

        r = np.asarray(self.rung)
        if r.ndim:
            return ",".join(dtype_name(self.ladder[int(i)]) for i in r.ravel())
        return dtype_name(self.ladder[int(r)])

    def trace(self) -> list[dict]:
        """The precision trace as a list of dicts, one per rung that was used.

        Example:
            >>> import jax.numpy as jnp
            >>> import adaptprec as ap
            >>> res = ap.solve_nlsq(lambda x: x - 1.0, jnp.zeros(2))
            >>> [t["rung"] for t in res.trace()][-1]
            'f64'
        """
        from ..precision import dtype_name

        out = []
        for i, d in enumerate(self.ladder):
            at = int(self.rung_entered[i])
            if at < 0:
                continue
            # the first rung entered is the start (rung 0, or a schedule's own start)
            out.append({"rung": dtype_name(d), "entered_at_iteration": at,
                        "nfev": int(self.rung_nfev[i]),
                        "reason": ESCALATION_REASONS.get(int(self.escalation_reason[i]), "?")
                        if out else "start"})
        return out

    def __repr__(self) -> str:  # pragma: no cover - cosmetic
        try:
            return (f"NLSQResult(status={int(self.status)}, cost={float(self.cost):.6g}, "
                    f"nfev={int(self.nfev)}, nit={int(self.nit)}, rung={self.rung_name}, "
                    f"escalations={int(self.escalations)})")
        except Exception:
            return "NLSQResult(<traced>)"


#: Scalar fields handed back as scipy's types by an eager NumPy result: counts and codes
#: as Python ``int``, ``cost``/``optimality`` as NumPy scalars (``np.float64``).
_INT_FIELDS = ("nfev", "njev", "nit", "status", "rung", "escalations")
_FLOAT_FIELDS = ("cost", "optimality")


def result_to_host(tree):
    """An eager result with NumPy leaves, and an :class:`NLSQResult`'s scalar fields as
    scipy's ``OptimizeResult`` has them (``int`` counts and status, ``np.float64`` cost
    and optimality), so they compare, format and serialise (``json``) as scipy's do.

    Example:
        >>> import json
        >>> import jax.numpy as jnp
        >>> from adaptprec.nlsq.result import result_to_host
        >>> import adaptprec as ap
        >>> res = result_to_host(ap.solve_nlsq(lambda x: x - 2.0, jnp.zeros(1)))
        >>> type(res.nfev).__name__, type(res.cost).__name__, type(res.success).__name__
        ('int', 'float64', 'bool')
        >>> json.loads(json.dumps({"status": res.status}))["status"] > 0
        True
    """
    import dataclasses

    from .._x64_rule import to_host

    tree = to_host(tree)
    if not isinstance(tree, NLSQResult):
        return tree
    out = {}
    for name in _INT_FIELDS + _FLOAT_FIELDS:
        v = getattr(tree, name)
        if isinstance(v, (np.ndarray, np.generic)) and np.ndim(v) == 0:
            out[name] = v.item() if name in _INT_FIELDS else np.asarray(v)[()]
    return dataclasses.replace(tree, **out)


def _status_ok(status):
    return jnp.asarray(status) > 0


_ = Status  # re-exported for convenience via adaptprec.nlsq.result.Status
