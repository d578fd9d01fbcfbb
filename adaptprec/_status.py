"""The one result vocabulary: :class:`Status` (how a computation ended) and
:class:`Reason` (why a rung was left, or why a guard fired).

Every layer reports through these two enums: guards and runtime reports (``Reason``),
``solve_nlsq``/``curve_fit``/``solve_nlsq_batch`` and ``linalg.solve``/``lstsq``
(``Status``, plus ``Reason`` for each escalation or fallback). Inside ``jit`` they travel as
``int32`` arrays; on the host, ``Status(int(code))`` or :func:`status_message` decode them.

Status codes keep scipy's integer meanings where scipy defines one (``least_squares``:
-1 improper input, 0 evaluation budget exhausted, 1..4 convergence tests). The sign says
what kind of ending it was: ``> 0`` success, ``0`` budget exhausted, ``< 0`` failure.

====  ======================  ==========================================================
code  name                    meaning
====  ======================  ==========================================================
  -1  IMPROPER_INPUT          bad input (raised at the boundary; inside jit: returned)
  -2  CALLBACK_STOP           a user callback raised StopIteration (scipy's -2)
  -3  NONFINITE_RESIDUAL      the residual is NaN/Inf at the current point on the top rung
  -4  NONFINITE_JACOBIAN      the Jacobian is NaN/Inf at the current point on the top rung
  -5  NO_FINITE_STEP          every trial step gave a non-finite residual
  -6  STALLED                 no further decrease possible at the top rung's precision
  -7  SINGULAR                the matrix is singular in the working precision
  -8  NONFINITE_INPUT         an input holds NaN/Inf (found inside jit)
  -9  ILL_CONDITIONED         solved with a small backward error, but cond * u >= 1
 -10  NOT_A_MINIMUM           a convergence test passed but the top-rung gradient test
                              does not: the point is not verified to be a minimum
 -11  RUNAWAY                 a convergence test passed with the parameters run off by
                              orders of magnitude (the model flattens: no finite minimum)
 -12  NOT_POSITIVE_DEFINITE   ``assume_a="pos"``: the working-precision Cholesky failed
 -13  INACCURATE              linear solve: finished, but the backward error of ``x`` is
                              above the working precision's (x is not trustworthy)
   0  MAX_EVALUATIONS         the evaluation/iteration budget is exhausted
   1  GTOL                    ``gtol`` termination condition is satisfied
   2  FTOL                    ``ftol`` termination condition is satisfied
   3  XTOL                    ``xtol`` termination condition is satisfied
   4  FTOL_XTOL               both ``ftol`` and ``xtol`` are satisfied
   5  CONVERGED               linear solve: refinement reached working accuracy
  99  RUNNING                 internal: the loop has not finished
====  ======================  ==========================================================

Example:
    >>> import adaptprec as ap
    >>> ap.Status(1).name, ap.Status.GTOL.success
    ('GTOL', True)
    >>> ap.status_message(0)
    'The maximum number of function evaluations is exceeded.'
    >>> ap.Reason.NONFINITE.describe()
    'non-finite value (NaN/Inf)'
"""

from __future__ import annotations

import enum

import numpy as np

__all__ = ["Status", "Reason", "status_message", "reason_name", "STATUS_TABLE"]


class Status(enum.IntEnum):
    """How a solve ended. ``> 0`` success, ``0`` budget exhausted, ``< 0`` failure."""

    IMPROPER_INPUT = -1
    NONFINITE_RESIDUAL = -3
    NONFINITE_JACOBIAN = -4
    NO_FINITE_STEP = -5
    STALLED = -6
    SINGULAR = -7
    NONFINITE_INPUT = -8
    ILL_CONDITIONED = -9
    NOT_A_MINIMUM = -10
    RUNAWAY = -11
    CALLBACK_STOP = -2
    NOT_POSITIVE_DEFINITE = -12
    INACCURATE = -13
    MAX_EVALUATIONS = 0
    GTOL = 1
    FTOL = 2
    XTOL = 3
    FTOL_XTOL = 4
    CONVERGED = 5
    RUNNING = 99

    # The iteration cap of solve_nlsq (max_steps) ends with the same code as scipy's max_nfev.
    MAX_STEPS = 0

    @property
    def success(self) -> bool:
        """``True`` for the convergence codes (``1 <= code <= 5``)."""
        return 0 < int(self) < 99

    @property
    def message(self) -> str:
        return _MESSAGES[self]


_MESSAGES = {
    Status.IMPROPER_INPUT: "Improper input parameters status returned from the boundary "
                           "checks.",
    Status.NONFINITE_RESIDUAL: "The residual is non-finite (NaN/Inf) at the current point "
                               "even on the top rung.",
    Status.NONFINITE_JACOBIAN: "The Jacobian is non-finite (NaN/Inf) at the current point "
                               "even on the top rung.",
    Status.NO_FINITE_STEP: "No finite trial point could be found: every step tried gave a "
                           "non-finite residual and the trust region collapsed.",
    Status.STALLED: "No further reduction of the cost is possible at this precision: the "
                    "damping reached its limit with finite trial points.",
    Status.SINGULAR: "Singular matrix: the working-precision factor has a zero pivot; x is "
                     "NaN.",
    Status.NONFINITE_INPUT: "Non-finite input: an input contains NaN or Inf; the result is "
                            "NaN.",
    Status.ILL_CONDITIONED: "Ill-conditioned: the condition estimate exceeds 1/u of the "
                            "working precision; the result has a small backward error but "
                            "may have no correct digits.",
    Status.NOT_A_MINIMUM: "A convergence test was met, but the gradient test on the top rung "
                          "fails: the point is not verified to be a minimum.",
    Status.RUNAWAY: "A convergence test was met with the parameters run off by orders of "
                    "magnitude from x0 (||x|| > 1e6 ||x0||): the model flattens along them "
                    "and the cost approaches a value no finite point attains; the point "
                    "is not a minimum. Check the model's parametrisation or bound it.",
    Status.CALLBACK_STOP: "`callback` raised StopIteration.",
    Status.NOT_POSITIVE_DEFINITE: "Not positive definite: the working-precision Cholesky "
                                  "factorization failed (assume_a='pos'); x is NaN.",
    Status.INACCURATE: "Inaccurate: the solve finished, but the backward error of x, "
                       "||b - A x|| / (||A|| ||x|| + ||b||), is far above the working "
                       "precision's (e.g. a non-symmetric A with assume_a='pos', "
                       "entries near the overflow threshold, or large LU growth); x is "
                       "not trustworthy.",
    Status.MAX_EVALUATIONS: "The maximum number of function evaluations is exceeded.",
    Status.GTOL: "`gtol` termination condition is satisfied.",
    Status.FTOL: "`ftol` termination condition is satisfied.",
    Status.XTOL: "`xtol` termination condition is satisfied.",
    Status.FTOL_XTOL: "Both `ftol` and `xtol` termination conditions are satisfied.",
    Status.CONVERGED: "Converged: iterative refinement reached working-precision accuracy.",
    Status.RUNNING: "Still running.",
}


def status_message(code) -> str:
    """The message for a status code (an int, a :class:`Status` or a concrete 0-d array).

    Example:
        >>> from adaptprec import status_message
        >>> status_message(-6)[:35]
        'No further reduction of the cost is'
    """
    code = int(np.asarray(code))
    try:
        return Status(code).message
    except ValueError:
        return f"Unknown status {code}."


class Reason(enum.IntEnum):
    """Why a rung was left (an escalation or a fallback), or why a guard fired.

    Codes 1..8 are the built-in guards' codes; user guards may use codes >= 100.
    """

    NONE = 0
    NONFINITE = 1
    OVERFLOW = 2
    UNDERFLOW = 3
    ILL_CONDITIONED = 4
    MATRIX_ILL_CONDITIONED = 5
    RESIDUAL = 6
    BACKWARD_ERROR = 7
    PREDICATE = 8
    INACCURATE = 9
    CANCELLATION = 10
    SPOT_CHECK = 11
    VERIFY = 12
    REJECTED_STEPS = 13
    SCHEDULE = 14
    BUDGET = 15
    STAGNATION = 16
    SINGULAR_FACTOR = 17

    def describe(self) -> str:
        return _REASONS[self]


_REASONS = {
    Reason.NONE: "ok",
    Reason.NONFINITE: "non-finite value (NaN/Inf)",
    Reason.OVERFLOW: "overflow (no headroom left in the rung's range)",
    Reason.UNDERFLOW: "underflow (a nonzero input flushed to zero)",
    Reason.ILL_CONDITIONED: "ill-conditioned (condition estimate x u above tolerance)",
    Reason.MATRIX_ILL_CONDITIONED: "ill-conditioned matrix",
    Reason.RESIDUAL: "residual above tolerance",
    Reason.BACKWARD_ERROR: "backward error above tolerance",
    Reason.PREDICATE: "predicate false",
    Reason.INACCURATE: "inaccurate (estimated rounding error above rtol)",
    Reason.CANCELLATION: "unstable cancellation",
    Reason.SPOT_CHECK: "spot check against the next rung disagrees",
    Reason.VERIFY: "converged on a lower rung (verify on the next one)",
    Reason.REJECTED_STEPS: "repeated rejected steps",
    Reason.SCHEDULE: "precision schedule (stall / noise floor)",
    Reason.BUDGET: "the rung's share of the iteration budget is used up",
    Reason.STAGNATION: "refinement stagnated or reached its iteration limit",
    Reason.SINGULAR_FACTOR: "the low-precision factor is singular or non-finite",
}


def reason_name(code) -> str:
    """Short readable name of a reason code; user codes print as ``code <n>``.

    Example:
        >>> from adaptprec import reason_name
        >>> reason_name(2), reason_name(123)
        ('overflow', 'code 123')
    """
    code = int(np.asarray(code))
    try:
        return _SHORT[Reason(code)]
    except (ValueError, KeyError):
        return f"code {code}"


_SHORT = {
    Reason.NONE: "ok",
    Reason.NONFINITE: "nonfinite",
    Reason.ILL_CONDITIONED: "ill-conditioned",
    Reason.MATRIX_ILL_CONDITIONED: "ill-conditioned matrix",
    **{r: r.name.lower().replace("_", " ") for r in Reason
       if r not in (Reason.NONE, Reason.NONFINITE, Reason.ILL_CONDITIONED,
                    Reason.MATRIX_ILL_CONDITIONED)},
}


#: ``{code: (name, message)}`` for documentation tables.
STATUS_TABLE = {int(s): (s.name, s.message) for s in Status}
