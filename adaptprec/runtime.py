"""Adaptive execution: run cheap, check inside ``jit``, escalate only when needed.

:class:`MixedPrecisionManager` runs a kernel on the lowest rung of a precision ladder,
evaluates its guards, and escalates with ``lax.cond`` — so a higher rung executes only
when every rung below failed. :func:`adaptive` wraps a function with a manager.

How it works
    * Floating inputs are cast to each rung's dtype (a rung can also be an object with
      ``.dtype`` and ``.wrap(fn)``, see :class:`Rung`); floating outputs are cast to one
      output dtype (the policy's output dtype, else the inputs' floating dtype) so all
      rungs agree.
    * Rung ``k + 1`` runs inside the false branch of a ``lax.cond`` on rung ``k``'s guards.
    * With an accuracy guard, a plan chosen at trace time by a cost model
      (:mod:`adaptprec._plan`) may skip rungs whose check would cost more than they save
      and check the others more cheaply (first-order bound, sampled entries); the report
      says what ran (``Report.plan``, ``Report.checks``). ``plan="all"`` tries every rung.
    * Under ``vmap`` the decision is made deliberately (``jax.custom_batching.custom_vmap``
      — a batched ``cond`` would silently become a ``select`` that runs every rung):
      ``batch="call"`` escalates the whole batch if any element fails (one scalar
      decision); ``batch="element"`` gathers the failing elements into a buffer of
      ``capacity`` slots, recomputes only them on the next rung and scatters them back; if
      more fail than fit, the whole batch escalates. Nested ``vmap`` axes are flattened
      into one batch.
    * ``grad``/``jvp`` flow through the rung that produced the result (``custom_jvp``; the
      tangent dispatches with ``lax.switch`` on the chosen rung — under ``vmap`` that
      switch is a select, so batched derivatives evaluate every rung's derivative).
    * When the top rung fails too, ``on_failure`` decides: ``"return"`` the top-rung
      result with ``report.ok == False``, ``"nan"`` fill floating outputs with NaN, or
      ``"raise"`` (``equinox.error_if``: a runtime error under ``jit``; eagerly a
      ``RuntimeError``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

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
from ._rungs import Rung, is_rung_object, normalize_ladder
from .guards import (SPOT_CHECK, Guard, GuardContext, accuracy, as_guard, finite,
                     output_error)
from ._policy import Policy, _is_floating_array, cast_floating
from .precision import dtype_name, unit_roundoff, x64_enabled
from .report import Report, _reason
from ._x64_rule import float64_call

__all__ = ["MixedPrecisionManager", "adaptive", "AdaptiveFunction", "Rung"]

_BATCH_MODES = ("call", "element")
_ON_FAILURE = ("return", "raise", "nan")
_PLANS = ("auto", "all")

#: Eager calls for the same kernel and shapes that must all escalate past a rung before
#: later eager calls skip it, and how often the full plan is tried again
#: (``MixedPrecisionManager._skip_failing``).
ESCALATED_CALLS, RETRY_EVERY = 2, 16


_DYNAMIC_TYPES: set = set()     # types seen to be arrays (isinstance on jax.Array is slow)


_CONCRETE_TYPES: set = set()    # concrete array types (not tracers): the eager fast path


def _concrete_type(t) -> bool:
    if t in _CONCRETE_TYPES:
        return True
    if issubclass(t, jax.core.Tracer) or not issubclass(t, (jax.Array, np.ndarray)):
        return False
    _CONCRETE_TYPES.add(t)
    return True


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


#: Settled eager programs a manager keeps for :meth:`MixedPrecisionManager.fast_call`
#: (the full programs stay in its ``_cache``; a shape evicted here only loses the shortcut).
_FAST_MAX = 64


class MixedPrecisionManager:
    """Runs kernels on a precision ladder, escalating when guards fire.

    Args:
        ladder: at least two rungs, least precise first: ``"bf16,f32,f64"``, a
            :class:`~adaptprec.Ladder`, or a sequence of dtypes/aliases and :class:`Rung`
            objects.
        guards: a :class:`~adaptprec.guards.Guard`, a callable ``fn(out, *inputs) -> bool``
            or a sequence of them (default: ``[guards.finite()]``).
        rtol: adds :func:`guards.accuracy(rtol) <adaptprec.guards.accuracy>` to the
            guards: a rung's result is accepted only when its estimated relative rounding
            error is at most ``rtol`` (the top rung is checked too; when it fails,
            ``on_failure`` applies). Without an accuracy guard a report says "finite
            only: accuracy not checked", and a kernel with integer or bool outputs raises
            ``TypeError`` when traced.
        policy: a :class:`~adaptprec.Policy` or policy string; its *output* dtype is the
            dtype floating outputs are returned in (default: the inputs' floating dtype).
        batch: ``"call"`` (default) or ``"element"`` — the decision under ``vmap``.
        capacity: for ``batch="element"``: slots in the buffer of failing elements, an
            int or a fraction of the batch size (default 0.05).
        on_failure: ``"return"`` (default), ``"nan"`` or ``"raise"`` when the top rung fails.
        name: label used in reports and monitor logs (default: the kernel's name).
        plan: ``"auto"`` (default): with an accuracy guard, a cost model chooses per
            kernel, shapes and backend which rungs to try and how to check each (see
            "When adaptivity pays" in docs/runtime.md): a rung whose check would cost
            more than it saves is skipped, a cheap first-order error bound replaces Monte
            Carlo arithmetic where it models the kernel, and the report says what ran
            (:attr:`Report.plan`). ``"all"``: try every rung with Monte Carlo checks.
        speculate: ``0`` (default): every call checks its own answer. ``N > 0``
            (opt-in; needs ``rtol``): after an *eager* call verified rung ``r`` below the
            top for these argument shapes, the next ``N - 1`` eager calls run rung ``r``
            alone with the finite check only; a non-finite result is recomputed on the
            verified path, and every ``N``-th call is verified in full (an escalation
            there ends the speculation). Their reports say "speculative". This call's
            rounding error is then *not* estimated: inputs that cancel worse than the
            verified call's pass unnoticed. Calls inside ``jit``/``vmap``/``grad``
            always verify (a compiled program cannot read host state).

    Bad configurations raise ``ValueError``/``TypeError`` here; a guard returning the wrong
    type, or a kernel returning non-arrays, raises ``TypeError`` when first called.

    Example:
        >>> import jax.numpy as jnp
        >>> import adaptprec as ap
        >>> mgr = ap.MixedPrecisionManager("bf16,f32,f64", guards=[ap.guards.finite()])
        >>> y, report = mgr.run(jnp.exp, jnp.array([1.0, 500.0]))  # e^500 > f32 max
        >>> report.rung_name, y.dtype.name                         # output: input dtype
        ('f64', 'float64')
    """

    def __init__(self, ladder: Any = "bf16,f32,f64",
                 guards: Guard | Callable | Sequence[Guard | Callable] | None = None,
                 policy: Policy | str | None = None, *, rtol: float | None = None,
                 batch: str = "call", capacity: int | float = 0.05,
                 on_failure: str = "return", name: str | None = None,
                 plan: str = "auto", speculate: int = 0):
        # the options first: with x64 off the default ladder's float64 error would
        # otherwise hide the actual mistake (newcomer audit 3)
        if batch not in _BATCH_MODES:
            raise ValueError(f"batch must be 'call' or 'element', got {batch!r}")
        _compaction.capacity_for(capacity, 1)   # validates (ValueError naming capacity)
        if plan not in _PLANS:
            raise ValueError(f"plan must be 'auto' or 'all', got {plan!r}")
        if isinstance(speculate, bool) or not isinstance(speculate, int) or speculate < 0:
            raise ValueError(f"speculate must be 0 (off) or a positive int (re-verify "
                             f"every that many eager calls), got {speculate!r}")
        if speculate and rtol is None:
            raise ValueError("speculate= needs rtol= (it re-uses a rung the accuracy "
                             "check verified on an earlier call)")
        if on_failure not in _ON_FAILURE:
            raise ValueError(f"on_failure must be 'return', 'raise' or 'nan', got "
                             f"{on_failure!r}")
        if guards is None:
            guards = [finite()]
        elif isinstance(guards, Guard) or (callable(guards) and not isinstance(
                guards, Sequence)):
            guards = [guards]
        elif not isinstance(guards, Sequence) or isinstance(guards, str):
            raise TypeError(f"guards must be a Guard, a callable or a sequence of them, got "
                            f"{guards!r}")
        self.guards: tuple[Guard, ...] = tuple(as_guard(g) for g in guards)
        if rtol is not None:
            if any(g.role == "accuracy" for g in self.guards):
                raise ValueError("pass either rtol= or an accuracy guard in guards=, not "
                                 "both")
            if not any(g.role == "finite" for g in self.guards):
                self.guards = (finite(),) + self.guards
            self.guards = self.guards + (accuracy(rtol),)
        if not self.guards:
            raise ValueError("an adaptive kernel needs at least one guard, e.g. "
                             "guards=[adaptprec.guards.finite()]")
        self.rtol = rtol
        # (float64 rungs with x64 off: the x64 rule applies per call, see run)
        self.rungs, self.ladder = normalize_ladder(ladder, min_rungs=2, check_x64=False)
        self.policy = None if policy is None else Policy.parse(policy)
        self.batch, self.capacity, self.on_failure, self.name = (
            batch, capacity, on_failure, name)
        self.plan, self.speculate = plan, speculate
        self.rung_names = tuple(
            dtype_name(d) if not is_rung_object(r) else getattr(r, "name", None)
            or f"{type(r).__name__}[{dtype_name(d)}]" for r, d in zip(self.rungs, self.ladder))
        self.guard_names = tuple(g.name for g in self.guards)
        self.guard_roles = tuple(g.role for g in self.guards)
        self.guard_rtols = tuple(getattr(g, "rtol", None) if g.role != "other" else None
                                 for g in self.guards)
        self._cache: dict = {}
        self._spec: dict = {}   # speculation per (kernel, shapes): [rung, calls, program]
        self._esc: dict = {}    # eager escalations per (kernel, shapes): _skip_failing
        # eager plain calls whose program is settled (no escalation memory to keep):
        # (kernel, x64, (shape, dtype) per positional array) -> compiled (out, rung)
        # (at most _FAST_MAX: a manager fed many shapes keeps its newest settled ones)
        self._fast: dict = {}

    def __repr__(self):
        return (f"MixedPrecisionManager(ladder={','.join(self.rung_names)!r}, guards="
                f"{list(self.guard_names)}, batch={self.batch!r}, "
                f"on_failure={self.on_failure!r})")

    def _capacity(self, m: int) -> int:
        return _compaction.capacity_for(self.capacity, m)

    def _x64_need(self, fn, *args, **kwargs):
        """For :func:`adaptprec._x64_rule.float64_call`: a float64 rung needs float64."""
        if not any(np.dtype(d) == np.float64 for d in self.ladder):
            return None
        name = self.name or getattr(fn, "__name__", type(fn).__name__)
        return (f"adaptive kernel {name!r}", "ladder", ",".join(self.rung_names),
                "a ladder without float64 (e.g. ladder='bf16,f32')", (args, kwargs))

    @functools.partial(float64_call, describe=_x64_need)
    def run(self, fn: Callable, *args, **kwargs) -> tuple[Any, Report]:
        """Run ``fn(*args, **kwargs)`` adaptively; returns ``(out, Report)``.

        Array leaves of the arguments are traced; other leaves (Python numbers, strings,
        ...) are static. Works under ``jit``, ``vmap`` and ``grad``.

        With ``jax_enable_x64`` off and a float64 rung, an eager call computes inside
        JAX's thread-local x64 scope and returns float64 results as NumPy arrays; a
        traced call raises the one x64 error (:mod:`adaptprec._x64_rule`).
        """
        return self._dispatch(fn, args, kwargs, True)

    @functools.partial(float64_call, describe=_x64_need)
    def call(self, fn: Callable, *args, **kwargs) -> Any:
        """``run(fn, *args, **kwargs)[0]`` without building the report.

        The same rungs run and every guard that decides an escalation (or feeds
        ``on_failure``) is evaluated; what only fed the report is not computed. An eager
        call compiles a program that returns the output alone, so XLA drops that work
        (e.g. the top rung's finite check when the plan runs that rung alone: there is
        nothing to escalate to). Under ``jit`` the caller's own trace does the same.
        ``adaptive(fn)(x)`` is ``manager.call(fn, x)``.

        Example:
            >>> import jax.numpy as jnp
            >>> import adaptprec as ap
            >>> mgr = ap.MixedPrecisionManager("f32,f64", guards=[ap.guards.finite()])
            >>> y = mgr.call(jnp.exp, jnp.array([1.0, 100.0]))   # e^100 > f32 max
            >>> bool(jnp.isfinite(y).all()), y.dtype.name            # the f64 rung's
            (True, 'float64')
        """
        return self._dispatch(fn, args, kwargs, False)

    def fast_call(self, fn, args):
        """``call(fn, *args)`` for positional concrete arrays whose program is settled
        (see ``_dispatch``), else ``None``: an eager plain call's Python overhead (~30
        us of pytree flattening, cache keys and escalation bookkeeping) is the 1.1-1.3x
        of a 0.3 ms kernel."""
        if not self._fast:
            return None
        try:
            sig = tuple((a.shape, a.dtype) for a in args if _concrete_type(type(a)))
        except AttributeError:
            return None
        if len(sig) != len(args):
            return None
        try:
            prog = self._fast.get((fn, x64_enabled(), sig))
        except TypeError:   # an unhashable kernel sharing the manager: never fast
            return None
        return None if prog is None else prog(*args)[0]

    def _dispatch(self, fn, args, kwargs, with_report: bool):
        if not callable(fn):
            raise TypeError(f"fn must be callable, got {fn!r}")
        leaves, treedef = jax.tree_util.tree_flatten((args, kwargs))
        flags = [_is_dynamic(x) for x in leaves]
        dyn_pos = tuple(i for i, f in enumerate(flags) if f)
        static = tuple((i, x) for i, (x, f) in enumerate(zip(leaves, flags)) if not f)
        key = (fn, treedef, dyn_pos, static)
        try:
            compiled = self._cache.get(key)
        except TypeError:       # unhashable static argument: no caching
            key, compiled = None, None
        if compiled is None:
            program = _Program(self, fn, treedef, dyn_pos, static, len(leaves))
            host_raise = self.on_failure == "raise"
            compiled = [program.run, jax.jit(functools.partial(program.run,
                                                               host_raise=host_raise)),
                        program, None]
            if key is not None:
                self._cache[key] = compiled
        dyn = [leaves[i] for i in dyn_pos]
        # Eager calls compile once; inside a transformation (jit, vmap, grad) trace inline.
        traced = any(isinstance(x, jax.core.Tracer) for x in dyn)
        if traced:
            out = compiled[0](*dyn)
            return out if with_report else out[0]
        # (shape, dtype) per array: the dtype object, not its name (str() costs ~7 us)
        spec_key = None if key is None else (key, tuple((np.shape(x), getattr(
            x, "dtype", type(x))) for x in dyn))
        learned = None
        if not self.speculate and spec_key is not None and self.plan == "auto":
            learned = self._skip_failing(spec_key, compiled[2])
        target = compiled if learned is None else learned
        if not with_report and not self.speculate and self.on_failure != "raise":
            # the output alone (and the rung, a scalar the escalations decided anyway):
            # XLA drops the guards that only fed the report
            if target[3] is None:
                prog = target[2]
                target[3] = jax.jit(lambda *d: (lambda o: (o[0], o[1].rung))(prog.run(*d)))
            out, rung = target[3](*dyn)
            if spec_key is not None and learned is None and self.plan == "auto":
                self._note_rung(spec_key, rung)
            if (spec_key is not None and not kwargs and len(dyn) == len(args)
                    and (self.plan != "auto" or self._esc.get(spec_key, {}).get("off"))):
                # nothing learned from later calls (a plan with one rung tried, or
                # plan="all"): they go straight to this program (fast_call)
                if len(self._fast) >= _FAST_MAX:   # oldest first (insertion order)
                    self._fast.pop(next(iter(self._fast)))
                self._fast[(fn, x64_enabled(), spec_key[1])] = target[3]
            return out
        if self.speculate and spec_key is not None:
            res = self._speculative(spec_key, compiled[2], dyn)
            if res is not None:
                return res if with_report else res[0]
        out, report = target[1](*dyn)
        if spec_key is not None and learned is None and self.plan == "auto":
            self._note_rung(spec_key, report.rung)
        if self.speculate and spec_key is not None:
            self._record(spec_key, report, compiled[2])
        if self.on_failure == "raise" and not bool(np.all(np.asarray(report.ok))):
            # eagerly a plain Python error (equinox's error_if surfaced as an INTERNAL
            # callback error with a banner: newcomer audit 3)
            raise RuntimeError(compiled[2].failure_message())
        return (out, report) if with_report else out


    # ------------------------------------------------- rungs that failed on the data

    def _note_rung(self, spec_key, rung):
        """Keep an eager call's returned rung (an array: read at the next call for these
        shapes, so the call itself stays asynchronous)."""
        st = self._esc.get(spec_key)
        if st is None:
            st = self._esc[spec_key] = {"streak": 0, "low": None, "calls": 0,
                                        "program": None, "pending": None, "off": False}
        if not st["off"]:
            st["pending"] = rung

    def _skip_failing(self, spec_key, program):
        """The compiled entry of a plan without the rungs that failed on the last
        ``ESCALATED_CALLS`` eager calls for these shapes (they escalated every time:
        the data, not the rounding model, decides), or ``None``: the full plan. Every
        ``RETRY_EVERY``-th call runs the full plan again. Skipping a rung never lowers
        the accuracy returned (the call ends on the rung it escalated to, checked as
        planned); the report says which rungs were skipped and why."""
        st = self._esc.get(spec_key)
        if st is None or st["off"]:
            return None
        plan = st.get("plan")
        if plan is None:        # the plan chosen for these shapes (plan_for's key)
            plan = st["plan"] = program._plans.get((tuple(
                (tuple(s), str(d)) for s, d in spec_key[1]), 1, jax.default_backend()))
            if plan is None or sum(plan.attempt) < 2 or all(c is None for c in plan.check):
                # nothing to skip (one rung tried, or a small / unplanned kernel): no
                # bookkeeping on later calls
                st["off"], st["pending"] = True, None
                return None
        if st["pending"] is not None:
            r, st["pending"] = int(np.asarray(st["pending"])), None
            first = plan.attempt.index(True) if plan is not None else r
            if r > first:
                st["streak"] += 1
                if st["low"] != r:
                    st["low"], st["program"] = r, None
            else:
                st["streak"], st["low"], st["program"] = 0, None, None
        if st["streak"] < ESCALATED_CALLS:
            return None
        st["calls"] += 1
        if st["calls"] % RETRY_EVERY == 0:
            return None
        if st["program"] is None:
            low = st["low"]
            why = (f"skipped: it escalated on the last {ESCALATED_CALLS} eager calls for "
                   f"these shapes (tried again every {RETRY_EVERY}th call)")
            sp = _Program(self, program.fn, program.treedef, program.dyn_pos,
                          program.static, program.n_leaves)
            sp.forced = _plan.Plan(
                tuple(a and k >= low for k, a in enumerate(plan.attempt)),
                tuple(c if k >= low else None for k, c in enumerate(plan.check)),
                tuple(n if k >= low or not a else why
                      for k, (a, n) in enumerate(zip(plan.attempt, plan.note))),
                tuple(x if k >= low else None for k, x in enumerate(plan.share)))
            st["program"] = [sp.run, jax.jit(functools.partial(
                sp.run, host_raise=self.on_failure == "raise")), sp, None]
        return st["program"]

    # ------------------------------------------------------------ speculation

    def _record(self, spec_key, report, program):
        """After a verified eager call: speculate on its rung when an accuracy check
        verified it below the top rung; forget it when the call escalated or failed."""
        spec = self._spec
        rung = int(np.asarray(report.rung))
        checked = report.checks[rung] if report.checks else "mca"
        if (bool(np.asarray(report.ok)) and rung < len(self.rungs) - 1
                and checked in ("mca", "first_order", "sample", "sample_rows",
                                   "sample_conv")):
            spec[spec_key] = [rung, 0, spec.get(spec_key, [None, 0, None])[2]]
        else:
            spec.pop(spec_key, None)

    def _speculative(self, spec_key, program, dyn):
        """``(out, report)`` from the speculative program, or ``None``: verify."""
        spec = self._spec.get(spec_key)
        if spec is None:
            return None
        rung, count, compiled = spec
        spec[1] = count + 1
        if spec[1] >= self.speculate:      # every N-th call: verify in full
            return None
        if compiled is None:
            sp = _Program(self, program.fn, program.treedef, program.dyn_pos,
                          program.static, program.n_leaves)
            sp.forced = _plan.speculative(len(self.rungs), rung)
            compiled = spec[2] = jax.jit(functools.partial(sp.run, host_raise=True))
        out, report = compiled(*dyn)
        if not bool(np.all(np.asarray(report.ok))):   # non-finite: the verified path
            return None
        return out, report


class _Program:
    """One kernel with one argument structure: rung attempts, escalation, vmap, jvp."""

    def __init__(self, mgr: MixedPrecisionManager, fn, treedef, dyn_pos, static, n_leaves):
        self.mgr, self.fn, self.treedef = mgr, fn, treedef
        self.dyn_pos, self.static, self.n_leaves = dyn_pos, static, n_leaves
        self.n_rungs, self.n_guards = len(mgr.rungs), len(mgr.guards)
        self.out_treedef = None
        self.name = mgr.name or getattr(fn, "__name__", type(fn).__name__)
        self._plans: dict = {}
        self.plan = _plan.all_rungs(self.n_rungs)
        self.forced = None      # a speculative program's plan (MixedPrecisionManager)
        acc = [g for g in mgr.guards if g.role == "accuracy"]
        self.accuracy_guard = acc[0] if acc else None

    # ------------------------------------------------------------------------ plan

    def plan_for(self, dyn, flags=None, size: int = 1) -> _plan.Plan:
        """The plan for these argument shapes (per element under vmap, costs x size)."""
        flags = flags or [False] * len(dyn)
        avals = tuple(jax.ShapeDtypeStruct(x.shape[1:] if f else x.shape, x.dtype)
                      for x, f in zip(dyn, flags))
        key = (tuple((a.shape, str(a.dtype)) for a in avals), size, jax.default_backend())
        plan = self._plans.get(key) if self.forced is None else self.forced
        if plan is None:
            g = self.accuracy_guard
            if self.mgr.plan == "all" or g is None:
                plan = _plan.all_rungs(self.n_rungs)
            else:
                # plain-dtype rungs and an entrywise / row-separable / convolution
                # kernel: checkable on a sample of entries / rows / output positions
                st = self._structure(avals)
                plan = _plan.choose_plan(self.n_rungs, tuple(self.mgr.ladder), g.rtol,
                                         self._rung_fn, self._check_fn, avals, size,
                                         entrywise=st is not None and st.entrywise,
                                         rowwise=st is not None and st.rows is not None,
                                         conv=st is not None and st.conv is not None)
            self._plans[key] = plan
        self.plan = plan
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
            call, inputs, (cargs, ckw), out, cast = self.call_at(k, d)
            dtype = self.mgr.ladder[k]
            ctx = GuardContext(call, cargs, ckw, inputs, out, dtype, unit_roundoff(dtype),
                               k, cast_out=tuple(cast), check=method)
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

    def call_at(self, k, dyn):
        rung, dtype = self.mgr.rungs[k], self.mgr.ladder[k]
        call = rung.wrap(self.fn) if is_rung_object(rung) else self.fn
        args, kwargs = self.rebuild(dyn)
        cargs, ckw = cast_floating((args, kwargs), dtype)
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
        return call, (args, kwargs), (cargs, ckw), out, cast

    def attempt(self, k, *dyn, batched=False, raw=False):
        """``(outputs, codes, values, ok)`` of rung ``k``; ``raw``: the outputs as the
        rung returned them (:meth:`single` casts them inside the branch that accepts
        them), else cast to the output dtype."""
        call, inputs, (cargs, ckw), out, cast = self.call_at(k, dyn)
        dtype = self.mgr.ladder[k]
        nxt = None
        if k + 1 < self.n_rungs and not batched:
            def nxt():
                return self.call_at(k + 1, dyn)[4]
        ctx = GuardContext(call, cargs, ckw, inputs, out, dtype, unit_roundoff(dtype), k,
                           next_rung=nxt, batched=batched, cast_out=tuple(cast),
                           check=self.plan.check[k])
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
                      checks=checks, check_shares=tuple(self.plan.share))

    def emit(self, rec):
        """Send the report to active monitors (nothing is traced when none is active)."""
        if _monitor_enabled():
            _emit_report(self.name, self.report(*rec[1:]))

    def failure_message(self) -> str:
        return (f"adaptive kernel {self.name!r}: guards {list(self.mgr.guard_names)} still "
                f"fail on the top rung ({self.mgr.rung_names[-1]}). Call .with_report(...) "
                "with on_failure='return' to see which guard and its value.")

    def run(self, *dyn, host_raise=False):
        """``(out, report)``; ``host_raise``: an eager call's ``on_failure="raise"`` is
        left to the caller, who raises a plain Python error on the host."""
        self.out_treedef = None          # set by the first rung traced for these shapes
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


class AdaptiveFunction:
    """A function wrapped by :func:`adaptive`: call it, or ``.with_report(...)``.

    Keeps the wrapped function's name, docstring and signature (``functools.wraps``);
    ``.manager`` is its :class:`MixedPrecisionManager`, ``.fn`` the original function.

    Example:
        >>> import jax.numpy as jnp
        >>> import adaptprec as ap
        >>> f = ap.adaptive(jnp.tanh, ladder="bf16,f32")
        >>> f.__name__, f.manager.rung_names
        ('tanh', ('bf16', 'f32'))
    """

    def __init__(self, fn: Callable, manager: MixedPrecisionManager):
        functools.update_wrapper(self, fn)
        self.fn = fn
        self.manager = manager

    def __call__(self, *args, **kwargs):
        # without the report: work that only fed it is not computed (manager.call)
        if not kwargs:
            out = self.manager.fast_call(self.fn, args)
            if out is not None:
                return out
        return self.manager.call(self.fn, *args, **kwargs)

    def with_report(self, *args, **kwargs) -> tuple[Any, Report]:
        """``(out, Report)`` for this call."""
        return self.manager.run(self.fn, *args, **kwargs)

    def __repr__(self):
        return f"adaptive({getattr(self.fn, '__name__', self.fn)!r}, {self.manager!r})"


def adaptive(fn: Callable | None = None, *, ladder: Any = "bf16,f32,f64",
             guards: Any = None, policy: Policy | str | None = None,
             rtol: float | None = None, batch: str = "call",
             capacity: int | float = 0.05, on_failure: str = "return",
             name: str | None = None, plan: str = "auto", speculate: int = 0):
    """Make ``fn`` adaptive: cheapest rung first, escalate when a guard fires.

    Usable as ``@adaptive`` or ``@adaptive(ladder=..., guards=[...], ...)`` or
    ``adaptive(fn, ...)``; the keyword arguments are those of
    :class:`MixedPrecisionManager` and are validated here, at wrap time. The result keeps
    ``fn``'s signature, returns what ``fn`` returns (floating leaves in the output dtype),
    and has ``.with_report(*args, **kwargs) -> (out, Report)``.

    **Pass** ``rtol=`` **for verified accuracy.** Without it (and without an accuracy
    guard in ``guards=``) the only guard is ``guards.finite()``: the first rung whose
    output is finite is returned, on the default ladder usually bfloat16 (~2-3
    significant digits, cast to the inputs' dtype), and its report says "finite only:
    accuracy not checked". With ``rtol=1e-3`` a rung is accepted only when its estimated
    relative rounding error is at most ``1e-3``, and the cost model chooses how that is
    checked (docs/runtime.md, "When adaptivity pays").

    Example:
        >>> import jax, jax.numpy as jnp
        >>> import adaptprec as ap
        >>> @ap.adaptive(ladder="bf16,f32,f64", guards=[ap.guards.finite()])
        ... def softplus_sum(x):
        ...     return jnp.sum(jnp.log1p(jnp.exp(x)), dtype=jnp.float32)
        >>> y, rep = jax.jit(softplus_sum.with_report)(jnp.linspace(-3.0, 3.0, 8))
        >>> rep.rung_name, bool(rep.ok)
        ('bf16', True)
        >>> import inspect; str(inspect.signature(softplus_sum))
        '(x)'
    """
    if fn is not None and not callable(fn):   # before the ladder's x64 check
        raise TypeError(f"adaptive wraps a callable, got {fn!r}")
    mgr = MixedPrecisionManager(ladder, guards, policy, rtol=rtol, batch=batch,
                                capacity=capacity, on_failure=on_failure, name=name,
                                plan=plan, speculate=speculate)

    def wrap(f):
        if not callable(f):
            raise TypeError(f"adaptive wraps a callable, got {f!r}")
        return AdaptiveFunction(f, mgr)

    return wrap if fn is None else wrap(fn)
