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
import numpy as np

from . import _compaction
from . import _outcomes, _plan
from ._program import _is_dynamic, _Program
from ._rungs import Rung, is_rung_object, normalize_ladder
from .guards import Guard, accuracy, as_guard, finite
from ._policy import Policy
from .precision import dtype_name
from .report import Report
from ._x64_rule import float64_call

__all__ = ["MixedPrecisionManager", "adaptive", "AdaptiveFunction", "Rung"]

_BATCH_MODES = ("call", "element")
_ON_FAILURE = ("return", "raise", "nan")
_PLANS = ("auto", "all")



#: Eager programs per argument shapes a manager keeps for
#: :meth:`MixedPrecisionManager.fast_call` (the full programs stay in its ``_cache``; a
#: shape evicted here only loses the shortcut).
_FAST_MAX = 64


def _fast_key(fn, args):
    """The key of an eager call on positional arrays: the kernel, the x64 mode, and each
    argument's type, shape and dtype (``AttributeError`` for a non-array argument)."""
    return (fn, jax.config.jax_enable_x64, *[(type(a), a.shape, a.dtype) for a in args])


class _Compiled:
    """The programs of one kernel and argument structure (under the a-priori plan, or
    one forced on it): ``with_report`` returns ``(out, Report)``; ``output`` the output
    alone, so XLA drops every guard that only fed the report; ``output_rung`` the output
    and the returned rung (an eager call learning which rungs fail). Each compiles per
    argument shapes when first called, under the program's own plan whatever eager
    calls learned before (a learned plan is another entry); a caller's trace runs
    ``program.run`` inline, with what they learned."""

    __slots__ = ("program", "_run", "with_report", "_output", "_output_rung")

    def __init__(self, program: _Program, host_raise: bool):
        self.program = program
        self._run = functools.partial(program.run, a_priori=True)
        self.with_report = jax.jit(functools.partial(self._run, host_raise=host_raise))
        self._output = self._output_rung = None

    @property
    def output(self):
        if self._output is None:
            self._output = jax.jit(lambda *d: self._run(*d)[0])
        return self._output

    @property
    def output_rung(self):
        if self._output_rung is None:
            self._output_rung = jax.jit(lambda *d: (lambda o: (o[0], o[1].rung))(
                self._run(*d)))
        return self._output_rung


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
        componentwise: with ``rtol``: ``False`` (default) checks the error *normwise*,
            ``max|e| <= atol + rtol * max|y|`` per output (an entry much smaller than
            the largest may lose its digits); ``True`` checks every entry,
            ``|e_i| <= atol + rtol * |y_i|``, as ``numpy.allclose`` reads a tolerance
            (only checks that see every entry are used: the first-order bound or Monte
            Carlo arithmetic, never a sample). The report says which was checked.
        atol: with ``rtol``: an absolute floor (default 0), as in ``numpy.allclose``;
            with ``componentwise``, what keeps an entry near zero from failing.
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
                 plan: str = "auto", speculate: int = 0, componentwise: bool = False,
                 atol: float = 0.0):
        # the options first: with x64 off the default ladder's float64 error would
        # otherwise hide the actual mistake
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
        if (componentwise or atol) and rtol is None:
            raise ValueError("componentwise= and atol= qualify rtol=: pass rtol= too, "
                             "e.g. rtol=1e-3, componentwise=True")
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
            self.guards = self.guards + (accuracy(rtol, componentwise=componentwise,
                                                  atol=atol),)
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
        self._learn: dict = {}  # per (kernel, shapes): what eager calls showed (_learned)
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
        """``call(fn, *args)`` for positional concrete arrays whose shapes an eager call
        has planned (see ``_dispatch``), else ``None``: an eager plain call's Python
        overhead (pytree flattening, cache keys: ~30-60 us) is the 1.1-1.3x of a 0.3-1 ms
        kernel. The key holds each argument's type, so a tracer never matches."""
        if not self._fast:
            return None
        try:
            call = self._fast.get(_fast_key(fn, args))
        except (AttributeError, TypeError):  # not arrays, or an unhashable kernel
            return None
        return None if call is None else call(*args)

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
            compiled = _Compiled(_Program(self, fn, treedef, dyn_pos, static, len(leaves)),
                                 self.on_failure == "raise")
            if key is not None:
                self._cache[key] = compiled
        dyn = [leaves[i] for i in dyn_pos]
        # Eager calls compile once; inside a transformation (jit, vmap, grad) trace inline.
        traced = any(isinstance(x, jax.core.Tracer) for x in dyn)
        if traced:
            out = compiled.program.run(*dyn)
            return out if with_report else out[0]
        # (shape, dtype) per array: the dtype object, not its name (str() costs ~7 us)
        spec_key = None if key is None else (key, tuple((np.shape(x), getattr(
            x, "dtype", type(x))) for x in dyn))
        if not with_report and not self.speculate and self.on_failure != "raise":
            # the output alone: XLA drops the guards that only fed the report
            outcomes = (spec_key is not None and self.plan == "auto"
                        and self._learning(spec_key, compiled.program))
            if not outcomes:
                # nothing to learn from later calls (a plan with one rung tried, or
                # plan="all"): the output alone, and nothing read back
                call = compiled.output
            else:
                call = functools.partial(self._learning_call, spec_key, compiled,
                                         outcomes)
            if (spec_key is not None and not kwargs and len(dyn) == len(args)
                    and all(a is d for a, d in zip(args, dyn))):
                # later calls with these shapes come straight here (fast_call)
                if len(self._fast) >= _FAST_MAX:   # oldest first (insertion order)
                    self._fast.pop(next(iter(self._fast)))
                self._fast[_fast_key(fn, args)] = call
            return call(*dyn)
        learned = None
        if not self.speculate and spec_key is not None and self.plan == "auto":
            learned = self._learned(spec_key, compiled.program)
        target = compiled if learned is None else learned
        if self.speculate and spec_key is not None:
            res = self._speculative(spec_key, compiled.program, dyn)
            if res is not None:
                return res if with_report else res[0]
        out, report = target.with_report(*dyn)
        if spec_key is not None and self.plan == "auto":
            self._note_rung(spec_key, target.program, report.rung)
        if self.speculate and spec_key is not None:
            self._record(spec_key, report, compiled.program)
        if self.on_failure == "raise" and not bool(np.all(np.asarray(report.ok))):
            # eagerly a plain Python error (equinox's error_if surfaces as an INTERNAL
            # callback error with a banner)
            raise RuntimeError(compiled.program.failure_message())
        return (out, report) if with_report else out


    # ------------------------------------------------- rungs that failed on the data

    def _learning_call(self, spec_key, compiled, outcomes, *dyn):
        """An eager plain call whose shapes learn which rungs fail on their data: the
        program of the plan learned so far, its output, and its returned rung kept."""
        target = self._learned(spec_key, compiled.program, outcomes) or compiled
        out, rung = target.output_rung(*dyn)
        outcomes.note(rung, target.program.plan_of(spec_key[1]).attempt)
        return out

    def _note_rung(self, spec_key, program, rung):
        """Keep an eager call's returned rung with the plan that ran (an array: read when
        a later decision needs it, so the call itself stays asynchronous)."""
        outcomes = self._learning(spec_key, program)
        if outcomes:
            outcomes.note(rung, program.plan_of(spec_key[1]).attempt)

    def _learning(self, spec_key, program):
        """The :class:`~adaptprec._outcomes.Outcomes` of these shapes, or ``False`` when
        the plan has nothing to learn (planned here if no call has traced them yet)."""
        outcomes = self._learn.get(spec_key)
        if outcomes is None:
            shapes = spec_key[1]
            plan = program.plans_by_shapes.get(shapes) or program.plan_with(shapes)
            if (sum(plan.attempt) < 2 or all(c is None for c in plan.check)) and not \
                    plan.priced_out:
                # nothing to learn (one rung tried, or a small / unplanned kernel): no
                # bookkeeping on later calls
                outcomes = False
            else:
                outcomes = _outcomes.Outcomes(len(self.rungs), plan.priced_out)
            self._learn[spec_key] = outcomes
        return outcomes

    def _learned(self, spec_key, program, outcomes=None):
        """The compiled entry of the plan chosen with the failure chances this kernel's
        eager calls showed for these shapes (:mod:`adaptprec._outcomes`), or ``None``:
        the a-priori plan (every ``RETRY_EVERY``-th call, before any call, and when it
        agrees). Skipping a rung never lowers the accuracy returned (the call ends on a
        rung checked as planned); the report says which rungs were skipped and why.

        The newest call's rung is read only when it decides the entry: when every rung
        it may have returned leads to the same one, this call does not wait for it."""
        outcomes = outcomes if outcomes is not None else self._learning(spec_key, program)
        if not outcomes:
            return None
        outcomes.calls += 1
        if outcomes.calls % _outcomes.RETRY_EVERY == 0:
            # the a-priori plan again, or, where it priced a rung out by the
            # componentwise chance alone, that rung tried at the plain a-priori chance
            # (else it would never be tried, and never learned)
            if not outcomes.priced_out or spec_key[1] not in program.plans_by_shapes:
                return None
            chances = (round(_plan.P_FAIL, 1),) * (len(self.rungs) - 1) + (0.0,)
            return self._entry_of(spec_key, program, outcomes, chances)
        outcomes.absorb(keep=1)
        entries = {self._entry_after(spec_key, program, outcomes, tries)
                   for tries in outcomes.possible()}
        if len(entries) == 1:
            return entries.pop()
        outcomes.absorb()
        return self._entry_after(spec_key, program, outcomes, outcomes.tries)

    def _entry_after(self, spec_key, program, outcomes, tries):
        """The compiled entry after these tries (``None``: the a-priori program)."""
        if tries in outcomes.by_tries:
            return outcomes.by_tries[tries]
        if spec_key[1] not in program.plans_by_shapes:   # no a-priori plan traced yet
            return None
        entry = None
        if any(tries):
            # (the entry chosen per failure chances as the plan rounds them; the top
            # rung's chance prices nothing, so it is left out of the key)
            chances = tuple(round(p, 1) for p in outcomes.p_fail(_plan.P_FAIL, tries)[
                :-1]) + (0.0,)
            entry = self._entry_of(spec_key, program, outcomes, chances)
        outcomes.by_tries[tries] = entry
        return entry

    def _entry_of(self, spec_key, program, outcomes, chances):
        """The compiled entry of the plan for these failure chances (``None``: the
        a-priori program, whose plan it is: only the notes differ)."""
        if chances not in outcomes.by_chances:
            outcomes.by_chances[chances] = self._entry_for(spec_key, program, outcomes,
                                                           chances)
        return outcomes.by_chances[chances]

    def _entry_for(self, spec_key, program, outcomes, chances):
        """A new compiled entry for the plan of these failure chances (``None``: the
        a-priori program's plan)."""
        plan = program.plan_with(spec_key[1], chances)
        default = program.plans_by_shapes[spec_key[1]]
        if (plan.attempt, plan.check) == (default.attempt, default.check):
            return None
        entry = next((e for e in outcomes.by_chances.values() if e is not None
                      and e.program.forced == plan), None)
        if entry is None:
            sp = _Program(self, program.fn, program.treedef, program.dyn_pos,
                          program.static, program.n_leaves)
            sp.forced = plan
            entry = _Compiled(sp, self.on_failure == "raise")
        return entry

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
             name: str | None = None, plan: str = "auto", speculate: int = 0,
             componentwise: bool = False, atol: float = 0.0):
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
    checked (docs/runtime.md, "When adaptivity pays"). The error is *normwise* (relative
    to each output's largest entry) unless ``componentwise=True`` (every entry relative
    to itself, with the floor ``atol``, as ``numpy.allclose``); the report says which.

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
                                plan=plan, speculate=speculate,
                                componentwise=componentwise, atol=atol)

    def wrap(f):
        if not callable(f):
            raise TypeError(f"adaptive wraps a callable, got {f!r}")
        return AdaptiveFunction(f, mgr)

    return wrap if fn is None else wrap(fn)
