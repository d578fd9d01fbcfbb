"""Blocked normal equations for pointwise residuals: the jaxpr analysis that proves a
residual pointwise (and refuses everything else), blocked vs unblocked solves, padding,
robust losses, 2-D data, trace counts, jit/vmap/grad; the Gram-matrix covariance path
against scipy's SVD route."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import adaptprec as ap
from adaptprec.nlsq._blocks import PointBlocks, block_size
from adaptprec._pointwise import point_axes
from adaptprec.nlsq.common import _covariance_svd, covariance
from adaptprec.nlsq.curve_fit import _residual_for

M = 50
_t, _y = jnp.linspace(0.0, 1.0, M), jnp.zeros(M)
_X, _XT = jnp.ones((2, M)), jnp.ones((M, 2))

POINTWISE = {
    "exp": (lambda p, t, y: p[0] * jnp.exp(-p[1] * t) + p[2] - y, (_t, _y), (0, 0)),
    "rows_2d": (lambda p, X, y: p[0] * jnp.exp(-p[1] * X[0]) + p[2] * X[1] - y,
                (_X, _y), (1, 0)),
    "cols_2d": (lambda p, X, y: p[0] * X[:, 0] + p[2] * X[:, 1] - y, (_XT, _y), (0, 0)),
    "polyval_scan": (lambda p, t, y: jnp.polyval(p, t) - y, (_t, _y), (0, 0)),
    "basis_dot": (lambda p, t, y: p @ jnp.stack([t, t ** 2, jnp.ones_like(t)]) - y,
                  (_t, _y), (0, 0)),
    "where": (lambda p, t, y: jnp.where(t > p[0], t, p[1]) - y, (_t, _y), (0, 0)),
    "custom_jvp": (lambda p, t, y: jax.nn.softplus(p[0] * t) - y, (_t, _y), (0, 0)),
    "nested_jit": (lambda p, t, y: jax.jit(lambda a, b: a * jnp.sin(b))(p[0], t) - y,
                   (_t, _y), (0, 0)),
    "table_arg": (lambda p, t, y, c: c[0] * p[0] * t - y, (_t, _y, jnp.ones(3)),
                  (0, 0, None)),
}
NOT_POINTWISE = {
    "normalised": lambda p, t, y: p[0] * t - y / jnp.sum(y),
    "iota": lambda p, t, y: p[0] * jnp.arange(M) - y,
    "linspace_inside": lambda p, t, y: p[0] * jnp.linspace(0.0, 1.0, M) - y,
    "diff": lambda p, t, y: p[0] * jnp.diff(t, append=0.0) - y,
    "cumsum": lambda p, t, y: p[0] * jnp.cumsum(t) - y,
    "roll": lambda p, t, y: p[0] * jnp.roll(t, 1) - y,
    "reverse": lambda p, t, y: p[0] * t[::-1] - y,
    "matvec": lambda p, t, y: jnp.ones((M, M)) @ (p[0] * t) - y,
    "sort": lambda p, t, y: jnp.sort(p[0] * t) - y,
    "half": lambda p, t, y: jnp.concatenate([p[0] * t[: M // 2], y[M // 2:]]),
}


@pytest.mark.parametrize("name", sorted(POINTWISE))
def test_point_axes_accepts_pointwise(name):
    fn, args, want = POINTWISE[name]
    assert point_axes(fn, jnp.ones(3), args, M) == want


@pytest.mark.parametrize("name", sorted(NOT_POINTWISE))
def test_point_axes_refuses_coupled_points(name):
    assert point_axes(NOT_POINTWISE[name], jnp.ones(3), (_t, _y), M) is None


def test_point_axes_ambiguous_and_curve_fit_wrappers():
    sq = jnp.ones((M, M))  # two axes of length m: which one holds the points?
    assert point_axes(lambda p, a, y: p[0] * a[0] - y, jnp.ones(1), (sq, _y), M) is None
    model = _residual_for(lambda t, a, b: a * jnp.exp(-b * t), "1d")
    assert point_axes(model, jnp.ones(2), (_t, _y, _y), M) == (0, 0, 0)


def test_block_size_and_padding():
    assert block_size(1_000_000) == 4000 and block_size(100) == 100
    pb = PointBlocks(10, (1, None), size=4)
    X = jnp.arange(20.0).reshape(2, 10)
    blocked = pb.block((X, jnp.ones(2)))
    assert blocked[0].shape == (3, 4, 2) and pb.padded
    data, valid = pb.xs(blocked)
    Xb, _ = pb.unblock(blocked, [d[2] for d in data])
    np.testing.assert_array_equal(Xb, [[8, 9, 9, 9], [18, 19, 19, 19]])
    assert valid.sum() == 10
    ys = jnp.arange(12.0).reshape(3, 4)
    np.testing.assert_array_equal(pb.points(ys), np.arange(10.0))


# ------------------------------------------------------------------ blocked solves
# m = 10007 is prime: 3 blocks of 4096, the last one padded.
MB = 10_007
TB = np.linspace(0.0, 4.0, MB)
_rng = np.random.default_rng(3)
YB = 2.5 * np.exp(-1.1 * TB) + 0.7 * np.exp(-0.2 * TB) + 0.1 + 0.01 * _rng.standard_normal(MB)
YB_OUT = YB.copy()
YB_OUT[::50] += 0.5
PB0 = jnp.asarray([2.0, 1.0, 1.0, 0.3, 0.0])


def dexp_res(p, t, y):
    return p[0] * jnp.exp(-p[1] * t) + p[2] * jnp.exp(-p[3] * t) + p[4] - y


def dexp_res_unblocked(p, t, y):
    # the same residual through a reversal twice: not provably pointwise, so the solver
    # takes the ordinary path (the reference for the blocked one)
    return (p[0] * jnp.exp(-p[1] * t) + p[2] * jnp.exp(-p[3] * t) + p[4] - y)[::-1][::-1]


def _blocked_key_used(fn):
    from adaptprec.nlsq import _caches
    return [k[2].point_axes for k in list(_caches.PROGRAMS._data)
            if k[0] == "nlsq-object" and k[1] is fn]


@pytest.mark.slow
@pytest.mark.parametrize("loss", ["linear", pytest.param("soft_l1", marks=pytest.mark.slow)])
def test_blocked_matches_unblocked(loss):
    args = (jnp.asarray(TB), jnp.asarray(YB_OUT if loss != "linear" else YB))
    kw = dict(loss=loss, f_scale=0.05, precision="f64", ftol=1e-15, xtol=1e-15, gtol=1e-15)
    rb = ap.solve_nlsq(dexp_res, PB0, args=args, **kw)
    ru = ap.solve_nlsq(dexp_res_unblocked, PB0, args=args, **kw)
    assert set(_blocked_key_used(dexp_res)) == {(0, 0)}
    assert set(_blocked_key_used(dexp_res_unblocked)) <= {None}   # (or the dense program)
    assert bool(rb.success) and bool(ru.success)
    assert rb.fun.shape == (MB,) and rb.jac.shape == (MB, 5)
    # converged tightly; only the summation order of J^T J differs. With the robust
    # loss the minimum is flat down to rounding (scipy's differs from both by ~1e-7).
    np.testing.assert_allclose(rb.x, ru.x, rtol=1e-10 if loss == "linear" else 1e-6)
    np.testing.assert_allclose(rb.cost, ru.cost, rtol=1e-12)
    rtol, atol = (1e-9, 1e-12) if loss == "linear" else (1e-6, 1e-8)
    np.testing.assert_allclose(rb.fun, ru.fun, rtol=rtol, atol=atol)
    np.testing.assert_allclose(rb.jac, ru.jac, rtol=rtol, atol=atol)
    np.testing.assert_allclose(rb.grad, ru.grad, atol=1e-6 * float(jnp.max(jnp.abs(ru.jac))))


@pytest.mark.slow
def test_blocked_adaptive_reaches_the_float64_minimum():
    args = (jnp.asarray(TB), jnp.asarray(YB))
    ref = ap.solve_nlsq(dexp_res_unblocked, PB0, args=args, precision="f64",
                        ftol=1e-15, xtol=1e-15, gtol=1e-15)
    r = ap.solve_nlsq(dexp_res, PB0, args=args)
    assert bool(r.success) and r.rung_name == "f64" and int(r.rung_nfev[0]) >= 1
    # the valley is flat: cost equal to the last bits, parameters to ~1e-6
    np.testing.assert_allclose(r.cost, ref.cost, rtol=1e-14)
    np.testing.assert_allclose(r.x, ref.x, rtol=1e-5)


@pytest.mark.slow
def test_blocked_2d_data_curve_fit_and_pcov():
    X = np.stack([TB, np.cos(TB)])
    y = 1.5 * np.exp(-0.8 * X[0]) + 0.4 * X[1] + 0.01 * _rng.standard_normal(MB)

    def model(X, a, k, b):
        return a * jnp.exp(-k * X[0]) + b * X[1]

    popt, pcov = ap.curve_fit(model, jnp.asarray(X), jnp.asarray(y), p0=[1.0, 1.0, 0.0])
    import scipy.optimize as so
    ps, cs = so.curve_fit(lambda X, a, k, b: a * np.exp(-k * X[0]) + b * X[1], X, y,
                          p0=[1.0, 1.0, 0.0], method="lm")
    np.testing.assert_allclose(popt, ps, rtol=1e-7)
    np.testing.assert_allclose(pcov, cs, rtol=1e-5)


@pytest.mark.slow
def test_blocked_trace_count_is_bounded():
    calls = {"n": 0}

    def counted(p, t, y):
        calls["n"] += 1
        return p[0] * jnp.exp(-p[1] * t) + p[2] - y

    args = (jnp.asarray(TB), jnp.asarray(YB))
    # (the ladder asked for: "adaptive" runs float64 alone at this size, SMALL_F64_MN)
    ap.solve_nlsq(counted, jnp.asarray([1.0, 1.0, 0.0]), args=args, precision="f32,f64")
    # the full data in float64 (one trace, issue 36's _residual.traced_once, replayed for
    # the shape check, the pointwise analysis and the final evaluation), then one block
    # body per rung (a block is a new shape: 4096 points in float32, then float64)
    assert calls["n"] == 1 + 2, calls["n"]
    # a second solve of the same residual traces nothing (memoised sizes, point axes and
    # compiled solver): any retracing per solve shows here
    ap.solve_nlsq(counted, jnp.asarray([1.5, 1.0, 0.0]), args=args, precision="f32,f64")
    assert calls["n"] == 3


@pytest.mark.slow
def test_blocked_jit_vmap_grad():
    t = jnp.asarray(TB)

    def fit(y):
        return ap.solve_nlsq(dexp_res, PB0, args=(t, y), precision="f64", ftol=1e-15,
                             xtol=1e-15, gtol=1e-15).x

    # eager calls run a program compiled with other XLA options than the one inlined
    # into a user's jit: rounding differs in the last bits, and this valley is flat to
    # ~1e-8 in the parameters (cost equal to 1e-16)
    y = jnp.asarray(YB)
    x_eager = fit(y)
    np.testing.assert_allclose(jax.jit(fit)(y), x_eager, rtol=1e-6)
    ys = jnp.stack([y, y * 1.01])
    xs = jax.vmap(fit)(ys)
    np.testing.assert_allclose(xs[0], x_eager, rtol=1e-6)
    np.testing.assert_allclose(xs[1], fit(ys[1]), rtol=1e-6)
    # d x / d(scale of y): the model is linear in a1, a2, c, so scaling y scales them
    g = jax.jacfwd(lambda s: fit(y * s))(1.0)
    np.testing.assert_allclose(g[jnp.array([0, 2, 4])], x_eager[jnp.array([0, 2, 4])],
                               rtol=1e-5)
    np.testing.assert_allclose(g[jnp.array([1, 3])], 0.0, atol=1e-7)


# ------------------------------------------------------------------ covariance
def test_gram_covariance_matches_svd_route():
    rng = np.random.default_rng(0)
    J = jnp.asarray(rng.standard_normal((4000, 5)) * np.array([1e3, 1.0, 1e-2, 5.0, 1e-4]))
    cov = covariance(J)
    ref = _covariance_svd(J, float(np.sqrt(np.finfo(np.float64).eps)))
    assert np.all(np.isfinite(np.asarray(cov))) and np.all(np.isfinite(np.asarray(ref)))
    # entrywise relative to sqrt(cov_ii cov_jj) (near-zero correlations have no
    # relative accuracy in either route)
    scale = np.sqrt(np.outer(np.diag(ref), np.diag(ref)))
    np.testing.assert_allclose(cov / scale, ref / scale, atol=1e-11)
    np.testing.assert_allclose(np.diag(cov), np.diag(ref), rtol=1e-11)


def test_ill_conditioned_covariance_falls_back_to_svd():
    rng = np.random.default_rng(1)
    A = rng.standard_normal((4000, 4))
    J = jnp.asarray(np.column_stack([A, A[:, 0] + 1e-9 * A[:, 1]]))  # near-dependent
    cov = covariance(J)
    ref = _covariance_svd(J, float(np.sqrt(np.finfo(np.float64).eps)))
    np.testing.assert_array_equal(np.isinf(cov), np.isinf(ref))
    np.testing.assert_allclose(np.where(np.isinf(ref), 0, cov), np.where(np.isinf(ref), 0, ref))
    Jd = J.at[:, 4].set(J[:, 0])  # exactly dependent: not identifiable
    cov_d = covariance(Jd)
    assert bool(jnp.isinf(cov_d[0, 0])) and bool(jnp.isinf(cov_d[4, 4]))
