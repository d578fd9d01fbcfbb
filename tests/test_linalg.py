"""adaptprec.linalg: solve (LU-IR, GMRES-IR, fallback), lstsq, matmul, bad input, AD.

References are independent: numpy/scipy float64 solves, jnp.linalg.solve in float64,
closed forms and finite differences. Shapes are few (N = 32) so that the jitted solvers
compile once per configuration.
"""

import math

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import adaptprec as ap
from adaptprec.linalg import SolveInfo

CONVERGED = int(ap.Status.CONVERGED)

N = 32
U64 = 2.0 ** -53
U32 = 2.0 ** -24

_solve_lu = jax.jit(lambda A, b: ap.linalg.solve(A, b))
_solve_gm = jax.jit(lambda A, b: ap.linalg.solve(A, b, refine="gmres"))
_ref = jax.jit(jnp.linalg.solve)
_lstsq = jax.jit(lambda A, b: ap.linalg.lstsq(A, b))


def prescribed(kappa, n=N, seed=0, m=None):
    """Random (m x n) matrix with singular values logspaced from 1 to 1/kappa."""
    rng = np.random.default_rng(seed)
    m = n if m is None else m
    u, _ = np.linalg.qr(rng.standard_normal((m, n)))
    v, _ = np.linalg.qr(rng.standard_normal((n, n)))
    s = np.logspace(0, -np.log10(kappa), n)
    return (u * s) @ v.T


def eta(A, x, b):
    """Normwise backward error (Rigal–Gaches, inf-norms), max over columns, in numpy."""
    A, x, b = (np.asarray(t, np.float64) for t in (A, x, b))
    x2, b2 = x.reshape(len(x), -1), b.reshape(len(b), -1)
    r = np.abs(b2 - A @ x2).max(0)
    den = np.abs(A).sum(1).max() * np.abs(x2).max(0) + np.abs(b2).max(0)
    return float((r / den).max())


def relerr(x, ref):
    x, ref = np.asarray(x), np.asarray(ref)
    return float(np.abs(x - ref).max() / np.abs(ref).max())


def check_sweep_point(solver, kappa, seed):
    """The issue's sweep criterion: backward error within a small constant of float64's,
    or fell_back set and the float64 answer."""
    A = prescribed(kappa, seed=seed)
    b = np.random.default_rng(seed + 100).standard_normal(N)
    x, info = solver(A, b)
    x_ref = np.asarray(_ref(A, b))
    be, be_ref = eta(A, x, b), eta(A, x_ref, b)
    assert bool(info.success) and int(info.status) == CONVERGED
    # the reported backward error is the one we recompute independently
    assert float(info.backward_error) == pytest.approx(be, rel=1e-6, abs=1e-300)
    # dsgesv's stopping rule caps eta at sqrt(n) u; measured ratios to LAPACK float64 are
    # far smaller (see docs/linalg.md). C is that cap expressed relative to max(be_ref, u).
    assert be <= 2 * math.sqrt(N) * max(be_ref, U64)
    # both answers are backward stable, so they agree to about kappa * u
    assert relerr(x, x_ref) <= 50 * kappa * U64 * N
    if bool(info.fell_back):
        assert int(info.reason) == ap.Reason.STAGNATION
        assert relerr(x, x_ref) <= 50 * kappa * U64
    else:
        assert int(info.reason) == ap.Reason.NONE
    return info


KAPPAS = [1e0, 1e2, 1e4, 1e6, 1e8, 1e10, 1e12, 1e14]


@pytest.mark.slow
@pytest.mark.parametrize("kappa", KAPPAS)
def test_kappa_sweep_lu(kappa):
    info = check_sweep_point(_solve_lu, kappa, seed=1)
    if kappa <= 1e6:          # kappa * u_f32 < 0.1: LU-IR converges, no fallback
        assert not bool(info.fell_back)
        assert int(info.iterations) <= 6
    if kappa >= 1e10:         # kappa * u_f32 >> 1: refinement cannot converge
        assert bool(info.fell_back)


@pytest.mark.slow
@pytest.mark.parametrize("kappa", KAPPAS)
def test_kappa_sweep_gmres(kappa):
    info = check_sweep_point(_solve_gm, kappa, seed=2)
    if kappa <= 1e8:          # GMRES-IR extends the no-fallback range beyond LU-IR's
        assert not bool(info.fell_back)
    if kappa >= 1e14:
        assert bool(info.fell_back)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("kappa", 10.0 ** np.arange(0, 15))
@pytest.mark.parametrize("refine", ["lu", "gmres"])
def test_kappa_sweep_full(kappa, seed, refine):
    check_sweep_point(_solve_lu if refine == "lu" else _solve_gm, kappa, seed=10 + seed)


@pytest.mark.parametrize("seed", [3, 4, 5])
def test_cond_estimate_in_info_within_factor_3(seed):
    # kappa_inf; f32 factors (two Hager–Higham steps) for the first two, f64 after fallback
    for kappa in (1e1, 1e5, 1e12):
        A = prescribed(kappa, seed=seed)
        _, info = _solve_lu(A, np.ones(N))
        true = np.linalg.cond(A, np.inf)
        assert bool(info.fell_back) == (kappa > 1e6)
        assert true / 3 <= float(info.cond_estimate) <= true * 1.01


def test_cond_estimate_in_info_structured_matrices():
    """Matrices where the starting vector matters: 1-D Poisson (inverse positive: x = e/n
    is exact), Kahan (triangular, graded), one tiny singular value."""
    rng = np.random.default_rng(40)
    u, _ = np.linalg.qr(rng.standard_normal((N, N)))
    v, _ = np.linalg.qr(rng.standard_normal((N, N)))
    s = np.ones(N)
    s[-1] = 1e-5
    t = 1.2
    kahan = np.diag(np.sin(t) ** np.arange(N)) @ (np.eye(N) - np.cos(t)
                                                  * np.triu(np.ones((N, N)), 1))
    for A in (2 * np.eye(N) - np.eye(N, k=1) - np.eye(N, k=-1), kahan, (u * s) @ v.T):
        _, info = _solve_lu(A, np.ones(N))
        true = np.linalg.cond(A, np.inf)
        assert not bool(info.fell_back)
        assert true / 3 <= float(info.cond_estimate) <= true * 1.01


@pytest.mark.slow
def test_batch_multiple_rhs_falls_back_only_where_needed():
    A = np.stack([prescribed(1e2, seed=4), prescribed(1e12, seed=5)])
    B = np.random.default_rng(7).standard_normal((2, N, 2))
    x, info = ap.linalg.solve(A, B)
    assert x.shape == (2, N, 2) and info.status.shape == (2,)
    assert info.fell_back.tolist() == [False, True]
    assert info.status.tolist() == [CONVERGED, CONVERGED]
    assert info.reason.tolist() == [ap.Reason.NONE, ap.Reason.STAGNATION]
    for i in range(2):
        assert relerr(x[i], np.linalg.solve(A[i], B[i])) <= 1e3 * np.linalg.cond(A[i]) * U64
        assert eta(A[i], x[i], B[i]) <= 2 * math.sqrt(N) * U64


@pytest.mark.slow
def test_batched_vectors_and_broadcast_b():
    A = np.stack([prescribed(10.0, seed=s) for s in range(2)])
    b = np.random.default_rng(8).standard_normal(N)
    x, info = ap.linalg.solve(A, b)                      # (n,) broadcasts over the batch
    assert x.shape == (2, N) and info.iterations.shape == (2,)
    np.testing.assert_allclose(x, np.linalg.solve(A, np.stack([b, b])[..., None])[..., 0],
                               rtol=1e-12, atol=1e-13)
    x2, _ = ap.linalg.solve(A, np.stack([b, 2 * b]))     # (..., n): one vector per matrix
    np.testing.assert_allclose(x2[1], 2 * x[1], rtol=1e-12)


@pytest.mark.slow
def test_vmap_matches_loop():
    A = np.stack([prescribed(1e3, seed=9), prescribed(1e12, seed=10)])
    b = np.random.default_rng(11).standard_normal((2, N))
    xv, iv = jax.vmap(_solve_lu)(A, b)                   # vmap == a Python loop
    loop = [_solve_lu(A[i], b[i]) for i in range(2)]
    np.testing.assert_allclose(xv, np.stack([x for x, _ in loop]), rtol=1e-13, atol=1e-14)
    assert iv.fell_back.tolist() == [bool(i.fell_back) for _, i in loop] == [False, True]
    assert iv.status.tolist() == [int(i.status) for _, i in loop]


def _loss(x):
    # smooth in x so that the reference gradient is meaningful even for kappa = 1e12
    return jnp.vdot(jnp.arange(N, dtype=x.dtype), x) + 0.5 * jnp.vdot(x, x)


def _loss_ours(A, b):
    return _loss(ap.linalg.solve(A, b)[0])


def _loss_ref(A, b):
    return _loss(jnp.linalg.solve(A, b))


_grad_ours = jax.jit(jax.grad(_loss_ours, argnums=(0, 1)))
_grad_ref = jax.jit(jax.grad(_loss_ref, argnums=(0, 1)))


@pytest.mark.parametrize("kappa", [1e2, 1e12])   # refined adjoint; adjoint via fallback
def test_grad_matches_jnp_linalg_solve(kappa):
    A = jnp.asarray(prescribed(kappa, seed=12))
    b = jnp.asarray(np.random.default_rng(13).standard_normal(N))
    gA, gb = _grad_ours(A, b)
    rA, rb = _grad_ref(A, b)
    tol = 100 * kappa * U64
    assert relerr(gb, rb) <= tol and relerr(gA, rA) <= tol


def _sin_loss(refine):
    def f(A, b):
        return jnp.sum(jnp.sin(ap.linalg.solve(A, b, refine=refine)[0]) * jnp.arange(N))
    return f


@pytest.mark.slow
@pytest.mark.parametrize("refine", [
    "lu", pytest.param("gmres", marks=pytest.mark.slow)])
def test_jvp_vs_finite_differences_and_grad(refine):
    A = jnp.asarray(prescribed(30.0, seed=14))
    b = jnp.asarray(np.random.default_rng(15).standard_normal(N))
    dA = jnp.asarray(np.random.default_rng(16).standard_normal((N, N)))
    db = jnp.asarray(np.random.default_rng(17).standard_normal(N))
    f = _sin_loss(refine)
    _, tangent = jax.jit(lambda A, b, dA, db: jax.jvp(f, (A, b), (dA, db)))(A, b, dA, db)
    h = 1e-6
    fpm = jax.jit(jax.vmap(f))(jnp.stack([A + h * dA, A - h * dA]),
                               jnp.stack([b + h * db, b - h * db]))
    fd = (fpm[0] - fpm[1]) / (2 * h)
    assert float(tangent) == pytest.approx(float(fd), rel=1e-6)
    gA, gb = jax.jit(jax.grad(f, argnums=(0, 1)))(A, b)
    assert float(jnp.vdot(gA, dA) + jnp.vdot(gb, db)) == pytest.approx(float(tangent),
                                                                         rel=1e-10)


@pytest.mark.slow
def test_solveinfo_message_and_success():
    _, info = _solve_lu(prescribed(1e12, seed=18), np.ones(N))
    assert info.message.startswith(ap.status_message(CONVERGED)) and bool(info.success)
    assert ap.Reason.STAGNATION.describe() in info.message
    _, infos = ap.linalg.solve(np.stack([np.eye(N), singular_matrix()]), np.ones(N))
    assert infos.message[0] == ap.status_message(CONVERGED)
    assert infos.message[1].startswith(ap.status_message(ap.Status.SINGULAR))
    assert infos.success.tolist() == [True, False]
    assert ap.linalg.STATUS_MESSAGES[-7] == ap.Status.SINGULAR.message
    with pytest.raises(TypeError, match="concrete"):
        jax.jit(lambda A, b: ap.linalg.solve(A, b)[1].message)(np.eye(2), np.ones(2))


# ---- bad input ---------------------------------------------------------------------

@pytest.mark.parametrize("A, b, match", [
    (np.ones((3, 4)), np.ones(3), "square"),
    (np.eye(3), np.ones(4), "does not match"),
    (np.eye(3, dtype=np.int32), np.ones(3), "floating dtype"),
    (np.eye(3), np.ones(3, dtype=np.int64), "floating dtype"),
    (np.array([[1.0, np.nan], [0.0, 1.0]]), np.ones(2), "A contains NaN or Inf"),
    (np.eye(2), np.array([1.0, np.inf]), "b contains NaN or Inf"),
    (np.ones((2, 3, 3)), np.ones((4, 3, 1)), "do not broadcast"),
])
def test_bad_input_raises_at_boundary(A, b, match):
    with pytest.raises(ValueError, match=match):
        ap.linalg.solve(A, b)


@pytest.mark.parametrize("kw, match", [
    ({"refine": "cg"}, "refine"),
    ({"max_iters": -1}, "max_iters"),
    ({"tol": 0.0}, "tol"),
    ({"factor": "f64", "working": "f32"}, "must not be more precise"),
    ({"factor": "f8"}, "unknown floating dtype"),
])
def test_bad_options_raise(kw, match):
    with pytest.raises(ValueError, match=match):
        ap.linalg.solve(np.eye(2), np.ones(2), **kw)


def singular_matrix():
    """N x N with the exactly singular block [[1, 2], [2, 4]] (LU gives a zero pivot)."""
    A = np.eye(N)
    A[:2, :2] = [[1.0, 2.0], [2.0, 4.0]]
    return A


def test_nonfinite_inside_jit_is_a_status():
    A = np.eye(N)
    A[3, 5] = np.nan
    x, info = _solve_lu(A, np.ones(N))
    assert int(info.status) == ap.Status.NONFINITE_INPUT and not bool(info.success)
    assert int(info.reason) == ap.Reason.NONFINITE
    assert bool(jnp.all(jnp.isnan(x)))
    assert float(info.backward_error) == np.inf


def test_exactly_singular_gives_status_and_nan():
    x, info = _solve_lu(singular_matrix(), np.ones(N))
    assert int(info.status) == ap.Status.SINGULAR and bool(info.fell_back)
    assert not bool(info.success)
    assert bool(jnp.all(jnp.isnan(x)))
    # honest info: a NaN x never reads as a perfect solve
    assert float(info.backward_error) == np.inf


def test_numerically_singular_is_flagged_not_silent():
    rng = np.random.default_rng(19)
    A = rng.standard_normal((N, 3)) @ rng.standard_normal((3, N))   # rank 3
    x, info = _solve_lu(A, rng.standard_normal(N))
    assert int(info.status) in (ap.Status.SINGULAR, ap.Status.ILL_CONDITIONED)
    assert not bool(info.success)
    assert float(info.cond_estimate) * U64 >= 1 or bool(jnp.all(jnp.isnan(x)))


def test_cast_overflow_falls_back_with_correct_answer():
    d = 1e39 * np.linspace(1.0, 2.0, N)               # > float32 max, well conditioned
    x, info = _solve_lu(np.diag(d), d)
    assert int(info.status) == CONVERGED and bool(info.fell_back)
    assert int(info.reason) == ap.Reason.OVERFLOW
    np.testing.assert_allclose(x, np.ones(N), rtol=1e-15)


@pytest.mark.slow
def test_estimate_cond_false_gives_nan_on_refinement_path():
    x, info = ap.linalg.solve(prescribed(10.0, seed=30), np.ones(N), estimate_cond=False)
    assert bool(jnp.isnan(info.cond_estimate)) and int(info.status) == CONVERGED
    _, info = ap.linalg.solve(prescribed(1e12, seed=31), np.ones(N), estimate_cond=False)
    assert bool(info.fell_back) and float(info.cond_estimate) > 1e11    # fallback: always


@pytest.mark.slow
def test_half_precision_factor_with_f32_working():
    A = prescribed(10.0, seed=20).astype(np.float32)
    b = np.ones(N, np.float32)
    x, info = ap.linalg.solve(A, b, factor="bf16", working="f32", refine="lu")
    assert x.dtype == np.float32 and not bool(info.fell_back)
    assert int(info.iterations) >= 2                  # bf16 factors need several steps
    assert eta(A, x, b) <= math.sqrt(N) * U32
    # the factor really is bf16-rounded: one bf16 LU solve alone is far less accurate
    A16 = A.astype(ml_dtypes.bfloat16).astype(np.float64)
    assert eta(A, np.linalg.solve(A16, b), b) > 100 * U32



def test_condition_estimate_keeps_the_working_dtype_with_x64_on():
    """Hager-Higham on float32 solves stays float32 while x64 is on (its alternating test
    vector came out float64, and with it the whole estimate)."""
    from adaptprec.linalg._factors import hh_kappa
    n = 8
    A = prescribed(10.0, n=n, seed=20).astype(np.float32)
    inv = jnp.asarray(np.linalg.inv(A.astype(np.float64)), jnp.float32)

    def low(R, trans):                         # op(A)^{-1} R, or op(A)^{-T} R when trans
        return jnp.einsum("ij,mjk->mik", inv if trans else inv.T, R)

    anrm = jnp.asarray([np.abs(A).sum(1).max()], jnp.float32)
    kappa = hh_kappa(low, anrm, True, n)
    assert kappa.dtype == np.float32
    true = np.linalg.cond(A.astype(np.float64), np.inf)
    assert true / 3 <= float(kappa[0]) <= true * 1.01


@pytest.mark.slow
def test_f32_working_gmres_ir_with_x64_on():
    """working="f32" with half-precision factors (GMRES-IR by default) while x64 is on:
    the condition estimate stays float32 (it came out float64, and the screen's
    lax.cond then refused float64 against float32 branches)."""
    n = 16
    A = prescribed(10.0, n=n, seed=20).astype(np.float32)
    b = np.ones(n, np.float32)
    x, info = ap.linalg.solve(A, b, factor="bf16", working="f32")
    assert x.dtype == np.float32 and int(info.status) == CONVERGED
    assert info.cond_value.dtype == np.float32 and info.cond_estimate.dtype == np.float32
    true = np.linalg.cond(A.astype(np.float64), np.inf)
    assert true / 3 <= float(info.cond_estimate) <= true * 1.01
    assert eta(A, x, b) <= math.sqrt(n) * U32

# ---- adaptive() certification with guards.backward_error ----------------------------

@pytest.mark.slow
def test_adaptive_backward_error_guard_certifies_and_escalates():
    @ap.adaptive(ladder="f32,f64", guards=[ap.guards.backward_error()])
    def kernel(A, b):
        return jnp.linalg.solve(A, b)

    A = prescribed(1e2, seed=21)
    b = np.random.default_rng(22).standard_normal(N)
    x, rep = jax.jit(kernel.with_report)(jnp.asarray(A), jnp.asarray(b))
    assert rep.rung_name == "f32" and bool(rep.ok)
    # the guard's value is the Rigal–Gaches eta of the f32 answer, computed independently
    assert float(rep.values[0, 0]) == pytest.approx(eta(A, np.asarray(x, np.float64), b),
                                                   rel=1e-3)
    big = A * 1e40                                    # fine in f64, overflows in f32
    x, rep = jax.jit(kernel.with_report)(jnp.asarray(big), jnp.asarray(b))
    assert rep.rung_name == "f64" and bool(rep.ok)
    assert eta(big, x, b) <= 10 * math.sqrt(N) * U64
    x_ours, info = ap.linalg.solve(big, b)            # same certification, one call
    assert int(info.status) == CONVERGED and int(info.reason) == ap.Reason.OVERFLOW
    assert float(info.backward_error) <= math.sqrt(N) * U64


# ---- lstsq -------------------------------------------------------------------------

@pytest.mark.parametrize("kappa", [1e0, 1e4, 1e12])
def test_lstsq_matches_numpy(kappa):
    rng = np.random.default_rng(23)
    A = prescribed(kappa, n=N // 2, m=N, seed=24)
    b = A @ rng.standard_normal(N // 2) + 1e-3 * rng.standard_normal(N)
    x, info = _lstsq(A, b)
    ref = np.linalg.lstsq(A, b, rcond=None)[0]
    assert bool(info.success)
    assert relerr(x, ref) <= 1e3 * kappa * U64 * max(1.0, kappa * 1e-3)
    r = b - A @ np.asarray(x)
    opt = np.abs(A.T @ r).max() / (np.abs(A).sum(0).max()
                                   * (np.abs(A).sum(1).max() * np.abs(x).max()
                                      + np.abs(b).max()))
    assert float(info.backward_error) == pytest.approx(opt, rel=1e-3, abs=1e-300)
    assert opt <= math.sqrt(N // 2) * U64
    assert bool(info.fell_back) == (kappa >= 1e12)


@pytest.mark.slow
def test_lstsq_batch():
    A = np.stack([prescribed(10.0, n=N // 2, m=N, seed=s) for s in range(2)])
    B = np.random.default_rng(25).standard_normal((2, N, 2))
    x, info = ap.linalg.lstsq(A, B)
    assert x.shape == (2, N // 2, 2) and info.status.shape == (2,)
    for i in range(2):
        np.testing.assert_allclose(x[i], np.linalg.lstsq(A[i], B[i], rcond=None)[0],
                                   rtol=1e-12, atol=1e-13)


def test_lstsq_bad_input():
    with pytest.raises(ValueError, match="tall"):
        ap.linalg.lstsq(np.ones((2, 3)), np.ones(2))
    with pytest.raises(ValueError, match="NaN or Inf"):
        ap.linalg.lstsq(np.ones((3, 2)), np.array([1.0, np.nan, 0.0]))


# ---- matmul ------------------------------------------------------------------------

def test_matmul_accumulates_in_f32():
    rng = np.random.default_rng(26)
    a = rng.uniform(0.5, 1.5, (4, 8192)).astype(ml_dtypes.bfloat16)
    b = rng.uniform(0.5, 1.5, (8192, 3)).astype(ml_dtypes.bfloat16)
    exact = a.astype(np.float64) @ b.astype(np.float64)       # products of bf16 are exact
    c = ap.linalg.matmul(a, b, policy="c=bf16,o=f32")
    assert c.dtype == np.float32
    assert np.abs(np.asarray(c, np.float64) - exact).max() / exact.max() <= 8192 * U32
    # a bf16 accumulator would be off by up to ~2**-8 per add once the sum is large
    c16 = ap.linalg.matmul(a, b)                              # no policy: bf16 out
    assert c16.dtype == ml_dtypes.bfloat16
    assert np.abs(np.asarray(c16, np.float64) - exact).max() / exact.max() <= 2 ** -8
    c64 = ap.linalg.matmul(a.astype(np.float64), b.astype(np.float64))
    assert c64.dtype == np.float64                            # never lowered silently
    np.testing.assert_allclose(c64, exact, rtol=1e-14)


def test_pad_to_multiple_preserves_product():
    rng = np.random.default_rng(27)
    a, b = rng.standard_normal((5, 13)), rng.standard_normal((13, 6))
    pa, pb = ap.linalg.pad_to_multiple(a, 8), ap.linalg.pad_to_multiple(b, 8)
    assert pa.shape == (8, 16) and pb.shape == (16, 8)
    np.testing.assert_allclose(ap.linalg.matmul(pa, pb)[:5, :6], a @ b, rtol=1e-13)
    with pytest.raises(ValueError, match="positive int"):
        ap.linalg.pad_to_multiple(a, 0)


def test_solveinfo_is_a_pytree():
    x, info = _solve_lu(np.eye(N), np.ones(N))
    leaves = jax.tree_util.tree_leaves(info)
    # 7 fields (with residual_norm) + the factors kept for the deferred condition
    # estimate (f, perm, scale, norm)
    assert isinstance(info, SolveInfo) and len(leaves) == 11
    assert info.cond_factors.f.shape == (N, N) and info.cond_factors.f.dtype == np.float32
    _, info = jax.jit(lambda A, b: ap.linalg.solve(A, b, estimate_cond=False))(
        np.eye(N), np.ones(N))
    assert info.cond_factors is None and len(jax.tree_util.tree_leaves(info)) == 7


@pytest.mark.slow
def test_lstsq_exactly_rank_deficient_is_never_converged():
    # newcomer audit: column 2 = c * column 0; the float32 R looked conditioned enough for
    # the refinement to "converge" (kappa_1(R_f32) ~ 1e8) to entries of 1e5, or the
    # float64 estimate landed just under 1/u: CONVERGED either way
    statuses = set()
    for seed in (10, 19, 0, 3):
        for c in (0.5, 3.0, 2.0):
            r = np.random.default_rng(seed)
            M = r.standard_normal((20, 3))
            M[:, 2] = c * M[:, 0]
            _, info = ap.linalg.lstsq(jnp.asarray(M), jnp.asarray(r.standard_normal(20)))
            statuses.add(int(info.status))
    assert statuses == {int(ap.Status.ILL_CONDITIONED)}


def test_matmul_never_lowers_float64_without_x64():
    # newcomer audit: float64 NumPy inputs with x64 off came back float32 (error 2e-6)
    # (the x64 rule: computed in float64 in the thread-local x64 scope, NumPy float64 out)
    a = np.random.default_rng(0).standard_normal((4, 4))
    with jax.enable_x64(False):
        c = ap.linalg.matmul(a, a)
        assert isinstance(c, np.ndarray) and c.dtype == np.float64
        np.testing.assert_allclose(c, a @ a, rtol=1e-13)
        c = ap.linalg.matmul(a, a, policy="c=f32,o=f32")    # asked for: fine
        assert c.dtype == jnp.float32


def test_column_norms_see_a_nan_in_5000_entries():
    # the refinements' convergence, stall and backward-error tests read column inf-norms;
    # a plain max under jit drops a NaN from 4096 entries on (XLA:CPU, issue 31)
    from adaptprec.linalg.lstsq import _measures
    from adaptprec.linalg._solve_info import colnorm
    x = jnp.ones((1, 50, 100)).at[0, 3, 7].set(jnp.nan)      # (batch, n, k)
    xn = jax.jit(colnorm)(x)
    assert np.isinf(float(xn[0, 7])) and float(xn[0, 8]) == 1.0
    A = jnp.ones((1, 50, 1))
    r = jnp.zeros((1, 50, 100)).at[0, 3, 7].set(jnp.nan)
    _, _, eta, fit = jax.jit(_measures)(A, jnp.ones((1, 50, 100)), jnp.ones((1, 1, 100)),
                                        r, jnp.ones(1), jnp.ones(1))
    assert not np.isfinite(float(eta[0, 7]))
    assert np.isinf(float(fit[0, 7])) and float(fit[0, 8]) == 0.0
