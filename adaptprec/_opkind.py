"""Op kinds: which class of numerical behaviour each JAX primitive belongs to.

A :class:`PrecisionPolicy <adaptprec.PrecisionPolicy>` assigns a precision rule
per op kind (and optionally per primitive). The classification is by primitive *name* as it
appears in JAX 0.10 jaxprs (``jit`` — formerly ``pjit`` —, ``custom_jvp_call``,
``custom_vjp_call``, ``scan``, ``while``, ``cond``, ``scatter-add``...).

==================  ======================================================================
kind                primitives (examples)
==================  ======================================================================
COMPUTE             dot_general, conv_general_dilated, ragged_dot_general
REDUCTION           reduce_sum/max/min/prod, argmax/argmin, cumsum/cumprod/cummax/cummin,
                    cumlogsumexp, reduce_window_sum/max/min, reduce_precision
ELEMENTWISE         add, sub, mul, neg, abs, max, min, select_n, clamp, comparisons,
                    square, integer_pow, sign, floor, round, stop_gradient, ...
TRANSCENDENTAL      exp, exp2, log, log1p, expm1, pow, logistic, erf, erfc, erf_inv,
                    sqrt, rsqrt, cbrt, div, rem, tanh, sin, cos, lgamma, digamma, ...
LINALG              lu, cholesky, triangular_solve, qr/geqrf, eigh, eig, svd, schur, ...
DATA_MOVEMENT       reshape, transpose, broadcast_in_dim, slice, dynamic_slice, gather,
                    scatter*, concatenate, pad, rev, squeeze, sort, copy, iota, ...
CONTROL             jit, closed_call, remat2, custom_jvp_call, custom_vjp_call, scan,
                    while, cond (recursed into; the rule applies to loop carries)
BOUNDARY            the function's inputs and captured constants (not a primitive)
UNKNOWN             anything not in the table: runs at its input dtype, and
                    :func:`explain <adaptprec.explain>` lists it
==================  ======================================================================

``CONTROL`` and ``UNKNOWN`` are additions to the kinds named in the design: control-flow
primitives are not computed at all (their bodies are), but their loop carries need a rule.

Example:
    >>> from adaptprec import OpKind, classify
    >>> [classify(name).name for name in ("dot_general", "exp", "while")]
    ['COMPUTE', 'TRANSCENDENTAL', 'CONTROL']
    >>> classify("my_custom_primitive")
    <OpKind.UNKNOWN: 'unknown'>
    >>> OpKind.parse("Reduction")
    <OpKind.REDUCTION: 'reduction'>
"""

from __future__ import annotations

import enum
import re
from types import MappingProxyType

__all__ = ["OpKind", "PRIMITIVE_KINDS", "EXACT_REDUCTIONS", "ENTRYWISE", "AXIS_REDUCTIONS",
           "CALLS", "classify"]


class NamedEnum(enum.Enum):
    """An enum of string values that parses from a value's name: ``parse("Data-Movement")``
    (case-insensitive, ``-`` or ``_``); a ``ValueError`` lists the choices. The base of
    :class:`OpKind` and :class:`~adaptprec.Rule`."""

    @classmethod
    def parse(cls, value):
        """The member whose value is ``value`` (case-insensitive, ``-`` or ``_``), or
        ``value`` itself if it is a member; ``ValueError`` if none."""
        what = re.sub(r"(?<!^)(?=[A-Z])", " ", cls.__name__).lower()   # OpKind: "op kind"
        return _parse_enum(cls, value, what)


class OpKind(NamedEnum):
    """Numerical class of a JAX primitive; the key of a precision policy's rules.

    Example:
        >>> from adaptprec import OpKind
        >>> [k.value for k in OpKind][:3]
        ['compute', 'reduction', 'elementwise']
        >>> OpKind.parse("data_movement") is OpKind.DATA_MOVEMENT
        True
    """

    COMPUTE = "compute"
    REDUCTION = "reduction"
    ELEMENTWISE = "elementwise"
    TRANSCENDENTAL = "transcendental"
    LINALG = "linalg"
    DATA_MOVEMENT = "data_movement"
    CONTROL = "control"
    BOUNDARY = "boundary"
    UNKNOWN = "unknown"


def _parse_enum(cls, value, what: str):
    """The member of enum ``cls`` whose value is ``value`` (case-insensitive, ``-`` = ``_``)."""
    if isinstance(value, cls):
        return value
    if isinstance(value, str):
        key = value.strip().lower().replace("-", "_")
        for member in cls:
            if member.value == key:
                return member
    raise ValueError(f"unknown {what} {value!r}; {what}s are: "
                     f"{', '.join(m.value for m in cls)}")


def _table() -> dict[str, OpKind]:
    k = OpKind
    groups: dict[OpKind, str] = {
        k.COMPUTE: "dot_general conv_general_dilated ragged_dot_general scaled_dot "
                   "scaled_matmul",
        k.REDUCTION: "reduce_sum reduce_max reduce_min reduce_prod argmax argmin cumsum "
                     "cumprod cummax cummin cumlogsumexp reduce_window_sum "
                     "reduce_window_max reduce_window_min reduce_precision reduce_and "
                     "reduce_or reduce_xor",
        k.ELEMENTWISE: "add add_any sub mul neg abs max min select_n clamp sign floor ceil "
                       "round square integer_pow is_finite nextafter stop_gradient eq ne "
                       "lt le gt ge and or not xor real imag conj complex "
                       "shift_left shift_right_arithmetic shift_right_logical "
                       "population_count clz",
        k.TRANSCENDENTAL: "exp exp2 log log1p expm1 pow logistic erf erfc erf_inv sqrt "
                          "rsqrt cbrt div rem tanh tan sin cos sinh cosh asin acos atan "
                          "asinh acosh atanh atan2 lgamma digamma polygamma igamma igammac "
                          "igamma_grad_a bessel_i0e bessel_i1e zeta random_gamma "
                          "regularized_incomplete_beta",
        k.LINALG: "lu cholesky cholesky_update triangular_solve qr geqrf geqp3 "
                  "householder_product ormqr eigh eig svd schur hessenberg tridiagonal "
                  "tridiagonal_solve lu_pivots_to_permutation symmetric_product "
                  "custom_linear_solve fft",
        k.DATA_MOVEMENT: "reshape transpose broadcast_in_dim slice dynamic_slice "
                         "dynamic_update_slice gather scatter scatter-add scatter-sub "
                         "scatter-mul scatter-min scatter-max concatenate pad rev squeeze "
                         "expand_dims sort top_k copy copy_p device_put iota split tile "
                         "select_and_gather_add select_and_scatter_add "
                         "optimization_barrier sharding_constraint bitcast_convert_type "
                         "convert_element_type debug_print debug_callback",
        k.CONTROL: "jit pjit closed_call core_call remat2 checkpoint custom_jvp_call "
                   "custom_vjp_call custom_vjp_call_jaxpr scan while cond",
    }
    return {name: kind for kind, names in groups.items() for name in names.split()}


PRIMITIVE_KINDS = MappingProxyType(_table())
"""JAX primitive name -> :class:`OpKind` (read-only): how autocast classifies each
primitive (``"dot_general"`` is ``OpKind.COMPUTE``, ``"exp"`` ``OpKind.TRANSCENDENTAL``...)."""

#: Reductions that are exact in any floating precision (max/min/arg*), so "accumulate in
#: float32" needs no cast for them.
EXACT_REDUCTIONS = frozenset(
    "reduce_max reduce_min argmax argmin cummax cummin reduce_window_max "
    "reduce_window_min reduce_and reduce_or reduce_xor".split()
)


#: Primitives that compute each output entry from the same entry of every operand (rank-0
#: operands broadcast): the ELEMENTWISE and TRANSCENDENTAL kinds (but ``random_gamma``,
#: which consumes a key) and the value-preserving casts. Shape analyses treat them alike
#: whatever their precision class: the pointwise analysis of a residual
#: (:mod:`adaptprec._pointwise`) and the fits-last evaluator
#: (:mod:`adaptprec.batch._fits_last`).
ENTRYWISE = frozenset(
    {n for n, kind in PRIMITIVE_KINDS.items()
     if kind in (OpKind.ELEMENTWISE, OpKind.TRANSCENDENTAL)} - {"random_gamma"}
    | {"convert_element_type", "reduce_precision", "copy", "copy_p"}
)

#: Reductions over a set of axes (parameter ``axes``); the other REDUCTION primitives
#: (cumulative, windowed) keep their operand's shape.
AXIS_REDUCTIONS = frozenset(
    "reduce_sum reduce_max reduce_min reduce_prod reduce_and reduce_or reduce_xor argmax "
    "argmin".split()
)

#: Call primitives (CONTROL): apply their body (``params["jaxpr"]``, ``"call_jaxpr"`` for
#: ``closed_call``/``core_call``) to their operands as is,
#: so an interpreter may inline them (:func:`adaptprec._jaxpr.call_body`).
CALLS = frozenset(("jit", "pjit", "closed_call", "core_call"))


def classify(primitive_name: str) -> OpKind:
    """The :class:`OpKind` of a primitive name; ``OpKind.UNKNOWN`` if it is not in the table.

    Example:
        >>> from adaptprec import classify
        >>> classify("reduce_sum").name, classify("scatter-add").name
        ('REDUCTION', 'DATA_MOVEMENT')
    """
    return PRIMITIVE_KINDS.get(primitive_name, OpKind.UNKNOWN)
