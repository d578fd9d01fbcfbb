"""Fit analysis: reports, intervals, bands and diagnostics for ``curve_fit`` and
``solve_nlsq_batch`` results.

A layer below ``nlsq`` and ``batch``: it uses their public APIs and nothing there imports
it. One concept per module: :mod:`.fit` (``fit``), :mod:`.result` (``FitResult``), :mod:`.intervals`
(Wald and profile-likelihood intervals), :mod:`.bands` (confidence and prediction
bands), :mod:`.identifiability` (the identifiable subspace and its names),
:mod:`.residual_tests` (runs test, autocorrelation), :mod:`.batch_summary` (the same
summaries for a batch of fits, vectorised).
"""

from .bands import Band, fit_band
from .batch_summary import BatchSummary, summarize_batch
from .intervals import ProfileIntervals, profile_intervals
from .fit import fit
from .result import FitResult

__all__ = ["Band", "BatchSummary", "FitResult", "ProfileIntervals", "fit", "fit_band",
           "profile_intervals", "summarize_batch"]
