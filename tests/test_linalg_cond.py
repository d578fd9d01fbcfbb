"""adaptprec.linalg.cond_estimate against the exact 1-norm condition number.

The exact value ||A||_1 ||A^{-1}||_1 uses numpy's explicit inverse (float64), on matrices
whose condition is small enough (<= 1e11) for that inverse to be accurate to a few digits.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.linalg

import adaptprec as ap

N = 12
_cond = jax.jit(ap.linalg.cond_estimate)
_cond_inf = jax.jit(lambda A: ap.linalg.cond_estimate(A, norm=np.inf))


def exact(A, p=1):
    A = np.asarray(A, np.float64)
    return float(np.linalg.norm(A, p) * np.linalg.norm(np.linalg.inv(A), p))


def kahan(n, theta=1.2):
    """Kahan's upper-triangular matrix: diag(1, s, s^2, ...) (I - c * strict upper ones)."""
    s, c = np.sin(theta), np.cos(theta)
    return np.diag(s ** np.arange(n)) @ (np.eye(n) - c * np.triu(np.ones((n, n)), 1))


def prescribed(kappa, seed, n=N):
    rng = np.random.default_rng(seed)
    u, _ = np.linalg.qr(rng.standard_normal((n, n)))
    v, _ = np.linalg.qr(rng.standard_normal((n, n)))
    return (u * np.logspace(0, -np.log10(kappa), n)) @ v.T


def within3(est, true):
    return true / 3 <= est <= true * (1 + 1e-6)


def test_hilbert():
    for n in (6, N):
        H = np.zeros((N, N))
        H[:n, :n] = scipy.linalg.hilbert(n)
        H[n:, n:] = np.eye(N - n)       # pad to the compiled size; cond is the Hilbert one
        true = exact(H)
        assert true > 1e7
        assert within3(float(_cond(H)), true)


@pytest.mark.parametrize("theta", [1.2, 0.5, 0.3])   # kappa_1 = 2e2, 6e6, 1e9 at n = 12
def test_kahan(theta):
    K = kahan(N, theta)
    true = exact(K)
    assert true > 1e2
    assert within3(float(_cond(K)), true)
    assert within3(float(_cond_inf(K)), exact(K, np.inf))


@pytest.mark.parametrize("kappa", [1e1, 1e4, 1e8, 1e11])
def test_random_prescribed_singular_values(kappa):
    for seed in range(3):
        A = prescribed(kappa, seed)
        assert within3(float(_cond(A)), exact(A))
        assert within3(float(_cond_inf(A)), exact(A, np.inf))


def test_given_float32_factors_batch_and_vmap():
    A = np.stack([prescribed(1e3, s) for s in range(4)])
    lu, piv, perm = jax.lax.linalg.lu(jnp.asarray(A, jnp.float32))
    est = ap.linalg.cond_estimate(A, lu=(lu, piv, perm))          # f64 A, f32 factors
    assert est.shape == (4,) and est.dtype == np.float64
    for i in range(4):
        # factors of the float32-rounded matrix: accurate while kappa * u_f32 << 1
        assert within3(float(est[i]), exact(A[i]) * 1.001)
    np.testing.assert_allclose(jax.vmap(_cond)(A), _cond(A), rtol=1e-12)


def test_singular_is_inf_and_bad_input():
    S = np.eye(N)
    S[:2, :2] = [[1.0, 2.0], [2.0, 4.0]]
    assert float(_cond(S)) == np.inf
    with pytest.raises(ValueError, match="square"):
        ap.linalg.cond_estimate(np.ones((3, 4)))
    with pytest.raises(ValueError, match="norm"):
        ap.linalg.cond_estimate(np.eye(3), norm=2)
    with pytest.raises(ValueError, match="floating"):
        ap.linalg.cond_estimate(np.eye(3, dtype=int))


@pytest.mark.parametrize("factor", ["f32", "bf16", "f16"])
def test_gmres_ir_beyond_its_factors_is_honest(factor):
    # newcomer audit: GMRES-IR converges where kappa u_f >> 1, and the estimate from the
    # factors there was 3e6..2e10 for kappa_inf 4e16, reported CONVERGED (no correct digit)
    with jax.enable_x64(True):
        for kappa, ill in ((1e12, False), (1e16, True)):
            A = prescribed(kappa, seed=1, n=30)
            b = A @ np.ones(30)
            x, info = ap.linalg.solve(jnp.asarray(A), jnp.asarray(b), refine="gmres",
                                      factor=factor)
            true = np.linalg.cond(A, np.inf)
            assert true / 4 <= float(info.cond_estimate) <= 4 * true, (kappa, info)
            want = ap.Status.ILL_CONDITIONED if ill else ap.Status.CONVERGED
            assert int(info.status) == want and not bool(info.fell_back)
