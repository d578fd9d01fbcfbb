"""The Krylov solvers under jit, vmap and grad, with x64 off, and at the boundary."""

import numpy as np
import pytest

import jax
import jax.numpy as jnp

import adaptprec as ap
from adaptprec import Status
from _krylov_problems import poisson_matvec
from _subprocess import run_python

N = 12


@pytest.fixture(scope="module")
def system():
    rng = np.random.default_rng(0)
    n = N * N
    A = np.asarray(jax.vmap(poisson_matvec(N), in_axes=1, out_axes=1)(jnp.eye(n)))
    A = A + np.diag(rng.uniform(0, 1, n))
    B = A + 0.3 * np.triu(rng.uniform(-1, 1, (n, n)) * (np.abs(A) > 0), 1)  # nonsymmetric
    b = rng.uniform(0.5, 1.5, n)
    return jnp.asarray(A), jnp.asarray(B), jnp.asarray(b)


@pytest.mark.slow
def test_jit_matches_eager(system):
    A, _, b = system
    x_eager, info_eager = ap.linalg.cg(A, b, rtol=1e-10)
    x_jit, info_jit = jax.jit(lambda A, b: ap.linalg.cg(A, b, rtol=1e-10))(A, b)
    np.testing.assert_array_equal(np.asarray(x_jit), np.asarray(x_eager))   # same bits
    assert int(info_jit.iterations) == int(info_eager.iterations)
    assert bool(info_jit.success)


@pytest.mark.parametrize("method", ["cg", pytest.param("gmres", marks=pytest.mark.slow),
                                    pytest.param("bicgstab", marks=pytest.mark.slow)])
def test_vmap_over_batched_systems_equals_loop(method, system):
    A, B, b = system
    M = A if method == "cg" else B
    scales = jnp.asarray([1.0, 2.0, 5.0])
    As = jnp.stack([M * s + jnp.eye(M.shape[0]) * (s - 1) for s in scales])
    bs = jnp.stack([b * s for s in scales])
    solve = getattr(ap.linalg, method)
    xs, infos = jax.vmap(lambda A, b: solve(A, b, rtol=1e-10))(As, bs)
    assert infos.status.shape == (3,) and np.all(np.asarray(infos.success))
    for i in range(3):
        x, info = solve(As[i], bs[i], rtol=1e-10)
        np.testing.assert_allclose(np.asarray(xs[i]), np.asarray(x), rtol=1e-8)
        assert np.linalg.norm(bs[i] - As[i] @ xs[i]) / np.linalg.norm(bs[i]) <= 1e-10


@pytest.mark.slow
def test_vmap_with_per_element_rungs():
    """One member needs float64 (kappa 3e7), the other finishes on float32: each keeps
    its own rung under vmap."""
    rng = np.random.default_rng(3)
    Q, _ = np.linalg.qr(rng.normal(size=(40, 40)))
    hard = (Q * np.geomspace(1, 3e7, 40)) @ Q.T
    easy = (Q * np.geomspace(1, 10, 40)) @ Q.T
    As = jnp.asarray(np.stack([(hard + hard.T) / 2, (easy + easy.T) / 2]))
    b = jnp.asarray(rng.normal(size=40))
    xs, infos = jax.vmap(lambda A: ap.linalg.cg(A, b, rtol=1e-9, maxiter=20000))(As)
    assert np.all(np.asarray(infos.success))
    assert np.asarray(infos.rung).tolist() == [1, 0]


@pytest.mark.parametrize("method", ["cg", pytest.param("gmres", marks=pytest.mark.slow),
                                    pytest.param("bicgstab", marks=pytest.mark.slow)])
def test_grad_by_implicit_differentiation(method, system):
    A, B, b = system
    M = A if method == "cg" else B
    solve = getattr(ap.linalg, method)

    def loss(M, b):
        x, _ = solve(M, b, rtol=1e-12)
        return jnp.sum(x ** 2)

    gM, gb = jax.grad(loss, argnums=(0, 1))(M, b)
    x = jnp.linalg.solve(M, b)
    lam = jnp.linalg.solve(M.T, 2 * x)                 # adjoint: M^T lam = dL/dx
    np.testing.assert_allclose(np.asarray(gb), np.asarray(lam), rtol=1e-7)
    np.testing.assert_allclose(np.asarray(gM), -np.outer(lam, x), rtol=1e-6, atol=1e-12)


@pytest.mark.slow
def test_grad_through_a_matrix_free_operator():
    base = poisson_matvec(N)
    b = jnp.ones(N * N)

    def loss(c):
        x, _ = ap.linalg.cg(lambda v: base(v) + c * v, b, rtol=1e-12)
        return jnp.sum(x)

    c = 0.5
    g = jax.grad(loss)(c)
    eps = 1e-5
    fd = (loss(c + eps) - loss(c - eps)) / (2 * eps)
    np.testing.assert_allclose(float(g), float(fd), rtol=1e-6)
    _, tangent = jax.jvp(loss, (c,), (1.0,))
    np.testing.assert_allclose(float(tangent), float(g), rtol=1e-9)


def test_nonfinite_input_inside_jit(system):
    A, _, b = system
    x, info = jax.jit(lambda b: ap.linalg.cg(A, b))(b.at[3].set(jnp.nan))
    assert int(info.status) == int(Status.NONFINITE_INPUT)
    assert np.all(np.isnan(np.asarray(x)))


def test_boundary_errors(system):
    A, _, b = system
    with pytest.raises(ValueError, match="square"):
        ap.linalg.cg(A[:, :-1], b)
    with pytest.raises(ValueError, match="rows"):
        ap.linalg.cg(A, b[:-1])
    with pytest.raises(ValueError, match="NaN or Inf"):
        ap.linalg.cg(A, b.at[0].set(jnp.inf))
    with pytest.raises(ValueError, match="rtol"):
        ap.linalg.cg(A, b, rtol=-1.0)
    with pytest.raises(ValueError, match="restart"):
        ap.linalg.gmres(A, b, restart=0)
    with pytest.raises(ValueError, match="M must be"):
        ap.linalg.cg(A, b, M="ilu")
    with pytest.raises(ValueError, match=r"matvec|A\(x\)"):
        ap.linalg.cg(lambda x: x[:3], b)
    with pytest.raises(TypeError, match="schedule"):
        ap.linalg.cg(A, b, schedule="stall")
    with pytest.raises(ValueError, match="ladder"):
        ap.linalg.cg(A, b, ladder="f64,f32")
    x, info = ap.linalg.cg(A, b, tol=1e-9)                  # jax.scipy's keyword
    assert float(info.residual_norm) <= 1e-9


@pytest.mark.slow
def test_x64_off_eager_scope_and_traced_error():
    code = r"""
import numpy as np, jax, jax.numpy as jnp
import adaptprec as ap
n = 64
A = np.diag(np.linspace(1, 10, n)) + np.diag(np.full(n - 1, 0.5), 1) + np.diag(np.full(n - 1, 0.5), -1)
b = np.ones(n)
x, info = ap.linalg.cg(A, b, rtol=1e-12)
assert isinstance(x, np.ndarray) and x.dtype == np.float64, (type(x), x.dtype)
assert np.linalg.norm(b - A @ x) / np.linalg.norm(b) <= 1e-12
assert bool(info.success)
x32, info32 = jax.jit(lambda A, b: ap.linalg.cg(A, b, ladder="f32"))(A.astype(np.float32), b.astype(np.float32))
assert x32.dtype == jnp.float32 and bool(info32.success)
try:
    jax.jit(lambda A, b: ap.linalg.cg(A, b))(A, b)
except ValueError as e:
    assert "needs float64" in str(e) and "ladder='f32'" in str(e)
else:
    raise AssertionError("no error")
print("ok")
"""
    proc = run_python(code, x64=False, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().endswith("ok")


def test_import_does_not_load_lineax_or_sparse():
    proc = run_python("import sys, adaptprec as ap\nap.linalg.cg\n"
                      "print(sorted(m for m in ('lineax', 'jax.experimental.sparse', 'equinox')"
                      " if m in sys.modules))", x64=False, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "[]"


@pytest.mark.slow
def test_preconditioned_solves_under_jit_and_grad(system):
    A, B, b = system

    @jax.jit
    def loss(A, b):
        x, info = ap.linalg.cg(A, b, M="block_jacobi", rtol=1e-12)
        return jnp.sum(x), info

    (value, info), grads = jax.value_and_grad(loss, argnums=1, has_aux=True)(A, b)
    assert bool(info.success)
    np.testing.assert_allclose(np.asarray(grads),
                               np.asarray(jnp.linalg.solve(A.T, jnp.ones_like(b))), rtol=1e-7)
    x, info = jax.jit(lambda B, b: ap.linalg.bicgstab(B, b, M="jacobi", rtol=1e-11))(B, b)
    assert bool(info.success)


@pytest.mark.slow
def test_grad_through_sparse_values():
    from jax.experimental import sparse
    A = jnp.asarray(np.diag(np.linspace(2.0, 3.0, 8)) + np.diag(np.full(7, 0.5), 1)
                    + np.diag(np.full(7, 0.5), -1))
    S = sparse.BCOO.fromdense(A)
    b = jnp.ones(8)

    def loss(data):
        x, _ = ap.linalg.cg(sparse.BCOO((data, S.indices), shape=S.shape), b, rtol=1e-12)
        return jnp.sum(x ** 2)

    g = jax.grad(loss)(S.data)
    x = jnp.linalg.solve(A, b)
    lam = jnp.linalg.solve(A, 2 * x)
    rows, cols = S.indices[:, 0], S.indices[:, 1]
    np.testing.assert_allclose(np.asarray(g), -np.asarray(lam[rows] * x[cols]), rtol=1e-7)
