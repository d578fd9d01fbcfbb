"""The guards that check range, conditioning and the user's own tests.

``finite``, ``headroom``, ``condition``, ``matrix_condition``, ``residual``,
``backward_error`` and ``predicate`` (re-exported by :mod:`adaptprec.guards`, where the
table of what each fires on lives), and the tests solvers run on values they already hold:
:func:`finite_values` and :func:`conditioned`.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ._guard_base import (BACKWARD_ERROR, ILL_CONDITIONED, MATRIX_ILL_CONDITIONED,
                          NONFINITE, OVERFLOW, PREDICATE, RESIDUAL, UNDERFLOW, Guard,
                          GuardResult, _check_scalar, _float_leaves, _wide)
from ._normest import norm1_estimate
from ._policy import _is_floating_array
from .precision import max_value

__all__ = ["finite", "finite_values", "conditioned", "headroom", "condition",
           "matrix_condition", "residual", "backward_error", "predicate"]


# ---------------------------------------------------------------------------- finite


@dataclasses.dataclass(frozen=True)
class _Finite(Guard):
    code = NONFINITE
    role = "finite"
    label = "finite"

    def check(self, ctx):
        # the value returned is the output cast to the output dtype: e^100 is finite on
        # float64 and inf in the float32 the caller gets
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
    from ._reductions import materialized
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
    materialized operand (:func:`adaptprec._reductions.materialized`).
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
        from ._reductions import nan_max_abs    # a NaN must fail the guard
        for x in _float_leaves(ctx.out):
            m = nan_max_abs(x.astype(_wide(x.dtype))) if x.size else 0.0
            # 1/max is subnormal for bf16/f32/f64 and XLA:CPU flushes it to zero; it also
            # rewrites any division by a constant into a product with the reciprocal, so
            # m * (1/max) was always 0 and the guard never fired. In
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
        from ._reductions import nan_max_abs    # a NaN must fail the guard
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
