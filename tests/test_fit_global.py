"""Global fits (shared and per-dataset parameters) against one stacked residual in
scipy.optimize.least_squares: parameters, standard errors, dof; uneven datasets; the
block solver under jit and vmap."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.optimize as so

import adaptprec as ap
from adaptprec.analysis._block_lm import solve_blocks

RNG = np.random.default_rng(8)
T = np.linspace(0.0, 5.0, 30)
D = 6
A = RNG.uniform(1, 5, D)
B = RNG.uniform(0, 1, D)
Y = A[:, None] * np.exp(-0.7 * T) + B[:, None] + RNG.normal(0, 0.02, (D, T.size))
P0 = {"a": 2.0, "k": 1.0, "b": 0.5}


def decay(t, a, k, b):
    return a * jnp.exp(-k * t) + b


def _stacked(ts, ys, sigma=None):
    """The global fit as one residual: q = (k, a_1..a_D, b_1..b_D)."""
    n = len(ys)

    def residual(q):
        k, a, b = q[0], q[1:1 + n], q[1 + n:]
        r = [(a[d] * np.exp(-k * ts[d]) + b[d] - ys[d]) /
             (1.0 if sigma is None else sigma[d]) for d in range(n)]
        return np.concatenate(r)

    r = so.least_squares(residual, np.r_[1.0, np.full(n, 2.0), np.full(n, 0.5)],
                         xtol=1e-14, ftol=1e-14, gtol=1e-14)
    m = sum(len(y) for y in ys)
    cov = np.linalg.inv(r.jac.T @ r.jac) * 2 * r.cost / (m - 1 - 2 * n)
    return r, cov


@pytest.fixture(scope="module")
def global_fit():
    return ap.fit_global(decay, T, Y, shared=["k"], p0=P0)


def test_global_fit_against_the_stacked_residual(global_fit):
    ref, cov = _stacked([T] * D, list(Y))
    res = global_fit
    se = np.sqrt(np.diag(cov))
    assert res.shared_values[0] == pytest.approx(ref.x[0], rel=1e-8)
    np.testing.assert_allclose(res.local_values[:, 0], ref.x[1:1 + D], rtol=1e-7)
    np.testing.assert_allclose(res.local_values[:, 1], ref.x[1 + D:], rtol=1e-6)
    assert res.shared_stderr[0] == pytest.approx(se[0], rel=1e-6)
    np.testing.assert_allclose(res.local_stderr[:, 0], se[1:1 + D], rtol=1e-6)
    np.testing.assert_allclose(res.local_stderr[:, 1], se[1 + D:], rtol=1e-6)
    assert res.dof == Y.size - 1 - 2 * D and res.chi2 == pytest.approx(2 * ref.cost,
                                                                       rel=1e-9)
    np.testing.assert_allclose(res.popt[:, 1], ref.x[0], rtol=1e-8)
    text = str(res)
    assert "[[Shared]]" in text and "[[Per dataset]]" in text and "1 shared" in text


def test_uneven_datasets_count_their_own_points():
    lengths = [10 + 3 * d for d in range(D)]
    ts = [T[:n] for n in lengths]
    ys = [Y[d, :n] for d, n in enumerate(lengths)]
    sig = [np.full(n, 0.02) for n in lengths]
    res = ap.fit_global(decay, ts, ys, sigma=sig, shared="k", p0=P0)
    ref, cov = _stacked(ts, ys, sig)
    assert res.shared_values[0] == pytest.approx(ref.x[0], rel=1e-8)
    assert res.shared_stderr[0] == pytest.approx(np.sqrt(cov[0, 0]), rel=1e-6)
    assert res.npoints.tolist() == lengths
    assert res.dof == sum(lengths) - 1 - 2 * D


@pytest.mark.slow
def test_fixed_per_dataset_values():
    res = ap.fit_global(decay, T, Y, shared=["k"], fixed={"b": B}, p0=P0)
    np.testing.assert_array_equal(res.popt[:, 2], B)
    assert np.all(res.stderr[:, 2] == 0.0) and res.dof == Y.size - 1 - D
    assert res.shared_values[0] == pytest.approx(0.7, abs=0.01)


def test_block_solver_under_jit_and_vmap():
    t = jnp.linspace(0.0, 2.0, 10)

    def fun(th, ph, y):
        return ph[0] * jnp.exp(-th[0] * t) - y

    def rate(k):
        y = jnp.array([1.0, 2.0, 3.0])[:, None] * jnp.exp(-k * t)
        return solve_blocks(fun, jnp.array([1.0]), jnp.ones((3, 1)), (y,)).theta[0]

    out = jax.jit(jax.vmap(rate))(jnp.array([0.5, 1.5]))
    np.testing.assert_allclose(out, [0.5, 1.5], rtol=1e-9)


@pytest.mark.parametrize("kwargs, match", [
    (dict(shared=["kk"]), "the parameters are"),
    (dict(shared=["k"], p0={"k": [1.0, 2.0]}), "give p0 one value"),
])
def test_bad_global_options(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ap.fit_global(decay, T, Y, **kwargs)
