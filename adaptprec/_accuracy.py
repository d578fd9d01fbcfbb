"""The accuracy guards: ``accuracy`` (the rung's rounding error against ``rtol``) and
``spot_check`` (a sample of a vmapped batch against the next rung).

How ``accuracy`` checks a rung is chosen per rung by the runtime's plan
(:mod:`adaptprec._plan`; ``GuardContext.check``): Monte Carlo arithmetic
(:mod:`adaptprec._mca`), the first-order error bound (:mod:`adaptprec._first_order`),
sampled entries, rows or convolution outputs re-evaluated in the widest dtype, or the
cancellation screen alone.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np

from ._guard_base import CANCELLATION, INACCURATE, SPOT_CHECK, Guard, GuardResult, _wide
from ._policy import _is_floating_array
from .precision import unit_roundoff

__all__ = ["accuracy", "spot_check", "output_error", "digits_from_error"]


# ------------------------------------------------------------------------- accuracy


def _check_rtol(rtol, who):
    if not isinstance(rtol, (int, float)) or isinstance(rtol, bool) or not 0 < rtol < 1:
        raise ValueError(f"{who}: rtol must be a relative tolerance in (0, 1), e.g. "
                         f"rtol=1e-3, got {rtol!r}")


def _leaf_error(y0, ys, componentwise: bool, floor: float = 0.0):
    """Max over samples of the normwise (or componentwise) relative distance to ``y0``;
    ``floor`` (``atol / rtol``) is added to the magnitude it is relative to."""
    from ._reductions import nan_to_inf    # a max drops NaN on XLA:CPU
    w = _wide(jnp.promote_types(y0.dtype, ys[0].dtype))
    a = y0.astype(w)
    d = jnp.max(jnp.stack([nan_to_inf(jnp.abs(y.astype(w) - a)) for y in ys]), axis=0)
    if componentwise:
        rel = nan_to_inf(jnp.where(d == 0, 0.0, d / (jnp.abs(a) + floor)))
        e = jnp.max(rel, initial=0.0)
    else:
        dmax = jnp.max(d, initial=0.0)
        e = jnp.where(dmax == 0, 0.0, dmax / (jnp.max(jnp.abs(a), initial=0.0) + floor))
    return jnp.where(jnp.isnan(e), jnp.inf, e).astype(jnp.float32)


def digits_from_error(err, u) -> jax.Array:
    """``-log10(err)`` clipped to ``[0, -log10(u)]``: the significant digits an error
    estimate leaves (a rung never verifies more digits than it carries)."""
    err = jnp.maximum(jnp.asarray(err, jnp.float32), jnp.float32(u))
    return jnp.clip(-jnp.log10(err), 0.0, -math.log10(u)).astype(jnp.float32)


@dataclasses.dataclass(frozen=True)
class _Accuracy(Guard):
    rtol: float
    samples: int
    componentwise: bool
    safety: float
    seed: int
    atol: float = 0.0
    code = INACCURATE
    role = "accuracy"

    @property
    def name(self) -> str:
        return f"accuracy({self.rtol:g}{self.norm_suffix})"

    @property
    def norm_suffix(self) -> str:
        """``""`` (normwise, no floor), else what the guard compares, e.g.
        ``", componentwise, atol 1e-08"``."""
        return (", componentwise" if self.componentwise else "") + (
            f", atol {self.atol:g}" if self.atol else "")

    @property
    def norm(self) -> str:
        """What "relative error" means here, for reports: ``"normwise"`` (``max|e| <=
        atol + rtol max|y|``) or ``"componentwise"`` (``|e_i| <= atol + rtol |y_i|``)."""
        return ("componentwise" if self.componentwise else "normwise") + (
            f", atol {self.atol:g}" if self.atol else "")

    @property
    def floor(self) -> float:
        """``atol`` in units of ``rtol``: added to the magnitude an error is relative to."""
        return self.atol / self.rtol

    #: the plan's name of each check: the method that runs it
    _METHODS = {"first_order": "first_order", "probe": "probe", "norm_bound": "norm_bound",
                "screen": "screen", "sample": "sampled", "sample_rows": "sampled_rows",
                "sample_conv": "sampled_conv"}

    def check(self, ctx):
        if ctx.check in self._METHODS:
            return getattr(self, self._METHODS[ctx.check])(ctx)
        if ctx.check in ("none", "speculative"):
            # the plan skipped the top rung's screens (they cost more than the budget):
            # the report says "not checked"; the finite guard still runs
            return GuardResult.make(True, INACCURATE, jnp.nan)
        return self.estimate(ctx, self.seed)

    #: entries re-evaluated by the sampled check, and the sampled checks' safety factor
    #: on the error measured there (the sample's largest error vs the whole array's:
    #: estimate/true 1.7-2.9 on benchmarks/calibrate_accuracy.py's suite, float32)
    SAMPLE, SAMPLE_SAFETY = 256, 3.0

    def sampled(self, ctx) -> GuardResult:
        """Entrywise kernels: ``SAMPLE`` evenly spaced entries re-evaluated in the
        widest dtype from the user's inputs; the largest normwise difference, times
        ``SAMPLE_SAFETY``. Statistical: a few bad entries between the samples are
        missed (the report says "sampled")."""
        from ._sampled import sampled_error
        ref = np.float64 if jax.config.jax_enable_x64 else np.float32
        err = sampled_error(ctx.fn, ctx.args, ctx.kwargs, ctx.inputs, *_returned(ctx), ref,
                            self.SAMPLE, self.seed, floor=self.floor)
        err = jnp.maximum(self.SAMPLE_SAFETY * err, jnp.float32(self._floor(ctx)))
        return GuardResult.make(err <= self.rtol, INACCURATE, digits_from_error(err, ctx.u))

    def sampled_rows(self, ctx) -> GuardResult:
        """Row-separable kernels (:mod:`adaptprec._rowwise`: an MLP in its batch,
        attention in its queries): ``_rowwise.rows_for(B)`` (8-64) evenly spaced rows re-evaluated in
        the widest dtype from the user's inputs; the largest normwise difference, times
        ``SAMPLE_SAFETY``. Statistical: a bad row between the samples is missed (the
        report says "sampled rows")."""
        from ._rowwise import sampled_rows_error
        from ._structure import structure_of_inputs
        mask = structure_of_inputs(ctx.fn, ctx.inputs).rows
        if mask is None:    # the plan chose it for a row-separable kernel: not reached
            raise TypeError("check 'sample_rows' on a kernel that is not row-separable")
        ref = np.float64 if jax.config.jax_enable_x64 else np.float32
        err = sampled_rows_error(ctx.fn, ctx.inputs, mask, *_returned(ctx), ref,
                                 seed=self.seed, floor=self.floor)
        err = jnp.maximum(self.SAMPLE_SAFETY * err, jnp.float32(self._floor(ctx)))
        return GuardResult.make(err <= self.rtol, INACCURATE, digits_from_error(err, ctx.u))

    def sampled_conv(self, ctx) -> GuardResult:
        """Convolution kernels (:mod:`adaptprec._convsample`): ``POSITIONS`` evenly
        spaced output positions (every channel) re-evaluated in the widest dtype on the
        input windows they read; the largest normwise difference, times
        ``SAMPLE_SAFETY``. Statistical: a bad position between the samples is missed
        (the report says "sampled")."""
        from ._convsample import sampled_conv_error
        from ._structure import structure_of_inputs
        conv = structure_of_inputs(ctx.fn, ctx.inputs).conv
        if conv is None:    # the plan chose it for a convolution: not reached
            raise TypeError("check 'sample_conv' on a kernel that is not one convolution")
        ref = np.float64 if jax.config.jax_enable_x64 else np.float32
        err = sampled_conv_error(conv, _dynamic_leaves(ctx), *_returned(ctx), ref,
                                 seed=self.seed, floor=self.floor)
        err = jnp.maximum(self.SAMPLE_SAFETY * err, jnp.float32(self._floor(ctx)))
        return GuardResult.make(err <= self.rtol, INACCURATE, digits_from_error(err, ctx.u))

    def probe(self, ctx) -> GuardResult:
        """Product expressions of matrices (:mod:`adaptprec._probe`, ``A^8``): the
        rung's answer against the expression re-associated onto ``PROBES`` random sign
        vectors in the widest dtype, ``O(n^2)``; the largest row error in the 2-norm,
        times its safety factor. Statistical (the report says "probes")."""
        from ._probe import probe_error
        ref = np.float64 if jax.config.jax_enable_x64 else np.float32
        (out,), (dt,) = _returned(ctx)
        err = probe_error(ctx.fn, ctx.inputs, out, dt, ref, seed=self.seed,
                          floor=self.floor)
        err = jnp.maximum(err, jnp.float32(self._floor(ctx)))
        return GuardResult.make(err <= self.rtol, INACCURATE, digits_from_error(err, ctx.u))

    def _floor(self, ctx) -> float:
        return max(ctx.u, _output_roundoff(ctx))

    def first_order(self, ctx) -> GuardResult:
        """The check by a first-order error bound at the rung's own precision
        (:mod:`adaptprec._first_order`): no wider dtype, about one cheap pass over the
        kernel's values (loops carry their bounds step by step); an unstable decision
        (comparison, argmax, a loop's exit test) fails it. ``ctx.prepared``: the walk
        that computed the rung's outputs (the runtime's; else it runs here)."""
        from ._first_order import FirstOrderResult, first_order, relative_bound
        res = ctx.prepared
        if not isinstance(res, FirstOrderResult):
            res = first_order(ctx.fn, ctx.args, ctx.kwargs, ctx.inputs, ctx.dtype)
        est = relative_bound(res.outs, res.errs, self.componentwise, self.floor)
        err = jnp.maximum(est, jnp.float32(self._floor(ctx)))
        err = jnp.where(res.unstable > 0, jnp.inf, err)
        return GuardResult.make(err <= self.rtol, INACCURATE, digits_from_error(err, ctx.u))

    def norm_bound(self, ctx) -> GuardResult:
        """The normwise first-order bound carried as a few numbers per value
        (:mod:`adaptprec._norm_bound`): a loop costs its body plus a few scalars per
        iteration; looser than :meth:`first_order`, normwise only. Its rounding part is
        probabilistic (Higham & Mary's model): each output's bound holds with probability
        ``1 - _norm_bound.FAILURE`` (``1 - 1e-6``). ``ctx.prepared``: the walk that
        computed the rung's outputs (the runtime's; else it runs here)."""
        from ._norm_bound import NormBoundResult, norm_bound
        res = ctx.prepared
        if not isinstance(res, NormBoundResult):
            res = norm_bound(ctx.fn, ctx.args, ctx.kwargs, ctx.inputs, ctx.dtype)
        err = jnp.maximum(res.relative(self.floor), jnp.float32(self._floor(ctx)))
        err = jnp.where(res.unstable > 0, jnp.inf, err)
        return GuardResult.make(err <= self.rtol, INACCURATE, digits_from_error(err, ctx.u))

    def screen(self, ctx) -> GuardResult:
        """Top rung, when no estimate pays: the cancellation screen alone (CADNA's
        unstable cancellation, normwise, and an output 0 from cancelled operands)."""
        from ._screen import cancellation_screen
        ratio, zero_cancel = cancellation_screen(ctx.fn, ctx.args, ctx.kwargs, ctx.dtype,
                                                 self.componentwise)
        zero_out = jnp.asarray(False)
        for y0 in jax.tree_util.tree_leaves(ctx.out):
            if _is_floating_array(y0):
                zero_out = zero_out | jnp.all(jnp.asarray(y0) == 0)
        lost = zero_out & zero_cancel
        err = jnp.maximum(ratio, jnp.float32(self._floor(ctx)))
        err = jnp.where(lost, jnp.inf, err)
        cancels = ((ratio > self.rtol) & (ratio > 2.0 * ctx.u)) | lost
        code = jnp.where(cancels, CANCELLATION, INACCURATE)
        return GuardResult.make(err <= self.rtol, code, digits_from_error(err, ctx.u))

    def estimate(self, ctx, seed) -> GuardResult:
        """The check with an explicit (possibly traced) ``seed``."""
        from ._mca import mca_samples
        res = mca_samples(ctx.fn, ctx.args, ctx.kwargs, ctx.inputs, ctx.dtype,
                          self.samples, seed, componentwise=self.componentwise)
        y0s = jax.tree_util.tree_leaves(ctx.out)
        est = jnp.float32(0)
        bad = jnp.float32(0)
        zero_out = jnp.asarray(False)
        for i, y0 in enumerate(y0s):
            ys = [s[i] for s in res.samples]
            if _is_floating_array(y0):
                est = jnp.maximum(est, _leaf_error(y0, ys, self.componentwise,
                                                   self.floor))
                zero_out = zero_out | jnp.all(jnp.asarray(y0) == 0)
            else:
                bad = bad + sum(jnp.sum(jnp.asarray(y) != y0, dtype=jnp.float32)
                                for y in ys)
        unstable = (bad > 0) | (res.unstable > 0)
        # floored at the rung's unit roundoff: storing the result in this dtype can cost
        # that much, and the samples may all round alike (an estimate of 0 that would let a
        # rung with u > rtol pass: 1.003 * 1.0 in bfloat16 is 1.0 in every sample)
        err = jnp.maximum(jnp.maximum(self.safety * est, res.cancellation),
                          jnp.float32(max(ctx.u, _output_roundoff(ctx))))
        err = jnp.where(unstable, jnp.inf, err)
        # an output leaf that is exactly 0 where an add/sub cancelled nonzero operands to
        # 0: no relative digit of it can be verified (a naive variance that cancels to
        # 0.0 where the truth is 1.04 is not "verified"); an exact tie (x - mean(x)
        # of a constant row) is then "not verified" too, which is what can be said of it
        lost = zero_out & res.zero_from_cancellation
        err = jnp.where(lost, jnp.inf, err)
        # a cancellation amplifies u by (|a| + |b|) / |a +- b|: every add has at least u,
        # so only an amplification above 2 is called one (x + 1 at x = 1 is not)
        cancels = ((res.cancellation > self.rtol) & (res.cancellation > 2.0 * ctx.u)) | lost
        code = jnp.where(cancels, CANCELLATION, INACCURATE)
        return GuardResult.make(err <= self.rtol, code, digits_from_error(err, ctx.u))


def _dynamic_leaves(ctx) -> list:
    """The dynamic (array) leaves of the user's inputs ``ctx.inputs``, in order."""
    from ._autocast.interpret import _is_dynamic
    return [x for x in jax.tree_util.tree_leaves(ctx.inputs) if _is_dynamic(x)]


def _returned(ctx) -> tuple[list, list]:
    """``(the rung's output leaves, the dtype each is returned in)``: the sampled checks
    read their samples from the rung's own outputs and cast the samples, so no check
    needs the whole cast output (the runtime casts only the output it accepts)."""
    raw = jax.tree_util.tree_leaves(ctx.out)
    if ctx.cast_out is None:
        return raw, [x.dtype for x in raw]
    return raw, [c.dtype for c in ctx.cast_out]


def _output_roundoff(ctx) -> float:
    """Unit roundoff of the coarsest floating dtype the caller gets back (the output
    cast): a float32 result returned as bfloat16 carries bfloat16's 2.4 digits, whatever
    the rung verified."""
    leaves = [x for x in (ctx.cast_out or ()) if _is_floating_array(x)]
    return max((unit_roundoff(x.dtype) for x in leaves), default=0.0)


def accuracy(rtol: float, samples: int = 2, *, componentwise: bool = False,
             atol: float = 0.0, safety: float = 2.0, seed: int = 0) -> Guard:
    """Fires when the rung's rounding error is estimated above ``rtol`` (inside ``jit``).

    **What "relative error" means.** Normwise (the default): the largest error over the
    entries of an output, relative to its largest entry, ``max|e| <= atol + rtol *
    max|y|``; one entry far smaller than the others may lose every digit and pass.
    ``componentwise=True``: every entry, relative to itself, ``|e_i| <= atol + rtol *
    |y_i|`` for all ``i``, as ``numpy.allclose`` reads a tolerance; ``atol`` is the floor
    that keeps an entry near zero (whose relative error is undefined) from failing the
    check. Reports say which was checked.

    Monte Carlo arithmetic (Parker 1997; the idea behind CADNA and Verificarlo): the
    kernel's jaxpr is re-evaluated ``samples`` times with the result of every
    floating-point operation, and every input cast, randomly rounded at the size of its
    rounding error (stochastic rounding from the next wider dtype; on the top rung, where
    there is none, error-free transformations TwoSum/TwoProd). The estimate is
    ``safety * max_k ||y_k - y||_inf / ||y||_inf`` per floating output leaf
    (``componentwise=True``: per element), ``y`` the rung's own result. Two deterministic
    checks complete it: an ``add``/``sub`` that cancels (``u * max(|a|+|b|) / max|a+-b|``
    above ``rtol``, per element with ``componentwise``: code ``CANCELLATION``) and, below
    the top rung, a comparison or
    ``argmax`` decided within rounding distance. Integer and bool outputs fail on any
    disagreement between samples. Keys are deterministic (``seed``).

    ``value`` is the estimated number of significant digits, ``-log10(error)``, capped by
    the rung's precision. Costs ``samples`` evaluations of the kernel in the next wider
    dtype plus O(size) integer work per operation; derivatives never flow through the
    samples. See docs/runtime.md for what it catches and misses, with measured rates.

    Example:
        >>> import jax.numpy as jnp
        >>> from adaptprec import guards
        >>> g = guards.accuracy(rtol=1e-3)
        >>> cancel = lambda x: (x + 1.0) - 1.0
        >>> r = g.evaluate(cancel, jnp.float32(1e-3), dtype="bf16")    # bf16 returns 0
        >>> bool(r.ok), guards.code_name(r.code)
        (False, 'cancellation')
        >>> r = g.evaluate(cancel, jnp.float32(1e-3), dtype="f32")
        >>> bool(r.ok), 3.0 < float(r.value) < 5.0                     # ~4 digits
        (True, True)
    """
    _check_rtol(rtol, "accuracy")
    if isinstance(samples, bool) or not isinstance(samples, int) or samples < 1:
        raise ValueError(f"accuracy: samples must be a positive int, got {samples!r}")
    if not isinstance(safety, (int, float)) or not safety > 0:
        raise ValueError(f"accuracy: safety must be a positive number, got {safety!r}")
    _check_atol(atol, "accuracy")
    if not isinstance(componentwise, (bool, np.bool_)):
        raise ValueError(f"accuracy: componentwise must be True (every entry relative to "
                         f"itself, as numpy.allclose) or False (normwise, the default), "
                         f"got {componentwise!r}")
    return _Accuracy(float(rtol), samples, bool(componentwise), float(safety), int(seed),
                     float(atol))


def _check_atol(atol, who):
    if isinstance(atol, bool) or not isinstance(atol, (int, float)) or not atol >= 0 \
            or not math.isfinite(atol):
        raise ValueError(f"{who}: atol must be a finite number >= 0 (an absolute floor, "
                         f"as in numpy.allclose), got {atol!r}")


def output_error(mine, ref) -> jax.Array:
    """Largest normwise relative difference between two lists of output leaves (float32).

    Floating leaves: ``max|mine - ref| / max|ref|``; integer/bool leaves: ``inf`` when any
    entry differs. NaN becomes ``inf``.

    Example:
        >>> import jax.numpy as jnp
        >>> from adaptprec.guards import output_error
        >>> float(output_error([jnp.array([1.0, 2.0])], [jnp.array([1.0, 2.2])]))  # doctest: +ELLIPSIS
        0.0909...
    """
    from ._reductions import nan_to_inf    # a max drops NaN on XLA:CPU
    err = jnp.float32(0)
    for a, b in zip(mine, ref):
        a, b = jnp.asarray(a), jnp.asarray(b)
        if _is_floating_array(a) and _is_floating_array(b):
            w = _wide(jnp.promote_types(a.dtype, b.dtype))
            d = jnp.max(nan_to_inf(jnp.abs(a.astype(w) - b.astype(w))), initial=0.0)
            e = jnp.where(d == 0, 0.0, d / jnp.max(jnp.abs(b.astype(w)), initial=0.0))
        else:
            e = jnp.where(jnp.any(a != b), jnp.inf, 0.0)
        err = jnp.maximum(err, jnp.asarray(e, jnp.float32))
    return jnp.where(jnp.isnan(err), jnp.inf, err)


@dataclasses.dataclass(frozen=True)
class _SpotCheck(Guard):
    rtol: float
    sample: int
    seed: int
    code = SPOT_CHECK
    role = "spot_check"
    label = "spot_check({self.rtol:g}, sample={self.sample})"

    def check(self, ctx):
        if ctx.batched or ctx.next_rung is None:
            # under vmap the runtime checks the batch (it overwrites this result); on the
            # top rung there is nothing to compare with: value NaN, nothing verified
            return GuardResult.make(True, SPOT_CHECK, jnp.nan)
        mine = ctx.cast_out if ctx.cast_out is not None else jax.tree_util.tree_leaves(
            ctx.out)
        err = output_error(mine, ctx.next_rung())
        return GuardResult.make(err <= self.rtol, SPOT_CHECK, err)


def spot_check(rtol: float, sample: int = 8, *, seed: int = 0) -> Guard:
    """Recompute ``sample`` random elements of a vmapped batch on the next rung; fires
    when any differs from this rung's result by more than ``rtol`` (normwise relative;
    integer/bool outputs: any difference).

    A cheap complement to :func:`accuracy` for big vmapped kernels (under ``vmap`` with
    ``batch="element"`` or ``"call"``): it costs ``sample`` element evaluations on the next
    rung per rung tried, whatever the batch size. When it fires, every element of the
    batch fails that rung (the sample says the rung is not trustworthy for this batch).
    It is a sample, not a proof: a few bad elements among many are likely missed (see
    docs/runtime.md). Outside ``vmap`` the whole call is one element, so it recomputes
    the call on the next rung. It verifies nothing on the top rung (value NaN). ``value``
    is the largest relative difference found.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> import adaptprec as ap
        >>> f = ap.adaptive(lambda x: jnp.sum(x) - 1e4, ladder="bf16,f32",
        ...                 guards=[ap.guards.finite(), ap.guards.spot_check(1e-2, 4)])
        >>> xs = jnp.full((64, 1000), 10.0001, jnp.float32)
        >>> _, rep = jax.vmap(f.with_report)(xs)
        >>> print(rep.summary())                             # doctest: +ELLIPSIS
        64 calls: f32 64; ok 64/64; reasons: spot check x64; spot check not run on the top rung...
    """
    _check_rtol(rtol, "spot_check")
    if isinstance(sample, bool) or not isinstance(sample, int) or sample < 1:
        raise ValueError(f"spot_check: sample must be a positive int, got {sample!r}")
    return _SpotCheck(float(rtol), sample, int(seed))
