r"""The batched runaway test: far from the start AND a flat direction (issue 32).

``solve_nlsq`` reports a convergence far from ``x0`` (``||x|| > RUNAWAY_FACTOR ||x0||``)
as ``Status.RUNAWAY`` only when the model also has a flat direction there
(:func:`adaptprec.nlsq.lm.flat_direction`): ``||(R D)^{-1}||_F\,||f|| >
FLAT_DIRECTION_RATIO`` with ``R^T R = J^T J`` and ``D = diag(max(|x|, ||x0||))``. Distance
alone is not evidence: Arrhenius ``A exp(-Ea/(R T))`` from ones has its well determined
minimum at ``A ~ 3e11``.

The batched state keeps ``J^T J``, not ``R``. Since
:math:`\|(RD)^{-1}\|_F^2 = \mathrm{tr}\big((D J^\top J D)^{-1}\big)`, the same quantity
comes from a Cholesky factor of the scaled Gram matrix. It is computed here in plain
``jnp`` arithmetic, with the fits on the minor axis (every entry a vector over the fits),
one column of the factor at a time: no LAPACK call. A batched ``jnp.linalg.cholesky`` of
every fit's Gram matrix hung ``solve_nlsq_batch`` on 1e5 fits on XLA:CPU (a futex wait,
no CPU; ``bench_value.py --solvers``). The factor is Jacobi-equilibrated first (unit
diagonal), so the Gram matrix's squared condition number costs the factorisation no
accuracy beyond what the column scales already carry. :func:`runaway_status` computes
the flatness only under ``lax.cond(any(far))``: the common case (no fit far out) costs
one norm per fit.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from .._status import Status

__all__ = ["inverse_trace_fits_last", "flat_direction_batch", "runaway_status"]


def inverse_trace_fits_last(a):
    r"""``trace(a^{-1})`` for every fit of ``a`` ``(n, n, B)`` (fits last; symmetric,
    only its lower triangle read), in ``a``'s dtype, without a LAPACK call.

    With ``S = diag(a_ii^{-1/2})`` and ``S a S = L L^T`` (a column-by-column Cholesky,
    each column one vector operation over ``(n, B)``), ``a^{-1} = S L^{-T} L^{-1} S`` and
    the trace is :math:`\sum_{i} s_i^2 \sum_k (L^{-1})_{ki}^2`. A matrix that is not
    numerically positive definite (a non-positive pivot or diagonal) gives ``inf``/NaN for
    that fit only.

    Example:
        >>> import jax.numpy as jnp
        >>> from adaptprec.batch.runaway import inverse_trace_fits_last
        >>> a = jnp.stack([jnp.array([[4.0, 2.0], [2.0, 3.0]]), jnp.eye(2)], axis=-1)
        >>> [round(float(t), 6) for t in inverse_trace_fits_last(a)]   # (3 + 4) / 8, 2
        [0.875, 2.0]
    """
    n = a.shape[0]
    diag = jnp.stack([a[i, i] for i in range(n)])                       # (n, B)
    s = jnp.where(diag > 0, jax.lax.rsqrt(jnp.where(diag > 0, diag, 1)), jnp.inf)
    c = a * s[:, None] * s[None, :]                                      # unit diagonal
    rows = jnp.arange(n)[:, None]
    low = jnp.zeros_like(c)
    for j in range(n):    # left-looking: columns >= j of `low` are still zero
        v = c[:, j] - jnp.einsum("ikb,kb->ib", low, low[j])
        d = jnp.sqrt(v[j])
        low = low.at[:, j].set(jnp.where(rows >= j, v / d, 0))
    # Y = L^{-1} by forward substitution, one row at a time (rows > i still zero)
    eye = jnp.broadcast_to(jnp.eye(n, dtype=c.dtype)[:, :, None], c.shape)
    inv = jnp.zeros_like(c)
    for i in range(n):
        r = eye[i] - jnp.einsum("kb,kjb->jb", low[i], inv)
        inv = inv.at[i].set(r / low[i, i])
    return jnp.sum(s * s * jnp.sum(inv * inv, axis=0), axis=0)


def flat_direction_batch(x, jtj, fnorm, x0_norm):
    r""":func:`adaptprec.nlsq.lm.flat_direction` for a batch, from ``J^T J``: fits first,
    ``x`` ``(B, n)``, ``jtj`` ``(B, n, n)``, ``fnorm``/``x0_norm`` ``(B,)``. True where
    ``||(R D)^{-1}||_F ||f|| > FLAT_DIRECTION_RATIO`` or the scaled Gram matrix is
    singular.

    Example:
        >>> import jax.numpy as jnp
        >>> from adaptprec.batch.runaway import flat_direction_batch
        >>> x = jnp.array([[1e9, 1e9]] * 2)
        >>> well = jnp.array([[1e-9, 0.0], [0.0, 1e-9]])     # R: each column ~ 1 / x
        >>> flat = jnp.array([[1e-9, 1e-9], [0.0, 1e-21]])   # nearly collinear columns
        >>> jtj = jnp.stack([well.T @ well, flat.T @ flat])
        >>> flat_direction_batch(x, jtj, jnp.ones(2), jnp.ones(2)).tolist()
        [False, True]
    """
    from ..nlsq.lm import FLAT_DIRECTION_RATIO
    d = jnp.maximum(jnp.abs(x), x0_norm[:, None])                        # (B, n)
    scaled = jtj * d[:, :, None] * d[:, None, :]
    trace = inverse_trace_fits_last(jnp.moveaxis(scaled, 0, -1))
    return ~(trace * fnorm * fnorm <= FLAT_DIRECTION_RATIO ** 2)        # NaN: flat


def runaway_status(s, x0):
    """``s.status`` (fits first: ``s.x``, ``s.jtj``, ``s.cost``, ``s.status``), with a
    convergence code made ``Status.RUNAWAY`` where ``solve_nlsq`` would: the fit is far
    (``||x|| > RUNAWAY_FACTOR ||x0||``, :func:`adaptprec.nlsq._loop._runaway`), its model
    has a flat direction there (:func:`flat_direction_batch`; issue 32: distance alone is
    not evidence) and its residual is not zero (``||f|| <= 1e5 eps ||J x||``, a line of
    minima far out, is exempt). The flatness is computed only when some fit is far.

    Example:
        >>> import jax.numpy as jnp
        >>> from types import SimpleNamespace
        >>> from adaptprec.batch.runaway import runaway_status
        >>> x = jnp.array([[1e9, 1e9], [1e9, 1e9], [1.0, 1.0]])
        >>> well = jnp.diag(jnp.array([1e-18, 1e-18]))                 # J^T J, ~ 1 / x^2
        >>> flat = jnp.array([[1e-18, 1e-18], [1e-18, 1e-18 + 1e-40]])
        >>> s = SimpleNamespace(status=jnp.array([3, 3, 3]), x=x, cost=jnp.full(3, 0.5),
        ...                     jtj=jnp.stack([well, flat, jnp.eye(2)]))
        >>> runaway_status(s, jnp.ones((3, 2))).tolist()    # far+determined, far+flat, near
        [3, -11, 3]
    """
    from ..nlsq._rules import runaway as _runaway
    from ..nlsq.lm import _NOISE_FACTOR
    dtype = s.x.dtype
    x0n = jnp.linalg.norm(jnp.asarray(x0, dtype), axis=-1)
    jtj = s.jtj.astype(dtype)
    fn = jnp.sqrt(2.0 * jnp.abs(s.cost)).astype(dtype)
    far = jax.vmap(_runaway)(s.status, s.x, x0n)

    def flat_and_nonzero(_):
        jx2 = jnp.einsum("bi,bij,bj->b", s.x, jtj, s.x)
        eps = jnp.finfo(dtype).eps
        zero_residual = fn <= _NOISE_FACTOR * eps * jnp.sqrt(jnp.abs(jx2))
        return flat_direction_batch(s.x, jtj, fn, x0n) & ~zero_residual

    flat = jax.lax.cond(jnp.any(far), flat_and_nonzero,
                        lambda _: jnp.zeros(far.shape, bool), None)
    runaway = far & flat
    return jnp.where(runaway, jnp.asarray(int(Status.RUNAWAY), s.status.dtype), s.status)
