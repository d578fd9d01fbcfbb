"""LU factorization without ``jax.lax.linalg.lu``'s extra pass over the factor (CPU).

``lax.linalg.lu`` lowers on CPU to LAPACK ``xGETRF`` and then, for LAPACK's
"illegal argument" code (``info < 0``, which a well-formed call never returns), replaces the
factor by NaN with a ``select`` over the whole matrix: one more read and write of ``n^2``
entries into a freshly allocated buffer. At n = 4096 in float32 that copy is 64 MB, a
measurable share of the mixed-precision solve (see ``benchmarks/RESULTS.md``). :func:`lu_factor`
calls the same LAPACK FFI target directly (in place on its operand, with the same
column-major layout as JAX's own lowering) and skips the select; an exactly singular
matrix (``info > 0``) is unaffected, as in ``lax.linalg.lu`` (zero pivot in ``U``).

On other backends, or if the target is not registered, it is ``lax.linalg.lu``.
"""

from __future__ import annotations

import numpy as np

import jax
import jax.numpy as jnp
from jax import lax
from jax.custom_batching import custom_vmap

__all__ = ["lu_factor", "lu_factor_transposed"]

_TARGETS = {np.dtype(np.float32): "lapack_sgetrf_ffi",
            np.dtype(np.float64): "lapack_dgetrf_ffi"}


def _direct_ok(dtype) -> bool:
    if jax.default_backend() != "cpu" or np.dtype(dtype) not in _TARGETS:
        return False
    try:
        from jaxlib import lapack
        lapack.prepare_lapack_call("getrf_ffi", np.dtype(dtype))   # registers the targets
    except Exception:  # pragma: no cover - jaxlib layout changed: use the public path
        return False
    return True


@custom_vmap
def _getrf3(a):
    """``(m, n, n)`` -> (packed LU, 0-based pivots) by LAPACK xGETRF, no NaN select.

    The operand and the factor are passed in row-major layout: LAPACK (column-major)
    therefore factors ``a^T`` and the returned array is the *transpose* of its packed
    factor. Keeping XLA's default layout here means a factor that is both used and
    returned from ``jit`` needs no layout copy (with column-major layouts XLA copies it)."""
    shp = a.shape
    layout = (0, 1, 2)                       # row-major: the transposed column-major view
    call = jax.ffi.ffi_call(
        _TARGETS[np.dtype(a.dtype)],
        (jax.ShapeDtypeStruct(shp, a.dtype), jax.ShapeDtypeStruct(shp[:-1], jnp.int32),
         jax.ShapeDtypeStruct(shp[:-2], jnp.int32)),
        input_layouts=[layout], output_layouts=[layout, None, None],
        input_output_aliases={0: 0})
    lu, piv, _info = call(a)
    return lu, piv - 1


@_getrf3.def_vmap
def _getrf3_vmap(axis_size, in_batched, a):
    (batched,) = in_batched
    if not batched:
        a = jnp.broadcast_to(a[None], (axis_size,) + a.shape)
    lu, piv = _getrf3(a.reshape((-1,) + a.shape[2:]))
    out = (lu.reshape(a.shape), piv.reshape(a.shape[:-1]))
    return out, (True, True)


def lu_factor_transposed(a):
    """Factor the transposes of a batch ``(m, n, n)``: ``(F, perm)`` with
    ``P a^T = L U``, ``F = lu^T`` (``lu`` packed as by ``lax.linalg.lu``).

    ``a`` is read in its own row-major buffer (the column-major buffer of ``a^T``), so no
    transposing copy is made; ``jnp.swapaxes(F, -1, -2)`` is ``lu`` and XLA passes it to
    the LAPACK triangular solves without a copy either.
    """
    if a.ndim != 3 or a.shape[-1] != a.shape[-2] or not _direct_ok(a.dtype):
        lu, _, perm = lax.linalg.lu(jnp.swapaxes(a, -1, -2))
        return jnp.swapaxes(lu, -1, -2), perm
    f, piv = _getrf3(a)
    return f, pivots_to_permutation(piv)


#: swaps per trip of :func:`pivots_to_permutation`'s loop
_SWAP_UNROLL = 8


def pivots_to_permutation(piv):
    """``lax.linalg.lu_pivots_to_permutation(piv, n)`` for square factors ``(m, n)``.

    The same sequence of row swaps, with the loop unrolled: XLA:CPU runs
    ``lax.linalg``'s version as one while-loop trip per swap (n = 2048: ~1.0 ms, about 1% of
    a float64 solve; unrolled by 8, ~0.6 ms).

    Example:
        >>> import jax.numpy as jnp
        >>> from adaptprec.linalg._getrf import pivots_to_permutation
        >>> pivots_to_permutation(jnp.array([[2, 2, 2]], jnp.int32)).tolist()
        [[2, 0, 1]]
    """
    m, n = piv.shape
    rows = jnp.arange(m)

    def swap(i, p):
        j = piv[:, i]
        pi, pj = p[:, i], p[rows, j]
        return p.at[:, i].set(pj).at[rows, j].set(pi)

    start = jnp.broadcast_to(jnp.arange(n, dtype=piv.dtype), (m, n))
    return lax.fori_loop(0, n, swap, start, unroll=min(_SWAP_UNROLL, max(n, 1)))


def lu_factor(a):
    """``P a = L U`` for a batch ``(m, n, n)`` of square matrices: ``(lu, perm)`` as the
    first and third outputs of ``lax.linalg.lu`` (bit-identical on CPU).

    Example:
        >>> import jax.numpy as jnp
        >>> from adaptprec.linalg._getrf import lu_factor
        >>> lu, perm = lu_factor(jnp.array([[[1.0, 2.0], [3.0, 4.0]]]))
        >>> perm.tolist(), lu.tolist()
        ([[1, 0]], [[[3.0, 4.0], [0.3333333333333333, 0.6666666666666667]]])
    """
    if a.ndim != 3 or a.shape[-1] != a.shape[-2] or not _direct_ok(a.dtype):
        lu, _, perm = lax.linalg.lu(a)
        return lu, perm
    f, perm = lu_factor_transposed(jnp.swapaxes(a, -1, -2))
    return jnp.swapaxes(f, -1, -2), perm
