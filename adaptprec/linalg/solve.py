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

The factors and the solves with them live in :mod:`._factors`, the refinement loop and the
fallback in :mod:`._refine`, :class:`SolveInfo` and its measures in :mod:`._solve_info`;
this module is the entry point: validation, ``"auto"`` choices, the implicit gradient.
"""

from __future__ import annotations

import math
from functools import partial

import numpy as np

import jax
import jax.numpy as jnp
from jax import lax

from .._compaction import capacity_for
from .._x64_rule import float64_call
from ..precision import canonical_dtype, unit_roundoff
from ._common import (check_array, check_options, prepare_system, resolve_precisions,
                      x64_need)
from ._factors import factor_low
from ._refine import refine_batched
from ._solve_info import STATUS_MESSAGES, SolveInfo

__all__ = ["solve", "SolveInfo", "STATUS_MESSAGES"]

_ASSUME_A = {"gen": "lu", "general": "lu", "pos": "chol", "positive definite": "chol"}

AUTO_FACTOR = {"cpu": ("f32", "lu"), "gpu": ("f16", "gmres"), "tpu": ("bf16", "gmres")}
"""``factor="auto"`` / ``refine="auto"`` per backend: ``{backend: (factor dtype,
refinement)}``. CPU: XLA:CPU has no faster-than-f32 LU (bf16 is upcast), so float32
factors + LU-IR; accelerators: half-precision factors (tensor-core GEMM updates) +
GMRES-IR, as cuSOLVER IRS / Haidar et al. (SC18)."""


def _backend() -> str:
    """The backend the ``"auto"`` choices are made for (a function: tests and
    benchmarks/bench_linalg.py trace the accelerator path on CPU by replacing it)."""
    return jax.default_backend()


@partial(jax.jit, static_argnames=("storage", "compute", "refine", "max_iters", "tol",
                                   "estimate_cond", "kind", "method", "capacity"))
def _solve_batched(A, B, *, storage, compute, refine, max_iters, tol, estimate_cond, kind,
                   method, capacity):
    """Factor the batch ``A`` ``(m, n, n)`` once and solve ``A X = B`` ``(m, n, k)`` by
    refinement, differentiable implicitly (``lax.custom_linear_solve``): the adjoint
    ``A^T y = g`` is refined on the same low-precision factors."""
    A_s = lax.stop_gradient(A)
    fac = factor_low(A_s, storage, compute, kind, method)
    kw = dict(refine=refine, max_iters=max_iters, tol=tol, kind=kind, capacity=capacity,
              u_factor=float(unit_roundoff(storage)))

    def matvec(X):
        return jnp.matmul(A, X)

    def solve_fn(_matvec, rhs):
        return refine_batched(A_s, rhs, fac, transpose=False, estimate_cond=estimate_cond,
                               **kw)

    def transpose_solve_fn(_vecmat, rhs):
        # no estimate for the adjoint solve; "lazy" keeps the aux structure of solve_fn
        ec = "lazy" if estimate_cond == "lazy" else "none"
        return refine_batched(A_s, rhs, fac, transpose=True, estimate_cond=ec, **kw)

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
