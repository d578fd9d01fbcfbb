"""A start where the residual or its Jacobian is not finite: scipy's early, clear
error, with the parameter values and the operation that failed.

Inside ``jit`` the solve reports it through ``status`` (``NONFINITE_RESIDUAL`` or
``NONFINITE_JACOBIAN`` with ``x`` still at ``x0``). Called eagerly,
:func:`raise_nonfinite_start` turns that result into scipy's ``ValueError("Residuals are
not finite in the initial point")``, naming the first operation of the residual that
produced an Inf or NaN from finite inputs (:mod:`adaptprec._nonfinite`).

Example:
    >>> import jax.numpy as jnp
    >>> import adaptprec as ap
    >>> try:
    ...     ap.solve_nlsq(lambda p: jnp.exp(p * 1000.0) - 1.0, jnp.array([1.0]))
    ... except ValueError as e:
    ...     "overflow in exp" in str(e)
    True
"""

from __future__ import annotations

import numpy as np
from jax.flatten_util import ravel_pytree

from .._nonfinite import describe, first_nonfinite_op
from .._status import Status

__all__ = ["raise_nonfinite_start", "NonFiniteStartError"]


class NonFiniteStartError(ValueError):
    """scipy's ``ValueError`` for a residual that is not finite at ``x0``."""


def raise_nonfinite_start(residual, x0, args, res) -> None:
    """Raise scipy's ``ValueError`` for a solve ``res`` that failed on a non-finite
    residual or Jacobian without leaving ``x0``, with the likely cause (an op-by-op
    evaluation, run only on this failure path); return when it left ``x0``."""
    x0_flat = np.ravel(np.asarray(ravel_pytree(x0)[0], np.float64))
    x = np.ravel(np.asarray(ravel_pytree(res.x)[0], np.float64))
    if x.shape != x0_flat.shape or not np.array_equal(x, x0_flat):
        return  # failed later along the path: the status says so
    args = args if isinstance(args, tuple) else (args,)
    what = ("Residuals are not finite in the initial point"
            if int(np.asarray(res.status)) == Status.NONFINITE_RESIDUAL else
            "The Jacobian is not finite in the initial point")
    try:
        cause = describe(first_nonfinite_op(lambda p, a: residual(p, *a), res.x, args))
    except Exception:  # the diagnosis must never hide the error itself
        cause = ""
    raise NonFiniteStartError(
        f"{what} x0 = {np.array2string(x0_flat, precision=6)}.{cause} Start from a "
        f"point where the model and its derivatives are finite (e.g. parameters of "
        f"the data's scale; curve_fit's default p0 is all ones).")
