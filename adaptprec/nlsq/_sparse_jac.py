"""A ``jac`` callable that returns a ``scipy.sparse`` matrix or a ``LinearOperator``.

Such a function cannot be traced by JAX, so it is evaluated on the host through
``jax.pure_callback`` and densified to the ``(m, n)`` array the step factors (under
``jit``/``vmap`` too; ``grad`` of the solution differentiates the residual only). The
memory is that of a dense Jacobian; ``res.jac`` comes back in the user's format.

Example:
    >>> import numpy as np
    >>> import scipy.sparse as sp
    >>> from adaptprec.nlsq._sparse_jac import probe_host_jac
    >>> kind, J0 = probe_host_jac(lambda x: sp.diags(2 * x).tocsr(), np.ones(3), ())
    >>> kind, J0.shape
    ('sparse', (3, 3))
"""

from __future__ import annotations

import functools

import jax
import numpy as np

__all__ = ["probe_host_jac", "host_jac", "densify", "as_user_format"]


def _kind(J) -> str | None:
    """``"sparse"``, ``"operator"`` or ``None`` (anything JAX can read as an array)."""
    try:
        import scipy.sparse as sp
        from scipy.sparse.linalg import LinearOperator
    except ImportError:  # pragma: no cover - scipy is a dependency of these paths
        return None
    if sp.issparse(J):
        return "sparse"
    if isinstance(J, LinearOperator):
        return "operator"
    return None


def probe_host_jac(jac, x0, args):
    """Call ``jac`` once on the host at NumPy ``x0`` and ``args``: ``(kind, J0)`` with
    ``kind`` ``"sparse"``/``"operator"`` for a scipy.sparse matrix or ``LinearOperator``,
    ``None`` otherwise (the caller then reports the original tracing error)."""
    a = jax.tree.map(lambda v: np.asarray(v) if isinstance(v, jax.Array) else v, args)
    try:
        J0 = jac(np.asarray(x0), *a)
    except Exception:  # noqa: BLE001 - the caller raises the tracing error instead
        return None, None
    return _kind(J0), J0


def densify(J, n: int) -> np.ndarray:
    """A scipy.sparse matrix or ``LinearOperator`` as a dense NumPy array."""
    kind = _kind(J)
    if kind == "sparse":
        return np.asarray(J.toarray())
    if kind == "operator":
        return np.asarray(J.matmat(np.eye(n)))
    return np.asarray(J)


@functools.lru_cache(maxsize=256)
def host_jac(jac, m: int, n: int):
    """``jac`` as a JAX function of ``(x, *args)``: evaluated on the host with
    ``jax.pure_callback`` and densified to ``(m, n)`` in ``x``'s dtype (stable per
    ``(jac, m, n)`` so the compiled-solver cache hits)."""
    def J(x, *args):
        # float64 travels as its bits (two uint32 per entry): the callback runs on an XLA
        # thread outside the caller's thread-local x64 scope, where JAX would
        # canonicalise a float64 result to float32 and refuse it
        wide = np.dtype(x.dtype) == np.float64
        out = (jax.ShapeDtypeStruct((m, n, 2), np.uint32) if wide
               else jax.ShapeDtypeStruct((m, n), x.dtype))

        def host(xv, *av):
            d = densify(jac(np.asarray(xv), *av), n)
            if d.shape != (m, n):
                raise ValueError(f"The return value of `jac` has wrong shape: expected "
                                 f"{(m, n)}, actual {d.shape}.")
            if wide:
                return np.ascontiguousarray(d, np.float64).view(np.uint32).reshape(m, n, 2)
            return d.astype(out.dtype)

        got = jax.pure_callback(host, out, x, *args, vmap_method="sequential")
        return jax.lax.bitcast_convert_type(got, x.dtype) if wide else got

    J.host = True
    return J


def as_user_format(J, kind: str):
    """The final Jacobian in the format the user's ``jac`` returned (scipy's ``res.jac``):
    a ``csr_array`` for a sparse ``jac``, a ``LinearOperator`` for an operator one."""
    if kind == "sparse":
        import scipy.sparse as sp
        return sp.csr_array(np.asarray(J))
    if kind == "operator":
        from scipy.sparse.linalg import aslinearoperator
        return aslinearoperator(np.asarray(J))
    return J

