r"""Levenberg–Marquardt with an explicit batch axis.

:class:`LMState` and the public functions have the batch (fit) axis first. Inside
:func:`lm_run`'s loop the same state is carried with the batch axis LAST (fits on the
minor, contiguous axis): every per-fit scalar of the iteration (an entry of
:math:`J^\top J`, a Cholesky pivot, a damping factor) is then one contiguous vector over
the fits, so the sums over residuals, the unrolled Cholesky and the selections run as
full-width vector operations. Measured on Gpufit's 2-D Gaussian (2500 fits, float32):
1.5x faster than the same iteration with the fits first, bit-identical iterates. One
iteration, for all ``B`` fits at once:

1. solve the damped normal equations
   :math:`(J^\top J + \lambda\,\mathrm{diag}(d^2))\,\delta = -J^\top f` per fit with a
   batched (unrolled for small ``n``) Cholesky, where :math:`d^2` is the running maximum
   of :math:`\mathrm{diag}(J^\top J)` (MINPACK's scaling);
2. evaluate residual and Jacobian at the trial point :math:`x+\delta` (forward mode:
   ``vmap`` of ``jvp`` over the unit tangents, as ``jacfwd``, under ``vmap`` over fits;
   the residual is the shared primal of the same pass);
3. gain ratio :math:`\rho = (C(x) - C(x+\delta)) / \mathrm{pred}` with
   :math:`\mathrm{pred} = \tfrac12\,\delta^\top(\lambda d^2\delta - J^\top f)`; accept when
   :math:`\rho > 10^{-4}` and the trial is finite;
4. damping update of Nielsen (1999): on acceptance
   :math:`\lambda \leftarrow \lambda \max(1/3, 1-(2\rho-1)^3)`, :math:`\nu = 2`; on
   rejection :math:`\lambda \leftarrow \lambda\nu`, :math:`\nu \leftarrow 2\nu`; the
   floor of :math:`\lambda` is ``eps`` times :func:`curvature_ratio` (the smallest
   :math:`\mathrm{diag}(J^\top J)_i / d_i^2`), so the damping can always fall below every
   parameter's current curvature (the step then becomes Gauss–Newton's);
5. MINPACK/scipy termination tests per fit (``ftol`` on actual and predicted relative
   reduction, ``xtol`` on the scaled step, ``gtol`` on the largest cosine between the
   residual and a Jacobian column), which set that fit's ``status`` and clear its
   ``active`` bit;
6. a Gauss–Newton test at every newly accepted point: with
   :math:`\delta_{GN} = -(J^\top J + \epsilon\,\mathrm{diag}(d^2))^{-1}J^\top f`
   (:math:`\epsilon = 8u\,r`, :math:`r` the :func:`curvature_ratio`), the reduction still available,
   :math:`\tfrac12 |J^\top f \cdot \delta_{GN}|`, is at most ``ftol * cost`` (status 2,
   or 4 when also :math:`\|d\,\delta_{GN}\| \le` ``xtol`` :math:`\|d\,x\|`). Unlike the
   MINPACK tests it does not depend on the *actual* reduction, which on a float32 rung is
   swamped by rounding near the minimum: without it, noisy gain ratios reject steps, the
   damping grows and ``xtol`` stops the fit early along flat directions.

With box constraints (the residual's ``bounds(bargs)``; see
:class:`~adaptprec.batch._problem.Residual`) the iteration is projected LM: a variable on
a bound whose gradient points out of the box is *held* (identity row and column in the
damped system, zero step), the trial point is clipped into the box, :math:`\mathrm{pred}`
is the Gauss–Newton model's reduction along the step actually taken, and the state keeps
the *projected* gradient (held components zero), which the ``gtol`` test, the escalation
guards and the reported optimality read.

Fits whose ``active`` bit is clear are *frozen*: every field is selected from the old
state with ``jnp.where``, so a converged fit does not change while others iterate. The
state keeps :math:`J^\top J`, :math:`J^\top f` and the cost instead of ``J`` and ``f``, so
its memory is :math:`O(B n^2)` not :math:`O(B m n)`. The loop runs until at most
``stop_count`` fits are active (so :mod:`~adaptprec.batch.compaction` can regroup the
stragglers); there is no host synchronisation inside it.

Arithmetic: the residual is evaluated at the rung's dtype (the caller's ``fj``); it is
returned in the accumulation dtype (float32 or wider) in which all sums, the normal
equations and the Cholesky run.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from .._policy import cast_floating
from . import _status as st
from ..nlsq.common import robust_cost, scale_for_robust_loss
from ._fits_last import vmap_last
from .cholesky import cholesky_solve_fits_last

__all__ = ["LMOptions", "LMState", "ResidualJacobian", "make_fj", "rung_ftol", "lm_init", "lm_step",
           "lm_run", "gradient_cosine", "held_by_bounds", "move_batch_axis", "to_fits_last",
           "to_fits_first", "init_fits_last", "damped_solve_fits_last", "curvature_ratio",
           "gauss_newton_shift"]

_ACCEPT = 1e-4
# rounding level of a cost evaluation, relative to the cost, in eps * sqrt(m)
_QUIET = 16.0
_LAMBDA_MAX = 1e16


class LMOptions(NamedTuple):
    """Static options of one LM stage (hashable). Tolerances are already rung-adjusted.

    Example:
        >>> from adaptprec.batch.lm_batched import LMOptions
        >>> LMOptions(ftol=1e-8, xtol=1e-8, gtol=1e-8, max_steps=100).lam0
        0.001
    """

    ftol: float
    xtol: float
    gtol: float
    max_steps: int
    lam0: float = 1e-3
    loss: object = "linear"   # a name from adaptprec.nlsq.common.LOSSES or a callable rho(z)
    f_scale: float = 1.0
    gram: str = "packed"      # "packed" (_gram) or "einsum" (batched dots; XLA defaults)
    # Adaptive ladders judge steps against the standard errors (batch/verify.py): a
    # lower rung stops only once its Gauss-Newton step is below se_below standard errors
    # (its ftol at most se_below^2 / (m - n)); the top rung also accepts a step below
    # se_accept standard errors (its Gauss-Newton test's ftol at least se_accept^2/(m-n)).
    se_below: float = 0.0
    se_accept: float = 0.0


def rung_ftol(opts: LMOptions, m: int, n: int, gauss_newton: bool = True) -> float:
    r"""The ``ftol`` of a rung's Gauss–Newton test (``gauss_newton=False``: of MINPACK's
    test on the actual and predicted reductions) for ``m`` residuals, ``n`` parameters.

    A Gauss–Newton step :math:`\delta` of ``c`` standard errors in the covariance's metric
    (:math:`\delta^\top J^\top J\delta = c^2 s^2`, :math:`s^2 = 2\,\mathrm{cost}/(m-n)`)
    has the available reduction :math:`c^2\,\mathrm{cost}/(m-n)`: ``se_below`` caps
    ``ftol`` at that (both tests), ``se_accept`` raises the Gauss–Newton test's to it (the
    MINPACK test, whose damped prediction can be far below the Gauss–Newton step's, keeps
    ``opts.ftol``). Without degrees of freedom (``m <= n``) both are off.

    Example:
        >>> from adaptprec.batch.lm_batched import LMOptions, rung_ftol
        >>> o = LMOptions(1e-6, 1e-6, 1e-6, 9)
        >>> rung_ftol(o, 25, 5), rung_ftol(o._replace(se_below=1e-3), 25, 5)
        (1e-06, 5e-08)
        >>> top = LMOptions(1e-15, 1e-10, 1e-10, 9, se_accept=1e-3)
        >>> rung_ftol(top, 25, 5), rung_ftol(top, 25, 5, gauss_newton=False), rung_ftol(top, 5, 5)
        (5e-08, 1e-15, 1e-15)
    """
    ftol = opts.ftol
    if m <= n:
        return ftol
    if opts.se_below > 0:
        ftol = min(ftol, opts.se_below ** 2 / (m - n))
    if gauss_newton and opts.se_accept > 0:
        ftol = max(ftol, opts.se_accept ** 2 / (m - n))
    return ftol


class LMState(NamedTuple):
    """Per-fit LM state; every leaf has the batch axis first (inside :func:`lm_run`'s loop
    the same fields are carried with it last).

    Example:
        >>> from adaptprec.batch.lm_batched import LMState
        >>> LMState._fields[:4]
        ('x', 'cost', 'jtj', 'jtf')
    """

    x: jax.Array        # (B, n)
    cost: jax.Array     # (B,)    0.5 * ||f||^2
    jtj: jax.Array      # (B, n, n)
    jtf: jax.Array      # (B, n)
    d2: jax.Array       # (B, n)  running max of diag(J^T J)
    lam: jax.Array      # (B,)
    nu: jax.Array       # (B,)
    active: jax.Array   # (B,) bool
    status: jax.Array   # (B,) int32
    nit: jax.Array      # (B,) int32
    nfev: jax.Array     # (B,) int32
    njev: jax.Array     # (B,) int32


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
        >>> from adaptprec.batch.lm_batched import make_fj
        >>> fj = make_fj(lambda x, b, s: x[:2] * s - b[0], jnp.float32, jnp.float32)
        >>> f, Jt = fj(jnp.ones((4, 3)), (jnp.zeros((4, 2)),), 2.0)
        >>> f.shape, Jt.shape, float(Jt[0, 1, 1]), float(Jt[0, 2, 1])
        ((4, 2), (4, 3, 2), 2.0, 0.0)
        >>> [a.shape for a in fj.fits_last(jnp.ones((3, 4)), (jnp.zeros((2, 4)),), 2.0)]
        [(2, 4), (3, 2, 4)]
    """
    return ResidualJacobian(residual, rung_dtype, acc_dtype)


# ---------------------------------------------------------------------------------------
# Everything below down to lm_run works on the fits-last layout: per-fit scalars (B,),
# vectors (n, B), matrices (n, n, B), residuals (m, B), transposed Jacobians (n, m, B).

def move_batch_axis(tree, src: int, dst: int):
    """Every leaf of ``tree`` with its axis ``src`` moved to ``dst`` (``0, -1``: fits
    first to fits last; ``-1, 0``: back).

    Example:
        >>> import jax.numpy as jnp
        >>> from adaptprec.batch.lm_batched import move_batch_axis
        >>> [a.shape for a in move_batch_axis((jnp.zeros((5, 2)), jnp.zeros((5, 2, 3))), 0, -1)]
        [(2, 5), (2, 3, 5)]
    """
    return jax.tree.map(lambda a: jnp.moveaxis(a, src, dst), tree)


def to_fits_last(s: LMState) -> LMState:
    """A fits-first :class:`LMState` in the layout of :func:`lm_run`'s loop (fits last)."""
    return move_batch_axis(s, 0, -1)


def to_fits_first(s: LMState) -> LMState:
    """The inverse of :func:`to_fits_last`: the public, fits-first layout."""
    return move_batch_axis(s, -1, 0)


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


def _diagonal(a):
    """``diag`` of every fit's matrix: (n, n, B) -> (n, B)."""
    return jnp.stack([a[i, i] for i in range(a.shape[0])])


def _normal_equations(f, jt, opts: LMOptions):
    """cost, J^T J, J^T f and the damping scale from f (m, B) and Jt (n, m, B).

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
        scale = _diagonal(jtj)
    return cost, jtj, jtf, scale


def _finite(*arrays):
    """Per fit: every entry of every array finite."""
    ok = None
    for a in arrays:
        r = jnp.isfinite(a).reshape(-1, a.shape[-1]).all(axis=0)
        ok = r if ok is None else ok & r
    return ok


def _gradient_cosine(cost, jtj, jtf):
    fnorm = jnp.sqrt(2.0 * cost)
    cnorm = jnp.sqrt(_diagonal(jtj))
    denom = cnorm * fnorm[None]
    cos = jnp.where(denom > 0, jnp.abs(jtf) / jnp.where(denom > 0, denom, 1), 0)
    return jnp.max(cos, axis=0)


def gradient_cosine(cost, jtj, jtf):
    """Largest cosine between the residual and a Jacobian column (scipy/MINPACK ``gtol``).

    Fits first: ``cost`` (B,), ``jtj`` (B, n, n), ``jtf`` (B, n). Zero for a zero
    residual; columns with zero norm are skipped.

    Example:
        >>> import jax.numpy as jnp
        >>> from adaptprec.batch.lm_batched import gradient_cosine
        >>> float(gradient_cosine(jnp.array([0.5]), jnp.eye(2)[None], jnp.array([[1.0, 0.0]]))[0])
        1.0
    """
    return _gradient_cosine(cost, jnp.moveaxis(jtj, 0, -1), jtf.T)


def held_by_bounds(x, g, lo, hi):
    """Variables *held* by a bound: on it, with the descent direction ``-g`` pointing out
    of the box (``x_i <= lo_i`` and ``g_i > 0``, or ``x_i >= hi_i`` and ``g_i < 0``).
    Elementwise, so any batch layout (also used by :mod:`~adaptprec.batch.implicit`).

    Example:
        >>> import jax.numpy as jnp
        >>> from adaptprec.batch.lm_batched import held_by_bounds
        >>> held_by_bounds(jnp.array([0.0, 0.0, 0.5]), jnp.array([1.0, -1.0, 1.0]), 0.0, 1.0).tolist()
        [True, False, False]
    """
    return ((x <= lo) & (g > 0)) | ((x >= hi) & (g < 0))


def _project_gradient(x, g, bounds):
    """``g`` with the components of variables held by a bound set to zero: the projected
    gradient is what vanishes at a box-constrained minimum, so the ``gtol`` test, the
    escalation guards and the reported optimality use it."""
    if bounds is None:
        return g
    return jnp.where(held_by_bounds(x, g, *bounds), 0, g)


def _held(x, g_projected, bounds):
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
        >>> from adaptprec.batch.lm_batched import damped_solve_fits_last
        >>> jtj = jnp.array([[2.0, 0.0], [0.0, 4.0]])[:, :, None]
        >>> dx = damped_solve_fits_last(jtj, jnp.array([[2.0], [4.0]]), jnp.zeros((2, 1)),
        ...                             jnp.zeros((2, 1)), None)
        >>> [round(float(v), 12) for v in dx[:, 0]]
        [-1.0, -1.0]
    """
    if bounds is None:
        return cholesky_solve_fits_last(jtj, -g, shift)
    held = _held(x, g, bounds)
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
        >>> from adaptprec.batch.lm_batched import curvature_ratio
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
    return eps * curvature_ratio(_diagonal(jtj), d2)[None] * d2


def _gauss_newton_test(cost, jtj, jtf, d2, x, opts: LMOptions, bounds=None, ftol=None):
    """(ftol, xtol) verdicts of the Gauss–Newton step at the current point (see step 6)."""
    dx = damped_solve_fits_last(jtj, jtf, gauss_newton_shift(jtj, d2), x, bounds)
    avail = 0.5 * jnp.abs(jnp.sum(jtf * dx, axis=0))
    f_ok = avail <= (opts.ftol if ftol is None else ftol) * cost
    dxn = jnp.sqrt(jnp.sum(d2 * dx * dx, axis=0))
    xnorm = jnp.sqrt(jnp.sum(d2 * x * x, axis=0))
    x_ok = dxn <= opts.xtol * (opts.xtol + xnorm)
    return f_ok, x_ok


def _materialised(x):
    """``x`` unchanged (a NaN stays NaN), through an op XLA does not copy into consumers.

    XLA:CPU fuses cheap producers (slices, transposes, converts) into every consumer, also
    into one that reads each element many times: the starts, a strided transpose of the
    fits-first block, were re-read for every residual and Jacobian entry (that kernel 6x
    slower, the whole solve about 1.4x). A select is not "cheap" to XLA's fusion, so the
    fits-last copy is made once. (``lax.optimization_barrier`` does not do this: XLA:CPU
    removes it before fusion.)
    """
    return jnp.where(jnp.isnan(x), jnp.nan, x)


def init_fits_last(fj: ResidualJacobian, x, bargs, sargs, opts: LMOptions, active) -> LMState:
    """:func:`lm_init` in the fits-last layout: ``x`` ``(n, B)``, batched args with a
    trailing ``B``; returns the fits-last state (``active=None``: every fit). The first
    evaluation of a rung, also :mod:`~adaptprec.batch.verify`'s one top-rung evaluation.
    """
    b = x.shape[-1]
    bounds = fj.bounds(bargs)
    if bounds is not None:    # infeasible starts are rejected at the boundary when concrete
        x = jnp.clip(x.astype(bounds[0].dtype), *bounds)
    else:
        x = _materialised(x)
    # the data too: each entry is read once, so XLA may still fuse the copy; measured
    # about 5% faster with it (three round-robin A/B rounds, 1e4 fits, three seeds)
    bargs = jax.tree.map(lambda a: _materialised(a) if jnp.issubdtype(a.dtype, jnp.floating)
                         else a, bargs)
    f, jac = fj.fits_last(x, bargs, sargs)
    acc = f.dtype
    x = x.astype(acc)
    cost, jtj, jtf, d2 = _normal_equations(f, jac, opts)
    jtf = _project_gradient(x, jtf, bounds)
    finite_f = _finite(x, cost)
    finite = finite_f & _finite(jtj, jtf)
    d2 = jnp.where(d2 > 0, d2, 1).astype(acc)
    if active is None:
        active = jnp.ones((b,), bool)
    gconv = _gradient_cosine(cost, jtj, jtf) <= opts.gtol
    status = jnp.where(~finite_f, st.NONFINITE_RESIDUAL,
                       jnp.where(~finite, st.NONFINITE_JACOBIAN,
                                 jnp.where(gconv, st.GTOL, st.RUNNING)))
    status = status.astype(jnp.int32)
    run = active & finite & ~gconv
    ones = jnp.ones((b,), jnp.int32)
    return LMState(x=x, cost=cost, jtj=jtj, jtf=jtf, d2=d2,
                   lam=jnp.full((b,), opts.lam0, acc), nu=jnp.full((b,), 2.0, acc),
                   active=run, status=jnp.where(active, status, st.RUNNING),
                   nit=jnp.zeros((b,), jnp.int32), nfev=ones * active,
                   njev=ones * active)


def _step(fj: ResidualJacobian, s: LMState, bargs, sargs, opts: LMOptions) -> LMState:
    acc = s.x.dtype
    active = s.active
    damp = s.lam[None] * s.d2
    bounds = fj.bounds(bargs)
    dx = damped_solve_fits_last(s.jtj, s.jtf, damp, s.x, bounds)
    xn = s.x + dx
    if bounds is not None:   # projected step: back into the box, then the step taken
        xn = jnp.clip(xn, *bounds)
        dx = xn - s.x
    f, jac = fj.fits_last(xn, bargs, sargs)
    cost_n, jtj_n, jtf_n, d2_n = _normal_equations(f, jac, opts)
    finite = _finite(xn, cost_n, jtj_n, jtf_n)
    jtf_n = _project_gradient(xn, jtf_n, bounds)

    if bounds is None:   # the damped system's solution: pred in closed form
        pred = 0.5 * jnp.sum(dx * (damp * dx - s.jtf), axis=0)
    else:                # the Gauss–Newton model's reduction along the step taken
        jdx = jnp.sum(s.jtj * dx[None, :, :], axis=1)
        pred = -jnp.sum(dx * (s.jtf + 0.5 * jdx), axis=0)
    actred = s.cost - cost_n
    pos = s.cost > 0
    safe_cost = jnp.where(pos, s.cost, 1)
    rel_act = jnp.where(finite & pos, actred / safe_cost, -1)
    rel_pred = jnp.where(pos, pred / safe_cost, 0)
    rho = jnp.where(finite & (pred > 0), actred / jnp.where(pred > 0, pred, 1), -1)
    rho = jnp.where(jnp.isfinite(rho), rho, -1)
    tiny = float(np.finfo(acc).eps)
    if opts.se_below > 0:
        # A rung whose answer the top rung verifies goes below its rounding-level ftol,
        # where the cost's change is rounding noise and the gain ratio a coin flip:
        # there a step predicted and measured to change the cost by less than the
        # evaluation's rounding is taken as a model step (judged by the Gauss-Newton
        # test and, at the end, by the top rung), not rejected into growing damping.
        level = _QUIET * tiny * float(np.sqrt(f.shape[0]))
        quiet = finite & pos & (rel_pred <= level) & (jnp.abs(rel_act) <= level)
        rho = jnp.where(quiet & ~(rho > _ACCEPT), 1.0, rho)
    accept = active & finite & (rho > _ACCEPT)

    # Nielsen damping update
    shrink = jnp.maximum(1.0 / 3.0, 1.0 - (2.0 * rho - 1.0) ** 3)
    # the floor eps, relative to the curvature left (see curvature_ratio)
    floor = tiny * curvature_ratio(d2_n, jnp.maximum(s.d2, d2_n))
    lam_n = jnp.where(accept, jnp.maximum(s.lam * shrink, floor), s.lam * s.nu)
    nu_n = jnp.where(accept, 2.0, 2.0 * s.nu)

    # termination tests (MINPACK lmder / scipy)
    m, n = f.shape[0], s.x.shape[0]
    ftol = rung_ftol(opts, m, n, gauss_newton=False)
    ftol_ok = (jnp.abs(rel_act) <= ftol) & (rel_pred <= ftol) & (rho <= 2.0)
    dxn = jnp.sqrt(jnp.sum(s.d2 * dx * dx, axis=0))
    xnew = jnp.where(accept, xn, s.x)
    xnorm = jnp.sqrt(jnp.sum(s.d2 * xnew * xnew, axis=0))
    xtol_ok = jnp.isfinite(dxn) & (dxn <= opts.xtol * (opts.xtol + xnorm))

    def pick(new, old):   # the fit axis is last: (B,) broadcasts against (..., B)
        return jnp.where(accept, new, old)

    cost = pick(cost_n, s.cost)
    jtj = pick(jtj_n, s.jtj)
    jtf = pick(jtf_n, s.jtf)
    d2 = pick(jnp.maximum(s.d2, d2_n), s.d2)
    gtol_ok = accept & (_gradient_cosine(cost, jtj, jtf) <= opts.gtol)
    gn_f, gn_x = _gauss_newton_test(cost, jtj, jtf, d2, xnew, opts, bounds,
                                    rung_ftol(opts, m, n))
    gn_f = accept & gn_f
    gn_x = accept & gn_x
    nit = s.nit + active.astype(jnp.int32)

    code = jnp.where((ftol_ok & xtol_ok) | (gn_f & gn_x), st.FTOL_XTOL,
           jnp.where(ftol_ok | gn_f, st.FTOL,
           jnp.where(xtol_ok, st.XTOL,
           jnp.where(gtol_ok, st.GTOL,
           jnp.where(lam_n > _LAMBDA_MAX, jnp.where(finite, st.STALLED, st.NO_FINITE_STEP),
           jnp.where(nit >= opts.max_steps, st.MAX_STEPS, st.RUNNING))))))
    status = jnp.where(active, code, s.status).astype(jnp.int32)
    inc = active.astype(jnp.int32)
    return LMState(
        x=xnew, cost=cost, jtj=jtj, jtf=jtf, d2=d2,
        lam=jnp.where(active, lam_n, s.lam), nu=jnp.where(active, nu_n, s.nu),
        active=active & (code == st.RUNNING), status=status, nit=nit,
        nfev=s.nfev + inc, njev=s.njev + inc)


# ---------------------------------------------------------------------------------------
# Public entry points: fits first.

def lm_init(fj, x, bargs, sargs, opts: LMOptions, active=None) -> LMState:
    """Evaluate the starts and build the initial state (non-finite starts get status -3 or -4).

    Example:
        >>> import jax.numpy as jnp
        >>> from adaptprec.batch.lm_batched import LMOptions, lm_init, make_fj
        >>> fj = make_fj(lambda x, b, s: x - b[0], jnp.float32, jnp.float32)
        >>> s = lm_init(fj, jnp.zeros((2, 1)), (jnp.ones((2, 1)),), (), LMOptions(1e-8, 1e-8, 1e-8, 10))
        >>> s.cost.tolist(), s.active.tolist()
        ([0.5, 0.5], [True, True])
    """
    return to_fits_first(init_fits_last(fj, x.T, move_batch_axis(bargs, 0, -1), sargs, opts,
                                        active))


def lm_step(fj, s: LMState, bargs, sargs, opts: LMOptions) -> LMState:
    """One LM iteration for every active fit; inactive fits are returned unchanged.

    Example:
        >>> import jax.numpy as jnp
        >>> from adaptprec.batch.lm_batched import LMOptions, lm_init, lm_step, make_fj
        >>> fj = make_fj(lambda x, b, s: x - b[0], jnp.float64, jnp.float64)
        >>> o = LMOptions(1e-8, 1e-8, 1e-8, 10)
        >>> s = lm_init(fj, jnp.zeros((1, 1)), (jnp.ones((1, 1)),), (), o)
        >>> s = lm_step(fj, s, (jnp.ones((1, 1)),), (), o)
        >>> round(float(s.x[0, 0]), 3)
        0.999
    """
    return to_fits_first(_step(fj, to_fits_last(s), move_batch_axis(bargs, 0, -1), sargs, opts))


def lm_run(fj, s: LMState, bargs, sargs, opts: LMOptions, stop_count: int = 0) -> LMState:
    """Iterate :func:`lm_step` until at most ``stop_count`` fits are still active.

    Every fit stops by ``opts.max_steps`` (status 0), so the loop terminates.

    Example:
        >>> import jax.numpy as jnp
        >>> from adaptprec.batch.lm_batched import LMOptions, lm_init, lm_run, make_fj
        >>> fj = make_fj(lambda x, b, s: jnp.exp(x) - b[0], jnp.float64, jnp.float64)
        >>> o = LMOptions(1e-10, 1e-10, 1e-10, 50)
        >>> y = (jnp.array([[2.0], [3.0]]),)
        >>> s = lm_run(fj, lm_init(fj, jnp.zeros((2, 1)), y, (), o), y, (), o)
        >>> [round(float(v), 6) for v in s.x[:, 0]], s.active.any().item()
        ([0.693147, 1.098612], False)
    """
    def cond(s):
        return jnp.sum(s.active.astype(jnp.int32)) > stop_count

    bargs = _rung_data(fj, move_batch_axis(bargs, 0, -1))
    s = jax.lax.while_loop(cond, lambda s: _step(fj, s, bargs, sargs, opts), to_fits_last(s))
    return to_fits_first(s)


def _rung_data(fj: ResidualJacobian, bargs_last):
    """The batched data (fits last) cast once to a lower rung's dtype and materialised
    there: the cast the residual makes at every evaluation is then a no-op. (Left to XLA,
    the float64 -> float32 cast hoisted out of the loop wrote the fits-first layout and
    copied it again: two passes over the data per block, issue 31.) Same values."""
    def cast(a):
        if not jnp.issubdtype(a.dtype, jnp.floating):
            return a
        low = jnp.asarray(cast_floating(a, fj.rung_dtype))
        return a if low.dtype == a.dtype else _materialised(low)
    return jax.tree.map(cast, bargs_last)
