"""Guards: jit-safe checks of whether a rung's result can be trusted.

A guard looks at one attempt of a kernel at one rung (a :class:`GuardContext`: the
rung's callable, its cast inputs, the original inputs, the output, the rung dtype and unit
roundoff ``u``) and returns a :class:`GuardResult` ``(ok, code, value)`` of scalars. The
runtime evaluates every guard at every rung it tries; a guard that is not ``ok`` makes it
escalate, and the :class:`~adaptprec.Report` records each guard's code and value.

===================================  ====================================================
guard                                fires (``ok`` false) when
===================================  ====================================================
``finite()``                         the output has a NaN or Inf
``headroom(fraction)``               ``max|out| > fraction * finfo(rung).max``, or a
                                     nonzero input was flushed to zero by the cast
``condition(tol)``                   ``kappa * u_rung > tol``, kappa a relative condition
                                     estimate from a few JVPs along random directions
``matrix_condition(tol)``            ``kappa_1(A) * u_rung > tol`` (Hager–Higham)
``residual(check_fn, tol)``          ``check_fn(out, *inputs) > tol``
``backward_error(tol)``              normwise backward error of ``x = fn(A, b)`` > tol
``predicate(fn)``                    ``fn(out, *inputs)`` is false
``accuracy(rtol, samples=2)``        Monte Carlo arithmetic (random rounding) estimates
                                     a relative error above ``rtol``, an add/sub cancels
                                     more than ``rtol / u``, or a discrete result/decision
                                     is unstable; value: estimated significant digits
``spot_check(rtol, sample=k)``       ``k`` elements of a vmapped batch recomputed on the
                                     next rung disagree by more than ``rtol``
===================================  ====================================================

A plain function in a guard list is treated as ``predicate(fn)``. Guards compose by
listing them; the runtime escalates when any fires.

Solvers that already hold their evaluation on a rung (nlsq's residual, trial point and
factor) run the same tests on it directly: :func:`finite_values` (the test of ``finite()``)
and :func:`conditioned` (the test of ``condition``/``matrix_condition`` on a ``kappa`` the
solver estimated), each a :class:`GuardResult` whose code is a :class:`~adaptprec.Reason`.

Example:
    >>> import jax.numpy as jnp
    >>> from adaptprec import guards
    >>> g = guards.finite()
    >>> r = g.evaluate(jnp.exp, jnp.array([1.0, 100.0]), dtype="f32")
    >>> bool(r.ok), int(r.code) == guards.NONFINITE, float(r.value)
    (False, True, 1.0)
    >>> bool(g.evaluate(jnp.exp, jnp.array([1.0, 100.0]), dtype="f64").ok)
    True
"""

from __future__ import annotations

import abc
import dataclasses
import functools
import math
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ._normest import norm1_estimate
from ._status import Reason, reason_name
from ._policy import _is_floating_array, cast_floating
from .precision import canonical_dtype, is_rung_object, max_value, unit_roundoff

__all__ = [
    "GuardResult",
    "GuardContext",
    "Guard",
    "finite",
    "finite_values",
    "conditioned",
    "headroom",
    "condition",
    "matrix_condition",
    "residual",
    "backward_error",
    "predicate",
    "accuracy",
    "spot_check",
    "output_error",
    "as_guard",
    "code_name",
    "OK",
    "NONFINITE",
    "OVERFLOW",
    "UNDERFLOW",
    "ILL_CONDITIONED",
    "MATRIX_ILL_CONDITIONED",
    "RESIDUAL",
    "BACKWARD_ERROR",
    "PREDICATE",
    "INACCURATE",
    "CANCELLATION",
    "SPOT_CHECK",
]

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
        check: how an accuracy guard checks this rung, chosen by the runtime's cost
            model (:mod:`adaptprec._cost`): ``"mca"`` (Monte Carlo arithmetic, the
            default), ``"first_order"`` (first-order error bound at the working
            precision) or ``"screen"`` (cancellation screen only, top rung).

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


# ---------------------------------------------------------------------------- finite


@dataclasses.dataclass(frozen=True)
class _Finite(Guard):
    code = NONFINITE
    role = "finite"
    label = "finite"

    def check(self, ctx):
        # the value returned is the output cast to the output dtype: e^100 is finite on
        # float64 and inf in the float32 the caller gets (newcomer audit 3)
        if ctx.cast_out is None:
            return finite_values(ctx.out)
        raw_leaves = _float_leaves(ctx.out)
        cast_leaves = _float_leaves(tuple(ctx.cast_out))
        if len(raw_leaves) == len(cast_leaves) and all(
                jnp.finfo(c.dtype).maxexp >= jnp.finfo(r.dtype).maxexp
                for r, c in zip(raw_leaves, cast_leaves)):
            # a cast to an equal or wider range keeps finite values finite and non-finite
            # ones non-finite: one pass over the rung's own output is enough,
            # in its dtype (fewer bytes, and the runtime casts only the accepted output)
            return finite_values(ctx.out)
        cast = finite_values(tuple(ctx.cast_out))
        raw = finite_values(ctx.out)
        # value: the non-finite entries of the output (raw or as returned, the larger)
        return GuardResult.make(raw.ok & cast.ok, NONFINITE,
                                jnp.maximum(raw.value, cast.value))


def finite_values(values: Any) -> GuardResult:
    """The check of :func:`finite` on values a caller already holds (a solver's residual
    and trial point): ``NONFINITE`` unless every floating leaf of ``values`` is finite;
    value = how many entries are not. Jit-safe; the solvers' per-evaluation check.

    Example:
        >>> import jax.numpy as jnp
        >>> from adaptprec import guards
        >>> r = guards.finite_values((jnp.array([1.0, jnp.nan]), jnp.float32(2.0)))
        >>> bool(r.ok), int(r.code), float(r.value)
        (False, 1, 1.0)
    """
    leaves = _float_leaves(values)

    def count(xs):
        return sum((jnp.sum(~jnp.isfinite(x), dtype=jnp.float32) for x in xs),
                   jnp.float32(0))

    if sum(x.size for x in leaves) <= _FINITE_SMALL:
        # a few entries (a scalar cost, a small output): counted directly, no ``cond``
        # (two conditionals were ~10-20 us of a 0.7 ms kernel's report)
        bad = count(leaves)
        return GuardResult.make(bad == 0, NONFINITE, bad)
    # one exact pass per leaf (_all_finite); the count runs only on failure
    from ._first_order import materialized
    ok = functools.reduce(
        jnp.logical_and, (materialized(_all_finite, x) if x.size else jnp.asarray(True)
                          for x in leaves), jnp.asarray(True))
    bad = jax.lax.cond(ok, lambda xs: jnp.float32(0), count, leaves)
    return GuardResult.make(ok, NONFINITE, bad)


#: Entries up to which :func:`finite_values` counts the non-finite ones directly
#: (exact: a sum of ``isfinite`` flags, not a max that XLA:CPU may let NaN through).
_FINITE_SMALL = 1024


#: Entries per row of the matrix-vector product in :func:`_all_finite`, and the power of
#: two every entry is scaled by there (a sum of fewer than 2**60 scaled finite entries of
#: float32 range or wider cannot overflow; a product by a power of two is exact).
_FINITE_BLOCK, _FINITE_SCALE = 2048, 2.0 ** -64


def _all_finite(x) -> jax.Array:
    """Whether every entry of ``x`` is finite, exactly: ``isfinite`` of a sum of the
    entries scaled by ``_FINITE_SCALE``. A NaN or an infinity makes the sum NaN or
    infinite (``inf + -inf`` is NaN); finite entries cannot overflow it.

    Not ``isfinite(max|x|)``: XLA:CPU's vectorized max drops NaN on arrays of 4096
    entries or more (it returned 1.0 for ones with one NaN), so that check
    passed NaN outputs. The sum is a matrix-vector product by a constant when the size
    allows (XLA:CPU runs it on every core: ~0.25x of a light float64 kernel on 2^20
    entries, against ~0.7x for a plain sum or max), else a plain sum. Call it on a
    materialized operand (:func:`adaptprec._first_order.materialized`).
    """
    w = np.dtype(jnp.promote_types(x.dtype, jnp.float32))
    x = x.reshape(-1)
    if x.dtype != w:
        x = x.astype(w)
    n = x.shape[0]
    if n % _FINITE_BLOCK == 0 and n >= 4 * _FINITE_BLOCK:
        rows = jnp.matmul(x.reshape(-1, _FINITE_BLOCK),
                          jnp.full((_FINITE_BLOCK,), _FINITE_SCALE, w),
                          precision=jax.lax.Precision.HIGHEST)
        return jnp.isfinite(jnp.sum(rows))
    return jnp.isfinite(jnp.sum(x * jnp.asarray(_FINITE_SCALE, w)))


def conditioned(kappa, u, tol, code: int = ILL_CONDITIONED) -> GuardResult:
    """``code`` (default ``ILL_CONDITIONED``) when the condition estimate ``kappa`` has
    ``kappa * u > tol``: the relative error the rung's rounding may cause exceeds ``tol``.
    value = ``kappa``. The test of :func:`condition` and :func:`matrix_condition`, and of a
    solver that estimates ``kappa`` itself (nlsq: the singular values of its factor; batch:
    one estimate per fit, the test applies elementwise). A NaN estimate does not fire
    (those guards map it to ``inf`` first).

    Example:
        >>> from adaptprec import guards
        >>> r = guards.conditioned(1e4, 2.0 ** -24, 1e-3)
        >>> bool(r.ok), guards.code_name(int(r.code))
        (True, 'ok')
        >>> guards.code_name(int(guards.conditioned(1e6, 2.0 ** -24, 1e-2).code))
        'ill-conditioned'
    """
    kappa = jnp.asarray(kappa)
    return GuardResult.make(~(kappa * u > tol), code, kappa)


def finite() -> Guard:
    """Fires when any floating output leaf has a NaN or Inf; value = how many.

    Example:
        >>> import jax.numpy as jnp
        >>> from adaptprec import guards
        >>> bool(guards.finite().evaluate(jnp.log, jnp.array([1.0, 2.0])).ok)
        True
    """
    return _Finite()


# -------------------------------------------------------------------------- headroom


@dataclasses.dataclass(frozen=True)
class _Headroom(Guard):
    fraction: float
    code = OVERFLOW
    role = "finite"
    label = "headroom({self.fraction:g})"

    def check(self, ctx):
        big = max_value(ctx.dtype)
        ratio = jnp.float32(0)
        from ._first_order import nan_max_abs    # a NaN must fail the guard
        for x in _float_leaves(ctx.out):
            m = nan_max_abs(x.astype(_wide(x.dtype))) if x.size else 0.0
            # 1/max is subnormal for bf16/f32/f64 and XLA:CPU flushes it to zero; it also
            # rewrites any division by a constant into a product with the reciprocal, so
            # m * (1/max) was always 0 and the guard never fired (newcomer audit 3). In
            # log2 no constant is subnormal: max|out| / max = 2^(log2 max|out| - log2 max)
            ratio = jnp.maximum(ratio, jnp.exp2((jnp.log2(m) - math.log2(big))
                                                .astype(jnp.float32)))
        ratio = jnp.where(jnp.isnan(ratio), jnp.inf, ratio)
        room_ok = ratio <= self.fraction
        # nonzero inputs flushed to zero by the cast to the rung
        flushed = jnp.float32(0)
        orig = jax.tree_util.tree_leaves(ctx.inputs)
        cast = jax.tree_util.tree_leaves((ctx.args, ctx.kwargs))
        for o, c in zip(orig, cast):
            if _is_floating_array(o) and _is_floating_array(c) and o.shape == c.shape:
                flushed = flushed + jnp.sum((o != 0) & (c == 0), dtype=jnp.float32)
        flush_ok = flushed == 0
        code = jnp.where(flush_ok, OVERFLOW, UNDERFLOW)
        value = jnp.where(flush_ok, ratio, flushed)
        return GuardResult.make(room_ok & flush_ok, code, value)


def headroom(fraction: float = 0.5) -> Guard:
    """Fires on overflow risk or on inputs flushed to zero by the cast to the rung.

    Overflow risk: ``max|out| > fraction * finfo(rung).max`` (value: ``max|out| / max``,
    code ``OVERFLOW``). Flush: a nonzero input that became zero when cast to the rung
    (value: how many, code ``UNDERFLOW``).

    Example:
        >>> import jax.numpy as jnp
        >>> from adaptprec import guards
        >>> g = guards.headroom(0.5)
        >>> bool(g.evaluate(lambda x: x * 400.0, jnp.array([100.0]), dtype="f16").ok)
        False
        >>> r = g.evaluate(lambda x: x, jnp.array([1e-30]), dtype="f16")
        >>> bool(r.ok), guards.code_name(r.code)
        (False, 'underflow')
    """
    if not (isinstance(fraction, (int, float)) and 0 < fraction <= 1):
        raise ValueError(f"headroom fraction must be in (0, 1], got {fraction!r}")
    return _Headroom(float(fraction))


# ------------------------------------------------------------------------- condition


def _split_floating(args, kwargs):
    leaves, treedef = jax.tree_util.tree_flatten((args, kwargs))
    pos = [i for i, x in enumerate(leaves) if _is_floating_array(x)]
    return leaves, treedef, pos


@dataclasses.dataclass(frozen=True)
class _Condition(Guard):
    tol: float
    n_dirs: int
    seed: int
    code = ILL_CONDITIONED
    label = "condition({self.tol:g})"

    def check(self, ctx):
        leaves, treedef, pos = _split_floating(ctx.args, ctx.kwargs)
        if not pos:
            return GuardResult.make(True, ILL_CONDITIONED, 0.0)
        xs = [leaves[i] for i in pos]

        def f_flat(*xs_):
            full = list(leaves)
            for i, x in zip(pos, xs_):
                full[i] = x
            a, kw = jax.tree_util.tree_unflatten(treedef, full)
            outs = _float_leaves(ctx.fn(*a, **kw))
            return jnp.concatenate([o.astype(_wide(o.dtype)).ravel() for o in outs])

        y, lin = jax.linearize(f_flat, *xs)
        keys = jax.random.split(jax.random.PRNGKey(self.seed), len(xs))
        # componentwise relative perturbations x * r, r_i = +-1: ||x * r|| = ||x||
        dirs = [jax.random.rademacher(k, (self.n_dirs,) + x.shape, jnp.int8).astype(x.dtype)
                * x for k, x in zip(keys, xs)]
        ts = jax.vmap(lin)(*dirs)
        wide = _wide(ts.dtype)
        tnorm = jnp.max(jnp.linalg.norm(ts.astype(wide), axis=1))
        ynorm = jnp.linalg.norm(y.astype(wide))
        kappa = jnp.where(tnorm == 0, 0.0, tnorm / ynorm)
        kappa = jnp.where(jnp.isnan(kappa), jnp.inf, kappa)
        return conditioned(kappa, ctx.u, self.tol)


def condition(tol: float = 1e-2, *, n_dirs: int = 2, seed: int = 0) -> Guard:
    """Fires when a relative condition estimate ``kappa`` has ``kappa * u_rung > tol``.

    ``kappa = max_k ||J (x * r_k)||_2 / ||f(x)||_2`` over ``n_dirs`` random sign vectors
    ``r_k`` (a componentwise relative perturbation of every floating input; the JVPs share
    one linearisation of ``fn`` at the rung). It is a cheap lower estimate of the
    componentwise relative condition number of the *function*: ill-conditioned solves
    show up with high probability; cancellation between two inputs (``x - y`` with
    ``x ~ y``) with probability ``1 - 2**-n_dirs`` per seed (signs alike on both miss it);
    cancellation inside a well-conditioned function (``(x + 1) - 1``) not at all (that is
    :func:`accuracy`'s job). ``kappa * u`` estimates the
    relative error the rung's rounding of the inputs causes. Costs about ``n_dirs`` extra
    evaluations of the kernel's derivative. ``value`` is ``kappa``.

    Example:
        >>> import jax.numpy as jnp
        >>> from adaptprec import guards
        >>> g = guards.condition(tol=0.1)      # accept ~10% relative error
        >>> diff = lambda x, y: x - y          # kappa = (|x| + |y|) / |x - y|
        >>> bool(g.evaluate(diff, jnp.array(1.0), jnp.array(0.5), dtype="bf16").ok)
        True
        >>> bool(g.evaluate(diff, jnp.array(1.0), jnp.array(0.999), dtype="bf16").ok)
        False
    """
    _check_tol(tol, "condition")
    if not isinstance(n_dirs, int) or n_dirs < 1:
        raise ValueError(f"n_dirs must be a positive int, got {n_dirs!r}")
    return _Condition(float(tol), n_dirs, int(seed))


def _check_tol(tol, who):
    if not isinstance(tol, (int, float)) or isinstance(tol, bool) or not tol > 0:
        raise ValueError(f"{who}: tol must be a positive number, got {tol!r}")


def _get_arg(args, kwargs, which, who):
    if isinstance(which, str):
        if which not in kwargs:
            raise ValueError(f"{who}: keyword argument {which!r} not found; the kernel "
                             f"was called with keywords {sorted(kwargs)}")
        return kwargs[which]
    if not -len(args) <= which < len(args):
        raise ValueError(f"{who}: positional argument {which} not found; the kernel was "
                         f"called with {len(args)} positional arguments")
    return args[which]


@dataclasses.dataclass(frozen=True)
class _MatrixCondition(Guard):
    tol: float
    arg: int | str
    max_iter: int
    code = MATRIX_ILL_CONDITIONED
    label = "matrix_condition({self.tol:g})"

    def check(self, ctx):
        a = _get_arg(ctx.args, ctx.kwargs, self.arg, "matrix_condition")
        if getattr(a, "ndim", 0) != 2 or a.shape[0] != a.shape[1]:
            raise ValueError(
                f"matrix_condition needs a square matrix as argument {self.arg!r}, got "
                f"shape {getattr(a, 'shape', type(a).__name__)}; under vmap the guard sees "
                "one matrix per element")
        a = a.astype(_wide(a.dtype))
        n = a.shape[0]
        lu = jax.scipy.linalg.lu_factor(a)
        inv_norm = norm1_estimate(
            lambda x: jax.scipy.linalg.lu_solve(lu, x),
            lambda x: jax.scipy.linalg.lu_solve(lu, x, trans=1),
            n, a.dtype, max_iter=self.max_iter)
        kappa = jnp.max(jnp.sum(jnp.abs(a), axis=0)) * inv_norm
        kappa = jnp.where(jnp.isfinite(kappa), kappa, jnp.inf)
        return conditioned(kappa, ctx.u, self.tol, MATRIX_ILL_CONDITIONED)


def matrix_condition(tol: float = 1e-2, *, arg: int | str = 0, max_iter: int = 5) -> Guard:
    """Fires when the input matrix has ``kappa_1(A) * u_rung > tol``.

    ``kappa_1(A) = ||A||_1 ||A^{-1}||_1`` with ``||A^{-1}||_1`` from the Hager–Higham
    estimator (LAPACK ``xLACN2`` logic, at most ``max_iter`` iterations) applied through
    an LU factorisation of ``A`` (argument ``arg``: a position or keyword) in the rung's
    precision, at least float32. Singular matrices give ``kappa = inf``. The LU costs
    ``O(n^3)``: use it for kernels that are at least that expensive (or use
    :func:`backward_error` for solves). ``value`` is ``kappa``.

    Example:
        >>> import jax.numpy as jnp, scipy.linalg
        >>> from adaptprec import guards
        >>> g = guards.matrix_condition(tol=1e-3)
        >>> H = jnp.asarray(scipy.linalg.hilbert(6))          # kappa_1 ~ 2.9e7
        >>> solve = jnp.linalg.solve
        >>> bool(g.evaluate(solve, H, jnp.ones(6), dtype="f32").ok)
        False
        >>> bool(g.evaluate(solve, H, jnp.ones(6), dtype="f64").ok)   # needs x64
        True
    """
    _check_tol(tol, "matrix_condition")
    return _MatrixCondition(float(tol), arg, int(max_iter))


# ------------------------------------------------------------------ residual & co.


@dataclasses.dataclass(frozen=True)
class _Residual(Guard):
    check_fn: Callable
    tol: float
    code = RESIDUAL
    label = "residual({fn_name}, {self.tol:g})"

    def check(self, ctx):
        args, kwargs = ctx.inputs
        r = _check_scalar(self.check_fn(ctx.out, *args, **kwargs), "residual", self.name)
        if not jnp.issubdtype(r.dtype, jnp.floating):
            raise TypeError(f"guard {self.name}: check_fn must return a floating scalar, "
                            f"got {r.dtype}")
        return GuardResult.make(r <= self.tol, RESIDUAL, r)


def residual(check_fn: Callable, tol: float) -> Guard:
    """Fires when ``check_fn(out, *inputs, **kw_inputs) > tol`` (or is NaN).

    ``check_fn`` gets the rung's output and the *original* (uncast) inputs, so it can
    measure a residual or backward error in higher precision than the rung. It must
    return a floating scalar; that is the guard's ``value``.

    Example (a bfloat16 sum stalls at 256):
        >>> import jax, jax.numpy as jnp
        >>> from adaptprec import guards
        >>> def rel_err(out, x):
        ...     ref = jnp.sum(x.astype(jnp.float32))
        ...     return jnp.abs(out.astype(jnp.float32) - ref) / jnp.abs(ref)
        >>> g = guards.residual(rel_err, tol=1e-2)
        >>> def naive_sum(x):                  # a sequential sum accumulating in x.dtype
        ...     return jax.lax.scan(lambda c, v: (c + v, None), jnp.zeros((), x.dtype), x)[0]
        >>> r = g.evaluate(naive_sum, jnp.ones(1000), dtype="bf16")
        >>> bool(r.ok), round(float(r.value), 3)
        (False, 0.744)
    """
    if not callable(check_fn):
        raise TypeError(f"residual needs a callable check_fn(out, *inputs), got {check_fn!r}")
    _check_tol(tol, "residual")
    return _Residual(check_fn, float(tol))


@dataclasses.dataclass(frozen=True)
class _BackwardError(Guard):
    tol: float | None
    a_arg: int | str
    b_arg: int | str
    c: float
    code = BACKWARD_ERROR

    @property
    def name(self):
        return "backward_error" + ("" if self.tol is None else f"({self.tol:g})")

    def check(self, ctx):
        args, kwargs = ctx.inputs
        a = jnp.asarray(_get_arg(args, kwargs, self.a_arg, "backward_error"))
        b = jnp.asarray(_get_arg(args, kwargs, self.b_arg, "backward_error"))
        x = ctx.out
        if not hasattr(x, "shape") or a.ndim != 2 or b.shape != x.shape:
            raise ValueError(
                "backward_error expects a kernel x = fn(A, b) with A a matrix and x of b's "
                f"shape; got A {a.shape}, b {b.shape}, x "
                f"{getattr(x, 'shape', type(x).__name__)}")
        wide = _wide(jnp.result_type(a, b, x, ctx.dtype))
        a, b, x = a.astype(wide), b.astype(wide), x.astype(wide)
        r = b - jnp.matmul(a, x, precision=jax.lax.Precision.HIGHEST)
        from ._first_order import nan_max_abs    # a NaN must fail the guard
        a_norm = nan_max_abs(jnp.sum(jnp.abs(a), axis=1))
        eta = nan_max_abs(r) / (a_norm * nan_max_abs(x) + nan_max_abs(b))
        eta = jnp.where(jnp.isnan(eta), jnp.inf, eta)
        n = a.shape[-1]
        tol = self.c * math.sqrt(n) * ctx.u if self.tol is None else self.tol
        return GuardResult.make(eta <= tol, BACKWARD_ERROR, eta)


def backward_error(tol: float | None = None, a_arg: int | str = 0,
                   b_arg: int | str = 1) -> Guard:
    """Normwise backward error of a linear-solve kernel ``x = fn(A, b)``.

    ``eta = ||b - A x||_inf / (||A||_inf ||x||_inf + ||b||_inf)`` (Rigal–Gaches), with
    ``A``, ``b`` the original inputs and the residual computed in float32 or wider. Fires
    when ``eta > tol``; the default ``tol = c * u_rung`` with ``c = 10 * sqrt(n)``: a
    backward-stable solve at the rung passes, a broken or inaccurate one does not. ``A`` and
    ``b`` are picked by ``a_arg``/``b_arg`` (positions or keywords). ``value`` is ``eta``.
    It measures backward stability, not conditioning: pair it with
    :func:`matrix_condition` to catch solves that are stable but inaccurate.

    Example:
        >>> import jax.numpy as jnp
        >>> from adaptprec import guards
        >>> A = jnp.array([[4.0, 1.0], [1.0, 3.0]]); b = jnp.array([1.0, 2.0])
        >>> g = guards.backward_error()
        >>> bool(g.evaluate(jnp.linalg.solve, A, b, dtype="f32").ok)
        True
        >>> bool(g.evaluate(lambda A, b: b / 4, A, b, dtype="f32").ok)   # a wrong solver
        False
    """
    if tol is not None:
        _check_tol(tol, "backward_error")
        tol = float(tol)
    return _BackwardError(tol, a_arg, b_arg, 10.0)


@dataclasses.dataclass(frozen=True)
class _Predicate(Guard):
    fn: Callable
    code = PREDICATE
    label = "predicate({fn_name})"

    def check(self, ctx):
        args, kwargs = ctx.inputs
        return self.fn(ctx.out, *args, **kwargs)


def predicate(fn: Callable) -> Guard:
    """A user check ``fn(out, *inputs, **kw_inputs) -> bool`` (True = trustworthy).

    ``fn`` gets the rung's output and the original inputs and may also return a
    :class:`GuardResult`. Anything else is a ``TypeError`` when the kernel is first traced.

    Example:
        >>> import jax.numpy as jnp
        >>> from adaptprec import guards
        >>> g = guards.predicate(lambda out, x: jnp.all(out >= 0))
        >>> bool(g.evaluate(jnp.sqrt, jnp.array([4.0])).ok)
        True
    """
    if not callable(fn):
        raise TypeError(f"predicate needs a callable fn(out, *inputs), got {fn!r}")
    return _Predicate(fn)


# ------------------------------------------------------------------------- accuracy


def _check_rtol(rtol, who):
    if not isinstance(rtol, (int, float)) or isinstance(rtol, bool) or not 0 < rtol < 1:
        raise ValueError(f"{who}: rtol must be a relative tolerance in (0, 1), e.g. "
                         f"rtol=1e-3, got {rtol!r}")


def _leaf_error(y0, ys, componentwise: bool):
    """Max over samples of the normwise (or componentwise) relative distance to ``y0``."""
    from ._first_order import nan_to_inf    # a max drops NaN on XLA:CPU
    w = _wide(jnp.promote_types(y0.dtype, ys[0].dtype))
    a = y0.astype(w)
    d = jnp.max(jnp.stack([nan_to_inf(jnp.abs(y.astype(w) - a)) for y in ys]), axis=0)
    if componentwise:
        rel = nan_to_inf(jnp.where(d == 0, 0.0, d / jnp.abs(a)))
        e = jnp.max(rel, initial=0.0)
    else:
        dmax = jnp.max(d, initial=0.0)
        e = jnp.where(dmax == 0, 0.0, dmax / jnp.max(jnp.abs(a), initial=0.0))
    return jnp.where(jnp.isnan(e), jnp.inf, e).astype(jnp.float32)


def digits_from_error(err, u) -> jax.Array:
    """``-log10(err)`` clipped to ``[0, -log10(u)]``: the significant digits an error
    estimate leaves (a rung never verifies more digits than it carries)."""
    err = jnp.maximum(jnp.asarray(err, jnp.float32), jnp.float32(u))
    return jnp.clip(-jnp.log10(err), 0.0, -math.log10(u)).astype(jnp.float32)


@dataclasses.dataclass(frozen=True)
class _Accuracy(Guard):
    rtol: float
    samples: int
    componentwise: bool
    safety: float
    seed: int
    code = INACCURATE
    role = "accuracy"
    label = "accuracy({self.rtol:g})"

    def check(self, ctx):
        if ctx.check == "first_order":
            return self.first_order(ctx)
        if ctx.check == "screen":
            return self.screen(ctx)
        if ctx.check == "sample":
            return self.sampled(ctx)
        if ctx.check == "sample_rows":
            return self.sampled_rows(ctx)
        if ctx.check == "sample_conv":
            return self.sampled_conv(ctx)
        if ctx.check in ("none", "speculative"):
            # the plan skipped the top rung's screens (they cost more than the budget):
            # the report says "not checked"; the finite guard still runs
            return GuardResult.make(True, INACCURATE, jnp.nan)
        return self.estimate(ctx, self.seed)

    #: entries re-evaluated by the sampled check, and its safety factor on the error
    #: measured there (the sample's largest error vs the whole array's)
    SAMPLE, SAMPLE_SAFETY = 256, 4.0

    def sampled(self, ctx) -> GuardResult:
        """Entrywise kernels: ``SAMPLE`` evenly spaced entries re-evaluated in the
        widest dtype from the user's inputs; the largest normwise difference, times
        ``SAMPLE_SAFETY``. Statistical: a few bad entries between the samples are
        missed (the report says "sampled")."""
        from ._first_order import sampled_error
        ref = np.float64 if jax.config.jax_enable_x64 else np.float32
        err = sampled_error(ctx.fn, ctx.args, ctx.kwargs, ctx.inputs, *_returned(ctx), ref,
                            self.SAMPLE, self.seed)
        err = jnp.maximum(self.SAMPLE_SAFETY * err, jnp.float32(self._floor(ctx)))
        return GuardResult.make(err <= self.rtol, INACCURATE, digits_from_error(err, ctx.u))

    def sampled_rows(self, ctx) -> GuardResult:
        """Row-separable kernels (:mod:`adaptprec._rowwise`: an MLP in its batch,
        attention in its queries): ``_rowwise.ROWS`` evenly spaced rows re-evaluated in
        the widest dtype from the user's inputs; the largest normwise difference, times
        ``SAMPLE_SAFETY``. Statistical: a bad row between the samples is missed (the
        report says "sampled rows")."""
        from ._rowwise import sampled_rows_error
        from ._structure import structure_of_inputs
        mask = structure_of_inputs(ctx.fn, ctx.inputs).rows
        if mask is None:    # the plan chose it for a row-separable kernel: not reached
            raise TypeError("check 'sample_rows' on a kernel that is not row-separable")
        ref = np.float64 if jax.config.jax_enable_x64 else np.float32
        err = sampled_rows_error(ctx.fn, ctx.inputs, mask, *_returned(ctx), ref,
                                 seed=self.seed)
        err = jnp.maximum(self.SAMPLE_SAFETY * err, jnp.float32(self._floor(ctx)))
        return GuardResult.make(err <= self.rtol, INACCURATE, digits_from_error(err, ctx.u))

    def sampled_conv(self, ctx) -> GuardResult:
        """Convolution kernels (:mod:`adaptprec._convsample`): ``POSITIONS`` evenly
        spaced output positions (every channel) re-evaluated in the widest dtype on the
        input windows they read; the largest normwise difference, times
        ``SAMPLE_SAFETY``. Statistical: a bad position between the samples is missed
        (the report says "sampled")."""
        from ._convsample import sampled_conv_error
        from ._structure import structure_of_inputs
        conv = structure_of_inputs(ctx.fn, ctx.inputs).conv
        if conv is None:    # the plan chose it for a convolution: not reached
            raise TypeError("check 'sample_conv' on a kernel that is not one convolution")
        ref = np.float64 if jax.config.jax_enable_x64 else np.float32
        err = sampled_conv_error(conv, _dynamic_leaves(ctx), *_returned(ctx), ref,
                                 seed=self.seed)
        err = jnp.maximum(self.SAMPLE_SAFETY * err, jnp.float32(self._floor(ctx)))
        return GuardResult.make(err <= self.rtol, INACCURATE, digits_from_error(err, ctx.u))

    def _floor(self, ctx) -> float:
        return max(ctx.u, _output_roundoff(ctx))

    def first_order(self, ctx) -> GuardResult:
        """The check by a first-order error bound at the rung's own precision
        (:mod:`adaptprec._first_order`): no wider dtype, about one cheap pass over the
        kernel's values; an unstable decision (comparison, argmax) fails it."""
        from ._first_order import first_order, relative_bound
        res = first_order(ctx.fn, ctx.args, ctx.kwargs, ctx.inputs, ctx.dtype)
        est = relative_bound(res.outs, res.errs, self.componentwise)
        err = jnp.maximum(est, jnp.float32(self._floor(ctx)))
        err = jnp.where(res.unstable > 0, jnp.inf, err)
        return GuardResult.make(err <= self.rtol, INACCURATE, digits_from_error(err, ctx.u))

    def screen(self, ctx) -> GuardResult:
        """Top rung, when no estimate pays: the cancellation screen alone (CADNA's
        unstable cancellation, normwise, and an output 0 from cancelled operands)."""
        from ._first_order import cancellation_screen
        ratio, zero_cancel = cancellation_screen(ctx.fn, ctx.args, ctx.kwargs, ctx.dtype,
                                                 self.componentwise)
        zero_out = jnp.asarray(False)
        for y0 in jax.tree_util.tree_leaves(ctx.out):
            if _is_floating_array(y0):
                zero_out = zero_out | jnp.all(jnp.asarray(y0) == 0)
        lost = zero_out & zero_cancel
        err = jnp.maximum(ratio, jnp.float32(self._floor(ctx)))
        err = jnp.where(lost, jnp.inf, err)
        cancels = ((ratio > self.rtol) & (ratio > 2.0 * ctx.u)) | lost
        code = jnp.where(cancels, CANCELLATION, INACCURATE)
        return GuardResult.make(err <= self.rtol, code, digits_from_error(err, ctx.u))

    def estimate(self, ctx, seed) -> GuardResult:
        """The check with an explicit (possibly traced) ``seed``."""
        from ._mca import mca_samples
        res = mca_samples(ctx.fn, ctx.args, ctx.kwargs, ctx.inputs, ctx.dtype,
                          self.samples, seed, componentwise=self.componentwise)
        y0s = jax.tree_util.tree_leaves(ctx.out)
        est = jnp.float32(0)
        bad = jnp.float32(0)
        zero_out = jnp.asarray(False)
        for i, y0 in enumerate(y0s):
            ys = [s[i] for s in res.samples]
            if _is_floating_array(y0):
                est = jnp.maximum(est, _leaf_error(y0, ys, self.componentwise))
                zero_out = zero_out | jnp.all(jnp.asarray(y0) == 0)
            else:
                bad = bad + sum(jnp.sum(jnp.asarray(y) != y0, dtype=jnp.float32)
                                for y in ys)
        unstable = (bad > 0) | (res.unstable > 0)
        # floored at the rung's unit roundoff: storing the result in this dtype can cost
        # that much, and the samples may all round alike (an estimate of 0 that would let a
        # rung with u > rtol pass: 1.003 * 1.0 in bfloat16 is 1.0 in every sample)
        err = jnp.maximum(jnp.maximum(self.safety * est, res.cancellation),
                          jnp.float32(max(ctx.u, _output_roundoff(ctx))))
        err = jnp.where(unstable, jnp.inf, err)
        # an output leaf that is exactly 0 where an add/sub cancelled nonzero operands to
        # 0: no relative digit of it can be verified (newcomer audit 7: a naive variance
        # gave 0.0 for 1.04, reported "~7.2 digits verified"); an exact tie (x - mean(x)
        # of a constant row) is then "not verified" too, which is what can be said of it
        lost = zero_out & res.zero_from_cancellation
        err = jnp.where(lost, jnp.inf, err)
        # a cancellation amplifies u by (|a| + |b|) / |a +- b|: every add has at least u,
        # so only an amplification above 2 is called one (x + 1 at x = 1 is not)
        cancels = ((res.cancellation > self.rtol) & (res.cancellation > 2.0 * ctx.u)) | lost
        code = jnp.where(cancels, CANCELLATION, INACCURATE)
        return GuardResult.make(err <= self.rtol, code, digits_from_error(err, ctx.u))


def _dynamic_leaves(ctx) -> list:
    """The dynamic (array) leaves of the user's inputs ``ctx.inputs``, in order."""
    from ._autocast.interpret import _is_dynamic
    return [x for x in jax.tree_util.tree_leaves(ctx.inputs) if _is_dynamic(x)]


def _returned(ctx) -> tuple[list, list]:
    """``(the rung's output leaves, the dtype each is returned in)``: the sampled checks
    read their samples from the rung's own outputs and cast the samples, so no check
    needs the whole cast output (the runtime casts only the output it accepts)."""
    raw = jax.tree_util.tree_leaves(ctx.out)
    if ctx.cast_out is None:
        return raw, [x.dtype for x in raw]
    return raw, [c.dtype for c in ctx.cast_out]


def _output_roundoff(ctx) -> float:
    """Unit roundoff of the coarsest floating dtype the caller gets back (the output
    cast): a float32 result returned as bfloat16 carries bfloat16's 2.4 digits, whatever
    the rung verified (newcomer audit 3: "verified to 1e-6", returned with error 3e-3)."""
    leaves = [x for x in (ctx.cast_out or ()) if _is_floating_array(x)]
    return max((unit_roundoff(x.dtype) for x in leaves), default=0.0)


def accuracy(rtol: float, samples: int = 2, *, componentwise: bool = False,
             safety: float = 2.0, seed: int = 0) -> Guard:
    """Fires when the rung's rounding error is estimated above ``rtol`` (inside ``jit``).

    Monte Carlo arithmetic (Parker 1997; the idea behind CADNA and Verificarlo): the
    kernel's jaxpr is re-evaluated ``samples`` times with the result of every
    floating-point operation, and every input cast, randomly rounded at the size of its
    rounding error (stochastic rounding from the next wider dtype; on the top rung, where
    there is none, error-free transformations TwoSum/TwoProd). The estimate is
    ``safety * max_k ||y_k - y||_inf / ||y||_inf`` per floating output leaf
    (``componentwise=True``: per element), ``y`` the rung's own result. Two deterministic
    checks complete it: an ``add``/``sub`` that cancels (``u * max(|a|+|b|) / max|a+-b|``
    above ``rtol``, per element with ``componentwise``: code ``CANCELLATION``) and, below
    the top rung, a comparison or
    ``argmax`` decided within rounding distance. Integer and bool outputs fail on any
    disagreement between samples. Keys are deterministic (``seed``).

    ``value`` is the estimated number of significant digits, ``-log10(error)``, capped by
    the rung's precision. Costs ``samples`` evaluations of the kernel in the next wider
    dtype plus O(size) integer work per operation; derivatives never flow through the
    samples. See docs/runtime.md for what it catches and misses, with measured rates.

    Example:
        >>> import jax.numpy as jnp
        >>> from adaptprec import guards
        >>> g = guards.accuracy(rtol=1e-3)
        >>> cancel = lambda x: (x + 1.0) - 1.0
        >>> r = g.evaluate(cancel, jnp.float32(1e-3), dtype="bf16")    # bf16 returns 0
        >>> bool(r.ok), guards.code_name(r.code)
        (False, 'cancellation')
        >>> r = g.evaluate(cancel, jnp.float32(1e-3), dtype="f32")
        >>> bool(r.ok), 3.0 < float(r.value) < 5.0                     # ~4 digits
        (True, True)
    """
    _check_rtol(rtol, "accuracy")
    if isinstance(samples, bool) or not isinstance(samples, int) or samples < 1:
        raise ValueError(f"accuracy: samples must be a positive int, got {samples!r}")
    if not isinstance(safety, (int, float)) or not safety > 0:
        raise ValueError(f"accuracy: safety must be a positive number, got {safety!r}")
    return _Accuracy(float(rtol), samples, bool(componentwise), float(safety), int(seed))


def output_error(mine, ref) -> jax.Array:
    """Largest normwise relative difference between two lists of output leaves (float32).

    Floating leaves: ``max|mine - ref| / max|ref|``; integer/bool leaves: ``inf`` when any
    entry differs. NaN becomes ``inf``.

    Example:
        >>> import jax.numpy as jnp
        >>> from adaptprec.guards import output_error
        >>> float(output_error([jnp.array([1.0, 2.0])], [jnp.array([1.0, 2.2])]))  # doctest: +ELLIPSIS
        0.0909...
    """
    from ._first_order import nan_to_inf    # a max drops NaN on XLA:CPU
    err = jnp.float32(0)
    for a, b in zip(mine, ref):
        a, b = jnp.asarray(a), jnp.asarray(b)
        if _is_floating_array(a) and _is_floating_array(b):
            w = _wide(jnp.promote_types(a.dtype, b.dtype))
            d = jnp.max(nan_to_inf(jnp.abs(a.astype(w) - b.astype(w))), initial=0.0)
            e = jnp.where(d == 0, 0.0, d / jnp.max(jnp.abs(b.astype(w)), initial=0.0))
        else:
            e = jnp.where(jnp.any(a != b), jnp.inf, 0.0)
        err = jnp.maximum(err, jnp.asarray(e, jnp.float32))
    return jnp.where(jnp.isnan(err), jnp.inf, err)


@dataclasses.dataclass(frozen=True)
class _SpotCheck(Guard):
    rtol: float
    sample: int
    seed: int
    code = SPOT_CHECK
    role = "spot_check"
    label = "spot_check({self.rtol:g}, sample={self.sample})"

    def check(self, ctx):
        if ctx.batched or ctx.next_rung is None:
            # under vmap the runtime checks the batch (it overwrites this result); on the
            # top rung there is nothing to compare with: value NaN, nothing verified
            return GuardResult.make(True, SPOT_CHECK, jnp.nan)
        mine = ctx.cast_out if ctx.cast_out is not None else jax.tree_util.tree_leaves(
            ctx.out)
        err = output_error(mine, ctx.next_rung())
        return GuardResult.make(err <= self.rtol, SPOT_CHECK, err)


def spot_check(rtol: float, sample: int = 8, *, seed: int = 0) -> Guard:
    """Recompute ``sample`` random elements of a vmapped batch on the next rung; fires
    when any differs from this rung's result by more than ``rtol`` (normwise relative;
    integer/bool outputs: any difference).

    A cheap complement to :func:`accuracy` for big vmapped kernels (under ``vmap`` with
    ``batch="element"`` or ``"call"``): it costs ``sample`` element evaluations on the next
    rung per rung tried, whatever the batch size. When it fires, every element of the
    batch fails that rung (the sample says the rung is not trustworthy for this batch).
    It is a sample, not a proof: a few bad elements among many are likely missed (see
    docs/runtime.md). Outside ``vmap`` the whole call is one element, so it recomputes
    the call on the next rung. It verifies nothing on the top rung (value NaN). ``value``
    is the largest relative difference found.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> import adaptprec as ap
        >>> f = ap.adaptive(lambda x: jnp.sum(x) - 1e4, ladder="bf16,f32",
        ...                 guards=[ap.guards.finite(), ap.guards.spot_check(1e-2, 4)])
        >>> xs = jnp.full((64, 1000), 10.0001, jnp.float32)
        >>> _, rep = jax.vmap(f.with_report)(xs)
        >>> print(rep.summary())                             # doctest: +ELLIPSIS
        64 calls: f32 64; ok 64/64; reasons: spot check x64; spot check not run on the top rung...
    """
    _check_rtol(rtol, "spot_check")
    if isinstance(sample, bool) or not isinstance(sample, int) or sample < 1:
        raise ValueError(f"spot_check: sample must be a positive int, got {sample!r}")
    return _SpotCheck(float(rtol), sample, int(seed))


def as_guard(g: Any) -> Guard:
    """A :class:`Guard` as is; a plain callable becomes :func:`predicate` of it.

    Example:
        >>> from adaptprec import guards
        >>> guards.as_guard(lambda out, x: out > 0).name
        'predicate(<lambda>)'
    """
    if isinstance(g, Guard):
        return g
    if getattr(g, "__module__", None) == __name__ and \
            getattr(g, "__annotations__", {}).get("return") in ("Guard", Guard):
        # guards=[guards.finite]: the factory itself, not a guard (newcomer audit 3)
        raise TypeError(f"guards.{g.__name__} is a guard factory: call it, e.g. "
                        f"guards.{g.__name__}(), not guards.{g.__name__}")
    if callable(g):
        return predicate(g)
    raise TypeError(
        f"a guard must be a Guard (e.g. adaptprec.guards.finite()) or a callable "
        f"fn(out, *inputs) -> bool; got {g!r} of type {type(g).__name__}")
