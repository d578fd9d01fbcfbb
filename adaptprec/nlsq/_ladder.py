"""The ladder a solve climbs: ``precision=`` resolved (:func:`resolve_ladder`) and, for an
``"adaptive"`` solve of a small problem on CPU, float64 alone (:data:`SMALL_F64_MN`,
with the ladder's top-rung stopping rules; docs/architecture.md, "Where the design
changed").

Example:
    >>> from adaptprec.nlsq._ladder import resolve_ladder
    >>> str(resolve_ladder("f32,f64"))
    'f32,f64'
"""

from __future__ import annotations

import jax

from ..precision import Ladder, canonical_dtype, is_adaptive, x64_enabled

__all__ = ["resolve_ladder", "SMALL_F64_MN"]

#: ``precision="adaptive"`` runs float64 alone on CPU when ``m n`` (residuals times
#: parameters) is below this: there a float32 rung saves nothing, since the step's cost
#: is dispatch and small dense algebra, not memory traffic. Measured
#: (curve_fit of a 3-parameter exponential, repeat fits, x64 off, 2 cores): float64
#: alone takes 0.84, 0.81 and 0.80 of the ladder's time at m = 120, 1000 and 4000,
#: 0.98 at 16000 and 1.04 at 64000. It also compiles one rung instead of two:
#: NIST StRD (54 solves) including compilation 5.5 s against 6.6 s. Such a solve keeps
#: the ladder's top-rung stopping rules (``LoopConfig.adaptive_stop``), which the
#: accuracy needs: with scipy's rules alone float64 ends at LRE 6.8 on NIST Lanczos3
#: start 2 (the ladder: 9.3). docs/architecture.md, "float64 alone for small problems".
SMALL_F64_MN = 32768


def resolve_ladder(precision) -> Ladder:
    """The ladder for ``precision``: ``"adaptive"`` is ``f32 -> f64`` (bf16 is not faster
    than f32 on CPU and loses too much for a Jacobian; ``solve_nlsq`` keeps only float64
    for a small problem on CPU, :data:`SMALL_F64_MN`), a :class:`~adaptprec.Ladder` or
    ``"f32,f64"`` string is used as given, and a single dtype means fixed precision.
    ``"adaptive"`` with ``jax_enable_x64`` off raises ``ValueError`` (a float32-only answer
    only when asked for; the entry points run eager calls inside ``jax.enable_x64(True)``).

    Example:
        >>> from adaptprec.nlsq.solve import resolve_ladder
        >>> str(resolve_ladder("f32"))
        'f32'
    """
    if isinstance(precision, Ladder):
        return precision
    if is_adaptive(precision):
        if not x64_enabled():
            raise ValueError(
                "precision='adaptive' ends on float64, but jax_enable_x64 is off here: "
                "call resolve_ladder inside jax.enable_x64(True) (as the eager entry points "
                "do), or ask for float32 explicitly with precision='f32'.")
        return Ladder(["f32", "f64"])
    if isinstance(precision, str) and ("," in precision or ">" in precision):
        return Ladder.parse(precision)
    if isinstance(precision, (list, tuple)):
        return Ladder(list(precision))
    return Ladder([canonical_dtype(precision)])


def _starts_on_float64(precision, schedule, m: int, n: int) -> bool:
    """Whether an ``"adaptive"`` solve runs on float64 alone (:data:`SMALL_F64_MN`):
    the default ladder (no schedule) on CPU with ``m n`` below the crossover."""
    return (is_adaptive(precision) and schedule is None and m * n < SMALL_F64_MN
            and jax.default_backend() == "cpu")
