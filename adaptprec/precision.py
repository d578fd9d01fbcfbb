"""Floating dtypes, their aliases and numerical constants, and the precision `Ladder`.

This is the bottom layer of adaptprec: everything else names precisions through
:func:`canonical_dtype` and climbs them through a :class:`Ladder`.

Aliases (case-insensitive, surrounding whitespace ignored):

=============================================  ===================================
alias                                          dtype
=============================================  ===================================
``bf16``, ``bfloat16``                         bfloat16 (8-bit mantissa, u = 2^-8)
``f16``, ``float16``                           float16 (11-bit mantissa, u = 2^-11)
``half``, ``h``, ``16``                        bfloat16 on TPU, float16 elsewhere
                                               (the rule jmp uses)
``f32``, ``float32``, ``single``, ``full``,    float32 (u = 2^-24)
``32``
``f64``, ``float64``, ``double``, ``64``       float64 (u = 2^-53); needs
                                               ``jax_enable_x64``
=============================================  ===================================

Example:
    >>> import adaptprec as ap
    >>> ap.canonical_dtype("bf16").name
    'bfloat16'
    >>> ap.unit_roundoff("f32") == 2.0 ** -24
    True
    >>> ladder = ap.Ladder.parse("bf16,f32")
    >>> [d.name for d in ladder]
    ['bfloat16', 'float32']
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, Union

import jax
import ml_dtypes
import numpy as np

__all__ = [
    "DTypeLike",
    "FLOATING_DTYPES",
    "ALIASES",
    "canonical_dtype",
    "half_dtype",
    "unit_roundoff",
    "max_value",
    "smallest_normal",
    "x64_enabled",
    "require_x64",
    "dtype_name",
    "Ladder",
]

DTypeLike = Union[str, np.dtype, type, Any]
"""What a dtype argument accepts: an alias (``"bf16"``, ``"f32"``, ``"half"``...), a NumPy
dtype, a scalar type (``jnp.float32``) or anything ``np.dtype`` reads."""

# Ordered from least to most precise (by unit roundoff). float16 is more precise than
# bfloat16 but has a far smaller range; the ordering is by precision, which is what
# escalation buys.
FLOATING_DTYPES: tuple[np.dtype, ...] = (
    np.dtype(ml_dtypes.bfloat16),
    np.dtype(np.float16),
    np.dtype(np.float32),
    np.dtype(np.float64),
)
"""The floating dtypes a ladder can hold, from least to most precise (by unit roundoff):
bfloat16, float16, float32, float64."""

ALIASES: dict[str, np.dtype] = {
    "bf16": np.dtype(ml_dtypes.bfloat16),
    "bfloat16": np.dtype(ml_dtypes.bfloat16),
    "f16": np.dtype(np.float16),
    "float16": np.dtype(np.float16),
    "f32": np.dtype(np.float32),
    "float32": np.dtype(np.float32),
    "single": np.dtype(np.float32),
    "full": np.dtype(np.float32),
    "32": np.dtype(np.float32),
    "f64": np.dtype(np.float64),
    "float64": np.dtype(np.float64),
    "double": np.dtype(np.float64),
    "64": np.dtype(np.float64),
}
"""Alias -> dtype for every string precision argument (``"bf16"``, ``"f32"``, ``"double"``,
``"full"``...). ``"half"``/``"h"``/``"16"`` are resolved per backend at call time
(:func:`half_dtype`: bfloat16 on TPU, float16 elsewhere), as jmp does."""
# Resolved per backend at call time, as jmp's ``half_dtype`` does.
_HALF_ALIASES = ("half", "h", "16")

_SHORT_NAMES = {
    "bfloat16": "bf16",
    "float16": "f16",
    "float32": "f32",
    "float64": "f64",
}


def _accepted_aliases() -> str:
    return ", ".join(sorted(set(ALIASES) | set(_HALF_ALIASES)))


def half_dtype() -> np.dtype:
    """The half-precision dtype for the default backend: bfloat16 on TPU, else float16.

    Example:
        >>> import adaptprec as ap
        >>> ap.half_dtype().name in ("float16", "bfloat16")
        True
    """
    on_tpu = jax.default_backend() == "tpu"
    return np.dtype(ml_dtypes.bfloat16) if on_tpu else np.dtype(np.float16)


def x64_enabled() -> bool:
    """Whether ``jax_enable_x64`` is on, i.e. whether float64 arrays really are float64.

    Example:
        >>> import adaptprec as ap
        >>> isinstance(ap.x64_enabled(), bool)
        True
    """
    return bool(jax.config.read("jax_enable_x64"))


def is_adaptive(precision) -> bool:
    """Whether a solver's ``precision`` argument is the string ``"adaptive"`` (any case,
    surrounding spaces allowed), the default ladder of the NLSQ entry points.

    Example:
        >>> from adaptprec.precision import is_adaptive
        >>> is_adaptive(" Adaptive"), is_adaptive("f32,f64")
        (True, False)
    """
    return isinstance(precision, str) and precision.strip().lower() == "adaptive"


_X64_MESSAGE = (
    "float64 was requested but jax_enable_x64 is off, so JAX would silently compute in "
    "float32. Turn it on before creating arrays: `jax.config.update('jax_enable_x64', "
    "True)` at the top of your program, or set the environment variable "
    "JAX_ENABLE_X64=1. adaptprec never changes this global setting for you."
)


def require_x64(dtype: DTypeLike) -> None:
    """Raise ``ValueError`` if ``dtype`` is float64 and ``jax_enable_x64`` is off.

    Example:
        >>> import adaptprec as ap
        >>> ap.require_x64("f32")  # always fine
    """
    if canonical_dtype(dtype, check_x64=False) == np.float64 and not x64_enabled():
        raise ValueError(_X64_MESSAGE)


def canonical_dtype(dtype: DTypeLike, *, check_x64: bool = True) -> np.dtype:
    """Resolve an alias, numpy/JAX dtype or scalar type to a floating ``np.dtype``.

    Raises ``ValueError`` for unknown aliases and for non-floating dtypes (ints, bools,
    complex), naming what was given and what is accepted. With ``check_x64`` (default),
    float64 while ``jax_enable_x64`` is off raises too, with instructions.

    Example:
        >>> import jax.numpy as jnp
        >>> import adaptprec as ap
        >>> ap.canonical_dtype("single") == ap.canonical_dtype(jnp.float32)
        True
        >>> ap.canonical_dtype("Half ") == ap.half_dtype()
        True
    """
    if isinstance(dtype, str):
        key = dtype.strip().lower()
        if key in _HALF_ALIASES:
            result = half_dtype()
        elif key in ALIASES:
            result = ALIASES[key]
        else:
            raise ValueError(
                f"unknown floating dtype alias {dtype!r}; accepted aliases are: "
                f"{_accepted_aliases()}"
            )
    else:
        try:
            result = np.dtype(dtype)
        except TypeError as exc:
            raise ValueError(
                f"cannot interpret {dtype!r} as a floating dtype; pass a dtype such as "
                f"jnp.float32 or one of the aliases: {_accepted_aliases()}"
            ) from exc
        if result not in FLOATING_DTYPES:
            raise ValueError(
                f"{dtype!r} ({result}) is not a supported floating dtype; expected one of "
                f"{', '.join(d.name for d in FLOATING_DTYPES)} or an alias: "
                f"{_accepted_aliases()}"
            )
    if check_x64 and result == np.float64 and not x64_enabled():
        raise ValueError(_X64_MESSAGE)
    return result


def dtype_name(dtype: DTypeLike) -> str:
    """The short canonical name of a floating dtype: ``bf16``, ``f16``, ``f32``, ``f64``.

    Example:
        >>> import adaptprec as ap
        >>> ap.dtype_name("double")
        'f64'
    """
    return _SHORT_NAMES[canonical_dtype(dtype, check_x64=False).name]


def unit_roundoff(dtype: DTypeLike) -> float:
    """Unit roundoff u = eps / 2 (round-to-nearest) of a floating dtype, as a Python float.

    Example:
        >>> import adaptprec as ap
        >>> ap.unit_roundoff("bf16") == 2.0 ** -8
        True
    """
    return float(ml_dtypes.finfo(canonical_dtype(dtype, check_x64=False)).eps) / 2.0


def max_value(dtype: DTypeLike) -> float:
    """Largest finite value of a floating dtype.

    Example:
        >>> import adaptprec as ap
        >>> ap.max_value("f16")
        65504.0
    """
    return float(ml_dtypes.finfo(canonical_dtype(dtype, check_x64=False)).max)


def smallest_normal(dtype: DTypeLike) -> float:
    """Smallest positive normal value of a floating dtype.

    Example:
        >>> import adaptprec as ap
        >>> ap.smallest_normal("f32") == 2.0 ** -126
        True
    """
    return float(ml_dtypes.finfo(canonical_dtype(dtype, check_x64=False)).smallest_normal)


def is_rung_object(r: Any) -> bool:
    """Whether ``r`` is a ladder rung that is more than a dtype: an object with ``.dtype``
    and ``.wrap(fn)`` (``adaptprec.runtime.Rung``; e.g. an autocast ``PrecisionPolicy``).
    A base predicate, so guards, runtime and schedule share it without importing each
    other.

    Example:
        >>> import numpy as np
        >>> from adaptprec.precision import is_rung_object
        >>> is_rung_object(np.dtype("float32")), is_rung_object("f32")
        (False, False)
    """
    return (not isinstance(r, (str, np.dtype, type))) and hasattr(r, "dtype") and callable(
        getattr(r, "wrap", None))


class Ladder(Sequence):
    """A strictly increasing sequence of floating precisions to escalate through.

    Each rung must be strictly more precise (smaller unit roundoff) than the one before.
    A ladder is immutable and hashable, so it can be a static argument under ``jit``.
    Constructing a ladder that contains float64 while ``jax_enable_x64`` is off raises
    ``ValueError`` explaining how to turn it on (pass ``check_x64=False`` to defer).

    Parse from ``"bf16,f32,f64"``, ``"bf16>f32>f64"``, or any sequence of aliases/dtypes.

    Example:
        >>> import adaptprec as ap
        >>> lad = ap.Ladder.parse("bf16 > f32")
        >>> len(lad), lad.top.name, lad.index("f32")
        (2, 'float32', 1)
        >>> str(lad)
        'bf16,f32'
        >>> ap.Ladder(["f32", "bf16"])
        Traceback (most recent call last):
        ...
        ValueError: ladder rungs must be strictly increasing in precision ...
    """

    __slots__ = ("_rungs",)

    def __init__(self, rungs: Sequence[DTypeLike] | str, *, check_x64: bool = True):
        if isinstance(rungs, Ladder):
            rungs = rungs.rungs
        if isinstance(rungs, str):
            text = rungs
            sep = ">" if ">" in text else ","
            parts = [p.strip() for p in text.split(sep)]
            if not text.strip() or any(not p for p in parts):
                raise ValueError(
                    f"cannot parse ladder {rungs!r}: expected rungs separated by ',' or "
                    f"'>' such as 'bf16,f32,f64'; accepted aliases are: "
                    f"{_accepted_aliases()}"
                )
            rungs = parts
        try:
            rungs = list(rungs)
        except TypeError as exc:
            raise ValueError(
                f"a ladder needs a string such as 'bf16,f32,f64' or a sequence of dtypes, "
                f"got {rungs!r}"
            ) from exc
        if not rungs:
            raise ValueError("a ladder needs at least one rung, e.g. 'bf16,f32,f64'")
        resolved = tuple(canonical_dtype(r, check_x64=check_x64) for r in rungs)
        for lo, hi in zip(resolved, resolved[1:]):
            if not unit_roundoff(hi) < unit_roundoff(lo):
                raise ValueError(
                    "ladder rungs must be strictly increasing in precision (decreasing unit "
                    f"roundoff); got {', '.join(dtype_name(d) for d in resolved)}, where "
                    f"{dtype_name(hi)} is not more precise than {dtype_name(lo)}. Order "
                    "them like 'bf16,f16,f32,f64'."
                )
        object.__setattr__(self, "_rungs", resolved)

    @classmethod
    def parse(cls, spec: Sequence[DTypeLike] | str, *, check_x64: bool = True) -> Ladder:
        """Build a ladder from ``"bf16,f32,f64"``, ``"bf16>f32>f64"`` or a sequence."""
        if isinstance(spec, Ladder):
            return spec
        return cls(spec, check_x64=check_x64)

    def __setattr__(self, name, value):
        raise AttributeError("Ladder is immutable")

    @property
    def rungs(self) -> tuple[np.dtype, ...]:
        """The rung dtypes, least precise first."""
        return self._rungs

    @property
    def bottom(self) -> np.dtype:
        """The cheapest (least precise) rung."""
        return self._rungs[0]

    @property
    def top(self) -> np.dtype:
        """The most precise rung."""
        return self._rungs[-1]

    @property
    def unit_roundoffs(self) -> tuple[float, ...]:
        """Unit roundoff of each rung."""
        return tuple(unit_roundoff(d) for d in self._rungs)

    def index(self, dtype: DTypeLike, *args) -> int:  # type: ignore[override]
        """Position of ``dtype`` on the ladder; ``ValueError`` if it is not a rung."""
        d = canonical_dtype(dtype, check_x64=False)
        try:
            return self._rungs.index(d)
        except ValueError:
            raise ValueError(
                f"{dtype_name(d)} is not a rung of ladder {self}"
            ) from None

    def __getitem__(self, i):
        if isinstance(i, slice):
            return Ladder(self._rungs[i], check_x64=False)
        return self._rungs[i]

    def __len__(self) -> int:
        return len(self._rungs)

    def __iter__(self) -> Iterator[np.dtype]:
        return iter(self._rungs)

    def __hash__(self) -> int:
        return hash(self._rungs)

    def __eq__(self, other) -> bool:
        if isinstance(other, Ladder):
            return self._rungs == other._rungs
        return NotImplemented

    def __str__(self) -> str:
        return ",".join(dtype_name(d) for d in self._rungs)

    def __repr__(self) -> str:
        return f"Ladder({str(self)!r})"
