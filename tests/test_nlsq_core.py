"""solve_nlsq: references (scipy least_squares, closed forms, finite differences), the
precision trace, caching/trace counts, jit/vmap/grad, non-finite handling, bad input."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.optimize as so

import adaptprec as ap
from adaptprec.nlsq import Status, cache_info
from adaptprec.schedule import Fixed, StallEscalation

# ---------------------------------------------------------------- shared problems
T = np.linspace(0.0, 3.0, 40)
_rng = np.random.default_rng(0)
Y = 2.0 * np.exp(-1.3 * T) + 0.3 + 0.02 * _rng.standard_normal(T.size)
Y_OUT = Y.copy()
Y_OUT[::7] += 1.5  # outliers for the robust losses


def expo(p, t, y):
    return p[0] * jnp.exp(-p[1] * t) + p[2] - y


def expo_np(p, t, y):
    return p[0] * np.exp(-p[1] * t) + p[2] - y


def rosen(x):
    return jnp.array([10.0 * (x[1] - x[0] ** 2), 1.0 - x[0]])


P0 = np.array([1.0, 1.0, 0.0])
TIGHT = dict(ftol=1e-15, xtol=1e-15, gtol=1e-15)


def _scipy(fun, x0, args=(), **kw):
    return so.least_squares(fun, x0, args=args, **TIGHT, **kw)


# ---------------------------------------------------------------- basic accuracy
@pytest.mark.parametrize("method", ["lm", "gn", "trf"])
def test_rosenbrock_all_methods(method):
    res = ap.solve_nlsq(rosen, jnp.array([-1.2, 1.0]), method=method)
    np.testing.assert_allclose(np.asarray(res.x), [1.0, 1.0], rtol=1e-9)
    assert bool(res.success) and res.status_int in (1, 2, 3, 4)
    assert res.rung_name == "f64"


def test_expfit_matches_scipy_lm_and_trace():
    res = ap.solve_nlsq(expo, jnp.asarray(P0), args=(jnp.asarray(T), jnp.asarray(Y)))
    ref = _scipy(expo_np, P0, (T, Y), method="lm")
    np.testing.assert_allclose(np.asarray(res.x), ref.x, rtol=1e-8)
    np.testing.assert_allclose(float(res.cost), ref.cost, rtol=1e-12)
    np.testing.assert_allclose(np.asarray(res.fun), ref.fun, atol=1e-10)
    np.testing.assert_allclose(np.asarray(res.jac), ref.jac, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(np.asarray(res.grad), ref.jac.T @ ref.fun, atol=1e-9)
    # "adaptive" at this size (m n = 120) on CPU: float64 alone (common.SMALL_F64_MN)
    assert [t["rung"] for t in res.trace()] == ["f64"] and int(res.escalations) == 0
    # the ladder: started on f32, finished (and verified) on f64
    res = ap.solve_nlsq(expo, jnp.asarray(P0), args=(jnp.asarray(T), jnp.asarray(Y)),
                        precision="f32,f64")
    np.testing.assert_allclose(np.asarray(res.x), ref.x, rtol=1e-8)
    tr = res.trace()
    assert [t["rung"] for t in tr] == ["f32", "f64"]
    assert int(res.escalations) == 1 and tr[1]["nfev"] >= 2
    assert int(res.rung_nfev.sum()) == int(res.nfev)


@pytest.mark.parametrize("loss", ["soft_l1", pytest.param("cauchy", marks=pytest.mark.slow),
                                  pytest.param("huber", marks=pytest.mark.slow),
                                  pytest.param("arctan", marks=pytest.mark.slow)])
def test_robust_losses_match_scipy(loss):
    x0 = np.array([1.5, 1.0, 0.5])  # robust fits start near a least-squares fit
    res = ap.solve_nlsq(expo, jnp.asarray(x0), args=(jnp.asarray(T), jnp.asarray(Y_OUT)),
                        loss=loss, f_scale=0.1, method="trf")
    ref = _scipy(expo_np, x0, (T, Y_OUT), loss=loss, f_scale=0.1, method="trf")
    np.testing.assert_allclose(np.asarray(res.x), ref.x, rtol=1e-6)
    np.testing.assert_allclose(float(res.cost), ref.cost, rtol=1e-9)
    # the robust fit is much closer to the clean truth than plain least squares
    lin = _scipy(expo_np, P0, (T, Y_OUT), method="lm")
    assert abs(ref.x[0] - 2.0) < abs(lin.x[0] - 2.0)


@pytest.mark.slow
def test_callable_loss_equals_scipy_cauchy():
    x0 = np.array([1.5, 1.0, 0.5])
    res_c = ap.solve_nlsq(expo, jnp.asarray(x0), args=(jnp.asarray(T), jnp.asarray(Y_OUT)),
                          loss=lambda z: jnp.log1p(z), f_scale=0.1)
    ref = _scipy(expo_np, x0, (T, Y_OUT), loss="cauchy", f_scale=0.1, method="trf")
    np.testing.assert_allclose(np.asarray(res_c.x), ref.x, rtol=1e-6)


def test_bounds_match_scipy_trf():
    lb, ub = np.array([0.0, 1.5, -1.0]), np.array([1.8, 5.0, 1.0])
    x0 = np.array([1.0, 2.0, 0.0])
    res = ap.solve_nlsq(expo, jnp.asarray(x0), args=(jnp.asarray(T), jnp.asarray(Y)),
                        bounds=(lb, ub))
    ref = _scipy(expo_np, x0, (T, Y), bounds=(lb, ub), method="trf")
    np.testing.assert_allclose(np.asarray(res.x), ref.x, rtol=1e-6, atol=1e-9)
    np.testing.assert_array_equal(np.asarray(res.active_mask), ref.active_mask)
    assert list(np.asarray(res.active_mask)) == [1, -1, 0]
    x = np.asarray(res.x)
    assert np.all(x >= lb) and np.all(x <= ub)
    np.testing.assert_allclose(float(res.cost), ref.cost, rtol=1e-9)


@pytest.mark.slow
def test_traced_bounds_under_jit_and_vmap():
    lb, ub = np.array([0.0, 1.5, -1.0]), np.array([1.8, 5.0, 1.0])
    x0 = jnp.asarray([1.0, 2.0, 0.0])
    args = (jnp.asarray(T), jnp.asarray(Y))

    def fit(ub):
        return ap.solve_nlsq(expo, x0, args=args, bounds=(jnp.asarray(lb), ub)).x

    eager = fit(ub)
    np.testing.assert_allclose(jax.jit(fit)(jnp.asarray(ub)), eager, rtol=1e-7, atol=1e-10)
    ubs = jnp.stack([jnp.asarray(ub), jnp.asarray([1.9, 5.0, 1.0]), jnp.full(3, jnp.inf)])
    xs = jax.vmap(fit)(ubs)
    np.testing.assert_allclose(xs[0], eager, rtol=1e-7, atol=1e-10)
    np.testing.assert_allclose(xs[1], fit(np.asarray(ubs[1])), rtol=1e-7, atol=1e-10)
    # upper bounds at +inf (known only at run time): scipy trf with lower bounds only
    ref = _scipy(expo_np, np.asarray(x0), (T, Y), bounds=(lb, np.inf), method="trf")
    np.testing.assert_allclose(xs[2], ref.x, rtol=1e-6, atol=1e-9)
    assert np.all(np.asarray(xs[:2]) <= np.asarray(ubs[:2]) + 1e-12)


def test_pytree_x0_and_residual():
    def resid(p, t, y):
        r = p["a"] * jnp.exp(-p["k"] * t) + p["c"] - y
        return {"head": r[:20], "tail": r[20:]}

    p0 = {"a": jnp.array(1.0), "k": jnp.array(1.0), "c": jnp.array(0.0)}
    res = ap.solve_nlsq(resid, p0, args=(jnp.asarray(T), jnp.asarray(Y)))
    ref = _scipy(expo_np, P0, (T, Y), method="lm")
    assert set(res.x) == {"a", "k", "c"}
    np.testing.assert_allclose([float(res.x[k]) for k in ("a", "k", "c")], ref.x, rtol=1e-8)
    assert res.fun.shape == (T.size,)


def test_user_jacobian_and_rev_mode():
    def jac(p, t, y):
        e = jnp.exp(-p[1] * t)
        return jnp.stack([e, -p[0] * t * e, jnp.ones_like(t)], axis=1)

    args = (jnp.asarray(T), jnp.asarray(Y))
    r1 = ap.solve_nlsq(expo, jnp.asarray(P0), args=args, jac=jac)
    ref = _scipy(expo_np, P0, (T, Y), method="lm")
    np.testing.assert_allclose(np.asarray(r1.x), ref.x, rtol=1e-8)


@pytest.mark.slow
def test_rev_mode_normal_equations():
    args = (jnp.asarray(T), jnp.asarray(Y))
    r2 = ap.solve_nlsq(expo, jnp.asarray(P0), args=args, jac="rev", linear_solver="normal")
    ref = _scipy(expo_np, P0, (T, Y), method="lm")
    np.testing.assert_allclose(np.asarray(r2.x), ref.x, rtol=1e-8)


# ---------------------------------------------------------------- precision control
def test_fixed_precisions_and_schedule():
    args = (jnp.asarray(T), jnp.asarray(Y))
    ref = _scipy(expo_np, P0, (T, Y), method="lm").x
    r32 = ap.solve_nlsq(expo, jnp.asarray(P0), args=args, precision="f32")
    assert r32.rung_name == "f32" and r32.x.dtype == jnp.float32
    assert int(r32.escalations) == 0
    np.testing.assert_allclose(np.asarray(r32.x), ref, rtol=2e-3)
    # a user schedule is consulted: an eager stall schedule leaves f32 after one step;
    # convergence is still only declared on f64
    rst = ap.solve_nlsq(expo, jnp.asarray(P0), args=args,
                        schedule=StallEscalation(rate=0.5, patience=1))
    default = ap.solve_nlsq(expo, jnp.asarray(P0), args=args, precision="f32,f64")
    assert rst.rung_name == "f64" and int(rst.escalation_reason[1]) == ap.Reason.SCHEDULE
    # (the default leaves f32 as early here since issue 15: at float32's resolution)
    assert int(rst.rung_entered[1]) <= int(default.rung_entered[1])
    np.testing.assert_allclose(np.asarray(rst.x), ref, rtol=1e-9)


@pytest.mark.slow
def test_fixed_schedule_and_f64():
    args = (jnp.asarray(T), jnp.asarray(Y))
    r64 = ap.solve_nlsq(expo, jnp.asarray(P0), args=args, precision="f64")
    assert int(r64.escalations) == 0 and r64.rung_name == "f64"
    rs = ap.solve_nlsq(expo, jnp.asarray(P0), args=args, schedule=Fixed(0))
    assert rs.rung_name == "f64"  # built-in convergence trigger still verifies on f64
    np.testing.assert_allclose(np.asarray(rs.x), np.asarray(r64.x), rtol=1e-9)


def test_overflow_on_low_rung_escalates():
    # exp(100) overflows float32 but not float64: the low rung gives Inf -> escalate
    def r(x):
        return jnp.exp(100.0 * x) - jnp.exp(100.0 * jnp.array([1.0, 1.01]))

    res = ap.solve_nlsq(r, jnp.array([0.9, 0.9]), precision="f32,f64")
    np.testing.assert_allclose(np.asarray(res.x), [1.0, 1.01], rtol=1e-10)
    assert int(res.escalation_reason[1]) == ap.Reason.NONFINITE


def test_nonfinite_residual_gives_status_not_answer():
    def r(x):  # NaN everywhere except at x0 -> every trial step is non-finite
        return jnp.where(jnp.abs(x[0] - 3.0) < 1e-12, x - 1.0, jnp.nan)

    res = ap.solve_nlsq(r, jnp.array([3.0]), precision="f64")
    assert not bool(res.success) and res.status_int == Status.NO_FINITE_STEP
    assert "non-finite" in res.message
    assert np.isfinite(float(res.x[0]))  # the last finite iterate, flagged as a failure
    # NaN at x0 on every rung: status -3, and throw=True raises with the message
    with pytest.raises(Exception, match="status -3"):
        ap.solve_nlsq(lambda x: jnp.sqrt(x - 10.0), jnp.array([1.0, 2.0]), throw=True)


def test_max_steps_status():
    res = ap.solve_nlsq(rosen, jnp.array([-1.2, 1.0]), max_steps=3, precision="f64")
    assert res.status_int == Status.MAX_STEPS and int(res.nit) == 3
    assert not bool(res.success)


# ---------------------------------------------------------------- compile cost
def test_cache_and_trace_count():
    calls = {"n": 0}

    def counted(p, t, y):
        calls["n"] += 1
        return p[0] * jnp.exp(-p[1] * t) + p[2] - y

    args = (jnp.asarray(T), jnp.asarray(Y))
    r1 = ap.solve_nlsq(counted, jnp.asarray(P0), args=args, precision="f32,f64")
    first = calls["n"]
    # traced once per shape and dtype (_residual.traced_once): the boundary
    # shape check at m = 40 (the pointwise analysis reuses it), then each rung on the
    # data padded to its bucket, 48 (the loop's branches and the final evaluation reuse
    # those)
    assert first == 1 + 2, first
    before = cache_info()["PROGRAMS"]["size"]
    r2 = ap.solve_nlsq(counted, jnp.asarray(P0) + 0.1, args=(args[0], args[1] * 1.01),
                       precision="f32,f64")
    assert calls["n"] == first  # no retrace: the shape check is memoised too
    assert cache_info()["PROGRAMS"]["size"] == before   # and no new program
    assert not np.allclose(np.asarray(r1.x), np.asarray(r2.x))


# ---------------------------------------------------------------- jit / vmap / grad
def _linfit(c, t, y):
    return c[0] + c[1] * t - y


@pytest.mark.slow
def test_jit_vmap_grad():
    t, y = jnp.asarray(T), jnp.asarray(Y)

    @jax.jit
    def fit(y):
        return ap.solve_nlsq(expo, jnp.asarray(P0), args=(t, y)).x

    ref = _scipy(expo_np, P0, (T, Y), method="lm").x
    ys = jnp.stack([y, y * 1.1, y + 0.2])
    xs = jax.vmap(fit)(ys)  # solve under jit + vmap (rungs: whole batch escalates)
    for i in range(3):
        r = _scipy(expo_np, P0, (T, np.asarray(ys[i])), method="lm").x
        np.testing.assert_allclose(np.asarray(xs[i]), r, rtol=1e-7)
    np.testing.assert_allclose(np.asarray(xs[0]), ref, rtol=1e-8)

    # grad of the solution w.r.t. the data, by implicit differentiation, against central
    # finite differences of independent (scipy) solutions
    gk = jax.grad(lambda y: fit(y)[1])(y)
    h = 1e-4
    e = np.zeros_like(Y)
    for i in (0, 13, 39):
        e[:] = 0
        e[i] = h
        fd = (_scipy(expo_np, ref, (T, Y + e), method="lm").x[1]
              - _scipy(expo_np, ref, (T, Y - e), method="lm").x[1]) / (2 * h)
        np.testing.assert_allclose(float(gk[i]), fd, rtol=1e-4, atol=1e-9)


@pytest.mark.slow
def test_grad_linear_closed_form():
    t, y = jnp.asarray(T), jnp.asarray(Y)
    A = np.stack([np.ones_like(T), T], axis=1)

    def slope(y):
        return ap.solve_nlsq(_linfit, jnp.zeros(2), args=(t, y)).x[1]

    g = jax.grad(slope)(y)
    np.testing.assert_allclose(np.asarray(g), np.linalg.pinv(A)[1], rtol=1e-8, atol=1e-12)


# ---------------------------------------------------------------- bad input
@pytest.mark.parametrize("kwargs,x0,args,exc,match", [
    ({}, jnp.array([jnp.nan, 1.0, 0.0]), (T, Y), ValueError, "x0 contains NaN"),
    ({}, jnp.asarray(P0), (T, np.where(T > 1, np.inf, Y)), ValueError, "data in args"),
    ({"bounds": (0.0, 0.5)}, jnp.asarray(P0), (T, Y), ValueError, "outside the bounds"),
    ({"bounds": ([0, 0, 0], [1, 0, 1])}, jnp.asarray(P0), (T, Y), ValueError,
     "strictly less"),
    ({"method": "lm"}, jnp.asarray(P0), (T[:2], Y[:2]), ValueError, "m=2 residuals"),
    ({"method": "lm", "bounds": (-5, 5)}, jnp.asarray(P0), (T, Y), ValueError,
     "does not support bounds"),
    ({"loss": "l2"}, jnp.asarray(P0), (T, Y), ValueError, "loss='l2'"),
    ({"method": "newton"}, jnp.asarray(P0), (T, Y), ValueError, "method='newton'"),
    ({"x_scale": -1.0}, jnp.asarray(P0), (T, Y), ValueError, "x_scale"),
    ({"precision": "f8"}, jnp.asarray(P0), (T, Y), ValueError, "alias"),
])
def test_bad_input(kwargs, x0, args, exc, match):
    with pytest.raises(exc, match=match):
        ap.solve_nlsq(expo, x0, args=args, **kwargs)


def test_bad_residual_shapes():
    # a scalar residual is one residual (scipy's atleast_1d); lm then needs m >= n
    with pytest.raises(ValueError, match="at least as many residuals"):
        ap.solve_nlsq(lambda x: jnp.sum(x ** 2), jnp.ones(2))
    with pytest.raises(ValueError, match=r"shape \(2, 2\)"):
        ap.solve_nlsq(lambda x: jnp.outer(x, x), jnp.ones(2))
    with pytest.raises(TypeError, match="callable"):
        ap.solve_nlsq("not a function", jnp.ones(2))


def test_status_messages_and_result_pytree():
    res = ap.solve_nlsq(rosen, jnp.array([-1.2, 1.0]))
    assert isinstance(res, ap.NLSQResult) and len(jax.tree_util.tree_leaves(res)) > 0
    assert "f64" in res.message
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        leaves = jax.tree.leaves(res)
    assert all(isinstance(leaf, jax.Array) for leaf in leaves)


# ---------------------------------------------------------------- optimistix adapter
def test_optimistix_adapter_nist():
    import optimistix as optx

    from adaptprec.nlsq import MoreLM
    from nist_problems import load, lre

    p = load("Misra1a")

    def fn(b, args):
        return p.model(b, args[0]) - args[1]

    sol = optx.least_squares(fn, MoreLM(rtol=1e-12, atol=1e-12), jnp.asarray(p.starts[0]),
                             args=(jnp.asarray(p.x), jnp.asarray(p.y)), max_steps=500)
    assert lre(sol.value, p.certified) >= 6.0
    assert int(sol.stats["status"]) > 0


# ---------------------------------------------------------------- tall problems
@pytest.mark.slow
def test_tall_problem_normal_equations_f32_phase():
    # m > 4096: normal equations accumulated on the f32 rung. The f32 phase must land
    # next to the f64 optimum (regression: an m-dependent rank threshold once dropped
    # directions and sent f32 to a wrong point), so f64 only verifies.
    m = 20000
    t = np.linspace(0.0, 10.0, m)
    rng = np.random.default_rng(3)
    y = 3.0 * np.exp(-1.7 * t) + 1.2 * np.exp(-0.23 * t) + 0.4 + 0.01 * rng.standard_normal(m)

    def dexp(p, t, y):
        return p[0] * jnp.exp(-p[1] * t) + p[2] * jnp.exp(-p[3] * t) + p[4] - y

    p0 = np.array([2.0, 1.0, 1.0, 0.1, 0.0])
    res = ap.solve_nlsq(dexp, jnp.asarray(p0), args=(jnp.asarray(t), jnp.asarray(y)))
    ref = so.least_squares(
        lambda p: p[0] * np.exp(-p[1] * t) + p[2] * np.exp(-p[3] * t) + p[4] - y, p0,
        method="lm", ftol=1e-15, xtol=1e-15, gtol=1e-15)
    np.testing.assert_allclose(np.asarray(res.x), ref.x, rtol=1e-7)
    assert res.trace()[-1]["rung"] == "f64" and res.trace()[-1]["nfev"] <= 4


@pytest.mark.slow
def test_x64_off_subprocess():
    # x64 off: an eager adaptive solve runs in float64 inside jax.enable_x64(True) and
    # returns NumPy float64 (the global flag is untouched); float32 only when asked for
    import os
    import subprocess
    import sys

    code = (
        "import jax, jax.numpy as jnp, numpy as np, adaptprec as ap\n"
        "rosen = lambda x: jnp.array([10*(x[1]-x[0]**2), 1-x[0]])\n"
        "r = ap.solve_nlsq(rosen, jnp.array([-1.2, 1.0]))\n"
        "assert isinstance(r.x, np.ndarray) and r.x.dtype == np.float64, r\n"
        "assert r.rung_name == 'f64' and abs(r.x[0] - 1) < 1e-12 and bool(r.success)\n"
        "assert not jax.config.read('jax_enable_x64')\n"
        "r = ap.solve_nlsq(rosen, jnp.array([-1.2, 1.0]), precision='f32')\n"
        "assert r.x.dtype == jnp.float32 and r.rung_name == 'f32', r\n"
        "try:\n"
        "    jax.jit(lambda x0: ap.solve_nlsq(lambda x: x - 1, x0).x)(jnp.ones(2))\n"
        "    raise SystemExit('no error')\n"
        "except ValueError as e:\n"
        "    assert 'jax_enable_x64' in str(e) and 'solve_nlsq' in str(e)\n"
        "print('ok')\n")
    env = {**os.environ, "JAX_ENABLE_X64": "0"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0 and "ok" in out.stdout, out.stderr[-2000:]


def test_gauss_newton_step_keeps_small_singular_directions():
    """Regression (NIST MGH17 start 1): a direction with ``s`` between
    ``eps max(m, n) s0`` and ``sqrt(eps max(m, n)) s0`` is numerically full rank and must
    be in the Gauss–Newton step (scipy's rank test is on ``s``, not ``s**2``)."""
    from adaptprec.nlsq.common import solve_lsq_trust_region

    s = jnp.array([1.0, 1e-9])
    uf = jnp.array([-1.0, -1e-9])          # U^T f; the exact step is -uf / s = (1, 1)
    p, alpha, gn = solve_lsq_trust_region(s, jnp.eye(2), s * uf, 10.0, 0.0, 30)
    np.testing.assert_allclose(np.asarray(p), np.linalg.lstsq(np.diag([1.0, 1e-9]),
                                                              -np.asarray(uf))[0], rtol=1e-6)
    assert bool(gn) and float(alpha) == 0.0


@pytest.mark.slow
def test_residual_closing_over_a_traced_value():
    # newcomer audit 2: x0 and args concrete inside the user's jit, the residual closing
    # over a traced scale: the eager machinery (host loop, AOT programs) crashed
    t = np.linspace(0.0, 3.0, 20)
    y = 2.0 * np.exp(-1.3 * t)
    with jax.enable_x64(True):
        fit = jax.jit(lambda s: ap.solve_nlsq(
            lambda p, t, y: p[0] * jnp.exp(-p[1] * t) - s * y, np.array([1.0, 1.0]),
            args=(t, y)).x)
        np.testing.assert_allclose(np.asarray(fit(1.0)), [2.0, 1.3], rtol=1e-8)
        cf = jax.jit(lambda s: ap.curve_fit(lambda t, a, k: s * a * jnp.exp(-k * t), t, y,
                                            p0=[1.0, 1.0])[0])
        np.testing.assert_allclose(np.asarray(cf(1.0)), [2.0, 1.3], rtol=1e-8)
        fb = jax.jit(lambda s: ap.solve_nlsq_batch(
            lambda p, t: s * p[0] * jnp.exp(-p[1] * t), np.ones((2, 2)), (t,),
            in_axes=None, ydata=np.stack([y, y])).x)
        np.testing.assert_allclose(np.asarray(fb(1.0)), [[2.0, 1.3]] * 2, rtol=1e-8)


@pytest.mark.slow
def test_schedule_observer_sees_only_the_updates_the_solver_makes():
    # newcomer audit 2: Callback/FitTrace got a first "step" at cost inf and one per rung
    # entered (updates the loop then discards): 9 calls for 6 iterations
    from adaptprec.schedule import Callback
    t = np.linspace(0.0, 3.0, 50)
    y = 2.0 * np.exp(-1.3 * t) + 0.3 + 0.01 * np.sin(9.0 * t)
    seen = []
    cb = Callback(lambda s, rung: seen.append((float(s.value), bool(s.accepted))))
    ap.solve_nlsq(lambda p, t, y: p[0] * jnp.exp(-p[1] * t) + p[2] - y,
                  jnp.array([1.0, 1.0, 0.0]), args=(t, y), schedule=cb)
    jax.effects_barrier()
    assert seen and all(np.isfinite(v) and acc for v, acc in seen), seen
    trace = ap.FitTrace()
    ap.curve_fit(lambda t, a, k, c: a * jnp.exp(-k * t) + c, t, y, p0=[1.0, 1.0, 0.0],
                 schedule=trace)
    assert np.all(np.isfinite(trace.cost)) and len(set(trace.steps)) == len(trace.steps)


def test_fixed_schedule_starts_on_its_rung():
    # newcomer audit 2: Fixed("f64") ran float32 first and escalated at its first update
    from adaptprec.schedule import Fixed
    t = np.linspace(0.0, 3.0, 50)
    y = 2.0 * np.exp(-1.3 * t) + 0.3
    res = ap.solve_nlsq(lambda p, t, y: p[0] * jnp.exp(-p[1] * t) + p[2] - y,
                        jnp.array([1.0, 1.0, 0.0]), args=(t, y), schedule=Fixed("f64"))
    assert [r["rung"] for r in res.trace()] == ["f64"] and bool(res.success)
    assert res.trace()[0]["reason"] == "start"
