"""Tests of solve_nlsq_batch: references are scipy least_squares(method="lm"), numpy
lstsq for linear problems, and the single-fit maths; compiled solvers are shared."""

from __future__ import annotations

import io

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.optimize import least_squares

import adaptprec as ap
from adaptprec._demos.batch import gauss2d, make_problem
from adaptprec.batch import BatchResult, TextProgress
from adaptprec.batch import _status as st
from adaptprec.batch._compile import tuned_jit
from adaptprec.batch.compaction import run_compacted
from adaptprec.batch.lm_batched import LMOptions, lm_init, lm_run, lm_step, make_fj

XY, DATA, TRUTH, X0 = make_problem(200, seed=1)
GAUSS_KW = dict(args=(XY,), in_axes=None, ydata=DATA)

T = np.linspace(0.0, 3.0, 20)


def decay(p, t):
    return p[0] * np.exp(-p[1] * t) + p[2] if isinstance(p, np.ndarray) else \
        p[0] * jnp.exp(-p[1] * t) + p[2]


def _decay_problem(b, seed=0):
    rng = np.random.default_rng(seed)
    true = np.column_stack([rng.uniform(1, 5, b), rng.uniform(0.3, 2.0, b), rng.uniform(-1, 1, b)])
    y = true[:, :1] * np.exp(-true[:, 1:2] * T) + true[:, 2:3] + 0.01 * rng.normal(size=(b, T.size))
    x0 = np.column_stack([np.ones(b), np.ones(b), np.zeros(b)])
    return x0, y, true


DX0, DY, DTRUE = _decay_problem(20)
TOL = dict(ftol=1e-12, xtol=1e-12, gtol=1e-12)
DECAY_KW = dict(args=(T,), in_axes=None, ydata=DY, precision="f64", **TOL)


@pytest.fixture(scope="module")
def gauss():
    return ap.solve_nlsq_batch(gauss2d, X0, **GAUSS_KW)


@pytest.fixture(scope="module")
def decay64():
    return ap.solve_nlsq_batch(decay, DX0, **DECAY_KW)


def _scipy(fun, x0):
    r = least_squares(fun, x0, method="lm")
    J = r.jac
    m, n = J.shape
    cov = np.linalg.inv(J.T @ J) * (2 * r.cost / (m - n))
    return r, np.sqrt(np.diag(cov))


# ----------------------------------------------------------------- agreement with scipy
@pytest.mark.slow
def test_adaptive_gaussian_agrees_with_scipy(gauss):
    assert isinstance(gauss, BatchResult)
    assert gauss.ladder == ("f32", "f64")
    assert gauss.x.dtype == jnp.float64
    assert bool(gauss.success.all())
    for k in range(0, 200, 17):
        ref, sd = _scipy(lambda p: np.asarray(gauss2d(p, XY)) - DATA[k], X0[k])
        # float32 bulk: within 1% of a standard error of scipy's float64 answer
        np.testing.assert_array_less(np.abs(np.asarray(gauss.x[k]) - ref.x), 0.01 * sd)
        assert abs(float(gauss.cost[k]) - ref.cost) <= 1e-5 * ref.cost


def test_f64_decay_matches_scipy_tightly(decay64):
    assert decay64.ladder == ("f64",) and bool((decay64.rung == 0).all())
    for k in range(20):
        ref = least_squares(lambda p: decay(p, T) - DY[k], DX0[k], method="lm", **TOL)
        np.testing.assert_allclose(np.asarray(decay64.x[k]), ref.x, rtol=1e-7, atol=1e-9)
        np.testing.assert_allclose(float(decay64.cost[k]), ref.cost, rtol=1e-12)
    np.testing.assert_array_less(np.abs(np.asarray(decay64.x) - DTRUE), 0.1)
    assert set(decay64.status_counts()) <= {1, 2, 3, 4}


def test_pcov_matches_scipy_curve_fit():
    from scipy.optimize import curve_fit
    r = ap.solve_nlsq_batch(decay, DX0[:4], args=(T,), in_axes=None, ydata=DY[:4],
                            precision="f64", return_pcov=True, **TOL)
    for k in range(4):
        popt, pcov = curve_fit(lambda t, a, b, c: decay(np.array([a, b, c]), t), T, DY[k],
                               p0=DX0[k])
        np.testing.assert_allclose(np.asarray(r.x[k]), popt, rtol=1e-6, atol=1e-8)
        np.testing.assert_allclose(np.asarray(r.pcov[k]), pcov, rtol=1e-4, atol=1e-12)


# ----------------------------------------------------------------- kernel properties
_FJ = make_fj(lambda x, b, s: x[0] * jnp.exp(-x[1] * s) + x[2] - b[0], jnp.float64, jnp.float64)
_OPTS = LMOptions(1e-10, 1e-10, 1e-10, 200)
# compiled as solve_nlsq_batch compiles its program (adaptprec.batch._compile): with those
# options every per-fit sum has a fixed order, so a fit's bits do not depend on its buffer
_jit = tuned_jit
_init = _jit(lambda x, b, s: lm_init(_FJ, x, b, s, _OPTS))
_step = _jit(lambda st_, b, s: lm_step(_FJ, st_, b, s, _OPTS))


def test_frozen_fits_do_not_change():
    s = _init(jnp.asarray(DX0[:6]), (jnp.asarray(DY[:6]),), jnp.asarray(T))
    frozen = jnp.array([True, False, True, False, False, True])
    s = s._replace(active=s.active & ~frozen)
    s2 = _step(s, (jnp.asarray(DY[:6]),), jnp.asarray(T))
    for a, b in zip(s, s2):
        np.testing.assert_array_equal(np.asarray(a)[np.asarray(frozen)],
                                      np.asarray(b)[np.asarray(frozen)])
    moved = np.asarray(~frozen)
    assert np.all(np.asarray(s2.nit)[moved] == 1) and np.all(np.asarray(s2.nfev)[moved] == 2)
    assert np.any(np.asarray(s.x)[moved] != np.asarray(s2.x)[moved])


def test_converged_start_is_returned_unchanged():
    exact = DTRUE[:3]
    y = exact[:, :1] * np.exp(-exact[:, 1:2] * T) + exact[:, 2:3]
    r = ap.solve_nlsq_batch(decay, exact, args=(T,), in_axes=None, ydata=y, precision="f64",
                            **TOL)
    np.testing.assert_array_equal(np.asarray(r.x), exact)
    assert bool(r.success.all()) and int(r.nit.max()) <= 1


@pytest.mark.slow
def test_compaction_gives_the_same_fits():
    x0 = jnp.asarray(np.tile(DX0, (4, 1)) * np.repeat([1.0, 3.0, 9.0, 0.2], 20)[:, None])
    y = (jnp.asarray(np.tile(DY, (4, 1))),)
    s0 = _init(x0, y, jnp.asarray(T))
    plain = _jit(lambda s, y: lm_run(_FJ, s, y, jnp.asarray(T), _OPTS))(s0, y)
    compact = _jit(lambda s, y: run_compacted(_FJ, s, y, jnp.asarray(T), _OPTS,
                                                 (80, 16)))(s0, y)
    assert int(np.ptp(np.asarray(plain.nit))) > 0  # some fits really straggle
    for a, b in zip(plain, compact):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


# ----------------------------------------------------------------- per-fit escalation
def _escalation_problem():
    rng = np.random.default_rng(3)
    b = 40
    shift = np.zeros(b)
    scale = np.ones(b)
    ill = np.arange(5, 10)      # nearly collinear columns: cond(J^T J) ~ 1e7
    huge = np.arange(20, 25)    # residuals ~1e30: cost overflows float32
    shift[ill] = 1e3
    scale[huge] = 1e30
    t = np.linspace(0.0, 1.0, 12)
    p = np.column_stack([rng.uniform(0.5, 2, b), rng.uniform(-2, 2, b)])
    y = scale[:, None] * (p[:, :1] + p[:, 1:2] * (t + shift[:, None])
                          + 0.01 * rng.normal(size=(b, t.size)))
    return t, shift, scale, y, sorted(set(ill) | set(huge))


@pytest.mark.slow
def test_guards_flag_exactly_the_fits_that_need_f64_and_every_fit_ends_on_f64():
    t, shift, scale, y, need = _escalation_problem()

    def model(p, c, s, t):
        return s * (p[0] + p[1] * (t + c))

    r = ap.solve_nlsq_batch(model, np.ones((40, 2)), (shift, scale, t), in_axes=(0, 0, None),
                            ydata=y, **TOL)
    why = np.asarray(r.escalation_reason)
    esc = np.flatnonzero(why != ap.Reason.VERIFY).tolist()
    assert esc == need and r.num_escalated == 10
    # (BUDGET: an ill-conditioned fit may spend the lower rung's step budget, the single
    # fit's common.lower_rung_budget, before a guard fires)
    assert set(why[need].tolist()) <= {ap.Reason.ILL_CONDITIONED, ap.Reason.NONFINITE,
                                       ap.Reason.SCHEDULE, ap.Reason.BUDGET}
    # a lower rung never ends a solve: every converged fit was finished on float64
    assert bool((np.asarray(r.rung) == 1).all())
    assert bool(r.success.all())
    for k in range(40):   # linear least squares: exact reference by lstsq in float64
        A = scale[k] * np.column_stack([np.ones_like(t), t + shift[k]])
        ref, res2 = np.linalg.lstsq(A, y[k], rcond=None)[:2]
        # every fit is verified in float64 (batch/verify.py): within 1e-3 of each
        # parameter's standard error of the exact answer (the flagged, ill-conditioned
        # ones have large standard errors; the others are well past float32 accuracy)
        se = np.sqrt(np.diag(np.linalg.inv(A.T @ A)) * res2[0] / (t.size - 2))
        if k not in need:
            np.testing.assert_allclose(np.asarray(r.x[k]), ref, rtol=1e-6, atol=1e-6)
        assert np.all(np.abs(np.asarray(r.x[k]) - ref) <= 1e-3 * se), k


# ----------------------------------------------------------------- chunks and blocks
@pytest.mark.slow
def test_chunked_blocked_streamed_equal_unchunked(decay64):
    seen = []
    chunked = ap.solve_nlsq_batch(decay, DX0, chunk_size=7, progress=lambda d, t: seen.append((d, t)),
                                  **DECAY_KW)
    assert seen == [(0, 20), (7, 20), (14, 20), (20, 20)]
    blocked = ap.solve_nlsq_batch(decay, DX0, block_size=8, **DECAY_KW)
    streamed = ap.solve_nlsq_batch(decay, DX0, block_size=6, compaction="stream", **DECAY_KW)
    for other in (chunked, blocked, streamed):
        for f in ("x", "cost", "status", "nit", "nfev", "rung"):
            np.testing.assert_allclose(np.asarray(getattr(other, f)),
                                       np.asarray(getattr(decay64, f)), rtol=1e-12, atol=0)
    buf = io.StringIO()
    ap.solve_nlsq_batch(decay, DX0, chunk_size=7, progress=TextProgress(buf), **DECAY_KW)
    assert "20/20 fits" in buf.getvalue()


# (slow: ~7s; CI runs the slow job too: keeps the default run near 10 min on 2 cores)
@pytest.mark.slow
def test_adaptive_bits_do_not_depend_on_blocks_chunks_or_batch_size():
    """docs/batch.md promises per-fit bits independent of block and buffer sizes. With
    1-3 lanes XLA:CPU rounded the float32 rung differently (newcomer audit 4: up to 4e-11
    in x with block_size 1-3, chunk_size=3 or a batch of 2); narrow work is now padded
    to ``MIN_LANES``."""
    rng = np.random.default_rng(1)
    t = np.linspace(0, 3, 30)
    a, k, c = rng.uniform(1, 3, 10), rng.uniform(0.5, 2, 10), rng.uniform(0, 1, 10)
    y = a[:, None] * np.exp(-k[:, None] * t) + c[:, None] + 0.05 * rng.standard_normal((10, 30))
    x0 = np.tile([1.0, 1.0, 0.0], (10, 1))
    kw = dict(args=(t,), in_axes=None)
    ref = ap.solve_nlsq_batch(decay, x0, ydata=y, **kw)
    assert bool(np.all(ref.success))
    for other, rows in ((ap.solve_nlsq_batch(decay, x0, ydata=y, block_size=3, **kw), 10),
                        (ap.solve_nlsq_batch(decay, x0, ydata=y, chunk_size=3, **kw), 10),
                        (ap.solve_nlsq_batch(decay, x0[:2], ydata=y[:2], **kw), 2)):
        for f in ("x", "cost", "nfev", "rung"):
            assert np.array_equal(np.asarray(getattr(other, f)),
                                  np.asarray(getattr(ref, f))[:rows]), f


# ----------------------------------------------------------------- transformations
@pytest.mark.slow
def test_jit_and_vmap(decay64):
    def solve(x0, y):
        return ap.solve_nlsq_batch(decay, x0, args=(T,), in_axes=None, ydata=y,
                                   precision="f64", **TOL).x

    jitted = jax.jit(solve)(DX0, DY)
    np.testing.assert_allclose(np.asarray(jitted), np.asarray(decay64.x), rtol=1e-12)
    stacked = jax.vmap(solve)(jnp.stack([DX0[:10], DX0[10:]]), jnp.stack([DY[:10], DY[10:]]))
    np.testing.assert_allclose(np.asarray(stacked).reshape(20, 3), np.asarray(decay64.x),
                               rtol=1e-12)


# ----------------------------------------------------------------- bad input
def test_bad_fit_does_not_spoil_the_others(gauss):
    data = DATA.copy()
    data[5, 3] = np.nan
    data[77] = np.inf
    r = ap.solve_nlsq_batch(gauss2d, X0, args=(XY,), in_axes=None, ydata=data)
    bad = [5, 77]
    assert r.status[np.array(bad)].tolist() == [st.NONFINITE_RESIDUAL] * 2
    assert not bool(r.success[5]) and "non-finite" in r.message(5)
    keep = np.setdiff1d(np.arange(200), bad)
    for f in ("x", "cost", "status", "rung", "nit"):
        np.testing.assert_array_equal(np.asarray(getattr(r, f))[keep],
                                      np.asarray(getattr(gauss, f))[keep])
    x0 = X0.copy()
    x0[9, 0] = np.nan
    r2 = ap.solve_nlsq_batch(gauss2d, x0, **GAUSS_KW)
    assert int(r2.status[9]) == st.NONFINITE_RESIDUAL and bool(r2.success[:9].all())
    with pytest.raises(ValueError, match=r"fits \[5, 77\]"):
        ap.solve_nlsq_batch(gauss2d, X0, args=(XY,), in_axes=None, ydata=data,
                            nan_policy="raise")


@pytest.mark.parametrize("call, match", [
    (lambda: ap.solve_nlsq_batch(decay, DX0[:3], args=(T,), in_axes=None, ydata=DY[:4]),
     "ydata must have shape"),
    (lambda: ap.solve_nlsq_batch(lambda p, y: p - y, np.zeros((3, 2)), (np.zeros((4, 2)),)),
     "batch size mismatch: x0 has 3 fits"),
    (lambda: ap.solve_nlsq_batch(decay, np.zeros((0, 3)), args=(T,), in_axes=None,
                                 ydata=np.zeros((0, 20))), "empty batch"),
    (lambda: ap.solve_nlsq_batch(decay, np.zeros(3), args=(T,), in_axes=None), r"shape \(B, n\)"),
    (lambda: ap.solve_nlsq_batch(lambda p: jnp.outer(p, p), np.zeros((2, 2))), "1-D"),
    (lambda: ap.solve_nlsq_batch(lambda p: p[:1], np.zeros((2, 2))), "m = 1 < n = 2"),
    (lambda: ap.solve_nlsq_batch(decay, DX0, args=(T,), in_axes=None, ydata=DY,
                                 sigma=np.ones(3)), "sigma must have shape"),
    (lambda: ap.solve_nlsq_batch(decay, DX0, args=(T,), in_axes=None, ydata=DY,
                                 nan_policy="drop"), "nan_policy"),
    (lambda: ap.solve_nlsq_batch(decay, DX0, args=(T,), in_axes=(0, 0)), "in_axes has 2"),
    (lambda: ap.solve_nlsq_batch(decay, DX0, args=(T,), in_axes=None, ydata=DY,
                                 precision="f8"), "unknown floating dtype alias"),
])
def test_boundary_errors(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_grad_by_implicit_differentiation_matches_finite_differences():
    y0 = jnp.asarray(DY[:2])

    def loss(y, t):
        r = ap.solve_nlsq_batch(decay, DX0[:2], args=(t,), in_axes=None, ydata=y,
                                precision="f64", **TOL)
        return jnp.sum(r.x[:, 1] ** 2) + jnp.sum(r.cost)

    gy, gt = jax.jit(jax.grad(loss, argnums=(0, 1)))(y0, jnp.asarray(T))
    h = 1e-6
    for i, j in [(0, 0), (1, 7), (0, 19)]:
        e = np.zeros(y0.shape)
        e[i, j] = h
        fd = (loss(y0 + e, jnp.asarray(T)) - loss(y0 - e, jnp.asarray(T))) / (2 * h)
        np.testing.assert_allclose(float(gy[i, j]), float(fd), rtol=1e-5, atol=1e-8)
    e = np.zeros(T.shape)
    e[4] = h
    fd = (loss(y0, jnp.asarray(T + e)) - loss(y0, jnp.asarray(T - e))) / (2 * h)
    np.testing.assert_allclose(float(gt[4]), float(fd), rtol=1e-5, atol=1e-8)


@pytest.mark.slow
def test_x64_off_adaptive_raises_and_f32_works():
    from _subprocess import run_python
    script = (
        "import jax, jax.numpy as jnp, numpy as np, adaptprec as ap\n"
        "t = np.linspace(0, 1, 8); y = 3 * np.exp(-np.array([[0.5], [2.0]]) * t)\n"
        "m = lambda p, t: p[0] * jnp.exp(-p[1] * t)\n"
        "r = ap.solve_nlsq_batch(m, np.ones((2, 2)), (t,), in_axes=None, ydata=y)\n"
        "assert isinstance(r.x, np.ndarray) and r.x.dtype == np.float64, r.x.dtype\n"
        "np.testing.assert_allclose(r.x, [[3, 0.5], [3, 2]], rtol=1e-10)\n"
        "try:\n"
        "    jax.jit(lambda y: ap.solve_nlsq_batch(m, jnp.ones((2, 2)), (t,), in_axes=None,"
        " ydata=y).x)(y)\n"
        "    raise SystemExit('no error')\n"
        "except ValueError as e:\n"
        "    assert 'jax_enable_x64' in str(e) and 'solve_nlsq_batch' in str(e)\n"
        "r = ap.solve_nlsq_batch(m, np.ones((2, 2)), (t,), in_axes=None, ydata=y, precision='f32')\n"
        "assert r.x.dtype == np.float32 and r.ladder == ('f32',)\n"
        "np.testing.assert_allclose(np.asarray(r.x), [[3, 0.5], [3, 2]], rtol=1e-5)\n"
        "print('OK')\n")
    proc = run_python(script, x64=False, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip() == "OK", proc.stderr[-3000:]


@pytest.mark.slow  # robust losses: tests/test_nlsq_core.py (single fits) in the default run
@pytest.mark.parametrize("loss", ["soft_l1", "cauchy"])
def test_robust_loss_matches_scipy_trf(loss):
    rng = np.random.default_rng(4)
    k = rng.uniform(0.5, 2.0, 5)
    y = 2 * np.exp(-k[:, None] * T) + 0.01 * rng.normal(size=(5, T.size))
    y[:, 5] += 1.0                                    # outliers
    y[:, 13] -= 0.7
    x0 = np.column_stack([np.full(5, 1.8), 1.2 * k, np.zeros(5)])
    r = ap.solve_nlsq_batch(decay, x0, args=(T,), in_axes=None, ydata=y, loss=loss,
                            f_scale=0.05, precision="f64", **TOL)
    for i in range(5):
        ref = least_squares(lambda p: decay(p, T) - y[i], x0[i], method="trf", loss=loss,
                            f_scale=0.05, **TOL)
        np.testing.assert_allclose(np.asarray(r.x[i]), ref.x, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(float(r.cost[i]), ref.cost, rtol=1e-8)
    plain = ap.solve_nlsq_batch(decay, x0, args=(T,), in_axes=None, ydata=y, precision="f64",
                                **TOL)   # the outliers pull the linear fit away
    assert np.abs(np.asarray(r.x[:, 1]) - k).max() < np.abs(np.asarray(plain.x[:, 1]) - k).max()


def test_escalated_counts_guards_not_the_top_rung_finish():
    # every adaptive fit ends on the top rung; only fits a guard sent up are escalated
    from adaptprec.batch import BatchResult

    z = jnp.zeros(3)
    r = BatchResult(z[:, None], z, jnp.array([2, 2, -3]), z == 0, jnp.ones(3, int), z, z, z,
                    z, None, ("f32", "f64"),
                    escalation_reason=jnp.array([ap.Reason.VERIFY, ap.Reason.OVERFLOW,
                                                 ap.Reason.NONFINITE]))
    assert r.escalated.tolist() == [False, True, True] and r.num_escalated == 2
