"""The adaptive batch's hand-off to float64 (adaptprec/batch/verify.py): one float64
evaluation verifies a float32 answer; only fits that fail the check iterate on float64.

The agreement criterion (stated in docs/runtime.md and batch/verify.py): every parameter
of the default (adaptive) answer is within 1e-3 of its standard error of the
``precision="f64"`` answer. A fit accepted by the one-evaluation check has
``njev == nit + 1`` (its float32 evaluations are nit + 1, minus none; the check adds
one evaluation and one Gauss-Newton step); a fit that iterates on float64 has a second
initial evaluation, ``njev == nit + 2``, as every fit had before the check existed.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import adaptprec as ap
from adaptprec.batch import _status as st
from adaptprec.batch.lm_batched import LMOptions, lm_init, lm_run, make_fj
from adaptprec.batch.verify import SE_FRACTION, SE_TAKEN, verify_handoff

T = np.linspace(0.0, 3.0, 20)


def decay(p, t):
    return p[0] * jnp.exp(-p[1] * t) + p[2]


def _problem(b, noise, seed=0):
    rng = np.random.default_rng(seed)
    true = np.column_stack([rng.uniform(1, 5, b), rng.uniform(0.3, 2.0, b),
                            rng.uniform(-1, 1, b)])
    y = true[:, :1] * np.exp(-true[:, 1:2] * T) + true[:, 2:3]
    y = y + noise[:, None] * rng.normal(size=(b, T.size))
    return np.column_stack([np.ones(b), np.ones(b), np.zeros(b)]), y, true


# 16 noisy fits (accepted by the check) and 8 exact ones: with no noise the standard
# errors vanish, float32's answer cannot be within 1e-3 of them, so float64 iterates
NOISE = np.r_[np.full(16, 0.01), np.zeros(8)]
X0, Y, TRUE = _problem(NOISE.size, NOISE)
KW = dict(args=(T,), in_axes=None)


@pytest.fixture(scope="module")
def f64():
    return ap.solve_nlsq_batch(decay, X0, ydata=Y, precision="f64", return_pcov=True, **KW)


@pytest.fixture(scope="module")
def adaptive():
    return ap.solve_nlsq_batch(decay, X0, ydata=Y, **KW)


def _within_se(x, ref):
    se = np.sqrt(np.diagonal(np.asarray(ref.pcov), axis1=1, axis2=2))
    return np.abs(np.asarray(x) - np.asarray(ref.x)) <= SE_FRACTION * se


def test_default_agrees_with_f64_within_a_thousandth_of_a_standard_error(adaptive, f64):
    noisy = NOISE > 0
    assert bool(adaptive.success.all()) and bool((np.asarray(adaptive.rung) == 1).all())
    assert _within_se(adaptive.x, f64)[noisy].all()
    # the noisy fits were verified by ONE float64 evaluation, not by iterating again
    extra = np.asarray(adaptive.njev) - np.asarray(adaptive.nit)
    assert (extra[noisy] == 1).all(), extra
    assert (np.asarray(adaptive.status)[noisy] == st.FTOL).all()


def test_top_rung_iterates_when_the_check_fails(adaptive, f64):
    exact = NOISE == 0
    extra = np.asarray(adaptive.njev) - np.asarray(adaptive.nit)
    assert (extra[exact] == 2).all(), extra       # float64 re-evaluated and iterated
    assert (extra[~exact] == 1).all(), extra      # ... only those: the others passed
    # ... to float64 accuracy: exact data are fitted to the truth, as float64 alone does
    np.testing.assert_allclose(np.asarray(adaptive.x)[exact], TRUE[exact], rtol=1e-9,
                               atol=1e-9)
    np.testing.assert_allclose(np.asarray(f64.x)[exact], TRUE[exact], rtol=1e-9, atol=1e-9)
    assert int(np.max(adaptive.nit)) < 40


@pytest.mark.slow  # default run: jit + agreement + iterate; CI runs this too
def test_failed_check_carries_the_damping_across_the_handoff():
    res = lambda x, b, s: x[0] * jnp.exp(-x[1] * T) + x[2] - b[0]
    f32, f64_ = make_fj(res, jnp.float32, jnp.float32), make_fj(res, jnp.float64, jnp.float64)
    o32 = LMOptions(1e-6, 1e-6, 1e-6, 50, se_below=0.5 * SE_FRACTION)
    o64 = LMOptions(1e-15, 1e-10, 1e-10, 50, se_accept=SE_FRACTION)
    y = (jnp.asarray(Y[14:18]),)                 # two noisy fits, two exact ones
    low = lm_run(f32, lm_init(f32, jnp.asarray(X0[14:18]), y, (), o32), y, (), o32)
    low = jax.tree.map(lambda a: a.astype(jnp.float64) if a.dtype == jnp.float32 else a, low)
    top = verify_handoff(f64_, low, y, (), o64)
    assert top.active.tolist() == [False, False, True, True]
    assert top.status.tolist()[:2] == [st.FTOL] * 2
    want = np.clip(np.asarray(low.lam), np.finfo(np.float64).eps, o64.lam0)
    np.testing.assert_array_equal(np.asarray(top.lam), want)
    assert (want < o64.lam0).all()               # carried, not restarted at lam0


def _solve(x0, y):
    r = ap.solve_nlsq_batch(decay, x0, ydata=y, **KW)
    return r.x, r.njev - r.nit


def _check(x, extra, f64):
    # inside a user's jit the Gram matrix is formed by other dots (batch/api.py: _core),
    # so float32's bits differ: the criterion, not bit equality
    x, extra = np.asarray(x).reshape(-1, 3), np.asarray(extra).ravel()
    noisy = NOISE > 0
    assert _within_se(x, f64)[noisy].all()
    np.testing.assert_allclose(x[~noisy], TRUE[~noisy], rtol=1e-9, atol=1e-9)
    assert (extra[noisy] == 1).all() and (extra[~noisy] == 2).all(), extra


@pytest.mark.slow  # the default ladder under jit: tests/test_batch.py::test_jit_and_vmap
def test_handoff_under_jit(f64):
    _check(*jax.jit(_solve)(X0, Y), f64)


@pytest.mark.slow
def test_handoff_under_vmap(f64):
    halves = lambda a: jnp.stack([a[:12], a[12:]])
    _check(*jax.vmap(_solve)(halves(X0), halves(Y)), f64)


@pytest.mark.slow  # default run: jit + agreement + iterate; CI runs this too
def test_handoff_under_grad(f64):
    noisy = slice(0, 4)

    def loss(y, precision):
        r = ap.solve_nlsq_batch(decay, X0[noisy], ydata=y, precision=precision, **KW)
        return jnp.sum(r.x[:, 1] ** 2), r.njev - r.nit

    y = jnp.asarray(Y[noisy])
    g, extra = jax.grad(loss, has_aux=True)(y, "adaptive")
    g64, _ = jax.grad(loss, has_aux=True)(y, "f64")
    assert (np.asarray(extra) == 1).all()        # the verified path was differentiated
    np.testing.assert_allclose(np.asarray(g), np.asarray(g64), rtol=1e-4, atol=1e-10)


# Noise 1e-4: float32 resolves x only to ~1e-3..1e-2 of the standard errors, so float32's
# answer is accepted by the single fit's SE_TAKEN clause (a step of up to 1e-2 standard
# errors, taken, when float32 measured Gauss-Newton contracting), not by the 1e-3 one.
# 24 fits: the bucket of the module's fixtures, whose compiled programs these reuse.
XQ, YQ, _ = _problem(24, np.full(24, 1e-4), seed=1)


@pytest.fixture(scope="module")
def quiet64():
    return ap.solve_nlsq_batch(decay, XQ, ydata=YQ, precision="f64", return_pcov=True, **KW)


def _se_distance(x, ref):
    se = np.sqrt(np.diagonal(np.asarray(ref.pcov), axis1=1, axis2=2))
    return np.max(np.abs(np.asarray(x) - np.asarray(ref.x)) / se, axis=1)


def test_low_noise_fits_take_the_handoff_within_a_hundredth_of_a_standard_error(quiet64):
    res = ap.solve_nlsq_batch(decay, XQ, ydata=YQ, **KW)
    assert bool(res.success.all())
    assert (_se_distance(res.x, quiet64) <= SE_TAKEN).all()
    one = np.asarray(res.njev) - np.asarray(res.nit) == 1
    assert one.mean() >= 1 / 3, one.mean()    # 2 of 24 without the record


def test_the_contraction_record_is_what_accepts_them(quiet64):
    # the same float32 answers verified with and without the lower rung's record
    res = lambda x, b, s: x[0] * jnp.exp(-x[1] * T) + x[2] - b[0]
    f32, f64_ = make_fj(res, jnp.float32, jnp.float32), make_fj(res, jnp.float64, jnp.float64)
    o32 = LMOptions(1e-6, 1e-6, 1e-6, 30, se_below=0.75 * SE_FRACTION)
    o64 = LMOptions(1e-15, 1e-10, 1e-10, 50, se_accept=SE_FRACTION)
    y = (jnp.asarray(YQ),)
    low = jax.jit(lambda x, y: lm_run(f32, lm_init(f32, x, y, (), o32), y, (), o32))(
        jnp.asarray(XQ, jnp.float32), y)
    assert np.isfinite(np.asarray(low.gn_rate)[:, 1:]).all()   # every fit measured a rate
    check = jax.jit(lambda low, y: verify_handoff(f64_, low, y, (), o64))
    measured = check(low, y)
    blind = check(low._replace(gn_rate=jnp.full_like(low.gn_rate, jnp.inf)), y)
    took, took_blind = ~np.asarray(measured.active), ~np.asarray(blind.active)
    assert (took >= took_blind).all() and took.sum() > took_blind.sum() + 6, (
        took.sum(), took_blind.sum())
    assert (_se_distance(measured.x, quiet64)[took] <= SE_TAKEN).all()
