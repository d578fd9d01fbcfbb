"""Mixed-precision linear algebra with working-precision-certified answers.

* :func:`matmul`, :func:`pad_to_multiple` — low-precision products with float32 (or wider)
  accumulation;
* :func:`cond_estimate` — Hager–Higham condition estimate on existing LU factors;
* :func:`solve` — dsgesv/dsposv-style iterative refinement (LU-IR or GMRES-IR; LU or, with
  ``assume_a="pos"``, Cholesky factors) with a per-system fallback;
* :func:`lstsq` — least squares by low-precision QR plus working-precision refinement;
* :func:`cg`, :func:`gmres`, :func:`bicgstab` — matrix-free Krylov solvers iterating on a
  precision ladder (float32 by default), each answer verified by its float64 residual,
  with :func:`jacobi` / :func:`block_jacobi` preconditioners (:mod:`.krylov`).

Example:
    >>> import jax.numpy as jnp
    >>> import adaptprec as ap
    >>> x, info = ap.linalg.solve(jnp.array([[2.0, 0.0], [0.0, 4.0]]), jnp.ones(2))
    >>> x.tolist(), int(info.iterations)
    ([0.5, 0.25], 0)
"""

from .._lapack_init import ensure_lapack as _ensure_lapack
from .cond import cond_estimate
from .krylov import (BlockJacobi, Jacobi, KrylovInfo, bicgstab, block_jacobi, cg, gmres,
                     jacobi)
from .lstsq import lstsq
from .matmul import matmul, pad_to_multiple
from .solve import AUTO_FACTOR, STATUS_MESSAGES, SolveInfo, solve

__all__ = ["matmul", "pad_to_multiple", "cond_estimate", "solve", "lstsq", "SolveInfo",
           "STATUS_MESSAGES", "AUTO_FACTOR", "cg", "gmres", "bicgstab", "KrylovInfo",
           "Jacobi", "BlockJacobi", "jacobi", "block_jacobi"]

# Every function here lowers LAPACK calls: start jaxlib's LAPACK now without importing
# all of scipy.linalg (adaptprec/_lapack_init.py; 0.2-0.4 s less on the first call).
# `import adaptprec` does not import this package (it loads on first use of ap.linalg).
_ensure_lapack()
