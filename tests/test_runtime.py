"""adaptive()/MixedPrecisionManager: escalation, execution counts, vmap modes, grad, reports."""

import collections
import dataclasses
import functools
import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.linalg
import scipy.special

import adaptprec as ap
from adaptprec import guards

# ---- kernels with host-side execution counters ------------------------------------

CALLS = collections.Counter()


def _tick(name, _x):
    CALLS[name] += 1


def _count(x):
    # one callback per element under vmap (JAX unrolls debug callbacks over the batch)
    jax.debug.callback(functools.partial(_tick, x.dtype.name), x)


def naive_lse(x):
    """log(sum(exp(x))) without max-shifting: overflows in bf16/f32 for x ~ 100."""
    _count(x)
    return jnp.log(jnp.sum(jnp.exp(x)))


LSE = ap.adaptive(naive_lse, ladder="bf16,f32,f64", guards=[guards.finite()])
LSE_ELEM = ap.adaptive(naive_lse, ladder="bf16,f32,f64", batch="element", capacity=2)
LSE_F32 = ap.adaptive(naive_lse, ladder="f32,f64")

lse_report = jax.jit(LSE.with_report)
lse_call_vmap = jax.jit(jax.vmap(LSE.with_report))
lse_elem_vmap = jax.jit(jax.vmap(LSE_ELEM.with_report))

BENIGN = jnp.array([1.0, 2.0, -1.0], jnp.float32)
BIG = jnp.array([100.0, 99.0, 1.0], jnp.float32)


def _counts():
    jax.effects_barrier()
    out = dict(CALLS)
    CALLS.clear()
    return out


def test_benign_stays_on_bf16_and_higher_rungs_never_run():
    CALLS.clear()
    y, rep = lse_report(BENIGN)
    assert _counts() == {"bfloat16": 1}
    assert rep.rung_name == "bf16" and bool(rep.ok) and int(rep.escalations) == 0
    assert y.dtype == jnp.float32                     # output in the input dtype
    np.testing.assert_allclose(float(y), scipy.special.logsumexp(BENIGN), rtol=2e-2)
    assert np.all(np.asarray(rep.codes)[1:] == -1)    # rungs that did not run


def test_overflow_escalates_to_f64_and_each_rung_runs_once():
    CALLS.clear()
    y, rep = lse_report(BIG)
    assert _counts() == {"bfloat16": 1, "float32": 1, "float64": 1}
    assert rep.rung_name == "f64" and int(rep.escalations) == 2 and bool(rep.ok)
    assert rep.reason_name == "nonfinite"
    np.testing.assert_array_equal(np.asarray(rep.codes)[:, 0], [1, 1, 0])
    np.testing.assert_allclose(float(y), scipy.special.logsumexp(np.asarray(BIG, np.float64)),
                               rtol=1e-7)
    assert "f64 after 2 escalations" in rep.summary() and "nonfinite" in rep.summary()


def test_ill_conditioned_solve_escalates_well_conditioned_does_not():
    solve = ap.adaptive(jnp.linalg.solve, ladder="f32,f64",
                        guards=[guards.finite(), guards.matrix_condition(tol=1e-3)])
    run = jax.jit(solve.with_report)
    h = jnp.asarray(scipy.linalg.hilbert(8))
    rng = np.random.default_rng(0)
    well = jnp.asarray(np.eye(8) * 4 + 0.3 * rng.standard_normal((8, 8)))
    b = jnp.asarray(rng.standard_normal(8))
    x_h, rep_h = run(h, b)
    x_w, rep_w = run(well, b)
    assert rep_h.rung_name == "f64" and rep_h.reason_name == "ill-conditioned matrix"
    assert rep_w.rung_name == "f32" and bool(rep_w.ok)
    ref_h = np.linalg.solve(np.asarray(h), np.asarray(b))
    assert np.linalg.norm(np.asarray(x_h) - ref_h) / np.linalg.norm(ref_h) < 1e-5
    np.testing.assert_allclose(np.asarray(x_w), np.linalg.solve(well, b), rtol=1e-5)
    # kappa recorded per rung (the f32 rung's own estimate is rough but far over 1/u)
    kap = np.linalg.cond(np.asarray(h), 1)
    assert kap / 3 <= float(rep_h.values[1, 1]) <= kap * 1.01
    assert float(rep_h.values[0, 1]) * 2.0 ** -24 > 1e-3


def seq_sum(x):
    """Sequential sum accumulating in x.dtype: in bfloat16 it stalls at 256."""
    return jax.lax.scan(lambda c, v: (c + v, None), jnp.zeros((), x.dtype), x)[0]


def _rel_err(out, x):
    ref = jnp.sum(x.astype(jnp.float64))
    return jnp.abs(out.astype(jnp.float64) - ref) / jnp.abs(ref)


def test_bf16_sum_stall_caught_by_residual_guard():
    s = ap.adaptive(seq_sum, ladder="bf16,f32,f64", guards=[guards.residual(_rel_err, 1e-4)])
    y, rep = jax.jit(s.with_report)(jnp.ones(1000, jnp.float32))
    assert float(y) == 1000.0 and rep.rung_name == "f32"
    assert rep.reason_name == "residual"
    np.testing.assert_allclose(float(rep.values[0, 0]), 0.744, rtol=1e-6)


# ---- vmap ------------------------------------------------------------------------

def _batch(n, bad):
    xs = np.tile(np.asarray(BENIGN), (n, 1)) + np.arange(n)[:, None] * 0.01
    xs[list(bad), 0] = 100.0
    return jnp.asarray(xs, jnp.float32)


def _lse_ref(xs):
    return scipy.special.logsumexp(np.asarray(xs, np.float64), axis=1)


def test_vmap_call_mode_one_decision_for_the_batch():
    xs = _batch(8, [5])
    CALLS.clear()
    y, rep = lse_call_vmap(xs)
    # every element ran on every rung exactly once: one scalar decision per rung
    assert _counts() == {"bfloat16": 8, "float32": 8, "float64": 8}
    np.testing.assert_array_equal(np.asarray(rep.rung), [2] * 8)
    np.testing.assert_allclose(np.asarray(y), _lse_ref(xs), rtol=1e-6)
    CALLS.clear()
    y, rep = lse_call_vmap(_batch(8, []))
    assert _counts() == {"bfloat16": 8}                # a real cond, not a select
    np.testing.assert_array_equal(np.asarray(rep.rung), [0] * 8)


def test_vmap_element_mode_compacts_failures():
    xs = _batch(16, [3])
    CALLS.clear()
    y, rep = lse_elem_vmap(xs)
    # only a capacity-2 buffer is recomputed on the higher rungs
    assert _counts() == {"bfloat16": 16, "float32": 2, "float64": 2}
    rungs = np.asarray(rep.rung)
    assert rungs[3] == 2 and np.all(np.delete(rungs, 3) == 0)
    # per element the same answer as an unbatched call
    singles = [lse_report(x) for x in xs]
    CALLS.clear()
    np.testing.assert_array_equal(rungs, [int(r.rung) for _, r in singles])
    np.testing.assert_allclose(np.asarray(y), [float(v) for v, _ in singles], rtol=1e-6)
    assert "bf16 15, f64 1; ok 16/16; reasons: nonfinite x1" in rep.summary()


def test_vmap_element_mode_overflow_escalates_whole_batch():
    xs = _batch(16, [1, 7, 12])                        # 3 failures > capacity 2
    CALLS.clear()
    y, rep = lse_elem_vmap(xs)
    assert _counts() == {"bfloat16": 16, "float32": 16, "float64": 16}
    rungs = np.asarray(rep.rung)
    np.testing.assert_array_equal(np.flatnonzero(rungs == 2), [1, 7, 12])
    np.testing.assert_allclose(np.asarray(y)[[1, 7, 12]], _lse_ref(xs)[[1, 7, 12]], rtol=1e-6)
    assert np.all(np.isfinite(np.asarray(y)))


@pytest.mark.slow
def test_nested_vmap_flattens_into_one_batch():
    xs = _batch(16, [3])
    CALLS.clear()
    y2, rep2 = jax.jit(jax.vmap(jax.vmap(LSE_ELEM.with_report)))(xs.reshape(4, 4, 3))
    assert _counts() == {"bfloat16": 16, "float32": 2, "float64": 2}
    y1, rep1 = lse_elem_vmap(xs)
    CALLS.clear()
    np.testing.assert_array_equal(np.asarray(y2).ravel(), np.asarray(y1))
    np.testing.assert_array_equal(np.asarray(rep2.rung).ravel(), np.asarray(rep1.rung))
    assert rep2.codes.shape == (4, 4, 3, 1)


# ---- grad ------------------------------------------------------------------------

@pytest.mark.slow
def test_grad_flows_through_chosen_rung_matches_finite_differences():
    x = jnp.array([100.0, 99.0, 1.0])                  # float64 input: f32 overflows
    g = jax.jit(jax.grad(LSE_F32))(x)
    CALLS.clear()
    f = lambda v: float(LSE_F32(jnp.asarray(v)))
    h = 1e-6
    fd = [(f(np.asarray(x) + h * e) - f(np.asarray(x) - h * e)) / (2 * h)
          for e in np.eye(3)]
    CALLS.clear()
    np.testing.assert_allclose(np.asarray(g), fd, rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(np.asarray(g), scipy.special.softmax(np.asarray(x)), rtol=1e-12)
    # on a benign input the f32 rung is chosen: the gradient is that of the f32 kernel
    xb = jnp.array([1.0, 2.0, -1.0])
    g32 = jax.grad(lambda v: naive_lse(v.astype(jnp.float32)).astype(jnp.float64))(xb)
    np.testing.assert_array_equal(np.asarray(jax.grad(LSE_F32)(xb)), np.asarray(g32))
    CALLS.clear()


def test_vmap_of_grad_in_element_mode():
    xs = _batch(4, [2]).astype(jnp.float64)
    gs = jax.jit(jax.vmap(jax.grad(LSE_ELEM)))(xs)
    CALLS.clear()
    np.testing.assert_allclose(np.asarray(gs)[2], scipy.special.softmax(np.asarray(xs[2])),
                               rtol=1e-12)
    np.testing.assert_allclose(np.asarray(gs), scipy.special.softmax(np.asarray(xs), axis=1),
                               rtol=2e-2)             # bf16-rung gradients elsewhere


# ---- failure policy, monitor, bad input -----------------------------------------

def always_inf(x):
    return x / jnp.zeros_like(x)


@pytest.mark.parametrize("mode", ["return", "nan", "raise"])
def test_on_failure(mode):
    f = jax.jit(ap.adaptive(always_inf, ladder="f32,f64", on_failure=mode).with_report)
    if mode == "raise":
        with pytest.raises(Exception, match="still fail on the top rung"):
            jax.block_until_ready(f(jnp.ones(2)))
        # eagerly: a plain RuntimeError (newcomer audit 3: an INTERNAL callback error)
        with pytest.raises(RuntimeError, match="still fail on the top rung"):
            ap.adaptive(always_inf, ladder="f32,f64", on_failure=mode)(jnp.ones(2))
        return
    y, rep = f(jnp.ones(2))
    assert not bool(rep.ok) and rep.rung_name == "f64" and rep.reason_name == "nonfinite"
    assert "NOT OK" in rep.summary()
    if mode == "return":
        assert np.all(np.isinf(np.asarray(y)))
    else:
        assert np.all(np.isnan(np.asarray(y)))


def plain_exp(x):
    return jnp.exp(x)


@pytest.mark.slow
def test_monitor_is_free_when_off_and_collects_when_on():
    f = ap.adaptive(plain_exp, ladder="f32,f64")
    assert "debug_callback" not in str(jax.make_jaxpr(f)(jnp.ones(2)))
    jf = jax.jit(f)
    jf(jnp.ones(2))                                   # compiled without monitoring
    with ap.monitor() as log:
        assert "debug_callback" in str(jax.make_jaxpr(f)(jnp.ones(2)))
        jf(jnp.array([1.0, 800.0]))                   # re-traced inside the block
        jf(jnp.array([1.0, 2.0]))
        jax.vmap(f)(jnp.ones((5, 2)).at[3, 1].set(800.0))     # one entry for the batch
    assert [r.rung_name for r in log.reports[:2]] == ["f64", "f32"]
    assert log.reports[2].batch_shape == (5,) and len(log) == 3
    assert "5 calls: f64 5" in log.reports[2].summary()
    assert log[0][0] == "plain_exp" and "plain_exp: f64 after 1 escalation" in log.summary()
    jf(jnp.ones(2))
    assert len(log) == 3                              # nothing logged after the block


def test_bad_input_is_caught_at_the_boundary():
    with pytest.raises(ValueError, match="at least 2 are needed"):
        ap.adaptive(plain_exp, ladder="f32")
    with pytest.raises(ValueError, match="batch"):
        ap.adaptive(plain_exp, batch="rows")
    with pytest.raises(ValueError, match="capacity"):
        ap.MixedPrecisionManager("f32,f64", capacity=0)
    with pytest.raises(ValueError, match="on_failure"):
        ap.adaptive(plain_exp, on_failure="ignore")
    with pytest.raises(TypeError, match="guards must be"):
        ap.adaptive(plain_exp, guards="finite")
    with pytest.raises(TypeError, match="callable"):
        ap.adaptive(3)
    with pytest.raises(ValueError, match="strictly increasing"):
        ap.adaptive(plain_exp, ladder="f64,f32")
    bad_guard = ap.adaptive(plain_exp, ladder="f32,f64", guards=[lambda out, x: out])
    with pytest.raises(TypeError, match=r"returned an array of shape \(2,\)"):
        bad_guard(jnp.ones(2))
    not_array = ap.adaptive(lambda x: "done", ladder="f32,f64")
    with pytest.raises(TypeError, match="must return arrays"):
        not_array(jnp.ones(2))


# ---- composition, rung objects, signatures -----------------------------------------

def test_nested_adaptive_calls():
    outer = ap.adaptive(lambda x: LSE(x) * 2, ladder="bf16,f32,f64", name="outer")
    with ap.monitor() as log:
        y, rep = jax.jit(outer.with_report)(BIG)
    CALLS.clear()
    names = [(n, r.rung_name) for n, r in log]
    # the inner call saw bf16 inputs (the outer rung) and escalated on its own
    assert ("naive_lse", "f64") in names and ("outer", "bf16") in names
    assert rep.rung_name == "bf16"
    np.testing.assert_allclose(float(y), 2 * scipy.special.logsumexp(BIG), rtol=1e-2)


class Scaled:
    """A rung object: runs fn at float32 and records that it wrapped it."""

    dtype = np.dtype(np.float32)
    name = "scaled-f32"

    def __init__(self):
        self.wrapped = []

    def wrap(self, fn):
        self.wrapped.append(fn)
        return lambda *a: fn(*a) * 1.0


def test_rung_objects_and_policy_output():
    rung = Scaled()
    f = ap.adaptive(plain_exp, ladder=["bf16", rung, "f64"])
    y, rep = jax.jit(f.with_report)(jnp.array([1.0, 89.0]))   # e^89 overflows bf16 & f32
    assert rung.wrapped == [plain_exp] and rep.rung_names == ("bf16", "scaled-f32", "f64")
    assert rep.rung_name == "f64"
    y, rep = f.with_report(jnp.array([1.0, 2.0], jnp.float32))
    assert rep.rung_name == "bf16"
    g = ap.adaptive(plain_exp, ladder="bf16,f32", policy="p=f32,c=bf16,o=f32")
    assert g(jnp.ones(2, jnp.float64)).dtype == jnp.float32
    with pytest.raises(ValueError, match="strictly increasing"):
        ap.adaptive(plain_exp, ladder=["f32", rung])


def test_decorator_forms_signature_kwargs_and_static_args():
    @ap.adaptive
    def scaled(x, scale=2.0, *, n: int = 1, idx=None):
        """Doc."""
        return jnp.exp(x) * scale * n + (0 if idx is None else idx.sum())

    assert str(inspect.signature(scaled)) == "(x, scale=2.0, *, n: int = 1, idx=None)"
    assert scaled.__name__ == "scaled" and scaled.__doc__ == "Doc."
    y, rep = scaled.with_report(jnp.ones(2), 3.0, n=2, idx=jnp.arange(3))
    np.testing.assert_allclose(np.asarray(y), np.e * 6 + 3, rtol=1e-2)
    assert rep.rung_name == "bf16" and y.dtype == jnp.float64
    assert len(jax.tree_util.tree_leaves(rep)) == 6   # Report is a pytree
    assert dataclasses.is_dataclass(rep)


def test_manager_run_and_pytree_outputs():
    # an integer output needs an accuracy guard (rtol=): finiteness cannot check it
    mgr = ap.MixedPrecisionManager("bf16,f32,f64", guards=guards.finite(), rtol=1e-2)

    def both(d):
        return {"e": jnp.exp(d["x"]), "n": jnp.arange(2, dtype=jnp.int32)}

    out, rep = mgr.run(both, {"x": jnp.array([1.0, 100.0], jnp.float32)})
    assert rep.rung_name == "f64" and out["n"].dtype == jnp.int32
    assert out["e"].dtype == jnp.float32 and np.isinf(np.asarray(out["e"])[1])


@pytest.mark.slow
def test_forward_mode_hessian_and_two_shapes_in_one_trace():
    f = ap.adaptive(lambda x: jnp.exp(x) * x, ladder="f32,f64")
    x = jnp.array([1.0, 100.0])                       # e^100 overflows f32 -> f64
    ref = np.diag(np.exp(np.asarray(x)) * (1 + np.asarray(x)))
    np.testing.assert_allclose(np.asarray(jax.jacfwd(f)(x)), ref, rtol=1e-12)
    np.testing.assert_allclose(np.asarray(jax.jacrev(f)(x)), ref, rtol=1e-12)
    h = ap.adaptive(lambda x: jnp.sum(jnp.exp(x)), ladder="f32,f64")
    np.testing.assert_allclose(np.asarray(jax.hessian(h)(jnp.array([1.0, 2.0]))),
                               np.diag(np.exp([1.0, 2.0])), rtol=1e-6)   # f32 rung
    a, b = jax.jit(lambda a, b: (f(a), f(b)))(jnp.ones(2), jnp.ones((3, 3)))
    assert a.shape == (2,) and b.shape == (3, 3)


def test_float64_rung_with_x64_off_says_how_to_fix():
    from _subprocess import run_python

    # the x64 rule (tests/test_x64_rule.py): a float64 rung works eagerly (thread-local
    # x64 scope); under jit it raises the one error, which says how to fix it
    code = ("import jax, adaptprec as ap, jax.numpy as jnp\n"
            "f = ap.adaptive(jnp.exp, ladder='bf16,f32')\n"
            "assert f(jnp.ones(2)).dtype == jnp.float32\n"
            "g = ap.adaptive(jnp.exp, ladder='f32,f64')\n"
            "try:\n"
            "    jax.jit(g)(jnp.ones(2))\n"
            "except ValueError as e:\n"
            "    print('ERR', e)\n")
    proc = run_python(code, x64=False, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "ERR" in proc.stdout and "jax_enable_x64" in proc.stdout


# ------------------------------------------------------------------ speculation


@pytest.mark.slow
def test_speculation_reuses_a_verified_rung_and_reverifies():
    def f(x):
        return jnp.exp(x) * 0.5

    g = ap.adaptive(f, ladder="f32,f64", rtol=1e-3, speculate=3)
    x = jnp.linspace(0.0, 1.0, 64, dtype=jnp.float64)
    seen = []
    for _ in range(4):
        y, rep = g.with_report(x)
        np.testing.assert_allclose(np.asarray(y), np.asarray(f(x)), rtol=1e-3)
        seen.append(rep.verified.startswith("speculative"))
        assert rep.rung_name == "f32" and bool(rep.ok)
    # verified, two speculative calls, verified again (every 3rd call)
    assert seen == [False, True, True, False], seen
    # a non-finite speculative result is recomputed on the verified path (f64 here)
    y, rep = g.with_report(jnp.full(64, 100.0, jnp.float64))
    assert rep.rung_name == "f64" and np.isfinite(np.asarray(y)).all()
    assert not rep.verified.startswith("speculative")
    # inside jit every call verifies
    _, rep = jax.jit(g.with_report)(x)
    assert not rep.verified.startswith("speculative")


def test_speculation_is_off_when_the_cheap_rung_failed():
    def cancel(x):
        return (x + 1.0) - 1.0

    g = ap.adaptive(cancel, ladder="f32,f64", rtol=1e-3, speculate=4)
    x = jnp.linspace(1e-5, 2e-5, 64, dtype=jnp.float64)
    for _ in range(3):
        y, rep = g.with_report(x)
        assert rep.rung_name == "f64" and not rep.verified.startswith("speculative")


def test_speculate_is_validated():
    with pytest.raises(ValueError, match="speculate must be"):
        ap.adaptive(jnp.sin, rtol=1e-3, speculate=-1)
    with pytest.raises(ValueError, match="needs rtol"):
        ap.adaptive(jnp.sin, speculate=2)
