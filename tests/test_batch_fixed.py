"""Per-fit fixed parameters in solve_nlsq_batch (Gpufit's parameters_to_fit), against
scipy's curve_fit of each fit's reduced model: the free parameters, their covariance
(the fixed rows and columns zero), cost and dof; and derivatives through a masked,
partly fixed batch (jit of grad, by the implicit function theorem). `fixed=` did not
exist before.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.optimize as so

import adaptprec as ap

T = np.linspace(0.0, 3.0, 25)
RNG = np.random.default_rng(3)
TRUTH = np.array([[2.0, 1.1, 0.1], [1.5, 0.7, -0.2], [3.0, 2.0, 0.3], [2.5, 1.4, 0.0]])
Y = TRUTH[:, :1] * np.exp(-TRUTH[:, 1:2] * T) + TRUTH[:, 2:] + RNG.normal(0, 0.02, (4, 25))
#: fit 0 holds the offset, fit 1 the amplitude, fit 2 nothing, fit 3 the rate and offset
FIXED = np.array([[0, 0, 1], [1, 0, 0], [0, 0, 0], [0, 1, 1]], bool)
X0 = np.where(FIXED, TRUTH, [1.0, 1.0, 0.0])
F64 = dict(precision="f64", compaction=None, return_pcov=True)
TIGHT = dict(ftol=1e-14, xtol=1e-14, gtol=1e-14)


def decay(p, t):
    return p[0] * jnp.exp(-p[1] * t) + p[2]


@pytest.fixture(scope="module")
def fixed_fits():
    res = ap.solve_nlsq_batch(decay, X0, (T,), in_axes=None, ydata=Y, fixed=FIXED, **F64)
    return jax.tree.map(np.asarray, res)


def _reduced_scipy(i):
    free = ~FIXED[i]

    def model(t, *q):
        p = X0[i].copy()
        p[free] = q
        return p[0] * np.exp(-p[1] * t) + p[2]

    q, c = so.curve_fit(model, T, Y[i], p0=X0[i][free], **TIGHT)
    return free, q, c, 0.5 * float(np.sum((model(T, *q) - Y[i]) ** 2))


def test_fixed_match_the_reduced_model_in_scipy(fixed_fits):
    res = fixed_fits
    assert bool(np.all(res.success))
    assert res.dof.tolist() == [25 - int(np.sum(~f)) for f in FIXED]
    for i in range(4):
        free, q, c, cost = _reduced_scipy(i)
        assert np.array_equal(res.x[i][~free], X0[i][~free])      # kept exactly
        np.testing.assert_allclose(res.x[i][free], q, rtol=1e-7)
        np.testing.assert_allclose(res.pcov[i][np.ix_(free, free)], c, rtol=1e-5)
        held = ~free[:, None] | ~free[None, :]
        assert np.all(res.pcov[i][held] == 0.0)
        assert float(res.cost[i]) == pytest.approx(cost, rel=1e-9)


def test_fixed_must_be_bool():
    with pytest.raises(ValueError, match="fixed must be bool"):
        ap.solve_nlsq_batch(decay, X0, (T,), in_axes=None, ydata=Y, fixed=[0, 0, 1])
    with pytest.raises(ValueError, match=r"fixed has shape \(2,\)"):
        ap.solve_nlsq_batch(decay, X0, (T,), in_axes=None, ydata=Y,
                            fixed=np.array([True, False]))


def _reduced_gradient(x, y, mask, free):
    """d loss / d y of ``loss = sum x^2 + cost`` for one fit (NumPy, by hand): the
    reduced model's implicit derivative ``dq/dy = H^{-1} J^T`` at the solution ``x``
    (``H = J^T J + sum r_i d2f_i``, the free columns, the real points)."""
    a, k, b = x
    e = np.exp(-k * T) * mask
    r = (a * np.exp(-k * T) + b - y) * mask
    J = np.stack([e, -a * T * e, mask * 1.0], axis=1)               # df/d(a, k, b)
    d2 = np.array([[0.0, -np.sum(r * T * e), 0.0],
                   [-np.sum(r * T * e), np.sum(r * a * T * T * e), 0.0], [0.0, 0.0, 0.0]])
    H = (J.T @ J + d2)[np.ix_(free, free)]
    dq = np.linalg.solve(H, J[:, free].T)                            # (free, m)
    return 2.0 * x[free] @ dq - r


def test_jit_grad_through_a_masked_partly_fixed_batch():
    mask = np.ones((2, 25), bool)
    mask[0, 18:] = False
    x0, fixed = X0[:2], FIXED[:2]

    def loss(y):
        r = ap.solve_nlsq_batch(decay, x0, (T,), in_axes=None, ydata=y, mask=mask,
                                fixed=fixed, precision="f64", compaction=None, **TIGHT)
        return jnp.sum(r.x ** 2) + jnp.sum(r.cost), r.x

    y0 = jnp.asarray(Y[:2])
    g, x = jax.jit(jax.grad(loss, has_aux=True))(y0)
    g, x = np.asarray(g), np.asarray(x)
    assert np.all(g[0, 18:] == 0.0)        # padded points do not move the fit
    assert np.array_equal(x[fixed], x0[fixed])
    for i in range(2):
        ref = _reduced_gradient(x[i], Y[i], mask[i], ~fixed[i])
        np.testing.assert_allclose(g[i], ref, rtol=1e-7, atol=1e-8)


def test_summary_of_fixed_fits_is_the_reduced_models(fixed_fits):
    s = ap.summarize_batch(fixed_fits, decay, (T,), in_axes=None, ydata=Y, fixed=FIXED)
    assert s.dof.tolist() == fixed_fits.dof.tolist() and int(s.flags.max()) == 0
    for i in range(4):
        free, _, c, cost = _reduced_scipy(i)
        np.testing.assert_allclose(s.stderr[i][free], np.sqrt(np.diag(c)), rtol=1e-5)
        assert np.all(s.stderr[i][~free] == 0.0)
        assert float(s.chi2[i]) == pytest.approx(2 * cost, rel=1e-9)


def test_fixed_takes_a_pytree_like_x0():
    from adaptprec.batch._problem import build_problem

    tree = {"a": X0[:, 0], "k": X0[:, 1], "c": X0[:, 2]}     # leaves in order a, c, k
    prob = build_problem(lambda p, t: p["a"] * jnp.exp(-p["k"] * t) + p["c"], tree, (T,),
                         None, Y, None, fixed={"a": FIXED[:, 0], "k": False, "c": True})
    lo, hi = prob.residual.bounds(prob.bargs)
    held = np.asarray(lo == hi)
    assert held.tolist() == np.column_stack([FIXED[:, 0], np.ones(4, bool),
                                             np.zeros(4, bool)]).tolist()
    assert np.array_equal(np.asarray(lo)[held], np.column_stack(
        [X0[:, 0], X0[:, 2], X0[:, 1]])[held])
