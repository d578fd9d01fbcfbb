"""Eager calls of adaptive(): the compiled programs, the fast path, what calls learn."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import adaptprec as ap


def always_inf(x):
    return x / jnp.zeros_like(x)


def _hlo(compiled_fn, *args):
    return compiled_fn.lower(*args).compile().as_text()


def test_plain_call_skips_what_only_fed_the_report():
    # issue 31: a plan that runs the top rung alone checks finiteness only for the
    # report (there is nothing to escalate to); the eager plain call compiles the output
    # alone, so XLA drops that pass, while .with_report still computes it
    x = jnp.linspace(0.0, 1.0, 2 ** 16)
    f = ap.adaptive(lambda v: jnp.exp(v) * 2.0, ladder="bf16,f64", rtol=1e-3)
    y = f(x)
    y_rep, rep = f.with_report(x)
    assert rep.checks[0] == "skipped" and rep.rung_name == "f64" and bool(rep.ok)
    np.testing.assert_array_equal(np.asarray(y), np.asarray(y_rep))
    (entry,) = f.manager._cache.values()
    assert "is-finite" in _hlo(entry.with_report, x) and "is-finite" not in _hlo(
        entry.output, x)
    # a guard that decides an escalation still runs in the plain call, and on_failure
    # (which reads the report's ok) still applies
    big = jnp.array([1.0, 100.0])      # float64: e^100 overflows the f32 rung
    assert np.isfinite(np.asarray(ap.adaptive(jnp.exp, ladder="f32,f64")(big))).all()
    assert np.isnan(np.asarray(ap.adaptive(always_inf, ladder="f32,f64",
                                           on_failure="nan")(jnp.ones(2)))).all()
    with pytest.raises(RuntimeError, match="still fail on the top rung"):
        ap.adaptive(always_inf, ladder="f32,f64", on_failure="raise")(jnp.ones(2))


def test_eager_calls_learn_that_a_rung_fails_on_their_data(monkeypatch):
    from adaptprec import _outcomes
    monkeypatch.setattr(_outcomes, "RETRY_EVERY", 4)
    big = jnp.full(2 ** 16, 100.0)                   # e^100 overflows the f32 rung
    f = ap.adaptive(lambda v: jnp.exp(v) * jnp.cos(v) * 1e-30, rtol=1e-3)
    reps = [f.with_report(big)[1] for _ in range(3)]
    assert [r.rung_name for r in reps] == ["f64"] * 3 and all(bool(r.ok) for r in reps)
    assert reps[0].checks[1] != "skipped" and int(reps[0].escalations) == 1
    # its failures raise the chance priced for f32 until trying it no longer pays
    assert reps[2].checks[1] == "skipped" and int(reps[2].escalations) == 0
    assert "learned from this kernel's eager calls" in reps[2].plan[1], reps[2].plan
    np.testing.assert_array_equal(np.asarray(f(big)), np.asarray(reps[0] and
                                                                 f.with_report(big)[0]))
    # a plan traced later under jit for these shapes uses what the calls showed
    assert jax.jit(f.with_report)(big)[1].checks[1] == "skipped"
    # the a-priori plan is tried again every RETRY_EVERY-th call: on benign data f32
    # passes there, and the learned chance falls until later calls try it again
    small = jnp.full(2 ** 16, 0.5)
    seen = [f.with_report(small)[1] for _ in range(12)]
    assert "f32" in [r.rung_name for r in seen]
    assert seen[-1].checks[1] != "skipped" and seen[-1].rung_name == "f32"
    # a kernel planned every rung (small) never skips
    g = ap.adaptive(jnp.exp, ladder="f32,f64", rtol=1e-3)
    assert all(g.with_report(jnp.array([100.0]))[1].checks[0] != "skipped"
               for _ in range(4))


def test_a_program_traced_after_one_eager_call_plans_with_its_outcome():
    # the eager call's returned rung is kept as an array until the next eager call reads
    # it; a jit trace right after that one call reads it too (a plan kept for jit)
    big = jnp.full(2 ** 16, 100.0)                   # e^100 overflows the f32 rung
    f = ap.adaptive(lambda v: jnp.exp(v) * jnp.cos(v) * 1e-30, rtol=1e-3)
    assert jax.jit(f.with_report)(big)[1].checks[1] != "skipped"     # nothing learned
    y = f(big)
    _, rep = jax.jit(f.with_report)(big)
    assert rep.checks[1] == "skipped" and int(rep.escalations) == 0, rep.plan
    assert "learned from this kernel's eager calls" in rep.plan[1], rep.plan
    np.testing.assert_array_equal(np.asarray(y), np.asarray(jax.jit(f)(big)))


def test_an_eager_call_does_not_wait_for_the_previous_one_when_its_plan_cannot_change():
    # the learned plan is a function of the rungs earlier calls returned; when both
    # rungs the previous call may have returned lead to the same program, the next call
    # is dispatched without reading it (eager calls stay asynchronous), and the tries,
    # folded in call order later, are those of reading every call
    f = ap.adaptive(lambda v: jnp.exp(v) * jnp.cos(v) * 1e-30, rtol=1e-3)
    x = jnp.full(2 ** 16, 0.5)                        # benign: f32 passes its check
    ys = [f(x) for _ in range(6)]
    (outcomes,) = f.manager._learn.values()
    assert outcomes.tries[1] == (False,) * 4 and outcomes.pending  # passed: p_fail 0.03

    class Unread:
        def __array__(self, *args, **kwargs):
            raise AssertionError("the previous call's rung was read before dispatch")

    rung, attempt = outcomes.pending[-1]
    unread = outcomes.pending[-1] = (Unread(), attempt)
    y = f(x)                    # a failure there (p_fail 0.2) would not change the plan
    assert unread in outcomes.pending
    outcomes.pending[outcomes.pending.index(unread)] = (rung, attempt)
    np.testing.assert_array_equal(np.asarray(y), np.asarray(ys[0]))
    f(x)
    outcomes.absorb()
    assert outcomes.tries[1] == (False,) * 4 and outcomes.tries[2] == ()
    # where the previous rung decides the plan (f32 failed: the chance priced for it
    # rises until it is skipped), the next call reads it first
    big = jnp.full(2 ** 16, 100.0)                   # e^100 overflows the f32 rung
    g = ap.adaptive(lambda v: jnp.exp(v) * jnp.cos(v) * 1e-30, rtol=1e-3)
    g(big), g(big)
    (outcomes,) = g.manager._learn.values()
    assert outcomes.tries[1] == (True,) and len(outcomes.pending) == 1
    assert g.with_report(big)[1].checks[1] == "skipped"
    # eager calls note their rungs under the a-priori plan, so the kernel's own
    # compiled programs run it even when compiled after calls learned to skip a rung
    # (the plan that skips it is a program of its own); a caller's trace learns
    (entry,) = g.manager._cache.values()
    (a_priori,) = entry.program.plans_by_shapes.values()
    assert a_priori.attempt[1]
    entry.with_report(big)
    assert entry.program.plan.attempt == a_priori.attempt
    assert jax.jit(g.with_report)(big)[1].checks[1] == "skipped"


def test_outcomes_fold_every_call_in_order_and_keep_two_unread():
    from adaptprec import _outcomes
    o = _outcomes.Outcomes(3)
    for rung in (2, 1, 1, 2, 1):                # under a plan trying f32, then f64
        o.note(np.asarray(rung), (False, True, True))
        assert len(o.pending) <= 2              # (calls without a decision between)
    assert o.tries[1] == (True, False, False)   # the three oldest, read
    o.absorb()
    assert o.tries[1] == (False, False, True, False) and o.tries[2] == (False, False)
    assert o.p_fail(0.1)[1] == pytest.approx((1 + 0.2) / 6)


def test_settled_eager_calls_take_the_fast_path():
    # once an eager plain call has planned its shapes, later calls with the same array
    # shapes skip the pytree/caching bookkeeping
    x = jnp.linspace(0.0, 1.0, 2 ** 16)
    f = ap.adaptive(lambda v: jnp.exp(v) * 2.0, ladder="bf16,f64", rtol=1e-3)  # f64 alone
    ys = [f(x) for _ in range(3)]
    assert len(f.manager._fast) == 1
    called = []
    (prog,) = f.manager._fast.values()
    f.manager._fast[next(iter(f.manager._fast))] = lambda *a: called.append(1) or prog(*a)
    y = f(x)
    assert called == [1]
    np.testing.assert_array_equal(np.asarray(y), np.asarray(f.with_report(x)[0]))
    np.testing.assert_array_equal(np.asarray(y), np.asarray(ys[0]))
    # a settled program (nothing to learn) returns the output alone: no rung to read
    # back, no second buffer
    (entry,) = f.manager._cache.values()
    assert entry.output is prog and "->f64[65536]" in _hlo(prog, x).splitlines()[0].replace(
        "{0}", "")
    # other shapes, dtypes, kwargs and traced calls take the full path
    f(x[:100]), f(x.astype(jnp.float32)), f(v=x), jax.jit(f)(x)
    assert called == [1]
    # a plan with escalation memory (f32 + check, then f64) takes the fast path too,
    # and its calls still learn that a rung fails on the data
    big = jnp.full(2 ** 16, 100.0)
    g = ap.adaptive(lambda v: jnp.exp(v) * jnp.cos(v) * 1e-30, rtol=1e-3)
    for _ in range(3):
        g(big)
    assert len(g.manager._fast) == 1
    # a repeat call looks its learned plan up by the failure chances: no planning pass
    (entry,) = g.manager._cache.values()
    planned, plan_with = [], entry.program.plan_with
    entry.program.plan_with = lambda *a, **k: planned.append(a) or plan_with(*a, **k)
    np.testing.assert_array_equal(np.asarray(g(big)), np.asarray(g(big)))
    assert planned == []
    assert g.with_report(big)[1].checks[1] == "skipped"     # learned: f32 fails here


def test_fast_path_with_a_shared_manager_and_an_unhashable_kernel():
    class Unhashable:
        __hash__ = None
        __name__ = "unhashable"

        def __call__(self, x):
            return jnp.sin(x)

    deco = ap.adaptive(ladder="f32,f64", plan="all")   # one manager for both kernels
    f, g = deco(jnp.cos), deco(Unhashable())
    x = jnp.linspace(0.0, 1.0, 8)
    f(x), f(x)
    assert f.manager is g.manager and g.manager._fast
    np.testing.assert_allclose(np.asarray(g(x)), np.sin(np.asarray(x)), rtol=1e-6)


def test_fast_path_keeps_the_newest_settled_shapes(monkeypatch):
    # the eager shortcut is bounded (runtime._FAST_MAX): a manager fed many shapes keeps
    # its newest settled programs there, and an evicted shape still answers (full path)
    from adaptprec import runtime
    monkeypatch.setattr(runtime, "_FAST_MAX", 2)
    f = ap.adaptive(jnp.cos, ladder="f32,f64", plan="all")
    xs = [jnp.linspace(0.0, 1.0, n) for n in (3, 4, 5, 6)]
    for x in xs:
        f(x), f(x)
    assert [k[2][1] for k in f.manager._fast] == [(5,), (6,)]
    np.testing.assert_allclose(np.asarray(f(xs[0])), np.cos(np.asarray(xs[0])), rtol=1e-6)
