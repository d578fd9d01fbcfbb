"""What a kernel's own eager calls showed: how often each lower rung failed on the data.

The plan prices a lower rung with the chance that it fails its check and the rung above
runs too (:mod:`adaptprec._plan`). A priori that chance is ``_plan.P_FAIL``; after eager
calls for the same shapes it is learned from them: each call's returned rung says which
tried rungs failed (those below it) and which passed (it). The estimate is the mean of a
Beta prior worth ``PRIOR_WEIGHT`` calls at ``P_FAIL``, updated by the last ``WINDOW``
tries of that rung:

    p_fail = (failures + PRIOR_WEIGHT * P_FAIL) / (tries + PRIOR_WEIGHT)

so two failures in two tries make it 0.55 (the rung is skipped when that makes its
expected cost too high), and a few passes bring it back. A rung the learned plan skips is
tried again every ``RETRY_EVERY``-th eager call (the data may have changed). A rung the
a-priori plan skipped for its componentwise chance (``Plan.priced_out``) stays skipped
until such a retry has tried it at ``P_FAIL``. The learned chances also feed plans traced
later under ``jit`` for the same shapes.

The returned rung of a call is kept as an array and read at the next call, so an eager
call stays asynchronous.
"""

from __future__ import annotations

import collections

import numpy as np

__all__ = ["Outcomes", "WINDOW", "PRIOR_WEIGHT", "RETRY_EVERY"]

#: tries per rung remembered, the prior's weight in calls, and how often (in eager calls)
#: a plan that learned to skip a rung runs the a-priori plan again
WINDOW, PRIOR_WEIGHT, RETRY_EVERY = 4, 2.0, 16


class Outcomes:
    """The recent tries of each rung of one kernel for one set of argument shapes."""

    def __init__(self, n_rungs: int):
        self.tries = [collections.deque(maxlen=WINDOW) for _ in range(n_rungs)]
        self.pending = None     # (returned rung array, the plan's attempted rungs)
        self.calls = 0

    def note(self, rung, attempt: tuple) -> None:
        """Keep a call's returned ``rung`` (an array, read later) under a plan that
        attempted the rungs ``attempt``."""
        self.pending = (rung, attempt)

    def absorb(self) -> None:
        """Fold the last call's returned rung into the tries."""
        if self.pending is None:
            return
        rung, attempt = self.pending
        self.pending = None
        r = np.asarray(rung)
        r = int(r) if r.ndim == 0 else int(r.max())  # a batch: the highest rung needed
        for k, tried in enumerate(attempt):
            if tried and k <= r:
                self.tries[k].append(k < r)

    def p_fail(self, prior: float, priced_out: tuple = ()) -> tuple:
        """Per rung, the chance of failing on the data (``prior`` when never tried; 1
        for a rung in ``priced_out``, which the a-priori plan skipped for its
        componentwise chance, until a retry has tried it)."""
        return tuple(1.0 if k in priced_out and not t else
                     (sum(t) + PRIOR_WEIGHT * prior) / (len(t) + PRIOR_WEIGHT)
                     for k, t in enumerate(self.tries))

    def tried(self) -> bool:
        return any(self.tries)
