"""ap.linalg.cg / gmres / bicgstab: answers against scipy, the operator forms, the
preconditioners, and the honest statuses (stagnation, indefinite, singular)."""

import numpy as np
import pytest
import scipy.sparse as sps
import scipy.sparse.linalg as spla

import jax
import jax.numpy as jnp
from jax.experimental import sparse

import adaptprec as ap
from adaptprec import Reason, Status
from adaptprec.schedule import Fixed
from _krylov_problems import poisson_matvec

N = 16                      # 16 x 16 grids: 256 unknowns


def poisson_matrix(n=N):
    """5-point Dirichlet Laplacian on an n x n grid (scipy CSR)."""
    t = sps.diags([-1.0, 2.0, -1.0], [-1, 0, 1], shape=(n, n))
    eye = sps.identity(n)
    return (sps.kron(eye, t) + sps.kron(t, eye)).tocsr()


def convection_diffusion(n=N, wind=20.0):
    """Upwind convection-diffusion, nonsymmetric (scipy CSR)."""
    h = 1.0 / (n + 1)
    t = sps.diags([-1.0 - wind * h, 2.0 + wind * h, -1.0], [-1, 0, 1], shape=(n, n))
    eye = sps.identity(n)
    return (sps.kron(eye, t) + sps.kron(t, sps.diags([-1.0, 2.0, -1.0], [-1, 0, 1],
                                                      shape=(n, n)))).tocsr()


@pytest.fixture(scope="module")
def rhs():
    return np.random.default_rng(0).uniform(0.5, 1.5, N * N)


def rel_residual(A, x, b):
    return np.linalg.norm(b - A @ np.asarray(x)) / np.linalg.norm(b)


@pytest.mark.parametrize("method", ["cg", pytest.param("gmres", marks=pytest.mark.slow),
                                    pytest.param("bicgstab", marks=pytest.mark.slow)])
def test_agrees_with_scipy_and_verifies_in_float64(method, rhs):
    A = poisson_matrix() if method == "cg" else convection_diffusion()
    solver = getattr(ap.linalg, method)
    x, info = solver(A, rhs, rtol=1e-10)
    assert int(info.status) == int(Status.CONVERGED) and bool(info.success)
    assert x.dtype == np.float64
    assert info.residual_norm <= 1e-10
    assert rel_residual(A, x, rhs) <= 1e-10               # the reported residual is true
    ref, code = getattr(spla, method)(A, rhs, rtol=1e-12, maxiter=10000)
    assert code == 0
    np.testing.assert_allclose(np.asarray(x), ref, rtol=1e-7)
    assert int(info.iterations_per_rung[0]) > 0           # float32 did the work
    assert int(np.asarray(info.iterations_per_rung).sum()) == int(info.iterations)


@pytest.mark.slow
def test_operator_forms_agree(rhs):
    A = poisson_matrix()
    dense = jnp.asarray(A.toarray())
    forms = {
        "dense": dense,
        "bcoo": sparse.BCOO.fromdense(dense),
        "bcsr": sparse.BCSR.fromdense(dense),
        "scipy": A,
        "callable": poisson_matvec(N),
    }
    out = {k: ap.linalg.cg(v, rhs, rtol=1e-11) for k, v in forms.items()}
    for k, (x, info) in out.items():
        assert bool(info.success), k
        np.testing.assert_allclose(np.asarray(x), np.asarray(out["dense"][0]), rtol=1e-9,
                                   err_msg=k)


@pytest.mark.slow
def test_lineax_operators():
    import lineax as lx
    A = poisson_matrix(8)
    b = np.ones(64)
    dense = jnp.asarray(A.toarray())
    fn_op = lx.FunctionLinearOperator(poisson_matvec(8), jax.ShapeDtypeStruct((64,),
                                                                             jnp.float64))
    for op in (lx.MatrixLinearOperator(dense), fn_op):
        x, info = ap.linalg.gmres(op, b, rtol=1e-11)
        assert bool(info.success)
        assert rel_residual(A, x, b) <= 1e-11


@pytest.mark.slow
def test_multiple_right_hand_sides(rhs):
    A = poisson_matrix()
    B = np.stack([rhs, 2 * rhs, np.ones(N * N)], axis=1)
    X, info = ap.linalg.cg(A, B, rtol=1e-10)
    assert X.shape == B.shape and info.status.shape == (3,)
    assert np.all(np.asarray(info.success))
    for j in range(3):
        assert rel_residual(A, X[:, j], B[:, j]) <= 1e-10
    np.testing.assert_allclose(np.asarray(X[:, 1]), 2 * np.asarray(X[:, 0]), rtol=1e-8)


@pytest.mark.slow
def test_x0_and_atol(rhs):
    A = poisson_matrix()
    exact = spla.spsolve(A.tocsc(), rhs)
    x, info = ap.linalg.cg(A, rhs, x0=exact, rtol=1e-12)
    assert bool(info.success) and int(info.iterations) == 0      # x0 already solves it
    x, info = ap.linalg.cg(A, rhs, x0=exact + 1e-3, rtol=0.0, atol=1e-9)
    assert bool(info.success) and np.linalg.norm(rhs - A @ np.asarray(x)) <= 1e-9


@pytest.mark.slow
@pytest.mark.parametrize("M", ["jacobi", "block_jacobi"])
def test_preconditioners_cut_iterations(M):
    # strongly varying diagonal: Jacobi-type preconditioners help a lot
    A = poisson_matrix() + sps.diags(np.geomspace(1.0, 1e4, N * N))
    b = np.ones(N * N)
    _, plain = ap.linalg.cg(A, b, rtol=1e-10)
    x, info = ap.linalg.cg(A, b, rtol=1e-10, M=M)
    assert bool(info.success) and rel_residual(A, x, b) <= 1e-10
    assert int(info.iterations) < 0.5 * int(plain.iterations)
    # a small matrix-free operator: the preconditioner is built from its probed columns
    dense = jnp.asarray(A.toarray())
    x, info = ap.linalg.cg(lambda v: dense @ v, b, rtol=1e-10, M=M)
    assert bool(info.success) and rel_residual(A, x, b) <= 1e-10


@pytest.mark.slow
def test_block_jacobi_picks_storage_by_condition():
    blocks = [np.array([[1.0, 1 - 1e-7], [1 - 1e-7, 1.0]]),   # kappa 2e7: float64
              np.array([[1.0, 0.999], [0.999, 1.0]]),           # kappa 2e3: float32
              np.array([[2.0, 0.5], [0.5, 3.0]])]               # kappa ~2: 2 bytes
    A = jnp.asarray(sps.block_diag(blocks).toarray())
    M = ap.linalg.block_jacobi(A, block_size=2)
    assert M.storage_names() == ["float64", "float32", "float16"]
    np.testing.assert_allclose(np.asarray(M.cond[2]), np.linalg.cond(blocks[2], 1),
                               rtol=1e-12)
    # the stored inverse is the exact inverse rounded to its format
    np.testing.assert_array_equal(
        np.asarray(M.blocks[2]),
        np.linalg.inv(blocks[2]).astype(np.float16).astype(np.float64))
    # scipy's convention: M approximates A^{-1}; here it is exact up to storage
    x, info = ap.linalg.cg(A, np.ones(6), M=M, rtol=1e-12)
    assert bool(info.success) and int(info.iterations) <= 15   # one per cycle


def test_indefinite_matrix_given_to_cg():
    A = np.diag(np.concatenate([np.linspace(1, 2, 10), -np.linspace(1, 2, 10)]))
    A = A + 0.01 * np.eye(20, k=1) + 0.01 * np.eye(20, k=-1)
    x, info = ap.linalg.cg(A, np.ones(20), rtol=1e-10)
    assert int(info.status) == int(Status.NOT_POSITIVE_DEFINITE)
    assert not bool(info.success)
    assert "positive definite" in info.message
    # climbed first: p^T A p <= 0 on float32 is a guard failure, not the verdict
    assert int(info.escalations) == 1 and int(info.reason) == int(
        Reason.MATRIX_ILL_CONDITIONED)
    x, info = ap.linalg.gmres(A, np.ones(20), rtol=1e-10)     # the right method solves it
    assert bool(info.success)


def neumann_laplacian(n=N):
    """Singular: constant vectors are in the null space."""
    t = sps.diags([-1.0, 2.0, -1.0], [-1, 0, 1], shape=(n, n)).tolil()
    t[0, 0] = t[-1, -1] = 1.0
    eye = sps.identity(n)
    return (sps.kron(eye, t) + sps.kron(t, eye)).tocsr()


@pytest.mark.slow
def test_singular_consistent_system_converges():
    A = neumann_laplacian()
    b = np.random.default_rng(1).normal(size=N * N)
    b -= b.mean()                               # in the range of A
    x, info = ap.linalg.cg(A, b, rtol=1e-10)
    assert bool(info.success) and rel_residual(A, x, b) <= 1e-10


def test_singular_inconsistent_system_says_so():
    A = neumann_laplacian()
    b = np.ones(N * N) + np.random.default_rng(1).normal(size=N * N)   # not in the range
    x, info = ap.linalg.gmres(A, b, rtol=1e-10)
    assert int(info.status) == int(Status.STALLED) and not bool(info.success)
    assert "singular" in info.message
    assert int(info.rung) == 1                  # it climbed before giving up
    floor = abs(b.mean()) * np.sqrt(N * N) / np.linalg.norm(b)
    np.testing.assert_allclose(float(info.residual_norm), floor, rtol=1e-6)
    # CG: p^T A p <= 0 along the null space (or the budget); never a success, and the
    # returned x is the best iterate (here x = 0: the last one had blown up), with its
    # true residual
    x, info = ap.linalg.cg(A, b, rtol=1e-10, maxiter=3000)
    assert int(info.status) in (int(Status.NOT_POSITIVE_DEFINITE),
                                int(Status.MAX_EVALUATIONS)), info
    assert not bool(info.success) and float(info.residual_norm) <= 1.0
    assert rel_residual(A, x, b) == pytest.approx(float(info.residual_norm), rel=1e-6)


def test_stagnation_on_float32_climbs_and_converges():
    # kappa 3e7: u_32 kappa ~ 2, float32 CG crawls (and float64 CG takes 1816 iterations)
    rng = np.random.default_rng(2)
    Q, _ = np.linalg.qr(rng.normal(size=(60, 60)))
    A = (Q * np.geomspace(1.0, 3e7, 60)) @ Q.T
    A = (A + A.T) / 2
    b = rng.normal(size=60)
    x, info = ap.linalg.cg(A, b, rtol=1e-9, maxiter=20000)
    assert bool(info.success) and rel_residual(A, x, b) <= 1e-9
    assert int(info.escalations) == 1 and int(info.reason) == int(Reason.SCHEDULE)
    trace = np.asarray(info.rung_trace)
    assert trace[0] == 0 and trace[int(info.cycles) - 1] == 1
    assert "float64" in info.trace()
    # pinned to float32 it does not get there, and says so (never a lower-rung success)
    x, info = ap.linalg.cg(A, b, rtol=1e-9, maxiter=3000, schedule=Fixed(0))
    assert not bool(info.success) and int(info.status) == int(Status.MAX_EVALUATIONS)
    assert float(info.residual_norm) > 1e-9


@pytest.mark.slow
def test_zero_rhs_and_budget():
    A = poisson_matrix()
    x, info = ap.linalg.cg(A, np.zeros(N * N))
    assert bool(info.success) and not np.any(np.asarray(x))
    x, info = ap.linalg.cg(A, np.ones(N * N), rtol=1e-12, maxiter=5)
    assert int(info.status) == int(Status.MAX_EVALUATIONS) and int(info.iterations) == 5


@pytest.mark.slow
def test_plain_float64_ladder(rhs):
    A = poisson_matrix()
    x, info = ap.linalg.bicgstab(A, rhs, rtol=1e-10, ladder="f64")
    assert bool(info.success) and info.ladder == ("float64",)
    assert rel_residual(A, x, rhs) <= 1e-10


def test_a_tolerance_below_the_rounding_floor_stalls_within_two_checks(rhs):
    """rtol = 1e-18 is below float64's floor ``~u ||A|| ||x|| / ||b||``: the residual
    reaches the floor and then wanders by a few percent; the solve must end STALLED two
    checks after the residual stops halving, not keep iterating while it drifts."""
    A = poisson_matrix()
    x, info = ap.linalg.cg(A, rhs, rtol=1e-18, ladder="f64", maxiter=20_000)
    assert int(info.status) == int(Status.STALLED) and not bool(info.success)
    trace = np.asarray(info.residual_trace)[: int(info.cycles)]
    best = int(np.argmin(trace))
    # cycles after the last one that halved the best so far: at most STALL_CYCLES
    halving = [i for i in range(1, len(trace)) if trace[i] < 0.5 * trace[:i].min()]
    assert len(trace) - 1 - halving[-1] <= 2, trace
    assert trace[best] < 1e-14 and rel_residual(A, x, rhs) < 1e-14   # it got to the floor
    assert int(info.iterations) < 2_000
