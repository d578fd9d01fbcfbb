"""Per-fit status codes of the batched solver and their messages.

Codes 0..4 follow :func:`scipy.optimize.least_squares`; negative codes are adaptprec's own
failure modes. Kept in one table so single and batched solvers report the same numbers.

Example:
    >>> from adaptprec.batch._status import GTOL, message
    >>> GTOL, message(GTOL)
    (1, '`gtol` termination condition is satisfied.')
"""

from __future__ import annotations

MAX_STEPS = 0
GTOL = 1
FTOL = 2
XTOL = 3
FTOL_XTOL = 4
IMPROPER_INPUT = -1
NONFINITE = -2
STALLED = -3
RUNNING = -100  # internal: the fit is still iterating

MESSAGES: dict[int, str] = {
    MAX_STEPS: "The maximum number of function evaluations is exceeded.",
    GTOL: "`gtol` termination condition is satisfied.",
    FTOL: "`ftol` termination condition is satisfied.",
    XTOL: "`xtol` termination condition is satisfied.",
    FTOL_XTOL: "Both `ftol` and `xtol` termination conditions are satisfied.",
    IMPROPER_INPUT: "Improper input parameters.",
    NONFINITE: "The residual or Jacobian is not finite (non-finite data, start or model).",
    STALLED: "No further reduction of the cost is possible at the highest precision "
             "(damping exceeded its limit).",
    RUNNING: "The fit was still running (internal state).",
}


def message(code: int) -> str:
    """The human-readable message for a status code (unknown codes say so).

    Example:
        >>> from adaptprec.batch._status import message
        >>> message(0)
        'The maximum number of function evaluations is exceeded.'
    """
    return MESSAGES.get(int(code), f"unknown status code {int(code)}")
