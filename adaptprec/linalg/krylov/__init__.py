"""Matrix-free Krylov solvers on a precision ladder, verified by the float64 residual.

:func:`cg`, :func:`gmres` and :func:`bicgstab` iterate in a cheap precision (float32 by
default) in cycles; after each cycle the true residual ``b - A x`` is computed in the
working precision (a reliable update), a precision schedule decides whether the next
cycle climbs, and only that residual can declare convergence. ``docs/krylov.md`` has the
algorithm and the measured speed.

Files: ``api.py`` (the entry points and their decision tree), ``_loop.py`` (the one loop),
``_cg.py``, ``_gmres.py``, ``_bicgstab.py`` (one method each), ``common.py`` (the solver
interface and the tuned constants), ``_operator.py`` (matrices, functions and lineax
operators on every rung), ``preconditioners.py``, ``info.py``.
"""

from .api import DEFAULT_LADDER, bicgstab, cg, default_schedule, gmres
from .info import KRYLOV_MESSAGES, KrylovInfo
from .preconditioners import BlockJacobi, Jacobi, block_jacobi, jacobi

__all__ = ["cg", "gmres", "bicgstab", "KrylovInfo", "KRYLOV_MESSAGES", "Jacobi",
           "BlockJacobi", "jacobi", "block_jacobi", "DEFAULT_LADDER", "default_schedule"]
