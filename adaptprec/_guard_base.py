"""The guard protocol: :class:`GuardContext` in, :class:`GuardResult` out, the reason codes.

Every guard (:mod:`adaptprec.guards`) subclasses :class:`Guard`; the runtime builds one
:class:`GuardContext` per attempt of a kernel on a rung and validates what each guard
returns (a scalar bool or a :class:`GuardResult`; anything else is a ``TypeError`` naming
the guard).
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ._status import Reason, reason_name
from ._policy import _is_floating_array, cast_floating
from .precision import canonical_dtype, is_rung_object, unit_roundoff

__all__ = ["GuardResult", "GuardContext", "Guard", "code_name", "OK", "NONFINITE",
           "OVERFLOW", "UNDERFLOW", "ILL_CONDITIONED", "MATRIX_ILL_CONDITIONED", "RESIDUAL",
           "BACKWARD_ERROR", "PREDICATE", "INACCURATE", "CANCELLATION", "SPOT_CHECK"]

#: Reason codes carried by :class:`GuardResult` (0 means the guard passed): the values of
#: :class:`adaptprec.Reason`, the one reason vocabulary of runtime, nlsq, batch and linalg.
OK = Reason.NONE
"""0: the guard passed (``Reason.NONE``)."""
NONFINITE = Reason.NONFINITE
"""1: a NaN or Inf in the checked values (:func:`finite`)."""
OVERFLOW = Reason.OVERFLOW
"""2: an output used more than ``fraction`` of the rung's range, so the next
operation could overflow (:func:`headroom`)."""
UNDERFLOW = Reason.UNDERFLOW
"""3: a nonzero input was flushed to zero by the cast to the rung (:func:`headroom`)."""
ILL_CONDITIONED = Reason.ILL_CONDITIONED
"""4: the function's condition estimate times the rung's unit roundoff is
above ``tol`` (:func:`condition`, :func:`conditioned`)."""
MATRIX_ILL_CONDITIONED = Reason.MATRIX_ILL_CONDITIONED
"""5: a matrix argument's condition estimate (Hager–Higham) times the
unit roundoff is above ``tol`` (:func:`matrix_condition`)."""
RESIDUAL = Reason.RESIDUAL
"""6: the user's residual check of the output is above ``tol`` (:func:`residual`)."""
BACKWARD_ERROR = Reason.BACKWARD_ERROR
"""7: the normwise backward error of a linear solve's ``x`` is above ``tol``
(:func:`backward_error`)."""
PREDICATE = Reason.PREDICATE
"""8: the user's predicate returned false (:func:`predicate`)."""
INACCURATE = Reason.INACCURATE
"""9: the estimated rounding error of the output is above ``rtol``
(:func:`accuracy`, Monte Carlo arithmetic)."""
CANCELLATION = Reason.CANCELLATION
"""10: as :data:`INACCURATE`, and the error comes from an unstable cancellation
(an add/sub amplifying rounding by more than ``rtol``) (:func:`accuracy`)."""
SPOT_CHECK = Reason.SPOT_CHECK
"""11: a sample of the output disagrees with the next rung's by more than ``rtol``
(:func:`spot_check`)."""


def code_name(code: int) -> str:
    """Readable name of a reason code (user codes print as ``code <n>``).

    Example:
        >>> from adaptprec import guards
        >>> guards.code_name(guards.OVERFLOW)
        'overflow'
    """
    return reason_name(code)


class GuardResult(NamedTuple):
    """Outcome of one guard: ``ok`` (bool), reason ``code`` (int32, 0 when ok), ``value``.

    ``value`` (float32) is what the guard measured: a count of non-finite entries, a
    condition estimate, a residual... Build one with :meth:`make`.

    Example:
        >>> from adaptprec.guards import GuardResult
        >>> r = GuardResult.make(False, 7, 3e-3)
        >>> bool(r.ok), int(r.code), r.value.dtype.name
        (False, 7, 'float32')
    """

    ok: jax.Array
    code: jax.Array
    value: jax.Array

    @classmethod
    def make(cls, ok, code, value=float("nan")) -> GuardResult:
        """Scalar result; ``code`` is reported only when the guard fires (else 0)."""
        ok = jnp.asarray(ok, bool)
        code = jnp.where(ok, 0, jnp.asarray(code, jnp.int32)).astype(jnp.int32)
        return cls(ok, code, jnp.asarray(value).astype(jnp.float32))


class GuardContext(NamedTuple):
    """Everything a guard may look at for one attempt at one rung.

    Attributes:
        fn: the callable that ran at this rung (takes the cast inputs).
        args, kwargs: inputs cast to the rung dtype (what ``fn`` received).
        inputs: ``(args, kwargs)`` as the user passed them (uncast).
        out: ``fn``'s output at this rung (before any output cast).
        dtype: the rung's dtype; ``u``: its unit roundoff; ``rung``: its ladder index.
        next_rung: ``None`` on the top rung or under ``vmap``; else a thunk returning the
            output leaves recomputed on the next rung (cast like ``cast_out``).
        batched: whether the runtime evaluates this guard per element of a vmapped batch.
        cast_out: the output leaves cast to the runtime's output dtype (or ``None``).
        check: how an accuracy guard checks this rung, chosen by the runtime's plan
            (:mod:`adaptprec._plan`): ``"mca"`` (Monte Carlo arithmetic, the default),
            ``"first_order"`` (first-order error bound at the working precision),
            ``"sample"``/``"sample_rows"``/``"sample_conv"``/``"probe"`` (sampled
            re-evaluations in the widest dtype) or ``"screen"`` (cancellation screen
            only, top rung).
        prepared: work the runtime did for the check while computing ``out`` (the
            first-order walk that computed the rung's outputs, so a loop runs once), or
            ``None``.

    Example:
        >>> import jax.numpy as jnp
        >>> from adaptprec import guards
        >>> x = jnp.array([1.0, 2.0])
        >>> ctx = guards.GuardContext(jnp.exp, (x,), {}, ((x,), {}), jnp.exp(x),
        ...                           x.dtype, 2.0 ** -24)
        >>> bool(guards.finite()(ctx).ok)
        True
    """

    fn: Callable
    args: tuple
    kwargs: dict
    inputs: tuple
    out: Any
    dtype: np.dtype
    u: float
    rung: int = 0
    next_rung: Callable | None = None
    batched: bool = False
    cast_out: tuple | None = None
    check: str | None = None
    prepared: Any = None


def _check_scalar(x, what: str, name: str) -> jax.Array:
    try:
        arr = jnp.asarray(x)
    except TypeError:
        arr = None
    if arr is None or arr.shape != ():
        got = (f"an array of shape {arr.shape}" if arr is not None
               else f"a {type(x).__name__}")
        raise TypeError(
            f"guard {name} returned {got} for its {what}; a guard must return a scalar "
            "bool (True = trustworthy) or a GuardResult(ok, code, value) of scalars. "
            "Reduce array checks with jnp.all(...).")
    return arr


def _validate(result, name: str, default_code: int) -> GuardResult:
    if isinstance(result, GuardResult):
        ok = _check_scalar(result.ok, "ok field", name)
        code = _check_scalar(result.code, "code field", name)
        value = _check_scalar(result.value, "value field", name)
        if ok.dtype != bool:
            raise TypeError(f"guard {name} returned GuardResult.ok of dtype {ok.dtype}; "
                            "it must be a bool scalar")
        return GuardResult.make(ok, code, value)
    if isinstance(result, (bool, np.bool_)) or (
            hasattr(result, "dtype") and hasattr(result, "shape")):
        ok = _check_scalar(result, "result", name)
        if ok.dtype != bool:
            raise TypeError(
                f"guard {name} returned a {ok.dtype} scalar; a guard must return a bool "
                "scalar (True = trustworthy) or a GuardResult(ok, code, value). Compare "
                "explicitly, e.g. `err < tol`.")
        return GuardResult.make(ok, default_code, jnp.where(ok, 0.0, 1.0))
    raise TypeError(
        f"guard {name} returned {type(result).__name__} ({result!r:.60}); a guard must "
        "return a scalar bool (True = trustworthy) or a GuardResult(ok, code, value)")


def _float_leaves(tree) -> list:
    return [x for x in jax.tree_util.tree_leaves(tree) if _is_floating_array(x)]


def _wide(dtype) -> np.dtype:
    """``dtype`` promoted to at least float32 (where guards accumulate)."""
    return np.dtype(jnp.promote_types(dtype, jnp.float32))


class Guard(abc.ABC):
    """Base class of guards: implement :meth:`check` and set ``code``.

    ``guard(ctx)`` runs :meth:`check` and validates its result (a scalar bool or a
    :class:`GuardResult`; anything else is a ``TypeError`` naming the guard).

    Example:
        >>> import jax.numpy as jnp
        >>> from adaptprec import guards
        >>> class Positive(guards.Guard):
        ...     code = 100
        ...     def check(self, ctx):
        ...         return jnp.all(ctx.out > 0)
        >>> bool(Positive().evaluate(jnp.sin, jnp.array([1.0, 2.0])).ok)
        True
    """

    code: int = PREDICATE
    #: What a passing guard verifies, for reports: ``"finite"`` (finiteness / range only),
    #: ``"accuracy"`` (an error estimate against ``rtol``), ``"spot_check"`` or ``"other"``.
    #: (``"accuracy"``/``"spot_check"`` guards also carry the ``rtol`` they verify.)
    role: str = "other"

    @abc.abstractmethod
    def check(self, ctx: GuardContext) -> GuardResult | jax.Array:
        """The check itself (jit-safe: no Python branches on traced values)."""

    #: Report label, a ``str.format`` template over the guard's fields (``{self.tol:g}``);
    #: ``None``: the class name.
    label: str | None = None

    @property
    def name(self) -> str:
        """Short label used in reports."""
        if self.label is None:
            return type(self).__name__
        return self.label.format(self=self, fn_name=getattr(
            getattr(self, "check_fn", getattr(self, "fn", None)), "__name__", "fn"))

    def __call__(self, ctx: GuardContext) -> GuardResult:
        return _validate(self.check(ctx), self.name, self.code)

    def evaluate(self, fn: Callable, *args, dtype=None, **kwargs) -> GuardResult:
        """Run ``fn`` at ``dtype`` (default: the inputs' floating dtype) and check it.

        A convenience for trying a guard outside the runtime.
        """
        if dtype is None:
            leaves = _float_leaves((args, kwargs))
            dtype = jnp.result_type(*leaves) if leaves else jnp.float32
        if is_rung_object(dtype):
            fn, dtype = dtype.wrap(fn), dtype.dtype
        dtype = canonical_dtype(dtype)
        cargs, ckw = cast_floating((args, kwargs), dtype)
        out = fn(*cargs, **ckw)
        ctx = GuardContext(fn, cargs, ckw, (args, kwargs), out, dtype, unit_roundoff(dtype))
        return self(ctx)
