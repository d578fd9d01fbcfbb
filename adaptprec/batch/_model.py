r"""The model of one rung with the fits on the minor axis: the batched residual and
Jacobian, the normal equations, and the damped solves every stage of the batched solver
shares (:mod:`~adaptprec.batch.lm_batched`'s iteration, the top rung's one-evaluation check
in :mod:`~adaptprec.batch.verify`, the escalation guards).

Layout: per-fit scalars ``(B,)``, vectors ``(n, B)``, matrices ``(n, n, B)``, residuals
``(m, B)``, transposed Jacobians ``(n, m, B)``, unless a docstring says "fits first". With
the fits on the minor, contiguous axis every per-fit scalar of an iteration (an entry of
:math:`J^\top J`, a Cholesky pivot, a damping factor) is one contiguous vector over the
fits, so sums over residuals, the unrolled Cholesky and selections run as full-width vector
operations.

Arithmetic: the residual is evaluated at the rung's dtype; it comes back in the
accumulation dtype (float32 or wider) in which all sums, the normal equations and the
Cholesky run.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from .._backend import cpu_tricks
from .._policy import cast_floating
from ..nlsq.common import robust_cost, scale_for_robust_loss
from ._fits_last import vmap_last
from .cholesky import cholesky_solve_fits_last

__all__ = ["ResidualJacobian", "make_fj", "move_batch_axis", "normal_equations",
           "finite_fits", "gradient_cosine", "gradient_cosine_last", "held_by_bounds",
           "project_gradient", "damped_solve_fits_last", "curvature_ratio",
           "gauss_newton_shift", "gauss_newton_fits_last", "diagonal", "materialised"]


@dataclasses.dataclass(frozen=True)
class ResidualJacobian:
    """Batch residual-and-Jacobian evaluator ``fj(x, bargs, sargs) -> (f, Jt)``.

    ``residual(x, bargs, sargs)`` is the user residual for ONE fit (``bargs`` are that
    fit's slices of the batched arguments, ``sargs`` the shared ones). Inputs are cast to
    ``rung_dtype`` (floating leaves only); ``f`` ``(B, m)`` and the *transposed* Jacobian
    ``Jt`` ``(B, n, m)`` come back in ``acc_dtype``. ``Jt`` is forward mode (``vmap`` of
    ``jvp`` over the ``n`` unit tangents, as ``jacfwd`` does) and ``f`` is the shared
    primal, so the residual is traced once per rung. :meth:`fits_last` is the same
    evaluation with the batch axis last (the layout of :func:`lm_run`'s loop).
    """

    residual: Callable
    rung_dtype: Any
    acc_dtype: Any

    def _one(self, x, bargs, sargs):
        bargs_r = cast_floating(bargs, self.rung_dtype)
        sargs_r = cast_floating(sargs, self.rung_dtype)

        def r(p):
            out = self.residual(p.astype(self.rung_dtype), bargs_r, sargs_r)
            return jnp.asarray(out).astype(self.acc_dtype)

        x = x.astype(self.acc_dtype)
        basis = jnp.eye(x.shape[0], dtype=self.acc_dtype)
        # forward mode, one tangent per parameter; the primal is computed once
        return jax.vmap(lambda t: jax.jvp(r, (x,), (t,)), out_axes=(None, 0))(basis)

    def bounds(self, bargs):
        """``(lower, upper)`` in ``acc_dtype`` (the residual's trailing batched args, same
        layout as ``bargs``), or ``None`` for an unbounded problem."""
        lim = getattr(self.residual, "bounds", lambda b: None)(bargs)
        if lim is None:
            return None
        return tuple(jnp.asarray(a).astype(self.acc_dtype) for a in lim)

    def __call__(self, x, bargs, sargs):
        """``x`` ``(B, n)``, batched args with leading ``B`` -> ``f`` ``(B, m)``, ``Jt`` ``(B, n, m)``."""
        return jax.vmap(self._one, in_axes=(0, 0, None))(x, bargs, sargs)

    def fits_last(self, x, bargs, sargs):
        """``x`` ``(n, B)``, batched args with trailing ``B`` -> ``f`` ``(m, B)``, ``Jt`` ``(n, m, B)``.

        Evaluated by :func:`~adaptprec.batch._fits_last.vmap_last`, so the model is computed
        with the fits on the minor axis instead of being transposed there.
        """
        return vmap_last(lambda xb, s: self._one(xb[0], xb[1], s))((x, bargs), sargs)


def make_fj(residual: Callable, rung_dtype, acc_dtype) -> ResidualJacobian:
    """The :class:`ResidualJacobian` of ``residual`` on one rung.

    Example:
        >>> import jax.numpy as jnp
        >>> from adaptprec.batch._model import make_fj
        >>> fj = make_fj(lambda x, b, s: x[:2] * s - b[0], jnp.float32, jnp.float32)
        >>> f, Jt = fj(jnp.ones((4, 3)), (jnp.zeros((4, 2)),), 2.0)
        >>> f.shape, Jt.shape, float(Jt[0, 1, 1]), float(Jt[0, 2, 1])
        ((4, 2), (4, 3, 2), 2.0, 0.0)
        >>> [a.shape for a in fj.fits_last(jnp.ones((3, 4)), (jnp.zeros((2, 4)),), 2.0)]
        [(2, 4), (3, 2, 4)]
    """
    return ResidualJacobian(residual, rung_dtype, acc_dtype)



def move_batch_axis(tree, src: int, dst: int):
    """Every leaf of ``tree`` with its axis ``src`` moved to ``dst`` (``0, -1``: fits
    first to fits last; ``-1, 0``: back).

    Example:
        >>> import jax.numpy as jnp
        >>> from adaptprec.batch._model import move_batch_axis
        >>> [a.shape for a in move_batch_axis((jnp.zeros((5, 2)), jnp.zeros((5, 2, 3))), 0, -1)]
        [(2, 5), (2, 3, 5)]
    """
    return jax.tree.map(lambda a: jnp.moveaxis(a, src, dst), tree)



def _gram_index(n: int):
    """Static index maps of the packed Gram matrix of the rows ``(J_1..J_n, f)``."""
    pairs = [(i, j) for i in range(n + 1) for j in range(i + 1)]
    pos = {p: k for k, p in enumerate(pairs)}
    rows = np.array([i for i, _ in pairs])
    cols = np.array([j for _, j in pairs])
    full = np.array([[pos[max(i, j), min(i, j)] for j in range(n)] for i in range(n)])
    jtf = np.array([pos[n, i] for i in range(n)])
    return rows, cols, full, jtf, pos[n, n]


def _gram(jt, f):
    """``J^T J`` (n, n, B), ``J^T f`` (n, B) and ``f^T f`` (B,) from one fused reduction.

    Only the ``(n+1)(n+2)/2`` distinct entries of the Gram matrix of the rows
    ``(J_1, ..., J_n, f)`` are formed, as products summed over the residual axis: with
    the fits last, each entry is a sum of ``m`` contiguous vectors over the fits (one
    multiply-reduce XLA fuses and vectorises across fits, and sums every fit in the same
    order whatever the batch size).
    """
    n = jt.shape[0]
    rows, cols, full, jtf_idx, ff_idx = _gram_index(n)
    a = jnp.concatenate([jt, f[None]], axis=0)           # (n+1, m, B)
    g = jnp.sum(a[rows] * a[cols], axis=1)                # (P, B)
    # unpacked with static slices: an index-array gather here is a separate, slow kernel
    jtj = jnp.stack([jnp.stack([g[full[i, j]] for j in range(n)]) for i in range(n)])
    return jtj, jnp.stack([g[k] for k in jtf_idx]), g[ff_idx]


def _gram_dots(jt, f):
    """:func:`_gram` as batched ``dot``s over fits-first copies: under XLA's default
    options (inside a user's ``jit``) its library dot fusions run this form fastest."""
    jt_b = jnp.moveaxis(jt, -1, 0)                        # (B, n, m)
    f_b = f.T
    jtj = jnp.einsum("bim,bjm->bij", jt_b, jt_b, preferred_element_type=f.dtype)
    jtf = jnp.einsum("bim,bm->bi", jt_b, f_b, preferred_element_type=f.dtype)
    return jnp.moveaxis(jtj, 0, -1), jtf.T, jnp.sum(f * f, axis=0)


def diagonal(a):
    """``diag`` of every fit's matrix: (n, n, B) -> (n, B)."""
    return jnp.stack([a[i, i] for i in range(a.shape[0])])


def normal_equations(f, jt, opts):
    """cost, J^T J, J^T f and the damping scale from f (m, B) and Jt (n, m, B), with the
    loss, ``f_scale`` and Gram form of ``opts`` (:class:`~adaptprec.batch.lm_batched.LMOptions`).

    Sums run in f's dtype (float32 or wider). With a robust loss the cost is
    ``0.5 f_scale^2 sum(rho((f/f_scale)^2))`` and ``f``, ``J`` are rescaled as scipy does
    (:func:`adaptprec.nlsq.common.scale_for_robust_loss`), so ``J^T J``/``J^T f`` are those
    of the cost's Gauss–Newton model; the damping scale stays ``diag`` of the *unscaled*
    ``J^T J``, because where every residual is an outlier the rescaled ``J`` is ~0 and a
    damping relative to it would not bound the step.
    """
    robust = not (isinstance(opts.loss, str) and opts.loss == "linear")
    scale = jnp.sum(jt * jt, axis=1) if robust else None
    if robust:
        cost = jax.vmap(lambda r: robust_cost(opts.loss, r, opts.f_scale), in_axes=-1)(f)
        f, jac = jax.vmap(
            lambda r, j: scale_for_robust_loss(opts.loss, r, j.T, opts.f_scale),
            in_axes=(-1, -1), out_axes=(-1, -1))(f, jt)
        jt = jnp.swapaxes(jac, 0, 1)
    jtj, jtf, sq = (_gram_dots if opts.gram == "einsum" else _gram)(jt, f)
    if not robust:
        cost = 0.5 * sq
    if scale is None:
        scale = diagonal(jtj)
    return cost, jtj, jtf, scale


def finite_fits(*arrays):
    """Per fit: every entry of every array finite."""
    ok = None
    for a in arrays:
        r = jnp.isfinite(a).reshape(-1, a.shape[-1]).all(axis=0)
        ok = r if ok is None else ok & r
    return ok


def gradient_cosine_last(cost, jtj, jtf):
    """Fits last: the largest cosine between the residual and a Jacobian column,
    ``max_i |(J^T f)_i| / (||J_i|| ||f||)`` (scipy/MINPACK ``gtol``), ``(B,)``."""
    fnorm = jnp.sqrt(2.0 * cost)
    cnorm = jnp.sqrt(diagonal(jtj))
    denom = cnorm * fnorm[None]
    cos = jnp.where(denom > 0, jnp.abs(jtf) / jnp.where(denom > 0, denom, 1), 0)
    return jnp.max(cos, axis=0)


def gradient_cosine(cost, jtj, jtf):
    """Largest cosine between the residual and a Jacobian column (scipy/MINPACK ``gtol``).

    Fits first: ``cost`` (B,), ``jtj`` (B, n, n), ``jtf`` (B, n). Zero for a zero
    residual; columns with zero norm are skipped.

    Example:
        >>> import jax.numpy as jnp
        >>> from adaptprec.batch._model import gradient_cosine
        >>> float(gradient_cosine(jnp.array([0.5]), jnp.eye(2)[None], jnp.array([[1.0, 0.0]]))[0])
        1.0
    """
    return gradient_cosine_last(cost, jnp.moveaxis(jtj, 0, -1), jtf.T)


def held_by_bounds(x, g, lo, hi):
    """Variables *held* by a bound: on it, with the descent direction ``-g`` pointing out
    of the box (``x_i <= lo_i`` and ``g_i > 0``, or ``x_i >= hi_i`` and ``g_i < 0``), and
    every variable of a box of width zero (``lo_i == hi_i``: a fixed parameter, whatever
    its gradient). Elementwise, so any batch layout (also used by
    :mod:`~adaptprec.batch.implicit`).

    Example:
        >>> import jax.numpy as jnp
        >>> from adaptprec.batch._model import held_by_bounds
        >>> held_by_bounds(jnp.array([0.0, 0.0, 0.5]), jnp.array([1.0, -1.0, 1.0]), 0.0, 1.0).tolist()
        [True, False, False]
    """
    return ((x <= lo) & (g > 0)) | ((x >= hi) & (g < 0)) | (lo == hi)


def project_gradient(x, g, bounds):
    """``g`` with the components of variables held by a bound set to zero: the projected
    gradient is what vanishes at a box-constrained minimum, so the ``gtol`` test, the
    escalation guards and the reported optimality use it."""
    if bounds is None:
        return g
    return jnp.where(held_by_bounds(x, g, *bounds), 0, g)


def held_fits_last(x, g_projected, bounds):
    """Variables held by a bound, recovered from the projected gradient (see above)."""
    lo, hi = bounds
    return ((x <= lo) | (x >= hi)) & (g_projected == 0)


def damped_solve_fits_last(jtj, g, shift, x, bounds):
    """Fits last (``jtj`` ``(n, n, B)``, the others ``(n, B)``; ``bounds`` a
    ``(lower, upper)`` pair or ``None``): solve ``(J^T J + diag(shift)) dx = -g`` on the
    variables not held by a bound (held ones get ``dx = 0``: their rows and columns are
    replaced by the identity). The step of one iteration (``shift = lam d^2``) and the
    Gauss–Newton test's (``shift = 16 u d^2 / 2``, also :mod:`~adaptprec.batch.verify`'s).

    Example:
        >>> import jax.numpy as jnp
        >>> from adaptprec.batch._model import damped_solve_fits_last
        >>> jtj = jnp.array([[2.0, 0.0], [0.0, 4.0]])[:, :, None]
        >>> dx = damped_solve_fits_last(jtj, jnp.array([[2.0], [4.0]]), jnp.zeros((2, 1)),
        ...                             jnp.zeros((2, 1)), None)
        >>> [round(float(v), 12) for v in dx[:, 0]]
        [-1.0, -1.0]
    """
    if bounds is None:
        return cholesky_solve_fits_last(jtj, -g, shift)
    held = held_fits_last(x, g, bounds)
    free = ~held
    a = jnp.where(free[:, None] & free[None, :], jtj, 0)
    return cholesky_solve_fits_last(a, jnp.where(free, -g, 0), jnp.where(held, 1, shift))


def curvature_ratio(diag, d2):
    r"""Per fit, the smallest ratio of a parameter's current curvature ``diag`` (``(n, B)``,
    ``diag(J^T J)``) to its damping scale ``d2`` (the running maximum of that diagonal),
    clipped to ``[eps, 1]``: ``(B,)``.

    The damping :math:`\lambda d^2` must be able to fall below every parameter's current
    curvature, else the step can never become the Gauss–Newton step. Where the curvature
    has dropped far below its running maximum (Arrhenius ``A exp(-Ea/(R T))`` from ones:
    ``diag_A`` falls 1e17-fold while ``A`` grows to 3e11) a fixed floor ``lambda >= eps``
    damped ``A`` by 1e7 times its curvature and the fit crawled (300 steps to reach
    ``A = 2e7``); solve_nlsq's trust region takes the Gauss–Newton step (Moré's
    ``alpha = 0``) whenever it fits the radius. The floors of the damping and of the
    Gauss–Newton test's regularising shift are scaled by this ratio; where the curvature
    keeps its maximum (the common case) the ratio is 1 and nothing changes. The clip at
    ``eps`` keeps a zero curvature (a parameter the model lost) from removing the floor.

    Example:
        >>> import jax.numpy as jnp
        >>> from adaptprec.batch._model import curvature_ratio
        >>> diag = jnp.array([[4.0, 1e-30], [2.0, 2.0]])     # (n=2, B=2)
        >>> d2 = jnp.array([[4.0, 1.0], [4.0, 2.0]])
        >>> [float(v) for v in curvature_ratio(diag, d2)]    # min(1, .5); clipped at eps
        [0.5, 2.220446049250313e-16]
    """
    eps = float(np.finfo(diag.dtype).eps)
    ratio = jnp.min(jnp.where(d2 > 0, diag / jnp.where(d2 > 0, d2, 1), 1), axis=0)
    return jnp.clip(jnp.where(jnp.isfinite(ratio), ratio, 1), eps, 1)


def gauss_newton_shift(jtj, d2):
    """Fits last: the diagonal shift ``8 eps r d2`` (``r``: :func:`curvature_ratio`) that
    regularises the Gauss–Newton step of the convergence tests (step 6 and
    :mod:`~adaptprec.batch.verify`) against a singular ``J^T J``, ``(n, B)``."""
    eps = 16.0 * float(np.finfo(jtj.dtype).eps) / 2
    return eps * curvature_ratio(diagonal(jtj), d2)[None] * d2


def gauss_newton_fits_last(jtj, jtf, d2, x, bounds):
    r"""The Gauss–Newton step at the current point and what the convergence tests read:
    ``(dx, q2, dxn, xnorm)`` with ``dx = -(J^T J + shift)^{-1} J^T f``
    (:func:`gauss_newton_shift`; projected with ``bounds``),
    ``q2 = |J^T f . dx|`` (``||qtf||^2`` of a QR of ``J``: twice the reduction the step
    makes available), ``dxn = ||D dx||`` and ``xnorm = ||D x||`` (``D^2 = d2``)."""
    dx = damped_solve_fits_last(jtj, jtf, gauss_newton_shift(jtj, d2), x, bounds)
    q2 = jnp.abs(jnp.sum(jtf * dx, axis=0))
    dxn = jnp.sqrt(jnp.sum(d2 * dx * dx, axis=0))
    xnorm = jnp.sqrt(jnp.sum(d2 * x * x, axis=0))
    return dx, q2, dxn, xnorm


def materialised(x):
    """``x`` unchanged (a NaN stays NaN), through an op XLA does not copy into consumers.

    XLA:CPU fuses cheap producers (slices, transposes, converts) into every consumer, also
    into one that reads each element many times: the starts, a strided transpose of the
    fits-first block, were re-read for every residual and Jacobian entry (that kernel 6x
    slower, the whole solve about 1.4x). A select is not "cheap" to XLA's fusion, so the
    fits-last copy is made once. (``lax.optimization_barrier`` does not do this: XLA:CPU
    removes it before fusion.) A CPU trick (:func:`adaptprec._backend.cpu_tricks`):
    elsewhere ``x`` passes through.
    """
    if not cpu_tricks():
        return x
    return jnp.where(jnp.isnan(x), jnp.nan, x)

