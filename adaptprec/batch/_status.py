"""Per-fit status codes of the batched solver: the names of :class:`adaptprec.Status`.

``solve_nlsq`` and ``solve_nlsq_batch`` share one vocabulary (adaptprec/_status.py);
this module only gives the batched kernel short names for the codes it uses.

Example:
    >>> from adaptprec.batch._status import GTOL, STALLED, message
    >>> int(GTOL), message(GTOL)
    (1, '`gtol` termination condition is satisfied.')
    >>> message(STALLED)[:30]
    'No further reduction of the co'
"""

from __future__ import annotations

from .._status import Status, status_message as message

MAX_STEPS = Status.MAX_EVALUATIONS
IMPROPER_INPUT = Status.IMPROPER_INPUT
GTOL = Status.GTOL
FTOL = Status.FTOL
XTOL = Status.XTOL
FTOL_XTOL = Status.FTOL_XTOL
NONFINITE_RESIDUAL = Status.NONFINITE_RESIDUAL
NONFINITE_JACOBIAN = Status.NONFINITE_JACOBIAN
NO_FINITE_STEP = Status.NO_FINITE_STEP
RUNNING = Status.RUNNING
STALLED = Status.STALLED

FAILURES = (MAX_STEPS, IMPROPER_INPUT, NONFINITE_RESIDUAL, NONFINITE_JACOBIAN, NO_FINITE_STEP, STALLED)

__all__ = ["message"]
