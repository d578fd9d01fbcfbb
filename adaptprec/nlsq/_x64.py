"""float64 without setup for the scipy-compatible entry points: the rule lives in
:mod:`adaptprec._x64_rule` (one rule for every entry point: runtime, linalg, profile and
the fits); this module re-exports the names nlsq and batch use.

Example:
    >>> from adaptprec.nlsq._x64 import wants_float64
    >>> wants_float64("adaptive"), wants_float64("f32"), wants_float64("f32,f64")
    (True, False, True)
"""

from __future__ import annotations

from .._x64_rule import (TRACED_X64_MESSAGE, _numpy_out, float64_entry, numpy_results,
                         to_host, wants_float64)

__all__ = ["TRACED_X64_MESSAGE", "wants_float64", "float64_entry", "to_host",
           "numpy_results", "_numpy_out"]
