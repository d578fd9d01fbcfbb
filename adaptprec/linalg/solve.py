r"""Mixed-precision linear solve: low-precision factors, working-precision refinement, fallback.

This is LAPACK ``dsgesv``/``dsposv`` (and cuSOLVER IRS) for JAX:

1. round ``A`` to the factor precision (float32 on CPU) and factor it: ``P A = L U``, or
   ``A = L L^T`` with ``assume_a="pos"``;
2. ``x_0 = A^{-1} b`` with the low-precision factors, upcast to the working precision;
3. repeat: ``r_i = b - A x_i`` in the working precision, correction ``d_i`` from the
   low-precision factors (``refine="lu"``) or from factor-preconditioned FGMRES run in the
   working precision (``refine="gmres"``, GMRES-IR), ``x_{i+1} = x_i + d_i``;
4. stop when every column satisfies (dsgesv's rule)

   .. math:: \|r\|_\infty \le \mathrm{tol}\,\|x\|_\infty\,\|A\|_\infty, \qquad
             \mathrm{tol} = \sqrt{n}\,u_{working} \text{ by default};

5. fall back to a working-precision factorization when the cast overflowed, the
   low-precision factor is singular (or the low-precision Cholesky broke down), or
   refinement stagnated (residual not halved) or hit ``max_iters``.

The fallback recomputes only the systems that need it: they are gathered into a buffer of
``fallback_capacity`` slots, factored in the working precision, and scattered back; one
``lax.switch`` on the number of failing systems picks "none", "the buffer" or "the whole
batch" (:mod:`adaptprec._compaction`). Under ``jax.vmap`` a ``custom_vmap`` rule folds the
mapped axis into the batch, so the same compaction applies instead of a ``select`` that
would run the fallback for every element. Gradients are implicit
(``lax.custom_linear_solve``): the adjoint is another refined solve with ``A^T`` that
reuses the low-precision factors.
"""

from __future__ import annotations

import math
from functools import partial

import numpy as np

import jax
import jax.numpy as jnp
from jax import lax
from jax.custom_batching import custom_vmap

from .._compaction import capacity_for, recompute_rows
from .._first_order import nan_max_abs
from .._normest import norm1_estimate
from .._pytree import Module, field
from .._status import Reason, Status
from .._x64_rule import float64_call
from ..precision import canonical_dtype, max_value, unit_roundoff
from ._common import (
    apply,
    show_field,
    check_array,
    check_options,
    x64_need,
    pow2_scale,
    prepare_system,
    lu_solve,
    resolve_precisions,
    zero_pivot,
)
from ._getrf import lu_factor_transposed
from ._gmres import fgmres
from ._trsv import MIN_N, Panels, make_panels, panel_solve
from .cond import inverse_norm1

__all__ = ["solve", "SolveInfo", "STATUS_MESSAGES"]

STATUS_MESSAGES = {int(s): s.message for s in Status}
"""``{code: message}`` of the unified :class:`adaptprec.Status` (the same table as
``adaptprec.nlsq.STATUS_MESSAGES``). Linear solves end with ``CONVERGED`` (5),
``SINGULAR`` (-7), ``NONFINITE_INPUT`` (-8), ``ILL_CONDITIONED`` (-9),
``NOT_POSITIVE_DEFINITE`` (-12) or ``INACCURATE`` (-13)."""

_GMRES_RESTART = 30
_GMRES_TOL = 1e-4
_STAGNATION = 0.5
#: right-hand sides up to this many are solved column by column (see _low_one)
_SPLIT_COLUMNS = 3
#: f16 factors: A is scaled by a power of 2 so that ||A||_inf lands at this fraction of the
#: format's largest value (Higham, Pranesh & Zounon 2019 scale into range before the cast).
_F16_HEADROOM = 2.0 ** -4
_ASSUME_A = {"gen": "lu", "general": "lu", "pos": "chol", "positive definite": "chol"}

AUTO_FACTOR = {"cpu": ("f32", "lu"), "gpu": ("f16", "gmres"), "tpu": ("bf16", "gmres")}
"""``factor="auto"`` / ``refine="auto"`` per backend: ``{backend: (factor dtype,
refinement)}``. CPU: XLA:CPU has no faster-than-f32 LU (bf16 is upcast), so float32
factors + LU-IR; accelerators: half-precision factors (tensor-core GEMM updates) +
GMRES-IR, as cuSOLVER IRS / Haidar et al. (SC18)."""

_S_CONVERGED = int(Status.CONVERGED)
#: SolveInfo.huge_x: residual_norm / backward_error (about ||A|| ||x|| / ||b||) above
#: this says x is huge for its data
_HUGE_X = 1e6


def _backend() -> str:
    return jax.default_backend()


class SolveInfo(Module):
    """Diagnostics of :func:`solve` / :func:`lstsq`, one entry per system.

    All fields are arrays with the leading batch shape of ``A`` (scalars for one system),
    so the info works under ``jit``/``vmap`` and can be returned from compiled code.

    Attributes:
        iterations: refinement steps after the initial low-precision solve (dsgesv's
            ``ITER``); for ``refine="gmres"`` these are outer steps.
        backward_error: normwise backward error of the returned ``x``, maximised over
            right-hand sides: ``||b - A x||_inf / (||A||_inf ||x||_inf + ||b||_inf)``
            (for :func:`lstsq`: ``||A^T r||_inf / (||A||_1 (||A||_inf ||x||_inf + ...))``,
            see its docstring). ``inf`` whenever ``x`` (or its residual) is not finite.
        fell_back: True when the answer comes from the working-precision factorization.
        cond_estimate: estimate of ``kappa_inf(A)`` (:func:`solve`) from the factors
            that produced ``x`` (a property): on the refinement path two Hager–Higham
            steps on the low-precision factors, after a fallback the full estimator on
            the working-precision factors (computed in the call: it decides
            ``ILL_CONDITIONED``). With ``estimate_cond="lazy"`` (the default) the
            refinement-path estimate is *deferred*: the info carries the low-precision
            factors (:attr:`cond_factors`) and the four single-column solves run when
            ``cond_estimate`` is read (inside ``jit`` they are traced there and then;
            unread, they never run). NaN with ``estimate_cond=False`` on the refinement
            path.
        cond_value: the estimate computed in the call (after a fallback, or with
            ``estimate_cond=True``); NaN where it is deferred or disabled.
        cond_factors: the low-precision factors kept for the deferred estimate
            (``estimate_cond="lazy"``), else None. They hold ``n^2`` entries of the
            factor precision per system (64 MB at n = 4096 in float32); pass
            ``estimate_cond=True`` or ``False`` to not keep them.
        status: :class:`adaptprec.Status` code (``int32``): ``CONVERGED`` (5) when ``x``
            has working-precision backward error, else ``SINGULAR``, ``NONFINITE_INPUT``,
            ``ILL_CONDITIONED`` or ``NOT_POSITIVE_DEFINITE``.
        reason: :class:`adaptprec.Reason` code of the fallback (``NONE`` when the
            low-precision factors sufficed): ``OVERFLOW`` (the cast to the factor
            precision overflowed), ``SINGULAR_FACTOR`` (zero pivot or Cholesky breakdown
            in the factor precision), ``STAGNATION`` (refinement stagnated or reached
            ``max_iters``), ``NONFINITE`` (NaN/Inf input).
        residual_norm: relative residual of the returned ``x`` in the working precision,
            maximised over right-hand sides: ``||b - A x||_inf / ||b||_inf`` (``inf``
            for a nonzero residual of ``b = 0``). For :func:`lstsq` the least-squares
            residual ``||b - A x|| / ||b||``, which is not 0 at the solution of an
            inconsistent system.

    A small ``backward_error`` is not a certificate by itself. It says that ``x`` solves
    a nearby system, relative to ``||A|| ||x||``: when ``x`` is huge (a singular or
    nearly singular ``A``: ``ILL_CONDITIONED``), the backward error is tiny even though
    ``A x`` is far from ``b``. ``residual_norm`` shows that directly: the rank-deficient
    ``A = [[.1, .2, .3], [.4, .5, .6], [.5, .7, .9]]`` (row 0 + row 1 = row 2) with the
    inconsistent ``b = [1, 2, 4]`` returns ``x`` with entries near ``4.5e15``,
    ``backward_error`` 2e-17 and ``residual_norm`` 0.1. The info's ``repr`` and :attr:`message` then say that the backward error
    is small only because ``||x||`` is huge (see :attr:`huge_x`). Trust ``x`` when
    ``success`` is True.

    Example:
        >>> import jax.numpy as jnp
        >>> import adaptprec as ap
        >>> x, info = ap.linalg.solve(jnp.eye(3) * 2.0, jnp.ones(3))  # float64: x64 on
        >>> ap.Status(int(info.status)).name, bool(info.success), bool(info.fell_back)
        ('CONVERGED', True, False)
        >>> info.message
        'Converged: iterative refinement reached working-precision accuracy.'
    """

    iterations: jax.Array
    backward_error: jax.Array
    fell_back: jax.Array
    cond_value: jax.Array
    status: jax.Array
    reason: jax.Array
    residual_norm: jax.Array | None = None
    cond_factors: "_CondFactors | None" = field(default=None, repr=False)
    #: "solve" or "lstsq" (static): an lstsq residual is not 0 at the solution
    kind: str = field(static=True, default="solve")

    @property
    def huge_x(self) -> jax.Array:
        """Boolean array: the backward error is small only because ``||x||`` is huge.

        True where ``residual_norm`` exceeds ``sqrt(eps)`` of the working precision *and*
        ``_HUGE_X`` times ``backward_error``: ``residual_norm / backward_error`` is about
        ``||A|| ||x|| / ||b||``, at most ``kappa(A)`` for a system with a solution
        near ``x``, so a ratio this large with a visible residual means ``x`` grew to
        make the backward error small (a singular or nearly singular ``A``). Always
        False for :func:`lstsq` (its residual need not vanish)."""
        if self.residual_norm is None or self.kind != "solve":
            return jnp.zeros_like(self.status, dtype=bool)
        rn = self.residual_norm
        eps = jnp.finfo(rn.dtype).eps
        return (rn > jnp.sqrt(eps)) & (rn > _HUGE_X * self.backward_error)

    def _note(self, huge) -> str:
        which = "" if huge.ndim == 0 else f"system(s) {np.argwhere(huge).tolist()}: "
        return (which + "backward_error is small only because ||x|| is huge: x solves a nearby "
                "system relative to ||A|| ||x||, but ||b - A x|| / ||b|| is "
                f"{float(np.max(np.asarray(self.residual_norm)[huge])):.3g}; "
                "A is (nearly) singular, x is not a solution of A x = b.")

    def __repr__(self) -> str:
        fields = ("status", "backward_error", "residual_norm", "fell_back", "iterations",
                  "reason", "cond_value")
        values = {f: getattr(self, f) for f in fields}
        if any(isinstance(v, jax.core.Tracer) for v in values.values()):
            inner = ", ".join(f"{f}={v!r}" for f, v in values.items())
            return f"SolveInfo({inner})"

        text = "SolveInfo(" + ", ".join(show_field(f, v) for f, v in values.items()) + ")"
        huge = np.asarray(self.huge_x)
        if huge.any():
            text += "\n  note: " + self._note(huge)
        return text

    @property
    def cond_estimate(self) -> jax.Array:
        """Estimate of ``kappa_inf(A)``; see the class docstring (deferred by default)."""
        cf = self.cond_factors
        if cf is None:
            return self.cond_value
        deferred = _deferred_kappa(cf.f, cf.perm, cf.scale, cf.anorm)
        return jnp.where(self.fell_back, self.cond_value, deferred)

    @property
    def success(self) -> jax.Array:
        """Boolean array: ``x`` is a trustworthy answer (``Status(status).success``)."""
        return (self.status > 0) & (self.status < int(Status.RUNNING))

    @property
    def message(self):
        """Text for ``status`` and, after a fallback, its ``reason`` (a string, or a nested
        list for a batch). Needs concrete values: call it outside ``jit``."""
        if isinstance(self.status, jax.core.Tracer) or isinstance(self.reason,
                                                                  jax.core.Tracer):
            raise TypeError(
                "SolveInfo.message needs a concrete status; return the info from jit and "
                "read .message outside, or use ap.status_message(int(status))"
            )

        def text(code, why, huge, rn):
            msg = Status(int(code)).message
            if int(why) != int(Reason.NONE):
                msg += f" Fell back to the working precision: {Reason(int(why)).describe()}."
            if huge:
                msg += (" The backward error is small only because ||x|| is huge: "
                        f"||b - A x|| / ||b|| = {float(rn):.3g}.")
            return msg

        codes, whys = np.asarray(self.status), np.asarray(self.reason)
        huge = np.asarray(self.huge_x)
        rn = (np.asarray(self.residual_norm) if self.residual_norm is not None
              else np.zeros(codes.shape))
        if codes.ndim == 0:
            return text(codes, whys, huge, rn)
        return np.vectorize(text, otypes=[object])(codes, whys, huge, rn).tolist()


class _Factors(Module):
    """Low-precision factors of ``A^T`` (not ``A``): LAPACK wants column-major input, and
    the column-major layout of ``A^T`` is the row-major buffer of ``A``, so factoring the
    transpose saves a transposing copy of ``A`` (here and in the fallback). Solves with
    ``A`` are then transposed solves with these factors. With ``assume_a="pos"`` ``lu``
    holds the Cholesky factor ``L`` (``A^T = A = L L^T``) and ``perm`` is None."""

    lu: jax.Array         # (m, n, n) factor compute dtype: A^T[perm] = L U, or L
    perm: jax.Array | None  # (m, n), None for Cholesky
    scale: jax.Array      # (m,) the factors are of scale * A (a power of 2; f16 range)
    cast_ok: jax.Array    # (m,) A finite after rounding to the factor precision
    factor_ok: jax.Array  # (m,) no zero / non-finite pivot (Cholesky: no breakdown)
    norminf: jax.Array    # (m,) ||A||_inf, working dtype


def _chol_ok(L):
    d = jnp.diagonal(L, axis1=-2, axis2=-1)
    return jnp.all(jnp.isfinite(d) & (d > 0), axis=-1)


def _factor(A, storage, compute, kind, method) -> _Factors:
    """Round A once to the factor precision and factor ``A^T``.

    ``||A||_inf`` comes from one read of ``A`` in the working precision; it also decides
    whether the cast can overflow (no entry can exceed the largest row sum), so a NaN/Inf
    or too-large entry sets ``cast_ok = False`` without another pass over ``A``.
    """
    w = A.dtype
    ninf = jnp.max(jnp.sum(jnp.abs(A), axis=-1), axis=-1)
    top = max_value(storage)
    if top < 1e6:      # f16: scale into range first (bf16 and f32 have float32's range)
        target = _F16_HEADROOM * top
        e = jnp.floor(jnp.log2(target / jnp.where(ninf > 0, ninf, 1.0)))
        scale = jnp.where(jnp.isfinite(e) & (ninf > 0), jnp.exp2(e), 1.0).astype(w)
        a = A * scale[:, None, None]
    else:
        scale = jnp.ones_like(ninf)
        a = A
    cast_ok = ninf * scale <= top
    if method == "blocked":
        from ._blocked_lu import blocked_lu
        lu, perm = jax.vmap(partial(blocked_lu, low=storage))(
            jnp.swapaxes(a, -1, -2).astype(compute))
        factor_ok = ~jax.vmap(zero_pivot)(lu)
        return _Factors(lu, perm, scale, cast_ok, factor_ok, ninf)
    a_low = a.astype(storage)
    if np.dtype(compute) != np.dtype(storage):
        a_low = a_low.astype(compute)
    if kind == "chol":
        L = lax.linalg.cholesky(jnp.swapaxes(a_low, -1, -2), symmetrize_input=False)
        return _Factors(L, None, scale, cast_ok, _chol_ok(L), ninf)
    f, perm = lu_factor_transposed(a_low)          # f = lu^T: a_low's own buffer
    lu = jnp.swapaxes(f, -1, -2)
    factor_ok = ~jax.vmap(zero_pivot)(lu)
    return _Factors(lu, perm, scale, cast_ok, factor_ok, ninf)


def _chol_solve(L, b):
    y = lax.linalg.triangular_solve(L, b, left_side=True, lower=True)
    return lax.linalg.triangular_solve(L, y, left_side=True, lower=True, transpose_a=True)


def _low_one(lu, perm, scale, r, w, trans_m):
    """``op(A)^{-1} r`` for one system from its low-precision factors.

    ``trans_m`` says whether the solve is transposed with respect to the factored matrix
    ``M = A^T`` (True for ``op(A) = A``). Each column of ``r`` is scaled by its inf-norm
    before the cast down so that neither overflow nor underflow in the low format can
    occur; the result is upcast, scaled back, and multiplied by the factor scaling.
    """
    s = jnp.max(jnp.abs(r), axis=0, keepdims=True)
    s = jnp.where(s > 0, s, jnp.ones_like(s))
    if isinstance(lu, Panels):          # blocked GEMV solves (CPU, large n; see _trsv)
        y = panel_solve(lu, perm, (r / s).astype(lu.diag[0].dtype), transpose=trans_m)
        return y.astype(w) * (s * scale)
    y = (r / s).astype(lu.dtype)

    def one(y):
        return _chol_solve(lu, y) if perm is None else lu_solve(lu, perm, y,
                                                                transpose=trans_m)

    k = y.shape[-1]
    if 1 < k <= _SPLIT_COLUMNS:
        # LAPACK xTRSM with 2..~64 right-hand sides runs ~4x slower than with one here
        # (OpenBLAS through jaxlib, n = 2048); a few columns are solved one at a time
        y = jnp.concatenate([one(y[:, i:i + 1]) for i in range(k)], axis=1)
    else:
        y = one(y)
    return y.astype(w) * (s * scale)


def _colnorm(x):
    """inf-norm of every column of a batch ``(m, n, k)`` -> ``(m, k)``; a NaN entry gives
    ``inf`` (a plain max drops it from 4096 entries on under XLA:CPU), so
    :func:`backward_error` and :func:`relative_residual` see a NaN ``x`` or residual."""
    return nan_max_abs(x, axis=1)


def _norm1(A):
    """||A||_1 of each matrix of a batch (only computed by consumers that need it)."""
    return jnp.max(jnp.sum(jnp.abs(A), axis=-2), axis=-1)


def _chol_inverse_norm1(L, dtype):
    n = L.shape[-1]

    def mv(v):
        return _chol_solve(L, v[:, None].astype(L.dtype))[:, 0].astype(dtype)

    est = norm1_estimate(mv, mv, n, dtype)     # A^{-1} is symmetric
    return jnp.where(_chol_ok(L) & jnp.isfinite(est), est, jnp.asarray(jnp.inf, dtype))


def _hh_kappa(low, anrm, tm, n):
    """``kappa_inf(op(A)) = ||op(A)||_inf ||op(A)^{-T}||_1`` from low-precision factors.

    The 1-norm is estimated by the first two Hager–Higham steps (LAPACK xLACN2, from
    x = e/n) plus Higham's alternating test vector: four single-column low-precision solves
    (``low(R, trans)``; multi-column xTRSM is slower, see _low_one). (Starting from the
    alternating vector instead saves one solve but underestimates kappa of the 1-D Poisson
    matrix 8x; e/n finds it.)
    """
    m = anrm.shape[0]
    w = anrm.dtype

    def solve_t(v, trans):          # v: (n,) shared or (m, n) per system
        v = jnp.broadcast_to(v, (m, n))
        return low(v[..., None], trans)[..., 0]

    i = jnp.arange(n)
    e = jnp.full((n,), 1.0 / n, w)
    alt = jnp.where(i % 2 == 0, 1.0, -1.0).astype(w) * (1.0 + i / max(n - 1, 1))
    y1 = solve_t(e, not tm)
    ya = solve_t(alt, not tm)
    est = jnp.maximum(jnp.sum(jnp.abs(y1), axis=1),
                      2.0 * jnp.sum(jnp.abs(ya), axis=1) / (3.0 * n))
    xi = jnp.where(y1 >= 0, 1.0, -1.0).astype(w)
    z1 = solve_t(xi, tm)
    j = jnp.argmax(jnp.abs(z1), axis=1)
    y2 = solve_t(jax.nn.one_hot(j, n, dtype=w), not tm)
    est = jnp.maximum(est, jnp.sum(jnp.abs(y2), axis=1))
    return anrm * est


class _CondFactors(Module):
    """What the deferred condition estimate needs (:attr:`SolveInfo.cond_factors`)."""

    f: jax.Array            # (..., n, n) low-precision factor, transposed (row-major view)
    perm: jax.Array | None  # (..., n) LU row permutation; None for Cholesky
    scale: jax.Array        # (...,) the factors are of scale * A
    anorm: jax.Array        # (...,) ||A||_inf in the working precision


def _low_solver(lu, perm, scale, w):
    """``low(R, trans)`` over a batch of factors, as in :func:`_refine`."""
    if perm is None:
        def low(R, trans):
            return jax.vmap(lambda l, s, r: _low_one(l, None, s, r, w, trans))(lu, scale, R)
    else:
        def low(R, trans):
            return jax.vmap(lambda l, p, s, r: _low_one(l, p, s, r, w, trans))(
                lu, perm, scale, R)
    return low


@jax.jit
def _deferred_kappa(f, perm, scale, anorm):
    """The refinement path's condition estimate from kept factors (any batch shape)."""
    batch, n = anorm.shape, f.shape[-1]
    lu = jnp.swapaxes(f.reshape((-1, n, n)), -1, -2)
    p = None if perm is None else perm.reshape((-1, n))
    low = _low_solver(lu, p, scale.reshape(-1), anorm.dtype)
    kappa = _hh_kappa(low, anorm.reshape(-1), True, n)   # solves with A: transposed
    return jnp.where(jnp.isfinite(kappa), kappa, jnp.asarray(jnp.inf, anorm.dtype)
                     ).reshape(batch)


#: largest factor (bytes, whole batch) for which the panel solves are used: cutting the
#: panels writes a second copy of the factor, and above ~32 MB that buffer comes fresh
#: from the OS on every call (glibc's mmap threshold), page faults included. Measured
#: (bench_linalg.py): a net gain at n = 2048 (16 MB), a net loss at n = 4096 (64 MB).
_PANEL_MAX_BYTES = 32 * 2 ** 20


def _use_panels(fac: _Factors, refine: str) -> bool:
    """Blocked GEMV triangular solves (:mod:`._trsv`) instead of LAPACK xTRSM: LU factors
    on CPU with n >= ``MIN_N`` and at most ``_PANEL_MAX_BYTES``, LU-IR (GMRES-IR keeps its
    per-vector preconditioner)."""
    return (fac.perm is not None and refine == "lu" and fac.lu.shape[-1] >= MIN_N
            and fac.lu.size * fac.lu.dtype.itemsize <= _PANEL_MAX_BYTES
            and jax.default_backend() == "cpu")


def relative_residual(rn, bn):
    """``max_k rn_k / bn_k`` over right-hand sides ``(m, k) -> (m,)``: 0 for a zero
    residual, ``inf`` for a nonzero residual of ``b = 0`` or a non-finite residual.

    Example:
        >>> import jax.numpy as jnp
        >>> from adaptprec.linalg.solve import relative_residual
        >>> relative_residual(jnp.array([[1.0, 0.0]]), jnp.array([[4.0, 0.0]])).tolist()
        [0.25]
    """
    rel = jnp.where(bn > 0, rn / jnp.where(bn > 0, bn, 1), jnp.where(rn > 0, jnp.inf, 0))
    rel = jnp.where(jnp.isfinite(rn), rel, jnp.inf)
    return jnp.max(rel, axis=-1)


def backward_error(anrm, xn, rn, bn):
    """The normwise backward error ``rn / (anrm xn + bn)``, formed as
    ``(rn / anrm) / (xn + bn / anrm)`` so that ``anrm xn`` cannot overflow
    (at 1e307 the product is inf and the error would read 0); ``inf`` where ``x`` or
    the residual is not finite, and for a nonzero residual of a zero problem.

    Example:
        >>> import jax.numpy as jnp
        >>> from adaptprec.linalg.solve import backward_error
        >>> float(backward_error(jnp.asarray(1e308), jnp.asarray(1.0), jnp.asarray(1e300),
        ...                      jnp.asarray(0.0)))
        1e-08
    """
    anrm = jnp.asarray(anrm)
    anrm = anrm.reshape(anrm.shape + (1,) * (jnp.ndim(xn) - anrm.ndim))
    pos = anrm > 0
    a = jnp.where(pos, anrm, 1)
    denom = jnp.where(pos, xn + bn / a, bn)
    num = jnp.where(pos, rn / a, rn)
    eta = jnp.where(denom > 0, num / jnp.where(denom > 0, denom, 1),
                    jnp.where(rn > 0, jnp.inf, 0))
    # honest: a non-finite x (or residual) has no meaningful backward error
    return jnp.where(jnp.isfinite(xn) & jnp.isfinite(rn), eta, jnp.inf)


def _inaccurate_above(tol, n: int, dtype) -> float:
    """The backward error above which a finished solve is ``INACCURATE``: far above both
    the refinement's ``tol`` and what a backward-stable working-precision solve gives
    (``n u`` up to modest growth), so only a solve that is not backward stable trips it."""
    return 64.0 * max(float(tol), n * float(unit_roundoff(dtype)))


def _refine(A, B, fac: _Factors, *, transpose, refine, max_iters, tol, estimate_cond,
            kind, capacity, u_factor):
    """Refine all systems of the batch; fall back where needed. A (m,n,n), B (m,n,k)."""
    w = A.dtype
    m, n, _ = A.shape
    anrm = _norm1(A) if transpose else fac.norminf   # ||op(A)||_inf
    tm = not transpose   # the factors are of A^T: solves with op(A) flip the transpose
    mv = jax.vmap(partial(apply, transpose=transpose))

    if _use_panels(fac, refine):
        solver = make_panels(jnp.swapaxes(fac.lu, -1, -2))     # one copy of the factor
    else:
        solver = None
    low_t = _low_solver(fac.lu if solver is None else solver, fac.perm, fac.scale, w)

    def low(R, trans=tm):
        return low_t(R, trans)

    # the corrections take the factor from the loop state, and the deferred estimate's
    # factor is the loop's output (one buffer throughout; tests/test_linalg_cost.py checks
    # on the compiled program that returning it costs no copy)
    if refine == "lu":
        def correct(r, lu):
            return _low_solver(lu if solver is None else solver, fac.perm, fac.scale,
                               w)(r, tm)
    else:
        def correct_one(a, lu, perm, sc, r, trans=tm):
            # trans == tm: op(A) d = r; otherwise op(A)^T d = r (the condition estimate)
            op_t = transpose if trans == tm else not transpose

            def matvec(v):
                return apply(a, v[:, None], transpose=op_t)[:, 0]

            def precond(v):
                return _low_one(lu, perm, sc, v[:, None], w, trans)[:, 0]

            col = partial(fgmres, matvec, precond, restart=min(n, _GMRES_RESTART),
                          tol=_GMRES_TOL)
            return jax.vmap(col, in_axes=1, out_axes=1)(r)

        def correct(r, lu, trans=tm):
            one = partial(correct_one, trans=trans)
            if fac.perm is None:
                return jax.vmap(lambda a, l, sc, r: one(a, l, None, sc, r))(
                    A, lu, fac.scale, r)
            return jax.vmap(one)(A, lu, fac.perm, fac.scale, r)

    fac_good = fac.cast_ok & fac.factor_ok
    x0 = low(B)
    cond_factors = None
    # "lazy": kappa_inf(A) is deferred; the info keeps the factors (also for the transposed
    # solve of a gradient, whose aux info must have the forward structure), filled in
    # after the loop. F = lu^T is the row-major view of the LAPACK factor: no copy.
    # GMRES-IR converges beyond kappa u_f ~ 1, where the low-precision factors no longer
    # estimate kappa (kappa 4e16 estimated at 3e6..2e10 and reported
    # CONVERGED): its estimate is always computed, to screen for that (see below)
    screen = refine == "gmres"
    # LU-IR converges only where kappa u_f < 1, which bounds kappa u_w only when the
    # factors are coarser than the working precision. With factors at the working
    # precision (x64 off: solve(..., working="f32"); factor="f64") x0 passes at once
    # whatever kappa (Hilbert-10 in float32 CONVERGED, kappa u_w = 56,
    # error 110%): the factors' estimate decides ILL_CONDITIONED, as after a fallback
    at_working = refine == "lu" and not u_factor > float(unit_roundoff(w))
    keep_factors = estimate_cond == "lazy" and not (screen or at_working)
    if estimate_cond == "eager" or screen or at_working:
        kappa_low = _hh_kappa(low, anrm, tm, n)
        kappa_low = jnp.where(fac_good & jnp.isfinite(kappa_low), kappa_low,
                              jnp.asarray(jnp.inf, w))
    else:
        kappa_low = jnp.full((m,), jnp.nan, w)

    thresh = (anrm * jnp.asarray(tol, w))[:, None]       # (m, 1)
    r0 = B - mv(A, x0)
    rn0 = _colnorm(r0)
    xn0 = _colnorm(x0)
    conv0 = rn0 <= xn0 * thresh
    bad0 = ~(jnp.isfinite(rn0) & jnp.isfinite(xn0)) | ~fac_good[:, None]
    its0 = jnp.zeros((m,), jnp.int32)

    def cond(s):
        it, _, _, _, _, conv, stalled, _ = s
        return (it < max_iters) & jnp.any(~conv & ~stalled)

    def body(s):
        it, its, x, r, rn, conv, stalled, lu = s
        active = ~conv & ~stalled                                  # (m, k)
        d = correct(r, lu)
        x_new = jnp.where(active[:, None, :], x + d, x)
        r_new = B - mv(A, x_new)
        rn_new = _colnorm(r_new)
        xn_new = _colnorm(x_new)
        conv_new = conv | (active & (rn_new <= xn_new * thresh))
        progress = rn_new <= _STAGNATION * rn                       # False on NaN
        stalled_new = stalled | (active & ~conv_new & ~progress)
        keep_old = active & ~(rn_new <= rn)                         # residual grew: revert
        x_out = jnp.where(keep_old[:, None, :], x, x_new)
        r_out = jnp.where(keep_old[:, None, :], r, r_new)
        rn_out = jnp.where(keep_old, rn, rn_new)
        its = its + jnp.any(active, axis=1).astype(jnp.int32)
        return it + 1, its, x_out, r_out, rn_out, conv_new, stalled_new, lu

    init = (jnp.asarray(0, jnp.int32), its0, x0, r0, rn0, conv0, bad0, fac.lu)
    _, its, x, r, _, conv, _, lu_out = lax.while_loop(cond, body, init)
    if keep_factors:
        cond_factors = _CondFactors(jnp.swapaxes(lu_out, -1, -2), fac.perm, fac.scale,
                                    fac.norminf)

    need = ~(fac_good & jnp.all(conv, axis=1))
    u_w = unit_roundoff(w)
    status_ref = jnp.full((m,), _S_CONVERGED, jnp.int32)
    if screen:
        # where kappa_low u_f >= 1 the factors are numerically singular at their own
        # precision: estimate kappa by the same Hager-Higham steps with solves through
        # GMRES-IR itself (working-precision products, the factors as preconditioner),
        # and decide ILL_CONDITIONED by kappa u_w >= 1 as the fallback does
        untrusted = ~(kappa_low * u_factor < 1) & ~need

        def through_gmres(_):
            return _hh_kappa(lambda R, trans: correct(R, fac.lu, trans), anrm, tm, n)

        kappa_gm = lax.cond(jnp.any(untrusted), through_gmres,
                            lambda _: jnp.zeros((m,), w), None)
        kappa_low = jnp.where(untrusted, jnp.maximum(kappa_gm, kappa_low), kappa_low)
        status_ref = jnp.where(untrusted & ~(kappa_low * u_w < 1),
                               int(Status.ILL_CONDITIONED), status_ref).astype(jnp.int32)
        if estimate_cond == "none":
            kappa_low = jnp.full((m,), jnp.nan, w)
    if at_working:
        status_ref = jnp.where(~need & ~(kappa_low * u_w < 1),
                               int(Status.ILL_CONDITIONED), status_ref).astype(jnp.int32)
        if estimate_cond == "none":
            kappa_low = jnp.full((m,), jnp.nan, w)

    def fallback(ops):
        """Working-precision solve of the given rows (any number of them)."""
        A_, B_, cast_ok, factor_ok = ops
        finite_in = (jnp.all(jnp.isfinite(A_), axis=(1, 2))
                     & jnp.all(jnp.isfinite(B_), axis=(1, 2)))
        anrm_f = _norm1(A_) if transpose else jnp.max(jnp.sum(jnp.abs(A_), axis=-1), -1)
        # ||A|| far from 1: solve (s A) x = s b, s a power of 2 (see pow2_scale)
        s1, s2 = pow2_scale(anrm_f, w)
        As, Bs = A_ * s1 * s2, B_ * s1 * s2
        anrm_s = anrm_f * s1[:, 0, 0] * s2[:, 0, 0]   # ||s A||: kappa does not change
        At = jnp.swapaxes(As, -1, -2)
        if kind == "chol":
            L = lax.linalg.cholesky(At, symmetrize_input=False)
            bad = ~_chol_ok(L)
            xf = jax.vmap(_chol_solve)(L, Bs)
            kappa = anrm_s * jax.vmap(partial(_chol_inverse_norm1, dtype=w))(L)
            s_bad = int(Status.NOT_POSITIVE_DEFINITE)
        else:
            f64_, perm64 = lu_factor_transposed(As)
            lu64 = jnp.swapaxes(f64_, -1, -2)
            bad = jax.vmap(zero_pivot)(lu64)
            xf = jax.vmap(partial(lu_solve, transpose=tm))(lu64, perm64, Bs)
            # kappa_inf(op(A)) = ||op(A)||_inf ||op(A)^{-T}||_1 (see the refinement path)
            kappa = anrm_s * jax.vmap(
                partial(inverse_norm1, dtype=w, transpose=not tm))(lu64, perm64)
            s_bad = int(Status.SINGULAR)
        rf = B_ - mv(A_, xf)
        nan_out = bad | ~finite_in
        xf = jnp.where(nan_out[:, None, None], jnp.asarray(jnp.nan, w), xf)
        status = jnp.select(
            [~finite_in, bad, kappa * u_w >= 1],
            [int(Status.NONFINITE_INPUT), s_bad, int(Status.ILL_CONDITIONED)],
            default=_S_CONVERGED).astype(jnp.int32)
        reason = jnp.select(
            [~finite_in, ~cast_ok, ~factor_ok],
            [int(Reason.NONFINITE), int(Reason.OVERFLOW), int(Reason.SINGULAR_FACTOR)],
            default=int(Reason.STAGNATION)).astype(jnp.int32)
        return xf, rf, anrm_f, status, reason, kappa

    current = (x, r, anrm, status_ref, jnp.full((m,), int(Reason.NONE), jnp.int32),
               kappa_low)
    x, r, anrm, status, reason, kappa = recompute_rows(
        need, fallback, (A, B, fac.cast_ok, fac.factor_ok), current,
        capacity=capacity_for(capacity, m))

    rn, bn = _colnorm(r), _colnorm(B)
    eta = backward_error(anrm, _colnorm(x), rn, bn)
    eta_max = jnp.max(eta, axis=1)
    # "CONVERGED" only with a working-precision backward error: a fallback is not
    # checked by the refinement's stopping rule (a non-symmetric A
    # with assume_a="pos", eta 0.13; entries at 1e307, x 68% wrong)
    status = jnp.where((status == _S_CONVERGED) & ~(eta_max <= _inaccurate_above(tol, n, w)),
                       int(Status.INACCURATE), status).astype(jnp.int32)
    info = SolveInfo(iterations=its, backward_error=eta_max.astype(w),
                     fell_back=need, cond_value=kappa, status=status, reason=reason,
                     residual_norm=relative_residual(rn, bn).astype(w),
                     cond_factors=cond_factors)
    return x, info


def _refine_batched(A, B, fac: _Factors, **kw):
    """:func:`_refine` with a ``custom_vmap`` rule: a ``vmap`` axis is folded into the
    batch axis (so the fallback stays a compacted ``switch``, not a ``select``)."""
    leaves, treedef = jax.tree_util.tree_flatten(fac)

    @custom_vmap
    def run(A, B, *leaves):
        return _refine(A, B, jax.tree_util.tree_unflatten(treedef, leaves), **kw)

    @run.def_vmap
    def rule(axis_size, in_batched, A, B, *leaves):
        args = (A, B) + tuple(leaves)
        if not any(in_batched):
            out = run(*args)
            return out, jax.tree_util.tree_map(lambda _: False, out)
        if not in_batched[0] and not any(in_batched[2:]):
            # only b is mapped (e.g. jacfwd): the members share A and its factors, so the
            # mapped axis becomes more right-hand sides of the same systems (no copies of
            # A); their info is shared, i.e. the worst case over the members
            m, n, k = B.shape[1:]
            Bf = jnp.moveaxis(B, 0, -2).reshape(m, n, axis_size * k)
            x, info = _refine_batched(A, Bf, jax.tree_util.tree_unflatten(treedef, leaves),
                                      **kw)
            x = jnp.moveaxis(x.reshape(m, n, axis_size, k), -2, 0)
            info = jax.tree_util.tree_map(
                lambda f: jnp.broadcast_to(f[None], (axis_size,) + f.shape), info)
            out = (x, info)
            return out, jax.tree_util.tree_map(lambda _: True, out)
        folded = []
        for x, batched in zip(args, in_batched):
            if not batched:
                x = jnp.broadcast_to(x[None], (axis_size,) + x.shape)
            folded.append(x.reshape((axis_size * x.shape[1],) + x.shape[2:]))
        fac_f = jax.tree_util.tree_unflatten(treedef, folded[2:])
        out = _refine_batched(folded[0], folded[1], fac_f, **kw)
        out = jax.tree_util.tree_map(lambda y: y.reshape((axis_size, -1) + y.shape[1:]),
                                     out)
        return out, jax.tree_util.tree_map(lambda _: True, out)

    return run(A, B, *leaves)


@partial(jax.jit, static_argnames=("storage", "compute", "refine", "max_iters", "tol",
                                   "estimate_cond", "kind", "method", "capacity"))
def _solve_batched(A, B, *, storage, compute, refine, max_iters, tol, estimate_cond, kind,
                   method, capacity):
    A_s = lax.stop_gradient(A)
    fac = _factor(A_s, storage, compute, kind, method)
    kw = dict(refine=refine, max_iters=max_iters, tol=tol, kind=kind, capacity=capacity,
              u_factor=float(unit_roundoff(storage)))

    def matvec(X):
        return jnp.matmul(A, X)

    def solve_fn(_matvec, rhs):
        return _refine_batched(A_s, rhs, fac, transpose=False, estimate_cond=estimate_cond,
                               **kw)

    def transpose_solve_fn(_vecmat, rhs):
        # no estimate for the adjoint solve; "lazy" keeps the aux structure of solve_fn
        ec = "lazy" if estimate_cond == "lazy" else "none"
        return _refine_batched(A_s, rhs, fac, transpose=True, estimate_cond=ec, **kw)

    return lax.custom_linear_solve(matvec, B, solve_fn, transpose_solve_fn, has_aux=True)


def _resolve_auto(factor, refine, what):
    if isinstance(factor, str) and factor == "auto":
        backend = _backend()
        factor_a, refine_a = AUTO_FACTOR.get(backend, AUTO_FACTOR["cpu"])
        factor = factor_a
        if refine == "auto":
            refine = refine_a
    if refine == "auto":
        fdt = canonical_dtype(factor)
        refine = "lu" if unit_roundoff(fdt) <= unit_roundoff(np.float32) else "gmres"
    return factor, refine


@partial(float64_call, describe=x64_need("solve", "auto"))
def solve(A, b, *, assume_a="gen", factor="auto", working="f64", refine="auto",
          max_iters=30, tol=None, estimate_cond="lazy", fallback_capacity=0.125):
    r"""Solve ``A x = b`` by low-precision factors and working-precision refinement.

    LAPACK ``dsgesv`` / ``dsposv`` semantics (see the module docstring and
    ``docs/linalg.md``): factor ``A`` once in ``factor`` precision, refine in ``working``
    precision until :math:`\|r\|_\infty \le \mathrm{tol}\,\|x\|_\infty\|A\|_\infty` for
    every right-hand side, else fall back to a ``working``-precision factorization
    (executed only for the systems that need it).

    Args:
        A: ``(..., n, n)`` floating array.
        b: ``(n,)``, ``(..., n)`` (one vector per matrix: ``b.ndim == A.ndim - 1``) or
            ``(..., n, k)`` (``k`` right-hand sides). Batch dimensions broadcast.
        assume_a: ``"gen"`` (general: LU with partial pivoting, dsgesv) or ``"pos"``
            (symmetric positive definite: Cholesky, dsposv; only the upper triangle of
            ``A`` enters the factors, the residuals use all of ``A``). As in
            ``scipy.linalg.solve``; ``"general"`` and ``"positive definite"`` also work.
        factor: precision of the factors. ``"auto"`` (default) picks per backend
            (:data:`AUTO_FACTOR`): float32 on CPU, float16 on GPU, bfloat16 on TPU.
            ``"f32"``, ``"bf16"``/``"f16"`` or the working precision itself can be forced.
            Half-precision factors on CPU round ``A`` to that format and factor it with
            float32 LAPACK (same numerics as a half-precision-input factorization, not
            faster); on accelerators a blocked LU runs its trailing updates as
            half-precision GEMMs with float32 accumulation (tensor cores).
        working: precision of ``x``, residuals and the fallback (``"f64"`` needs
            ``jax_enable_x64``; ``"f32"`` with a half-precision factor also works).
        refine: ``"lu"`` (corrections from the low-precision factors, dsgesv),
            ``"gmres"`` (GMRES-IR: factor-preconditioned FGMRES in the working precision;
            converges for larger condition numbers and for half-precision factors), or
            ``"auto"`` (``"lu"`` for float32 factors, ``"gmres"`` for half precision).
        max_iters: cap on refinement steps (dsgesv's ``ITERMAX = 30``).
        tol: stopping tolerance; default :math:`\sqrt{n}\,u_{working}`.
        estimate_cond: the refinement-path ``info.cond_estimate`` (two Hager–Higham
            steps on the low-precision factors: four single-column low-precision solves,
            O(n^2)). ``"lazy"`` (default): deferred until ``info.cond_estimate`` is read;
            the info keeps the low-precision factors for it (``info.cond_factors``, n^2
            factor-precision entries per system), so the call itself costs nothing extra.
            ``True``: computed in the call (no factors kept; ~10% of the call at n = 2048
            here, see ``docs/linalg.md``). ``False``: NaN, no factors kept. The fallback
            path always estimates it from the working-precision factors (it decides
            ``ILL_CONDITIONED``).
        fallback_capacity: how many systems of a batch (or of a ``vmap``) can fall back
            without factoring the whole batch in the working precision: an int, or a
            fraction of the batch size (default 1/8).

    Returns:
        ``(x, info)``: ``x`` in the working dtype with ``b``'s shape (batch-broadcast), and
        a :class:`SolveInfo` whose fields have the batch shape.

    Raises:
        ValueError: non-square ``A``, mismatched shapes, non-floating dtypes, unknown
            options, or (for concrete inputs, outside ``jit``) NaN/Inf in ``A`` or ``b``.
            Inside ``jit`` non-finite input gives ``Status.NONFINITE_INPUT`` and NaN ``x``.

    ``jit``, ``vmap`` and ``grad``/``jvp`` work (gradients by implicit differentiation:
    ``b_bar = A^{-T} x_bar``, ``A_bar = -b_bar x^T``, with the adjoint refined on the same
    factors). Under ``jax.vmap`` the mapped axis joins the batch: only the members that
    need the working-precision factorization compute it (up to ``fallback_capacity`` of
    them; beyond that the whole batch does).

    Example:
        >>> import jax.numpy as jnp
        >>> import adaptprec as ap
        >>> A = jnp.array([[4.0, 1.0], [1.0, 3.0]])          # float64 (x64 on)
        >>> x, info = ap.linalg.solve(A, jnp.array([1.0, 2.0]))
        >>> bool(jnp.allclose(A @ x, jnp.array([1.0, 2.0]), rtol=0, atol=1e-15))
        True
        >>> int(info.status), bool(info.fell_back), bool(info.backward_error < 1e-15)
        (5, False, True)
        >>> x, info = ap.linalg.solve(A, jnp.array([1.0, 2.0]), assume_a="pos")  # Cholesky
        >>> ap.Status(int(info.status)).name
        'CONVERGED'
    """
    what = "solve"
    if not isinstance(assume_a, str) or assume_a not in _ASSUME_A:
        raise ValueError(
            f"{what}: assume_a must be 'gen' (general, LU) or 'pos' (symmetric positive "
            f"definite, Cholesky), got {assume_a!r}; for symmetric indefinite matrices use "
            "'gen'"
        )
    kind = _ASSUME_A[assume_a]
    if refine not in ("lu", "gmres", "auto"):
        raise ValueError(f"{what}: refine must be 'auto', 'lu' or 'gmres', got {refine!r}")
    factor, refine = _resolve_auto(factor, refine, what)
    check_options(refine, max_iters, tol, what)
    capacity_for(fallback_capacity, 1)          # validates
    modes = {"lazy": "lazy", True: "eager", False: "none"}
    if not (isinstance(estimate_cond, (bool, str)) and estimate_cond in modes):
        raise ValueError(
            f"{what}: estimate_cond must be 'lazy' (default: estimated when "
            "info.cond_estimate is read), True (in the call) or False (not at all), got "
            f"{estimate_cond!r}"
        )
    storage, compute, w = resolve_precisions(factor, working, what=what)
    A = check_array(A, "A", what)
    if A.ndim < 2 or A.shape[-1] != A.shape[-2]:
        raise ValueError(
            f"{what}: A must be a square matrix or a stack of them, shape (..., n, n); got "
            f"shape {tuple(A.shape)}. For rectangular A use ap.linalg.lstsq."
        )
    method = "lapack"
    if unit_roundoff(storage) > unit_roundoff(np.float32) and kind == "lu" \
            and _backend() != "cpu":
        method = "blocked"
    n = A.shape[-1]
    A3, B3, out_shape, batch = prepare_system(A, b, w, what)
    tol_ = float(math.sqrt(n) * unit_roundoff(w)) if tol is None else float(tol)
    x, info = _solve_batched(A3, B3, storage=storage, compute=compute, refine=refine,
                             max_iters=int(max_iters), tol=tol_,
                             estimate_cond=modes[estimate_cond], kind=kind, method=method,
                             capacity=fallback_capacity)
    x = x.reshape(out_shape)
    info = jax.tree_util.tree_map(lambda f: f.reshape(batch + f.shape[1:]), info)
    return x, info
