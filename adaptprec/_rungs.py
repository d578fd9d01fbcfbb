"""Rungs of a precision ladder: plain dtypes or objects with ``.dtype`` and ``.wrap(fn)``.

Private helper shared by ``runtime`` and ``schedule`` (the rung predicate,
``is_rung_object``, lives in :mod:`adaptprec.precision`, which guards import too).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol, runtime_checkable

from .precision import Ladder, canonical_dtype, is_rung_object

__all__ = ["Rung", "normalize_ladder", "is_rung_object"]


@runtime_checkable
class Rung(Protocol):
    """A ladder rung that is more than a dtype (e.g. an autocast ``PrecisionPolicy``).

    ``dtype`` is the nominal precision: floating inputs are cast to it and its unit
    roundoff is the rung's ``u``. ``wrap(fn)`` returns the callable to run at this rung.

    Example:
        >>> import numpy as np
        >>> from adaptprec.runtime import Rung
        >>> class Doubled:
        ...     dtype = np.dtype("float32")
        ...     def wrap(self, fn):
        ...         return fn
        >>> isinstance(Doubled(), Rung)
        True
    """

    dtype: Any

    def wrap(self, fn: Callable) -> Callable: ...


def normalize_ladder(ladder: Any, *, min_rungs: int = 1,
                     check_x64: bool = True) -> tuple[tuple[Any, ...], Ladder]:
    """``(rungs, Ladder of their dtypes)``; rungs keep Rung objects, dtypes are resolved.
    ``check_x64=False``: a float64 rung with x64 off is the caller's to handle (the
    runtime applies :mod:`adaptprec._x64_rule` when the kernel runs)."""
    if isinstance(ladder, Ladder):
        rungs: tuple[Any, ...] = ladder.rungs
    elif isinstance(ladder, str):
        rungs = Ladder.parse(ladder, check_x64=check_x64).rungs
    elif is_rung_object(ladder):
        rungs = (ladder,)
    elif isinstance(ladder, Sequence):
        rungs = tuple(ladder)
    else:
        raise ValueError(
            f"a ladder is a string such as 'bf16,f32,f64', a Ladder, or a sequence of dtypes "
            f"and Rung objects (with .dtype and .wrap(fn)); got {ladder!r}")
    dtypes = []
    out = []
    for r in rungs:
        if is_rung_object(r):
            dtypes.append(canonical_dtype(r.dtype, check_x64=check_x64))
            out.append(r)
        else:
            d = canonical_dtype(r, check_x64=check_x64)
            dtypes.append(d)
            out.append(d)
    lad = Ladder(dtypes, check_x64=check_x64)
    if len(lad) < min_rungs:
        raise ValueError(
            f"this ladder has {len(lad)} rung(s) ({lad}) but at least {min_rungs} are needed: "
            "escalation needs somewhere to go, e.g. ladder='bf16,f32,f64'")
    return tuple(out), lad
