"""`solve_nlsq_batch`: many independent small least-squares fits sharing one model."""

from __future__ import annotations

from typing import Any, Callable, Optional, Union

import jax
import numpy as np

from .._pytree import replace
from .._tracing import is_traced
from .._x64_rule import float64_entry
from ..nlsq.common import DEFAULT_FTOL, DEFAULT_GTOL, DEFAULT_XTOL
from ..modeling.likelihood import check_likelihood
from ._options import batch_ladder, configure
from ._points import check_poisson_counts, pad_uneven, placeholders, points_mask
from ._problem import build_problem, nonfinite_fits, numeric_data
from ._program import batch_solver
from ._run import run_solver
from ._ties import tie_parameters
from .result import BatchResult
from .sharding import raise_together

__all__ = ["solve_nlsq_batch"]


def _to_host(tree):
    """NumPy leaves for the x64-scoped eager result, except arrays spanning processes
    (they stay global jax.Arrays: no process can hold them)."""
    return jax.tree.map(lambda a: np.asarray(a) if isinstance(a, jax.Array)
                        and a.is_fully_addressable else a, tree)


def _problem(fun, x0, args, in_axes, ydata, sigma, bounds, mask, fixed, likelihood, loss,
             nan_policy):
    """The validated :class:`~adaptprec.batch._problem.Problem` of one call: uneven data
    padded, the points that count, Poisson counts checked."""
    if nan_policy not in ("propagate", "raise", "omit"):
        raise ValueError(f"nan_policy must be 'propagate', 'omit' or 'raise', got "
                         f"{nan_policy!r}")
    likelihood = check_likelihood(likelihood, sigma, loss)
    if likelihood is not None and ydata is None:
        raise ValueError("likelihood='poisson' needs the counts as ydata=(B, m) and fun "
                         "as the model of their expected values")
    ydata, sigma, args, mask = pad_uneven(ydata, sigma, args, in_axes, mask)
    ydata, sigma, mask = _real_points(x0, ydata, sigma, mask, nan_policy)
    if likelihood is not None:
        check_poisson_counts(ydata, mask)
    return build_problem(fun, x0, args, in_axes, ydata, sigma, bounds, mask=mask,
                         fixed=fixed, likelihood=likelihood)


def _real_points(x0, ydata, sigma, mask, nan_policy):
    """``(ydata, sigma, mask)``: the validated mask (with ``nan_policy="omit"``, the
    non-finite data left out) and finite stand-ins on the points outside it."""
    if ydata is not None:
        ydata = numeric_data(ydata, "ydata")
        sigma = numeric_data(sigma, "sigma")
    if mask is None and nan_policy != "omit":
        return ydata, sigma, None
    size = np.shape(jax.tree.leaves(x0)[0])[0] if jax.tree.leaves(x0) else 0
    points = ydata if ydata is not None else mask
    m = np.shape(points)[-1] if points is not None and np.ndim(points) else 0
    mask = points_mask(mask, ydata, sigma, size, m, nan_policy)
    ydata, sigma = placeholders(ydata, sigma, mask)
    return ydata, sigma, mask


def _check_finite_inputs(prob) -> None:
    """``nan_policy="raise"``: ``ValueError`` listing fits with non-finite starts or data
    (every process raises when the inputs span processes)."""
    if is_traced(prob.x0, prob.bargs, prob.sargs):
        raise ValueError("nan_policy='raise' needs concrete inputs; under jit use "
                         "nan_policy='propagate' and read the per-fit status")
    bad = nonfinite_fits(prob)     # on inputs spanning processes: this process's fits
    raise_together(ValueError(
        f"{bad.size} fit(s) have non-finite starts or data, e.g. fits "
        f"{bad[:10].tolist()}; clean them, use nan_policy='omit' (NaN ydata points "
        f"left out of their fit) or nan_policy='propagate' (status -3 for those fits "
        f"only)") if bad.size else None, prob.x0, prob.bargs)


def _callers_layout(result: BatchResult, prob, ties) -> BatchResult:
    """``x`` (and with ties ``pcov``) over every parameter, in ``x0``'s structure."""
    if ties is not None:       # the free coordinates' result over every parameter
        return ties.full_result(result)
    if prob.spec is not None:  # x0 was a pytree: give x back in its structure
        return replace(result, x=prob.spec.unravel_batched(result.x))
    return result


@float64_entry("solve_nlsq_batch", ("x0", "args", "ydata", "sigma", "bounds", "mask"),
               host=_to_host)
def solve_nlsq_batch(
    fun: Callable,
    x0,
    args: Any = (),
    *,
    in_axes: Union[int, None, tuple] = 0,
    ydata=None,
    sigma=None,
    absolute_sigma: bool = False,
    bounds=None,
    mask=None,
    fixed=None,
    expr=None,
    constraints=None,
    likelihood: str = "gaussian",
    precision="adaptive",
    loss="linear",
    f_scale: float = 1.0,
    ftol: float = DEFAULT_FTOL,
    xtol: float = DEFAULT_XTOL,
    gtol: float = DEFAULT_GTOL,
    max_steps: Optional[int] = None,
    return_pcov: bool = False,
    nan_policy: str = "propagate",
    compaction: Union[str, int, None] = "auto",
    escalate_fraction: float = 0.125,
    cond_tol: float = 1e-2,
    noise_floor: float = 10.0,
    block_size: int = 2500,
    chunk_size: Optional[int] = None,
    progress: Union[bool, Callable[[int, int], None], None] = None,
    mesh=None,
    batch_axis: Optional[str] = None,
) -> BatchResult:
    r"""Solve ``B`` independent nonlinear least-squares fits that share one model.

    Each fit ``k`` minimises :math:`\tfrac12\|r(x_k)\|^2` by Levenberg–Marquardt
    (:mod:`adaptprec.batch.lm_batched`), the batch axis explicit: converged fits are
    frozen, stragglers compacted, and each fit climbs the precision ladder on its own
    (float32, then one float64 evaluation verifies it; only fits failing that iterate in
    float64, :mod:`adaptprec.batch.verify`): within 1e-3 standard errors of ``"f64"``.

    Args:
        fun: the residual ``fun(x, *args) -> (m,)`` of one fit, or with ``ydata`` the model
            ``fun(x, *args) -> (m,)`` whose residual is ``(fun(x, *args) - ydata) / sigma``.
        x0: starts, shape ``(B, n)``, or a pytree of arrays (dict, namedtuple, list of
            arrays...) whose leaves all have the leading batch axis ``B``; ``fun`` then
            gets one fit's pytree and ``res.x`` has ``x0``'s structure (``pcov`` rows
            follow the leaves in ``jax.tree`` order, each flattened in C order).
        args: extra arguments of ``fun``. Batched ones have a leading axis of size ``B``
            (per-fit data); mark shared ones (e.g. a common grid) with ``in_axes``.
        in_axes: ``0`` (all args batched, default), ``None`` (all shared), or a tuple with
            one ``0``/``None`` per arg, as in :func:`jax.vmap`.
        ydata: per-fit data ``(B, m)`` for the model form; ``sigma`` ``(m,)`` or ``(B, m)``
            its standard deviations; ``absolute_sigma`` as in ``curve_fit``.
        bounds: ``(lb, ub)``, each a scalar, ``(n,)`` (shared), ``(B, n)`` (per fit) or,
            for a pytree ``x0``, a pytree like it; ``-inf``/``inf`` for an open side.
            Projected Levenberg–Marquardt (``docs/batch.md``); ``lb < ub`` and ``x0``
            inside the box are required (``ValueError`` otherwise, as scipy).
        mask: ``(B, m)`` or ``(m,)`` bool, ``True`` on the points that count (others are
            selected away inside the solve; ``cost``, ``pcov``, ``dof`` count real points;
            fewer than the free parameters: status -1, scipy's ``m < n``). A mask, not
            lengths: a mask also marks gaps, lengths are ``arange(m) < lengths[:, None]``.
            ``ydata`` as a list of uneven 1-D arrays (per-fit args, ``sigma`` alike) is
            padded and masked for you.
        fixed: ``(n,)``/``(B, n)`` bool (a pytree like a pytree ``x0``): ``True`` holds a
            parameter at its ``x0`` (Gpufit's ``parameters_to_fit == 0``); zero ``pcov``
            rows and columns (exact, as in :func:`~adaptprec.fit`), not in ``dof``.
        expr, constraints: ties and inequalities shared by every fit, as in
            :func:`~adaptprec.curve_fit`: ``expr={"w2": "w1", "b": "2*a"}`` (or a callable
            of the parameters by name), ``constraints=["a < b"]``, by a dict ``x0``'s keys
            (an array's columns are ``p0, p1, ...``); solved on the free parameters and
            slacks, ``pcov`` propagated (:mod:`adaptprec.batch._ties`).
        likelihood: ``"gaussian"`` or ``"poisson"``: ``ydata`` counts (>= 0, zeros
            allowed, Gpufit's MLE), ``fun`` their expected values (> 0 at the start, else
            status -3); deviance residuals (:mod:`adaptprec.modeling.likelihood`), ``2 *
            cost`` the deviance, ``pcov`` the inverse Fisher information, unscaled.
        precision: ``"adaptive"`` (ladder ``f32,f64``; needs ``jax_enable_x64``), a ladder
            string such as ``"bf16,f32,f64"``/:class:`~adaptprec.Ladder`, or one dtype
            (``"f32"``, ``"f64"``) to solve everything at that precision.
        loss, f_scale: robust loss as in scipy ``least_squares`` (``"linear"``,
            ``"soft_l1"``, ``"huber"``, ``"cauchy"``, ``"arctan"`` or a callable
            ``rho(z)``); ``J``/``f`` are rescaled as scipy's ``trf`` does.
        ftol, xtol, gtol: termination tolerances, :func:`~adaptprec.solve_nlsq`'s
            defaults; each rung uses ``max(tol, 16 u_rung)`` (float32: about 1e-6: a
            float32 rung stops where it stops resolving progress; its guards decide).
        max_steps: iterations per fit on the top rung (default ``100 * (n + 1)``, as
            :func:`~adaptprec.solve_nlsq`); a lower rung gets a share of them
            (:func:`~adaptprec.nlsq.common.lower_rung_budget`), then escalates.
        return_pcov: also compute the per-fit covariance (``curve_fit`` semantics).
        nan_policy: ``"propagate"`` (fits with non-finite starts or data: status -3, the
            others unaffected), ``"omit"`` (NaN/Inf ``ydata``/``sigma`` points masked out
            of their fit, as scipy drops them) or ``"raise"`` (``ValueError``).
        compaction: how converged fits stop costing work: ``"auto"``/``"staged"``
            (:mod:`~adaptprec.batch.compaction`; default: once at most a quarter of a block
            iterates, those fits move to a buffer a quarter the size, down to 128), an int
            ``k >= 2`` (shrink factor), ``"stream"`` (lanes refilled) or ``None``.
        escalate_fraction: lanes of the float64 (upper-rung) buffer as a fraction of
            ``block_size`` (at least 64); any number of flagged fits streams through it.
        cond_tol, noise_floor: escalation guards (see :mod:`adaptprec.batch.escalation`).
        block_size: fits iterated in lockstep (lanes of the streaming buffer; on CPU,
            blocks run in turn, :func:`~adaptprec.batch.chunking.map_blocks`: in cache).
        chunk_size: solve at most this many fits at a time (default: all, unless the
            working set would exceed about 1 GiB).
        progress: ``True`` for a progress bar (:class:`~adaptprec.batch.TqdmProgress`, or
            :class:`~adaptprec.batch.TextProgress` without ``tqdm``) or a callable
            ``progress(done, total)`` after each chunk (eager calls only; the fits/s rate
            excludes compilation). Off by default.
        mesh, batch_axis: a :class:`jax.sharding.Mesh` and its axis to split the fits
            over (default: the first). Inputs sharded with a ``NamedSharding`` over
            their leading axis are split the same way; global arrays spanning processes
            are solved where they live (``docs/batch.md``, "Across processes").

    Returns:
        :class:`~adaptprec.batch.BatchResult`, per fit ``x``, ``cost``, ``status``,
        ``success``, ``rung``, ``nfev``, ``njev``, ``nit``, ``optimality``, ``dof``, ``pcov``.
        ``cost`` is the top rung's at ``x`` (its last evaluation there, or the
        Gauss–Newton model's after a verified hand-off step). ``x`` and ``cost`` are
        differentiable (forward and reverse) w.r.t. the floating ``args``/``ydata``/
        ``sigma`` by the implicit function theorem (:mod:`adaptprec.batch.implicit`).

    Raises:
        ValueError / TypeError: at the boundary: an empty batch, batch sizes that disagree,
            a residual not 1-D, ``m < n``, mismatched ``sigma``, unknown options or names.

    Example (x64 on, as under the tests):
        >>> import jax.numpy as jnp
        >>> import adaptprec as ap
        >>> t = jnp.linspace(0.0, 1.0, 8)
        >>> k = jnp.array([0.5, 1.0, 2.0])
        >>> y = 3.0 * jnp.exp(-k[:, None] * t)                      # (3 fits, 8 points)
        >>> model = lambda p, t: p[0] * jnp.exp(-p[1] * t)
        >>> res = ap.solve_nlsq_batch(model, jnp.ones((3, 2)), (t,), in_axes=None, ydata=y)
        >>> [round(float(v), 6) for v in res.x[:, 1]], res.success.all().item()
        ([0.5, 1.0, 2.0], True)
    """
    ladder = batch_ladder(precision)
    fun, x0, bounds, fixed, ties = tie_parameters(fun, x0, bounds, fixed, expr, constraints)
    prob = _problem(fun, x0, args, in_axes, ydata, sigma, bounds, mask, fixed, likelihood,
                    loss, nan_policy)
    if nan_policy == "raise":
        _check_finite_inputs(prob)
    cfg = configure(ladder, prob.m, prob.n, loss=loss, f_scale=f_scale, ftol=ftol,
                    xtol=xtol, gtol=gtol, max_steps=max_steps, compaction=compaction,
                    escalate_fraction=escalate_fraction, cond_tol=cond_tol,
                    noise_floor=noise_floor, block_size=block_size,
                    return_pcov=return_pcov, absolute_sigma=absolute_sigma)
    result = run_solver(batch_solver(prob.residual, cfg), prob, cfg, mesh=mesh,
                        batch_axis=batch_axis, chunk_size=chunk_size, progress=progress)
    return _callers_layout(result, prob, ties)
