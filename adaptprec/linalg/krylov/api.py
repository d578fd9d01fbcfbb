r"""``cg``, ``gmres`` and ``bicgstab``: the boundary (validation, the float64 rule) and the
one dispatch into the loop.

Decision tree of every call (:func:`solve_krylov`):

1. ``A``: a ``scipy.sparse`` matrix becomes a BCOO matrix (BCSR too: its product is slower); a dense ``(n, n)`` array, a
   BCOO/BCSR matrix, a callable ``matvec(x)`` or a lineax operator becomes the
   :class:`~adaptprec.linalg.krylov._operator.Operator`, its matrix in the top rung's dtype;
2. ``M``: ``None``; ``"jacobi"`` / ``"block_jacobi"`` (built from ``A``); a
   :class:`Jacobi` / :class:`BlockJacobi`; or any form ``A`` may take, applied as
   ``M r`` (scipy's convention: ``M`` approximates ``A^{-1}``);
3. ``ladder`` (default ``"f32,f64"``): the rungs the iterations may run on; the top rung
   is the working precision of ``x`` and of the residual that decides CONVERGED. With
   x64 off, a float64 top rung follows the one x64 rule (eager: computed in the
   thread-local float64 scope, NumPy results; traced: the one error);
4. ``b`` of shape ``(n, k)``: ``k`` solves under ``jax.vmap`` (each its own rung);
   ``x0``: the solve runs on ``A d = b - A x0`` from 0 and returns ``x0 + d``, the
   tolerance still relative to ``||b||``;
5. ``lax.custom_linear_solve``: ``grad``/``jvp`` by implicit differentiation, one solve
   with ``A^T`` (CG: ``A``) per cotangent, to the same ``rtol``.
"""

from __future__ import annotations

import math
import sys
from functools import partial

import numpy as np

import jax
import jax.numpy as jnp
from jax import lax

from ..._rungs import normalize_ladder
from ..._tracing import is_concrete
from ..._x64_rule import float64_call, wants_float64
from ...schedule import PrecisionSchedule, StallEscalation
from .._common import check_finite
from ._loop import run
from ._operator import Operator, as_operator, is_dense, operator_size, probe
from ._bicgstab import BiCGStab
from ._cg import CG
from ._gmres import DEFAULT_RESTART, GMRES
from .preconditioners import BlockJacobi, Jacobi, block_jacobi_of, jacobi_of

__all__ = ["cg", "gmres", "bicgstab", "DEFAULT_LADDER", "default_schedule"]

DEFAULT_LADDER = "f32,f64"
"""Iterate in float32, check and carry ``x`` in float64."""


def default_schedule() -> StallEscalation:
    """``StallEscalation(rate=0.5, patience=2)``: climb when two consecutive cycles fail to
    halve the true residual. A cycle ends when the recursive residual fell tenfold, so a
    true residual that does not halve means the rung's rounding, not the Krylov method,
    limits the progress: refinement with a solve of relative accuracy ``phi`` contracts
    the error by about ``phi`` per step, and ``phi = O(u_rung kappa)`` (Carson and Higham,
    "Accelerating the solution of linear systems by iterative refinement in three
    precisions", SIAM J. Sci. Comput. 40(2), 2018). Two cycles, as QUDA stops a solve at
    the second consecutive residual increase (``max_res_increase = 1``)."""
    return StallEscalation(rate=0.5, patience=2)


def _x64_need(entry: str):
    def describe(A, b, x0=None, **kwargs):
        ladder = kwargs.get("ladder", DEFAULT_LADDER)
        if not wants_float64(ladder):
            return None
        return (f"linalg.{entry}", "ladder", ladder, "ladder='f32'",
                (A, b, x0, kwargs.get("M")))
    return describe


def _scipy_sparse(A):
    sp = sys.modules.get("scipy.sparse")
    if sp is not None and sp.issparse(A):
        from jax.experimental import sparse
        return sparse.BCOO.from_scipy_sparse(A.tocoo())
    spla = sys.modules.get("scipy.sparse.linalg")
    if spla is not None and isinstance(A, spla.LinearOperator):
        raise TypeError(
            "A scipy.sparse.linalg.LinearOperator runs NumPy on the host and cannot be "
            "traced; pass its product as a JAX function instead, e.g. "
            "A=lambda x: my_matvec_in_jax(x)")
    return A


def _floating(x, name, what, w):
    x = np.asarray(x) if isinstance(x, (list, tuple)) or not hasattr(x, "dtype") else x
    dt = np.dtype(x.dtype)
    if dt.kind not in "fiub" or dt.kind == "c":
        raise ValueError(f"{what}: {name} must be a real array, got dtype {dt}")
    return jnp.asarray(x).astype(w)


def _check_options(what, rtol, atol, maxiter, tol):
    if tol is not None:
        if rtol != 1e-5:
            raise ValueError(f"{what}: give rtol or its alias tol (jax.scipy's name), not both")
        rtol = tol
    for name, v in (("rtol", rtol), ("atol", atol)):
        if isinstance(v, bool) or not isinstance(v, (int, float, np.floating)) \
                or not math.isfinite(v) or v < 0:
            raise ValueError(f"{what}: {name} must be a finite number >= 0, got {v!r}")
    if maxiter is not None and (isinstance(maxiter, bool)
                                or not isinstance(maxiter, (int, np.integer)) or maxiter < 0):
        raise ValueError(f"{what}: maxiter must be None or an int >= 0, got {maxiter!r}")
    return float(rtol), float(atol)


def _ladder(ladder, what):
    try:
        rungs, lad = normalize_ladder(ladder)
    except (ValueError, TypeError) as e:
        raise ValueError(f"{what}: bad ladder {ladder!r}: {e}") from None
    dts = tuple(np.dtype(d) for d in lad)
    if any(d.itemsize < 2 for d in dts) or any(getattr(r, "wrap", None) for r in rungs):
        raise ValueError(f"{what}: ladder rungs must be floating dtypes such as "
                         f"'f32,f64', got {ladder!r}")
    if dts[-1].itemsize < 4:
        raise ValueError(f"{what}: the top rung ({dts[-1].name}) holds x and the residual "
                         "that decides convergence; it must be float32 or float64")
    return tuple(d.name for d in dts)


def _preconditioner(M, op: Operator, n, w, what):
    if M is None or isinstance(M, (Jacobi, BlockJacobi)):
        return M
    if isinstance(M, str):
        if M == "jacobi":
            return jacobi_of(op, w)
        if M == "block_jacobi":
            from .preconditioners import DEFAULT_ACCURACY, DEFAULT_BLOCK_SIZE
            return block_jacobi_of(op, n, w, DEFAULT_BLOCK_SIZE, DEFAULT_ACCURACY)
        raise ValueError(f"{what}: M must be None, 'jacobi', 'block_jacobi', a "
                         f"preconditioner, a matrix or a callable; got {M!r}")
    M = _scipy_sparse(M)
    if operator_size(M, n, f"{what} (M)") != n:
        raise ValueError(f"{what}: M must be {n} x {n} like A")
    return as_operator(M, n, w)


def _check_callable(fn, n, w, name, what):
    try:
        out = probe(fn, n, w)
    except Exception as e:  # the user's function fails on a vector of the right shape
        raise ValueError(f"{what}: {name}(x) failed on a vector of shape ({n},): "
                         f"{type(e).__name__}: {e}") from e
    if not hasattr(out, "shape") or tuple(out.shape) != (n,):
        raise ValueError(f"{what}: {name}(x) must return an array of shape ({n},), got "
                         f"{getattr(out, 'shape', type(out).__name__)}")


@partial(jax.jit, static_argnames=("ladder",))
def _core(solver, op, M, B, X0, rtol, atol, maxiter, schedule, *, ladder):
    w = np.dtype(ladder[-1])
    matvec = op.at(w)
    op_t, M_t = op.transpose(), (M.transpose() if M is not None else None)
    kw = dict(maxiter=maxiter, ladder=ladder, schedule=schedule)

    def one(b, x0):
        bnorm = lax.stop_gradient(jnp.linalg.norm(b))
        tol_abs = jnp.maximum(rtol * bnorm, atol)
        rhs = b if x0 is None else b - matvec(x0)

        def solve_fn(_matvec, rhs):
            return run(solver, op, M, rhs, tol_abs=tol_abs, bnorm=bnorm, **kw)

        def transpose_solve_fn(_vecmat, rhs):
            cn = jnp.linalg.norm(rhs)
            return run(solver, op_t, M_t, rhs, tol_abs=jnp.maximum(rtol * cn, atol),
                       bnorm=cn, **kw)

        x, info = lax.custom_linear_solve(
            matvec, rhs, solve_fn,
            None if solver.name == "cg" else transpose_solve_fn,
            symmetric=solver.name == "cg", has_aux=True)
        return (x if x0 is None else x + x0), info

    if B.shape[1] == 1:
        x, info = one(B[:, 0], None if X0 is None else X0[:, 0])
        return x[:, None], jax.tree.map(lambda f: f[None], info)
    return jax.vmap(one, in_axes=(1, None if X0 is None else 1), out_axes=(1, 0))(B, X0)


def solve_krylov(solver, what, A, b, x0, *, rtol, atol, maxiter, M, ladder, schedule, tol):
    """The decision tree of the module docstring (the body of ``cg``/``gmres``/``bicgstab``)."""
    rtol, atol = _check_options(what, rtol, atol, maxiter, tol)
    ladder = _ladder(ladder, what)
    w = np.dtype(ladder[-1])
    if schedule is None:
        schedule = default_schedule()
    elif not isinstance(schedule, PrecisionSchedule):
        raise TypeError(f"{what}: schedule must be a PrecisionSchedule (e.g. "
                        f"ap.schedule.StallEscalation(0.5, 2)), got {schedule!r}")
    b = _floating(b, "b", what, w)
    if b.ndim not in (1, 2) or b.shape[0] == 0:
        raise ValueError(f"{what}: b must have shape (n,) or (n, k), got {tuple(b.shape)}")
    A = _scipy_sparse(A)
    n = operator_size(A, b.shape[0], what, working=w)
    if b.shape[0] != n:
        raise ValueError(f"{what}: b has {b.shape[0]} rows but A is {n} x {n}")
    if is_dense(A):
        A = _floating(A, "A", what, w)
    op = as_operator(A, n, w)
    if op.kind == "function":
        _check_callable(op.fn, n, w, "A", what)
    X0 = None
    if x0 is not None:
        x0 = _floating(x0, "x0", what, w)
        if tuple(x0.shape) != tuple(b.shape):
            raise ValueError(f"{what}: x0 must have b's shape {tuple(b.shape)}, got "
                             f"{tuple(x0.shape)}")
        X0 = x0 if x0.ndim == 2 else x0[:, None]
    if is_concrete(b, x0):
        check_finite(what, **({"b": b} if x0 is None else {"b": b, "x0": x0}))
    Mop = _preconditioner(M, op, n, w, what)
    if isinstance(Mop, Operator) and Mop.kind == "function":
        _check_callable(Mop.fn, n, w, "M", what)
    B = b if b.ndim == 2 else b[:, None]
    maxiter = 10 * n if maxiter is None else int(maxiter)
    x, info = _core(solver, op, Mop, B, X0, rtol, atol, jnp.asarray(maxiter, jnp.int32),
                    schedule, ladder=ladder)
    if b.ndim == 1:
        x, info = x[:, 0], jax.tree.map(lambda f: f[0], info)
    return x, info


_COMMON = r"""
    Args:
        A: the ``(n, n)`` operator: a dense array, a ``jax.experimental.sparse`` BCOO/BCSR
            matrix (or a ``scipy.sparse`` matrix, converted), a callable
            ``matvec(x) -> A x`` (called with ``x`` in the top rung's dtype; write it so
            that it runs in any floating dtype), or a lineax linear operator.
        b: ``(n,)`` or ``(n, k)`` (``k`` right-hand sides, solved side by side).
        x0: starting guess (``b``'s shape); default zeros.
        rtol, atol: stop when ``||b - A x||_2 <= max(rtol ||b||_2, atol)`` for the true
            residual computed in the top rung's dtype (scipy's rule); ``tol`` is an
            alias of ``rtol`` (jax.scipy's name).
        maxiter: cap on the iterations of all rungs (default ``10 n``, scipy's).
        M: preconditioner approximating ``A^{-1}``: ``"jacobi"``, ``"block_jacobi"``
            (storage precision per block from its condition number, as Ginkgo), a
            :class:`Jacobi`/:class:`BlockJacobi`, a matrix, a callable or a lineax
            operator.
        ladder: the rungs (default ``"f32,f64"``): iterations run on the schedule's rung,
            the top rung holds ``x`` and decides convergence. ``"f64"`` runs plain
            float64 with the same checks.
        schedule: a :class:`~adaptprec.schedule.PrecisionSchedule` fed once per cycle
            with the true relative residual; default :func:`default_schedule`. NaN/Inf
            on a lower rung climbs at once.

    Returns:
        ``(x, info)``: ``x`` in the top rung's dtype with ``b``'s shape and a
        :class:`KrylovInfo` (fields of shape ``(k,)`` for ``k`` right-hand sides).
        Trust ``x`` when ``info.success``.

    Raises:
        ValueError / TypeError: bad shapes, dtypes or options; NaN/Inf in concrete
            ``b`` or ``x0`` (inside ``jit``: status ``NONFINITE_INPUT``); float64 asked
            under ``jit`` with x64 off (the one x64 message).

    ``jit``, ``vmap`` (batched systems) and ``grad``/``jvp`` (implicit: one solve with
    ``A^T`` per cotangent) work.
"""


@partial(float64_call, describe=_x64_need("cg"))
def cg(A, b, x0=None, *, rtol=1e-5, atol=0.0, maxiter=None, M=None, ladder=DEFAULT_LADDER,
       schedule=None, tol=None):
    """Conjugate gradients for symmetric positive definite ``A``, iterating on a
    precision ladder and verified by the float64 residual (``docs/krylov.md``).
    {common}
    Example:
        >>> import jax.numpy as jnp
        >>> import adaptprec as ap
        >>> A = jnp.array([[4.0, 1.0], [1.0, 3.0]])
        >>> x, info = ap.linalg.cg(A, jnp.array([1.0, 2.0]), rtol=1e-12)
        >>> [round(v, 6) for v in x.tolist()], ap.Status(int(info.status)).name
        ([0.090909, 0.636364], 'CONVERGED')
    """
    return solve_krylov(CG(), "cg", A, b, x0, rtol=rtol, atol=atol, maxiter=maxiter, M=M,
                        ladder=ladder, schedule=schedule, tol=tol)


@partial(float64_call, describe=_x64_need("gmres"))
def gmres(A, b, x0=None, *, rtol=1e-5, atol=0.0, restart=DEFAULT_RESTART, maxiter=None,
          M=None, ladder=DEFAULT_LADDER, schedule=None, tol=None):
    """Restarted GMRES for a general square ``A`` on a precision ladder, verified by the
    float64 residual; ``restart`` Arnoldi steps per cycle (scipy's default 20).
    {common}
    Example:
        >>> import jax.numpy as jnp
        >>> import adaptprec as ap
        >>> A = jnp.array([[3.0, 2.0, 0.0], [1.0, -1.0, 0.0], [0.0, 5.0, 1.0]])
        >>> x, info = ap.linalg.gmres(A, jnp.array([2.0, 4.0, -1.0]), rtol=1e-12)
        >>> [round(v, 6) for v in x.tolist()], bool(info.success)
        ([2.0, -2.0, 9.0], True)
    """
    if isinstance(restart, bool) or not isinstance(restart, (int, np.integer)) or restart < 1:
        raise ValueError(f"gmres: restart must be an int >= 1, got {restart!r}")
    return solve_krylov(GMRES(restart=int(restart)), "gmres", A, b, x0, rtol=rtol, atol=atol,
                        maxiter=maxiter, M=M, ladder=ladder, schedule=schedule, tol=tol)


@partial(float64_call, describe=_x64_need("bicgstab"))
def bicgstab(A, b, x0=None, *, rtol=1e-5, atol=0.0, maxiter=None, M=None,
             ladder=DEFAULT_LADDER, schedule=None, tol=None):
    """BiCGStab for a general square ``A`` on a precision ladder, verified by the float64
    residual (two products per iteration).
    {common}
    Example:
        >>> import jax.numpy as jnp
        >>> import adaptprec as ap
        >>> A = jnp.array([[3.0, 2.0, 0.0], [1.0, -1.0, 0.0], [0.0, 5.0, 1.0]])
        >>> x, info = ap.linalg.bicgstab(A, jnp.array([2.0, 4.0, -1.0]), rtol=1e-12)
        >>> [round(v, 6) for v in x.tolist()], bool(info.success)
        ([2.0, -2.0, 9.0], True)
    """
    return solve_krylov(BiCGStab(), "bicgstab", A, b, x0, rtol=rtol, atol=atol,
                        maxiter=maxiter, M=M, ladder=ladder, schedule=schedule, tol=tol)


for _f in (cg, gmres, bicgstab):
    _f.__doc__ = _f.__doc__.replace("{common}", _COMMON)
del _f
