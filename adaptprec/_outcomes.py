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

The returned rung of a call is kept as an array and read only when a decision needs
it: the plan of the next call is a function of the tries, so when every rung the newest
call may have returned leads to the same program (:meth:`Outcomes.possible`), the next
call is dispatched without waiting for it. Eager calls then stay asynchronous, and the
tries, folded in call order when read, are what reading every call at once would give.
"""

from __future__ import annotations

import numpy as np

__all__ = ["Outcomes", "fold", "WINDOW", "PRIOR_WEIGHT", "RETRY_EVERY"]

#: tries per rung remembered, the prior's weight in calls, and how often (in eager calls)
#: a plan that learned to skip a rung runs the a-priori plan again
WINDOW, PRIOR_WEIGHT, RETRY_EVERY = 4, 2.0, 16


def fold(tries: tuple, rung: int, attempt: tuple) -> tuple:
    """``tries`` (per rung, its last ``WINDOW`` outcomes, ``True``: failed) after a call
    under a plan attempting ``attempt`` returned ``rung``: the attempted rungs below it
    failed, it passed."""
    return tuple((t + (k < rung,))[-WINDOW:] if tried and k <= rung else t
                 for k, (t, tried) in enumerate(zip(tries, attempt)))


def p_fail(tries: tuple, prior: float, priced_out: tuple = ()) -> tuple:
    """Per rung, the chance of failing on the data (``prior`` when never tried; 1 for a
    rung in ``priced_out``, which the a-priori plan skipped for its componentwise chance,
    until a retry has tried it)."""
    return tuple(1.0 if k in priced_out and not t else
                 (sum(t) + PRIOR_WEIGHT * prior) / (len(t) + PRIOR_WEIGHT)
                 for k, t in enumerate(tries))


class Outcomes:
    """The recent tries of each rung of one kernel for one set of argument shapes, the
    calls not read yet, and the runtime's compiled programs per failure chances."""

    def __init__(self, n_rungs: int, priced_out: tuple = ()):
        self.priced_out = priced_out   # the a-priori plan's rungs priced out (_plan.Plan)
        self.tries: tuple = ((),) * n_rungs
        self.pending: list = []  # (returned rung array, attempted rungs), oldest first
        self.calls = 0
        self.by_chances: dict = {}  # rounded failure chances -> program (the runtime's)
        self.by_tries: dict = {}    # tries -> program: a repeat state is looked up

    def note(self, rung, attempt: tuple) -> None:
        """Keep a call's returned ``rung`` (an array, read later) under a plan that
        attempted the rungs ``attempt`` (at most two kept: an older one is read)."""
        self.absorb(keep=1)
        self.pending.append((rung, attempt))

    def absorb(self, keep: int = 0) -> None:
        """Fold the returned rungs of the pending calls but the newest ``keep`` into the
        tries, oldest first (reading one waits for its call to finish)."""
        while len(self.pending) > keep:
            rung, attempt = self.pending.pop(0)
            r = np.asarray(rung)
            r = int(r) if r.ndim == 0 else int(r.max())  # a batch: the highest rung needed
            self.tries = fold(self.tries, r, attempt)

    def possible(self) -> list:
        """The tries once the one pending call is read, for each rung it may have
        returned (one of those it attempted); the tries alone when none is pending."""
        if not self.pending:
            return [self.tries]
        ((_, attempt),) = self.pending
        return [fold(self.tries, r, attempt) for r, tried in enumerate(attempt) if tried]

    def p_fail(self, prior: float, tries: tuple | None = None) -> tuple:
        """Per rung, the chance of failing on the data after ``tries`` (default: the
        tries so far; see :func:`p_fail`)."""
        return p_fail(self.tries if tries is None else tries, prior, self.priced_out)

    def tried(self) -> bool:
        return any(self.tries)
