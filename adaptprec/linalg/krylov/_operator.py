"""One linear operator for the Krylov solvers, whatever the user passed.

``A`` may be a dense ``(n, n)`` array, a ``jax.experimental.sparse`` BCOO/BCSR matrix, a
callable ``matvec(x)``, or a lineax linear operator; :func:`as_operator` turns each into
an :class:`Operator` whose product runs on any rung of the ladder, in the rung's
arithmetic (its dtype, at least float32):

* an explicit matrix is stored once per rung in the rung's dtype (rounded entries: an
  ``O(u_rung)`` relative perturbation of ``A``, which the float64 residual corrects) and
  multiplied with float32-or-wider accumulation;
* a callable is called with ``x`` in the rung's dtype (float32 for bfloat16/float16
  rungs) and its result rounded to the rung; whatever it closes over is the caller's
  business (constants kept in float64 promote the product to float64);
* a lineax operator other than ``MatrixLinearOperator`` (whose matrix is taken as a dense
  matrix) is closure-converted by lineax at its declared input dtype, so it is called in
  that dtype on every rung (which must be the working precision: pass the function
  itself to let the low rung compute in float32).

A stencil applied to a smooth vector cancels almost everything: written as
``4 u_ij - (sum of neighbours)`` its float32 product has a relative error near
``u_32 kappa``, which costs float32 CG iterations; written in flux form,
``sum over neighbours of (u_ij - u_nb)``, each difference of two close float32 numbers
is exact (Sterbenz) and the product is nearly as good as in float64 (docs/krylov.md).

``lineax`` and ``jax.experimental.sparse`` are never imported here: an object is
recognised only if its module is already loaded (the caller built it).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import numpy as np

import jax
import jax.numpy as jnp

from ..._pytree import Module, field

__all__: list[str] = []


def _lineax_operator(A) -> bool:
    lx = sys.modules.get("lineax")
    return lx is not None and isinstance(A, lx.AbstractLinearOperator)


def _sparse_kind(A) -> str | None:
    sp = sys.modules.get("jax.experimental.sparse")
    if sp is None:
        return None
    if isinstance(A, sp.BCOO):
        return "bcoo"
    if isinstance(A, sp.BCSR):
        return "bcsr"
    return None


def _sparse_astype(A, dtype):
    """A BCOO/BCSR matrix with its values in ``dtype`` (BCSR has no ``astype``)."""
    from jax.experimental import sparse
    data = A.data.astype(dtype)
    if isinstance(A, sparse.BCSR):
        return sparse.BCSR((data, A.indices, A.indptr), shape=A.shape)
    return sparse.BCOO((data, A.indices), shape=A.shape)


def is_dense(A) -> bool:
    """An array (NumPy, JAX, or anything with ``shape`` and ``dtype`` that is neither a
    sparse matrix, a lineax operator nor a callable)."""
    return (hasattr(A, "shape") and hasattr(A, "dtype") and not callable(A)
            and _sparse_kind(A) is None and not _lineax_operator(A))


class Operator(Module):
    """``A`` in one of four forms, with its product on every rung.

    ``kind`` is ``"dense"`` (``data`` the matrix), ``"bcoo"`` (``data`` the sparse matrix;
    a BCSR matrix is converted), ``"function"`` (``fn(x)``) or ``"lineax"`` (``data`` the operator).
    ``n`` is the length of the vectors; ``dtype`` the dtype of the operator's own values
    (``None`` for a function).
    """

    data: Any
    kind: str = field(static=True)
    n: int = field(static=True)
    fn: Callable | None = field(static=True, default=None)
    #: a lineax operator's non-array part (``equinox.partition``); ``data`` holds its arrays
    static: Any = field(static=True, default=None)

    def _lineax(self):
        import equinox as eqx
        return eqx.combine(self.data, self.static)

    def at(self, dtype) -> Callable:
        """The product ``x -> A x`` for ``x`` in ``dtype``, computed in the rung's compute
        dtype (``dtype``, at least float32) and rounded to ``dtype``. Matrices are rounded
        to ``dtype`` here, once (call it outside the loop)."""
        dtype = np.dtype(dtype)
        accumulate = np.dtype(np.promote_types(dtype, np.float32))
        if self.kind == "dense":
            M = self.data.astype(dtype)
            return lambda x: jnp.matmul(M, x, preferred_element_type=accumulate).astype(dtype)
        if self.kind == "bcoo":
            from jax.experimental import sparse
            M = _sparse_astype(self.data, dtype)
            dims = (([1], [0]), ([], []))
            return lambda x: sparse.bcoo_dot_general(
                M, x, dimension_numbers=dims, preferred_element_type=accumulate).astype(dtype)
        if self.kind == "lineax":
            # closure-converted at its declared input dtype: it computes in that dtype
            lop = self._lineax()
            own = np.dtype(lop.in_structure().dtype)
            return lambda x: jnp.asarray(lop.mv(x.astype(own))).astype(dtype)
        return lambda x: jnp.asarray(self.fn(x.astype(accumulate))).astype(dtype)

    def transpose(self) -> "Operator":
        """``A^T`` as an operator (for the adjoint solve of ``grad``)."""
        if self.kind == "dense":
            return Operator(self.data.T, "dense", self.n)
        if self.kind == "bcoo":
            return Operator(self.data.T, "bcoo", self.n)
        if self.kind == "lineax":
            return _lineax_op(self._lineax().transpose(), self.n)
        fn = self.fn

        def transposed(y):
            primal = jax.ShapeDtypeStruct(y.shape, y.dtype)
            (out,) = jax.linear_transpose(fn, primal)(y)
            return out

        return Operator(None, "function", self.n, fn=transposed)

    def diagonal(self, dtype) -> jax.Array:
        """The diagonal of ``A`` in ``dtype`` (Jacobi). A function is probed with unit
        vectors only when it is small (``n <= 4096``); otherwise pass the diagonal."""
        if self.kind == "dense":
            return jnp.diagonal(self.data).astype(dtype)
        if self.kind == "bcoo":
            A = self.data
            rows, cols = A.indices[:, 0], A.indices[:, 1]
            on = (rows == cols) & (rows < self.n)
            return jnp.zeros(self.n, dtype).at[jnp.where(on, rows, self.n)].add(
                jnp.where(on, A.data, 0).astype(dtype), mode="drop")
        if self.kind == "lineax":
            import lineax as lx
            return jnp.asarray(lx.diagonal(self._lineax())).astype(dtype)
        return self.dense(dtype).diagonal()

    def dense(self, dtype) -> jax.Array:
        """``A`` as a dense matrix (small operators: preconditioner set-up, tests)."""
        if self.kind == "dense":
            return self.data.astype(dtype)
        if self.kind == "bcoo":
            return self.data.todense().astype(dtype)
        if self.n > _PROBE_LIMIT:
            raise ValueError(
                f"building the dense form of a {self.n} x {self.n} matrix-free operator "
                f"would take {self.n} products; pass A as a matrix (dense or "
                "jax.experimental.sparse) or give the preconditioner its diagonal/blocks")
        mv = self.at(dtype)
        return jax.vmap(mv, in_axes=1, out_axes=1)(jnp.eye(self.n, dtype=dtype))


#: matrix-free operators are probed column by column (Jacobi / block-Jacobi set-up) only
#: up to this size
_PROBE_LIMIT = 4096


def operator_size(A, b_rows: int | None, what: str, working=None) -> int:
    """The length ``n`` of the vectors ``A`` acts on, with a clear error for a
    non-square matrix."""
    if _sparse_kind(A) is not None or is_dense(A):
        shape = tuple(A.shape)
        if len(shape) != 2 or shape[0] != shape[1]:
            raise ValueError(
                f"{what}: A must be a square matrix (n, n); got shape {shape}. Batched "
                f"systems: jax.vmap({what}) over a stack of them")
        return int(shape[0])
    if _lineax_operator(A):
        ins, outs = A.in_structure(), A.out_structure()
        if isinstance(ins, jax.ShapeDtypeStruct) and working is not None and \
                np.dtype(ins.dtype) != np.dtype(working):
            raise ValueError(
                f"{what}: the lineax operator takes {np.dtype(ins.dtype).name} vectors but "
                f"the working precision (the ladder's top rung) is {np.dtype(working).name}; "
                "lineax closure-converts it at that dtype, so the float64 residual could not "
                "be computed. Declare its input structure in the working dtype, or pass "
                "the matvec function itself")
        if not (isinstance(ins, jax.ShapeDtypeStruct) and isinstance(outs, jax.ShapeDtypeStruct)
                and ins.shape == outs.shape and len(ins.shape) == 1):
            raise ValueError(
                f"{what}: a lineax operator must map one 1-D array to one of the same "
                f"shape; got in_structure {ins} and out_structure {outs}")
        return int(ins.shape[0])
    if callable(A):
        if b_rows is None:
            raise ValueError(f"{what}: a matvec callable needs b to tell the size")
        return int(b_rows)
    raise TypeError(
        f"{what}: A must be a square array, a jax.experimental.sparse BCOO/BCSR matrix, a "
        f"callable matvec(x), or a lineax linear operator; got {type(A).__name__}")


def as_operator(A, n: int, dtype) -> Operator:
    """The :class:`Operator` of ``A`` (validated by :func:`operator_size`), with an
    explicit matrix cast to the working ``dtype``."""
    kind = _sparse_kind(A)
    if kind == "bcsr":
        # BCSR's product on CPU is a slow path in jax 0.10 (262k rows: 38 ms in float64,
        # 64 ms in float32, against BCOO's 3.7 and 2.3 ms): multiply in BCOO form
        A, kind = A.to_bcoo(), "bcoo"
    if kind is not None:
        return Operator(_sparse_astype(A, dtype), kind, n)
    if _lineax_operator(A):
        import lineax as lx
        if isinstance(A, lx.MatrixLinearOperator):
            return Operator(jnp.asarray(A.matrix).astype(dtype), "dense", n)
        return _lineax_op(A, n)
    if is_dense(A):
        return Operator(jnp.asarray(A).astype(dtype), "dense", n)
    return Operator(None, "function", n, fn=A)


def _lineax_op(A, n) -> Operator:
    """A lineax operator split into arrays (traced) and the rest (static)."""
    import equinox as eqx
    dynamic, static = eqx.partition(A, eqx.is_array)
    return Operator(dynamic, "lineax", n, static=static)


def probe(fn: Callable, n: int, dtype) -> jax.Array:
    """``fn`` applied to a zero vector of ``dtype`` (shape and dtype check of a user's
    matvec or preconditioner at the boundary)."""
    return jax.eval_shape(fn, jax.ShapeDtypeStruct((n,), np.dtype(dtype)))
