"""One adaptive kernel with one argument structure: the program the runtime compiles.

:class:`_Program` (built by :class:`adaptprec.runtime.MixedPrecisionManager` per kernel,
argument tree and static arguments) runs the plan's rungs: rung ``k + 1`` inside the false
branch of a ``lax.cond`` on rung ``k``'s guards; under ``vmap`` one decision per call or
per element with compaction (``jax.custom_batching.custom_vmap``); derivatives through the
rung that produced the result (``custom_jvp``); the :class:`~adaptprec.Report`.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.custom_batching import custom_vmap
from jax.sharding import PartitionSpec

from . import _compaction
from . import _plan
from ._monitor import emit as _emit_report
from ._monitor import enabled as _monitor_enabled
from ._rungs import is_rung_object
from .guards import SPOT_CHECK, GuardContext, output_error
from ._policy import _is_floating_array, cast_floating
from .precision import unit_roundoff
from .report import Report, _reason

if TYPE_CHECKING:
    from .runtime import MixedPrecisionManager

__all__ = ["_Program"]

#: checks whose walk computes the rung's outputs (a loop runs once for rung and check)
_WALKS = ("first_order", "norm_bound")


_DYNAMIC_TYPES: set = set()     # types seen to be arrays (isinstance on jax.Array is slow)


def _is_dynamic(x) -> bool:
    if type(x) in _DYNAMIC_TYPES:
        return True
    if isinstance(x, (jax.Array, np.ndarray, np.generic)):
        _DYNAMIC_TYPES.add(type(x))
        return True
    return False


def _explicit_sharding(x):
    """The explicit (sharding-in-types) sharding of a traced value, else None."""
    sharding = getattr(jax.typeof(x), "sharding", None)
    mesh = getattr(sharding, "mesh", None)
    if mesh is None or not getattr(mesh, "explicit_axes", ()):
        return None
    return sharding


def _replicated_sharding(x):
    sharding = _explicit_sharding(x)
    return None if sharding is None else sharding.update(spec=PartitionSpec())


def _replicated(x):
    """``x`` replicated across an explicit mesh (a no-op otherwise)."""
    sharding = _replicated_sharding(x)
    return x if sharding is None else jax.sharding.reshard(x, sharding)


def _gather_rows(x, idx):
    return x.at[idx].get(out_sharding=_replicated_sharding(x))


def _scatter_rows(full, idx, sub):
    return full.at[idx].set(sub, mode="drop", out_sharding=_explicit_sharding(full))


def _shard_like_batch(tree, dyn, flags):
    """With an explicit mesh, shard every output's batch axis like the inputs' batch axis.

    ``vmap`` over an explicitly sharded axis expects all batched results to carry that
    sharding; results built from scratch (rung indices, reports) would not.
    """
    for x, f in zip(dyn, flags):
        sharding = _explicit_sharding(x) if f else None
        if sharding is not None:
            axis = sharding.spec[0] if len(sharding.spec) else None

            def reshard(y):
                spec = PartitionSpec(axis, *([None] * (y.ndim - 1)))
                return jax.sharding.reshard(y, sharding.update(spec=spec))

            return jax.tree_util.tree_map(reshard, tree)
    return tree


def _unbatched(rec):
    return rec, jax.tree_util.tree_map(lambda _: False, rec)


def _set_rung_row(arr, k, row):
    """``arr[..., k, :] = row`` as a select, which keeps any sharding of the batch axis."""
    n_rungs = arr.shape[-2]
    mask = (jnp.arange(n_rungs) == k)[:, None]
    return jnp.where(mask, jnp.expand_dims(row, -2), arr)


def _float0_zeros(x):
    return np.zeros(np.shape(x), jax.dtypes.float0)


class _Program:
    """One kernel with one argument structure: rung attempts, escalation, vmap, jvp."""

    def __init__(self, mgr: MixedPrecisionManager, fn, treedef, dyn_pos, static, n_leaves):
        self.mgr, self.fn, self.treedef = mgr, fn, treedef
        self.dyn_pos, self.static, self.n_leaves = dyn_pos, static, n_leaves
        self.n_rungs, self.n_guards = len(mgr.rungs), len(mgr.guards)
        self.out_treedef = None
        self.name = mgr.name or getattr(fn, "__name__", type(fn).__name__)
        self._plans: dict = {}
        self.plans_by_shapes: dict = {}     # the a-priori plan of each eager shape
        self.plan = _plan.all_rungs(self.n_rungs)
        self.forced = None      # a speculative program's plan (MixedPrecisionManager)
        self.use_learned = True
        acc = [g for g in mgr.guards if g.role == "accuracy"]
        self.accuracy_guard = acc[0] if acc else None

    # ------------------------------------------------------------------------ plan

    def plan_for(self, dyn, flags=None, size: int = 1) -> _plan.Plan:
        """The plan for these argument shapes (per element under vmap, costs x size),
        with the failure chances this kernel's eager calls showed for them, if any."""
        flags = flags or [False] * len(dyn)
        avals = tuple(jax.ShapeDtypeStruct(x.shape[1:] if f else x.shape, x.dtype)
                      for x, f in zip(dyn, flags))
        shapes = tuple((tuple(a.shape), np.dtype(a.dtype)) for a in avals)
        if self.forced is not None:
            plan = self.forced
        else:
            try:
                learned = self.use_learned and self.mgr._learn.get(self.spec_of(shapes))
            except TypeError:       # an unhashable static argument: nothing learned
                learned = None
            if learned:
                # the last eager call's outcome too (kept as an array until the next
                # eager call reads it): a program traced right after one eager call
                # plans with what that call showed
                learned.absorb()
            p_fail = learned.p_fail(_plan.P_FAIL) if learned and learned.tried() else None
            plan = self.plan_with(shapes, p_fail, size)
            if size == 1 and p_fail is None:
                self.plans_by_shapes[shapes] = plan
        self.plan = plan
        return plan

    def spec_of(self, shapes):
        """The manager's key of this kernel on these shapes."""
        return ((self.fn, self.treedef, self.dyn_pos, self.static), shapes)

    def plan_of(self, shapes) -> _plan.Plan:
        """The plan an eager call on these shapes ran."""
        return self.forced if self.forced is not None else self.plans_by_shapes[shapes]

    def plan_with(self, shapes, p_fail=None, size: int = 1) -> _plan.Plan:
        """The plan for these ``(shape, dtype)`` pairs with the per-rung failure chances
        ``p_fail`` (``None``: a priori), cached per both."""
        # (to a tenth: the chance moves the plan only across its break-even, and a new
        # value costs a planning pass)
        rounded = None if p_fail is None else tuple(round(p, 1) for p in p_fail)
        # (keyed by the pairs as given: avals are built only to plan, not on every eager
        # call that looks a learned plan up)
        key = (shapes, size, jax.default_backend(), rounded)
        plan = self._plans.get(key)
        if plan is None:
            avals = tuple(jax.ShapeDtypeStruct(s, d) for s, d in shapes)
            g = self.accuracy_guard
            if self.mgr.plan == "all" or g is None:
                plan = _plan.all_rungs(self.n_rungs)
            else:
                # plain-dtype rungs and an entrywise / row-separable / convolution /
                # matrix-product kernel: checkable on a sample of entries / rows / output
                # positions / probes
                st = self._structure(avals)
                methods = _plan.check_order(st, g.componentwise)
                plan = _plan.choose_plan(self.n_rungs, tuple(self.mgr.ladder), g.rtol,
                                         self._rung_fn, self._check_fn, avals, size,
                                         methods=methods, p_fail=rounded,
                                         componentwise=g.componentwise and not g.atol)
            self._plans[key] = plan
        return plan

    def _structure(self, avals):
        """The kernel's structure on these avals (:mod:`adaptprec._structure`: one trace
        per kernel and shapes, shared with the accuracy guard's sampled checks), or
        ``None`` when a rung is a Rung object (not a plain dtype)."""
        if any(is_rung_object(r) for r in self.mgr.rungs):
            return None
        from ._structure import kernel_structure

        leaves = [None] * self.n_leaves
        for i, x in self.static:
            leaves[i] = x
        return kernel_structure(self.fn, self.treedef, leaves, tuple(self.dyn_pos), avals)

    def _rung_fn(self, k):
        def rung(*d):
            return tuple(self.call_at(k, d)[4])
        return rung

    def _check_fn(self, k, method):
        def checked(*d):
            call, inputs, (cargs, ckw), out, cast, *walked = self.call_at(
                k, d, walk=method if method in _WALKS else None)
            dtype = self.mgr.ladder[k]
            ctx = GuardContext(call, cargs, ckw, inputs, out, dtype, unit_roundoff(dtype),
                               k, cast_out=tuple(cast), check=method,
                               prepared=walked[0] if walked else None)
            r = self.accuracy_guard(ctx)
            return tuple(cast), r.ok, r.value
        return checked

    # ------------------------------------------------------------------ one attempt

    def rebuild(self, dyn):
        full = [None] * self.n_leaves
        for i, x in self.static:
            full[i] = x
        for i, x in zip(self.dyn_pos, dyn):
            full[i] = x
        return jax.tree_util.tree_unflatten(self.treedef, full)

    def out_dtype(self, dyn):
        if self.mgr.policy is not None:
            return self.mgr.policy.output
        floats = [x.dtype for x in dyn if _is_floating_array(x)]
        return np.dtype(jnp.result_type(*floats)) if floats else self.mgr.ladder.top

    def call_at(self, k, dyn, walk=None):
        """``(callable, inputs, cast inputs, outputs, outputs cast to the output dtype)``
        of rung ``k``; with ``walk`` (``"first_order"`` or ``"norm_bound"``), the outputs
        computed by that error walk (:mod:`adaptprec._first_order`,
        :mod:`adaptprec._norm_bound`), which is returned sixth: the check reads the bound
        of the very values returned, and a loop runs once for both."""
        rung, dtype = self.mgr.rungs[k], self.mgr.ladder[k]
        call = rung.wrap(self.fn) if is_rung_object(rung) else self.fn
        args, kwargs = self.rebuild(dyn)
        cargs, ckw = cast_floating((args, kwargs), dtype)
        walked = None
        if walk:
            from ._first_order import first_order
            from ._norm_bound import norm_bound
            walked = (first_order if walk == "first_order" else norm_bound)(
                call, cargs, ckw, (args, kwargs), dtype)
            out = jax.tree_util.tree_unflatten(walked.tree, walked.outs)
        else:
            out = call(*cargs, **ckw)
        leaves, treedef = jax.tree_util.tree_flatten(out)
        bad = [type(x).__name__ for x in leaves if not _is_dynamic(x)]
        if bad or not leaves:
            raise TypeError(
                f"adaptive kernel {self.name!r} must return arrays (a pytree of arrays); "
                f"it returned leaves of type {bad or 'nothing'}. Return jnp arrays, e.g. "
                "jnp.asarray(value).")
        discrete = [f"{jnp.dtype(x.dtype).name}{list(x.shape)}" for x in leaves
                    if not _is_floating_array(x)]
        if discrete and not any(r in ("accuracy", "spot_check")
                                for r in self.mgr.guard_roles):
            raise TypeError(
                f"adaptive kernel {self.name!r} returns integer/bool output(s) "
                f"({', '.join(discrete)}) but has no accuracy guard. A discrete result (a "
                "count, an argmax, a comparison) computed on a lower rung can be entirely "
                "wrong while every floating-point check passes, and finiteness cannot "
                f"check it. Pass rtol=, e.g. adaptive({self.name}, rtol=1e-3) (adds "
                "guards.accuracy, which fails when randomly rounded re-evaluations "
                "disagree), or add guards.spot_check(...) to the guards.")
        if self.out_treedef is None:
            self.out_treedef = treedef
        elif treedef != self.out_treedef:
            raise TypeError(f"adaptive kernel {self.name!r} returned different pytree "
                            f"structures on different rungs: {treedef} vs "
                            f"{self.out_treedef}")
        odt = self.out_dtype(dyn)
        cast = [x.astype(odt) if _is_floating_array(x) else x for x in leaves]
        if walk:
            return call, (args, kwargs), (cargs, ckw), out, cast, walked
        return call, (args, kwargs), (cargs, ckw), out, cast

    def attempt(self, k, *dyn, batched=False, raw=False):
        """``(outputs, codes, values, ok)`` of rung ``k``; ``raw``: the outputs as the
        rung returned them (:meth:`single` casts them inside the branch that accepts
        them), else cast to the output dtype."""
        check = self.plan.check[k]
        call, inputs, (cargs, ckw), out, cast, *walked = self.call_at(
            k, dyn, walk=check if check in _WALKS else None)
        dtype = self.mgr.ladder[k]
        nxt = None
        if k + 1 < self.n_rungs and not batched:
            def nxt():
                return self.call_at(k + 1, dyn)[4]
        ctx = GuardContext(call, cargs, ckw, inputs, out, dtype, unit_roundoff(dtype), k,
                           next_rung=nxt, batched=batched, cast_out=tuple(cast),
                           check=check, prepared=walked[0] if walked else None)
        results = [g(ctx) for g in self.mgr.guards]
        codes = jnp.stack([r.code for r in results])
        values = jnp.stack([r.value for r in results])
        ok = jnp.all(jnp.stack([r.ok for r in results]))
        if raw:
            # (16-bit leaves cast here, as before: XLA:CPU computes them in float32 and
            # may drop their rounding next to the cast (excess precision); cast in a
            # branch, the rounding stays and an unbatched call would differ from the same
            # element of a vmapped one)
            leaves = jax.tree_util.tree_leaves(out)
            return tuple(c if _is_floating_array(x) and jnp.dtype(x.dtype).itemsize < 4
                         else x for x, c in zip(leaves, cast)), codes, values, ok
        return tuple(cast), codes, values, ok

    def cast_leaves(self, leaves, dyn):
        odt = self.out_dtype(dyn)
        return tuple(x.astype(odt) if _is_floating_array(x) else x for x in leaves)

    def fresh(self, k, attempt_out, batch=()):
        out, c, v, ok = attempt_out
        shape = batch + (self.n_rungs, self.n_guards)
        codes = jnp.full(shape, -1, jnp.int32)
        values = jnp.full(shape, jnp.nan, jnp.float32)
        codes = _set_rung_row(codes, k, c)
        values = _set_rung_row(values, k, v)
        return out, codes, values, jnp.full(batch, k, jnp.int32), ok

    # ---------------------------------------------------------------- single call

    def single(self, *dyn):
        plan = self.plan_for(dyn)
        tried = [k for k in range(self.n_rungs) if plan.attempt[k]]
        # a rung's outputs travel raw (in its dtype) and are cast to the output dtype
        # inside the branch that accepts them: a cond returning an operand copies it,
        # while a cast computed in the branch writes the result in place (conv 8x64x64x32
        # f32 rung: the copy of its f64 output was ~0.2 of plain f64)
        rec = self.fresh(tried[0], self.attempt(tried[0], *dyn, raw=True))

        def accept(rec):
            return (self.cast_leaves(rec[0], dyn),) + tuple(rec[1:])

        def climb(i, rec):
            if i >= len(tried):
                return accept(rec)
            k = tried[i]

            def go(rec):
                out, c, v, ok = self.attempt(k, *dyn, raw=True)
                return climb(i + 1, (out, _set_rung_row(rec[1], k, c),
                                     _set_rung_row(rec[2], k, v),
                                     jnp.asarray(k, jnp.int32), ok))

            return lax.cond(rec[4], accept, go, rec)

        rec = climb(1, rec)
        self.emit(rec)
        return rec

    # ---------------------------------------------------------------------- batched

    def batched_entry(self, dyn, flags):
        sizes = {x.shape[0] for x, f in zip(dyn, flags) if f}
        (size,) = sizes
        prog = self

        @custom_vmap
        def batched(*d):
            return prog.batched(d, flags, size)

        @batched.def_vmap
        def rule(axis, in_batched, *d):
            if not any(in_batched):     # e.g. only tangents are batched (jacfwd of grad)
                return _unbatched(prog.batched(d, flags, size))
            # another vmap around this batch: flatten (axis, size) into one batch
            merged, mflags = [], []
            for x, f, g in zip(d, flags, in_batched):
                if f and g:
                    x = x.reshape((axis * size,) + x.shape[2:])
                elif f:
                    x = jnp.broadcast_to(x[None], (axis,) + x.shape)
                    x = x.reshape((axis * size,) + x.shape[2:])
                elif g:
                    x = jnp.repeat(x, size, axis=0)
                merged.append(x)
                mflags.append(f or g)
            rec = prog.batched_entry(merged, mflags)
            rec = jax.tree_util.tree_map(
                lambda y: y.reshape((axis, size) + y.shape[1:]), rec)
            return rec, jax.tree_util.tree_map(lambda _: True, rec)

        return batched(*dyn)

    def vattempt(self, k, dyn, flags):
        in_axes = tuple(0 if f else None for f in flags)
        out, codes, values, ok = jax.vmap(functools.partial(self.attempt, k, batched=True),
                                          in_axes=in_axes)(*dyn)
        if k + 1 < self.n_rungs:
            for gi, g in enumerate(self.mgr.guards):
                if g.role == "spot_check":
                    err = self.spot_check(g, k, dyn, flags, out)
                    passed = err <= g.rtol
                    codes = codes.at[:, gi].set(jnp.where(passed, 0, int(SPOT_CHECK)))
                    values = values.at[:, gi].set(err)
                    ok = ok & passed
        return out, codes, values, ok

    def spot_check(self, guard, k, dyn, flags, out):
        """Recompute ``guard.sample`` random elements of the batch on rung k + 1; the
        largest normwise relative difference to rung k's results (inf: a discrete output
        differs)."""
        size = next(x.shape[0] for x, f in zip(dyn, flags) if f)
        m = min(guard.sample, size)
        key = jax.random.fold_in(jax.random.PRNGKey(guard.seed), k)
        idx = jax.random.choice(key, size, (m,), replace=False)
        sub = [x[idx] if f else x for x, f in zip(dyn, flags)]
        in_axes = tuple(0 if f else None for f in flags)
        ref = jax.vmap(lambda *d: tuple(self.call_at(k + 1, d)[4]), in_axes=in_axes)(*sub)
        mine = [o[idx] for o in out]
        return jax.vmap(output_error)(mine, list(ref)).max()

    def batched(self, dyn, flags, size):
        plan = self.plan_for(dyn, flags, size)
        first = plan.attempt.index(True)
        rec = self.fresh(first, self.vattempt(first, dyn, flags), (size,))
        rec = self.climb_batch(first + 1, dyn, flags, rec, ~rec[4], size)
        self.emit(rec)   # once per batch (a callback under vmap would run per element)
        return rec

    @staticmethod
    def _merge(need, new, old):
        def sel(n, o):
            m = need.reshape(need.shape + (1,) * (n.ndim - 1))
            return jnp.where(m, n, o)
        return jax.tree_util.tree_map(sel, new, old)

    def step_batch(self, k, dyn, flags, rec, need, size, compact_ok=True):
        """Run rung k for the batch; elements in `need` (all, for batch="call") take it."""
        out, c, v, ok = self.vattempt(k, dyn, flags)
        new = (out, _set_rung_row(rec[1], k, c), _set_rung_row(rec[2], k, v),
               jnp.full_like(rec[3], k), ok)
        if self.mgr.batch == "call":
            return self.climb_batch(k + 1, dyn, flags, new, ~ok, size, compact_ok)
        new = self._merge(need, new, rec)
        return self.climb_batch(k + 1, dyn, flags, new, need & ~ok, size, compact_ok)

    def climb_batch(self, k, dyn, flags, rec, need, size, compact_ok=True):
        """Escalate from rung k on; `compact_ok` is False inside a compacted buffer."""
        if k >= self.n_rungs:
            return rec
        if not self.plan.attempt[k]:     # skipped by the plan: straight to the next rung
            return self.climb_batch(k + 1, dyn, flags, rec, need, size, compact_ok)
        whole = functools.partial(self.step_batch, k, dyn, flags, need=need, size=size,
                                  compact_ok=compact_ok)
        cap = self.mgr._capacity(size)
        if self.mgr.batch == "call" or size <= cap or not compact_ok:
            return lax.cond(jnp.any(need), whole, lambda r: r, rec)

        def compact(rec):
            # the buffer is small: build it replicated even when the batch is sharded
            idx, valid = _compaction.select(_replicated(need), cap)
            safe = jnp.where(valid, idx, 0)
            sub_dyn = [_gather_rows(x, safe) if f else x for x, f in zip(dyn, flags)]
            sub_rec = _compaction.gather(rec, safe, _gather_rows)
            sub_rec = self.climb_batch(k, sub_dyn, flags, sub_rec, valid, cap, False)
            return _compaction.scatter(rec, idx, sub_rec, _scatter_rows)

        return _compaction.by_count(need, cap, lambda r: r, compact, whole, rec)

    # ------------------------------------------------------------- grad through rung

    def tangent_at(self, k, primals, tangents):
        float_pos = None

        def out_only(*d):
            nonlocal float_pos
            cast = self.call_at(k, d)[4]
            float_pos = [i for i, x in enumerate(cast) if _is_floating_array(x)]
            return [cast[i] for i in float_pos]

        _, t = jax.jvp(out_only, primals, tangents)
        return t

    def build(self):
        single = custom_vmap(self.single)

        @single.def_vmap
        def rule(axis, in_batched, *dyn):
            if not any(in_batched):     # e.g. only tangents are batched (jacfwd of grad)
                return _unbatched(self.single(*dyn))
            rec = self.batched_entry(list(dyn), list(in_batched))
            rec = _shard_like_batch(rec, dyn, in_batched)
            return rec, jax.tree_util.tree_map(lambda _: True, rec)

        @jax.custom_jvp
        def run_flat(*dyn):
            return single(*dyn)

        @run_flat.defjvp
        def run_flat_jvp(primals, tangents):
            rec = single(*primals)
            out = rec[0]
            float_idx = [i for i, x in enumerate(out) if _is_floating_array(x)]
            branches = [functools.partial(self.tangent_at, k) for k in range(self.n_rungs)]
            t_float = lax.switch(rec[3], branches, primals, tangents)
            t_out = [_float0_zeros(x) for x in out]
            for i, t in zip(float_idx, t_float):
                t_out[i] = t
            t_rec = (tuple(t_out), _float0_zeros(rec[1]), jnp.zeros_like(rec[2]),
                     _float0_zeros(rec[3]), _float0_zeros(rec[4]))
            return rec, t_rec

        return run_flat

    def report(self, codes, values, rung, ok):
        reason = _reason
        for _ in range(rung.ndim):
            reason = jax.vmap(reason)
        tried = jnp.asarray(self.plan.attempt)
        below = jnp.arange(self.n_rungs) < jnp.expand_dims(rung, -1)
        escalations = jnp.sum(below & tried, axis=-1).astype(jnp.int32)
        checks = tuple(("skipped" if not a else (c or "mca")) if self.accuracy_guard
                       is not None else ("skipped" if not a else "")
                       for a, c in zip(self.plan.attempt, self.plan.check))
        return Report(rung=rung, escalations=escalations, ok=ok,
                      reason=reason(codes, rung, ok),
                      codes=codes, values=values, rung_names=self.mgr.rung_names,
                      guard_names=self.mgr.guard_names, guard_roles=self.mgr.guard_roles,
                      guard_rtols=self.mgr.guard_rtols, plan=tuple(self.plan.note),
                      checks=checks, check_shares=tuple(self.plan.share),
                      norm="" if self.accuracy_guard is None else getattr(
                          self.accuracy_guard, "norm", "normwise"))

    def emit(self, rec):
        """Send the report to active monitors (nothing is traced when none is active)."""
        if _monitor_enabled():
            _emit_report(self.name, self.report(*rec[1:]))

    def failure_message(self) -> str:
        return (f"adaptive kernel {self.name!r}: guards {list(self.mgr.guard_names)} still "
                f"fail on the top rung ({self.mgr.rung_names[-1]}). Call .with_report(...) "
                "with on_failure='return' to see which guard and its value.")

    def run(self, *dyn, host_raise=False, a_priori=False):
        """``(out, report)``; ``host_raise``: an eager call's ``on_failure="raise"`` is
        left to the caller, who raises a plain Python error on the host; ``a_priori``:
        plan without what eager calls showed (the manager's compiled eager programs:
        their calls' rungs are noted under the a-priori plan)."""
        self.out_treedef = None          # set by the first rung traced for these shapes
        self.use_learned = not a_priori  # read by plan_for in this trace
        out_leaves, codes, values, rung, ok = self.build()(*dyn)
        out = jax.tree_util.tree_unflatten(self.out_treedef, list(out_leaves))
        report = self.report(codes, values, rung, ok)
        if self.mgr.on_failure == "nan":
            out = jax.tree_util.tree_map(
                lambda x: jnp.where(ok, x, jnp.nan) if _is_floating_array(x) else x, out)
        elif self.mgr.on_failure == "raise" and not host_raise:
            import equinox as eqx  # only on this path: its import is slow
            out = eqx.error_if(out, ~ok, self.failure_message())
        return out, report
