"""Guards: jit-safe checks of whether a rung's result can be trusted.

A guard looks at one attempt of a kernel at one rung (a :class:`GuardContext`: the
rung's callable, its cast inputs, the original inputs, the output, the rung dtype and unit
roundoff ``u``) and returns a :class:`GuardResult` ``(ok, code, value)`` of scalars. The
runtime evaluates every guard at every rung it tries; a guard that is not ``ok`` makes it
escalate, and the :class:`~adaptprec.Report` records each guard's code and value.

===================================  ====================================================
guard                                fires (``ok`` false) when
===================================  ====================================================
``finite()``                         the output has a NaN or Inf
``headroom(fraction)``               ``max|out| > fraction * finfo(rung).max``, or a
                                     nonzero input was flushed to zero by the cast
``condition(tol)``                   ``kappa * u_rung > tol``, kappa a relative condition
                                     estimate from a few JVPs along random directions
``matrix_condition(tol)``            ``kappa_1(A) * u_rung > tol`` (Hager–Higham)
``residual(check_fn, tol)``          ``check_fn(out, *inputs) > tol``
``backward_error(tol)``              normwise backward error of ``x = fn(A, b)`` > tol
``predicate(fn)``                    ``fn(out, *inputs)`` is false
``accuracy(rtol, samples=2)``        Monte Carlo arithmetic (random rounding) estimates
                                     a relative error above ``rtol``, an add/sub cancels
                                     more than ``rtol / u``, or a discrete result/decision
                                     is unstable; value: estimated significant digits
``spot_check(rtol, sample=k)``       ``k`` elements of a vmapped batch recomputed on the
                                     next rung disagree by more than ``rtol``
===================================  ====================================================

A plain function in a guard list is treated as ``predicate(fn)``. Guards compose by
listing them; the runtime escalates when any fires.

Solvers that already hold their evaluation on a rung (nlsq's residual, trial point and
factor) run the same tests on it directly: :func:`finite_values` (the test of ``finite()``)
and :func:`conditioned` (the test of ``condition``/``matrix_condition`` on a ``kappa`` the
solver estimated), each a :class:`GuardResult` whose code is a :class:`~adaptprec.Reason`.

Example:
    >>> import jax.numpy as jnp
    >>> from adaptprec import guards
    >>> g = guards.finite()
    >>> r = g.evaluate(jnp.exp, jnp.array([1.0, 100.0]), dtype="f32")
    >>> bool(r.ok), int(r.code) == guards.NONFINITE, float(r.value)
    (False, True, 1.0)
    >>> bool(g.evaluate(jnp.exp, jnp.array([1.0, 100.0]), dtype="f64").ok)
    True
"""


from __future__ import annotations

from typing import Any

from ._accuracy import accuracy, output_error, spot_check
from ._basic_guards import (backward_error, condition, conditioned, finite, finite_values,
                            headroom, matrix_condition, predicate, residual)
from ._guard_base import (BACKWARD_ERROR, CANCELLATION, ILL_CONDITIONED, INACCURATE,
                          MATRIX_ILL_CONDITIONED, NONFINITE, OK, OVERFLOW, PREDICATE,
                          RESIDUAL, SPOT_CHECK, UNDERFLOW, Guard, GuardContext,
                          GuardResult, code_name)

__all__ = [
    "GuardResult",
    "GuardContext",
    "Guard",
    "finite",
    "finite_values",
    "conditioned",
    "headroom",
    "condition",
    "matrix_condition",
    "residual",
    "backward_error",
    "predicate",
    "accuracy",
    "spot_check",
    "output_error",
    "as_guard",
    "code_name",
    "OK",
    "NONFINITE",
    "OVERFLOW",
    "UNDERFLOW",
    "ILL_CONDITIONED",
    "MATRIX_ILL_CONDITIONED",
    "RESIDUAL",
    "BACKWARD_ERROR",
    "PREDICATE",
    "INACCURATE",
    "CANCELLATION",
    "SPOT_CHECK",
]

#: the guard factories (``guards=[guards.finite]`` passes the factory, not a guard)
_FACTORIES = frozenset({finite, headroom, condition, matrix_condition, residual,
                        backward_error, predicate, accuracy, spot_check})


def as_guard(g: Any) -> Guard:
    """A :class:`Guard` as is; a plain callable becomes :func:`predicate` of it.

    Example:
        >>> from adaptprec import guards
        >>> guards.as_guard(lambda out, x: out > 0).name
        'predicate(<lambda>)'
    """
    if isinstance(g, Guard):
        return g
    try:
        factory = g in _FACTORIES
    except TypeError:       # an unhashable callable object: not a factory
        factory = False
    if factory:
        # guards=[guards.finite]: the factory itself, not a guard
        raise TypeError(f"guards.{g.__name__} is a guard factory: call it, e.g. "
                        f"guards.{g.__name__}(), not guards.{g.__name__}")
    if callable(g):
        return predicate(g)
    raise TypeError(
        f"a guard must be a Guard (e.g. adaptprec.guards.finite()) or a callable "
        f"fn(out, *inputs) -> bool; got {g!r} of type {type(g).__name__}")
