"""Calling-convention adapters for running scipy's own tests against adaptprec.

Only the *signature* is adapted: scipy's ``least_squares(fun, x0, jac, bounds, method,
...)`` takes ``jac``, ``bounds`` and ``method`` positionally, while
``adaptprec.solve_nlsq(residual, x0, args=(), *, ...)`` takes options by keyword. Options
the test does not pass are not passed, so adaptprec's own defaults apply (as for a user
who switches the function name). Nothing else is translated or caught.
"""
import os

import jax
import numpy as np

import adaptprec as ap

#: issue 14 makes eager calls return NumPy arrays as scipy does; until that lands, the
#: adapter converts the result's arrays (ADAPTPREC_SUITE_NUMPY=0 to measure without it).
TO_NUMPY = os.environ.get("ADAPTPREC_SUITE_NUMPY", "1") == "1"


class _NumpyResult:
    """The NLSQResult with its array fields as NumPy arrays (attributes pass through)."""

    def __init__(self, res):
        self._res = res

    def __getattr__(self, name):
        v = getattr(self._res, name)
        return np.asarray(v) if isinstance(v, jax.Array) else v

_UNSET = object()


def least_squares(fun, x0, jac=_UNSET, bounds=_UNSET, method=_UNSET, *rest, **kw):
    if rest:
        raise TypeError("adapter: pass options after method by keyword")
    for name, v in (("jac", jac), ("bounds", bounds), ("method", method)):
        if v is not _UNSET:
            kw[name] = v
    args = kw.pop("args", ())
    res = ap.solve_nlsq(fun, x0, args, **kw)
    return _NumpyResult(res) if TO_NUMPY else res


def curve_fit(*a, **kw):
    out = ap.curve_fit(*a, **kw)
    if not TO_NUMPY:
        return out
    return tuple(np.asarray(v) if isinstance(v, jax.Array) else
                 ({k: np.asarray(x) if isinstance(x, jax.Array) else x
                   for k, x in v.items()} if isinstance(v, dict) else v) for v in out)
