"""Per-fit status codes of the batched solver: the single-fit solver's codes, plus one.

All codes and messages come from :class:`adaptprec.nlsq.common.Status` so that
``solve_nlsq`` and ``solve_nlsq_batch`` agree (0..4 are scipy's ``least_squares`` codes).
The batched kernel adds ``STALLED = -6``: the damping reached its limit although the trial
points were finite, i.e. no further reduction was possible at the rung's precision.

Example:
    >>> from adaptprec.batch._status import GTOL, STALLED, message
    >>> GTOL, message(GTOL)
    (1, '`gtol` termination condition is satisfied.')
    >>> message(STALLED)[:30]
    'No further reduction of the co'
"""

from __future__ import annotations

from ..nlsq.common import Status, status_message

MAX_STEPS = Status.MAX_STEPS
GTOL = Status.GTOL
FTOL = Status.FTOL
XTOL = Status.XTOL
FTOL_XTOL = Status.FTOL_XTOL
NONFINITE_RESIDUAL = Status.NONFINITE_RESIDUAL
NONFINITE_JACOBIAN = Status.NONFINITE_JACOBIAN
NO_FINITE_STEP = Status.NO_FINITE_STEP
RUNNING = Status.RUNNING
STALLED = -6

FAILURES = (MAX_STEPS, NONFINITE_RESIDUAL, NONFINITE_JACOBIAN, NO_FINITE_STEP, STALLED)

_STALLED_MESSAGE = ("No further reduction of the cost is possible at this precision: the "
                    "damping reached its limit with finite trial points.")


def message(code: int) -> str:
    """The human-readable message for a status code.

    Example:
        >>> from adaptprec.batch._status import message
        >>> message(0)
        'The maximum number of function evaluations is exceeded.'
    """
    if int(code) == STALLED:
        return _STALLED_MESSAGE
    return status_message(code)
