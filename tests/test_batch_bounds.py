"""Box constraints in solve_nlsq_batch (projected Levenberg–Marquardt)."""

import collections

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.optimize import least_squares

import adaptprec as ap

B = 24
T = np.linspace(0.0, 3.0, 20)
LB = np.array([0.0, 0.0, 0.0])
UB = np.array([2.5, 1.5, np.inf])
TIGHT = dict(ftol=1e-12, xtol=1e-12, gtol=1e-12)


def decay(p, t):
    return p[0] * jnp.exp(-p[1] * t) + p[2]


def _data(seed=0):
    rng = np.random.default_rng(seed)
    a, k, c = rng.uniform(1, 3, B), rng.uniform(0.3, 2.5, B), rng.uniform(-0.2, 0.2, B)
    y = a[:, None] * np.exp(-k[:, None] * T) + c[:, None] + 0.02 * rng.normal(size=(B, T.size))
    x0 = np.tile([1.0, 1.0, 0.0], (B, 1))
    return y, x0


Y, X0 = _data()


@pytest.fixture(scope="module")
def f64_solution():
    return ap.solve_nlsq_batch(decay, X0, (T,), in_axes=None, ydata=Y, bounds=(LB, UB),
                               precision="f64", compaction=None, **TIGHT)


def _scipy(i):
    return least_squares(lambda p: p[0] * np.exp(-p[1] * T) + p[2] - Y[i], X0[i],
                         bounds=(LB, UB), method="trf", **TIGHT)


def _on_bound(x):
    return np.where(x <= LB + 1e-6, -1, np.where(x >= UB - 1e-6, 1, 0))


def test_matches_scipy_trf_including_active_sets(f64_solution):
    res = f64_solution
    assert bool(res.success.all())
    x = np.asarray(res.x)
    held_upper = held_lower = 0
    for i in range(B):
        ref = _scipy(i)
        np.testing.assert_allclose(x[i], ref.x, rtol=1e-5, atol=1e-6)
        assert float(res.cost[i]) <= ref.cost * (1 + 1e-9) + 1e-15
        # the same variables end on (within 1e-6 of) a bound
        on = _on_bound(x[i])
        np.testing.assert_array_equal(on, _on_bound(ref.x))
        held_upper += int((on == 1).sum())
        held_lower += int((on == -1).sum())
    assert held_upper >= 3 and held_lower >= 3          # the test exercises both sides
    # optimality is the projected gradient: small also for fits held by a bound
    assert float(jnp.max(res.optimality)) < 1e-5    # a held component would be O(0.1)


@pytest.mark.slow
def test_inactive_bounds_change_nothing_beyond_rounding():
    kw = dict(args=(T,), in_axes=None, ydata=Y, precision="f64", compaction=None, **TIGHT)
    free = ap.solve_nlsq_batch(decay, X0, **kw)
    wide = ap.solve_nlsq_batch(decay, X0, bounds=(-1e3, 1e3), **kw)
    np.testing.assert_allclose(np.asarray(wide.x), np.asarray(free.x), rtol=1e-7, atol=1e-9)


@pytest.mark.slow
def test_shared_per_fit_and_pytree_bounds_agree(f64_solution):
    kw = dict(in_axes=None, ydata=Y, precision="f64", compaction=None, **TIGHT)
    per_fit = ap.solve_nlsq_batch(decay, X0, (T,), bounds=(np.tile(LB, (B, 1)),
                                                           np.tile(UB, (B, 1))), **kw)
    np.testing.assert_array_equal(np.asarray(per_fit.x), np.asarray(f64_solution.x))

    P = collections.namedtuple("P", "amp rate offset")
    tree_model = lambda p, t: p.amp * jnp.exp(-p.rate * t) + p.offset
    x0 = P(*(jnp.asarray(X0[:, i]) for i in range(3)))
    tree = ap.solve_nlsq_batch(tree_model, x0, (T,), bounds=(P(0.0, 0.0, 0.0),
                                                             P(2.5, 1.5, np.inf)), **kw)
    flat = np.column_stack([np.asarray(tree.x.amp), np.asarray(tree.x.rate),
                            np.asarray(tree.x.offset)])
    np.testing.assert_allclose(flat, np.asarray(f64_solution.x), rtol=1e-12, atol=1e-14)


@pytest.mark.slow
def test_adaptive_does_not_escalate_fits_for_sitting_on_a_bound():
    res = ap.solve_nlsq_batch(decay, X0, (T,), in_axes=None, ydata=Y, bounds=(LB, UB),
                              compaction=None)
    x = np.asarray(res.x)
    assert ((x <= LB) | (x >= UB)).any()
    assert bool(res.success.all()) and int(res.num_escalated) == 0


@pytest.mark.slow
def test_bounds_under_jit_and_chunked(f64_solution):
    kw = dict(in_axes=None, precision="f64", compaction=None, **TIGHT)
    jitted = jax.jit(lambda y, lb, ub: ap.solve_nlsq_batch(
        decay, X0, (T,), ydata=y, bounds=(lb, ub), **kw).x)(Y, LB, UB)
    np.testing.assert_allclose(np.asarray(jitted), np.asarray(f64_solution.x), rtol=1e-9,
                               atol=1e-12)
    chunked = ap.solve_nlsq_batch(decay, X0, (T,), ydata=Y, bounds=(LB, UB), chunk_size=10,
                                  **kw)
    np.testing.assert_array_equal(np.asarray(chunked.x), np.asarray(f64_solution.x))


@pytest.mark.slow
def test_implicit_derivatives_respect_active_bounds(f64_solution):
    x = np.asarray(f64_solution.x)
    # a fit whose rate sits on its upper bound 1.5, and one with every variable free
    held = int(np.flatnonzero(x[:, 1] >= UB[1])[0])
    free = int(np.flatnonzero(((x > LB) & (x < UB)).all(axis=1))[0])
    kw = dict(in_axes=None, precision="f64", compaction=None, **TIGHT)

    def solve(y, ub_rate):
        ub = jnp.stack([jnp.asarray(2.5), jnp.asarray(ub_rate, float), jnp.asarray(jnp.inf)])
        return ap.solve_nlsq_batch(decay, X0[[held, free]], (T,), ydata=y,
                                   bounds=(LB, ub), **kw).x

    y = jnp.asarray(Y[[held, free]])
    # the held rate follows its bound one to one and ignores the data
    d_ub = jax.jacfwd(solve, argnums=1)(y, 1.5)
    assert float(d_ub[0, 1]) == pytest.approx(1.0, abs=1e-9)
    assert float(jnp.max(jnp.abs(d_ub[1]))) < 1e-12          # the free fit ignores it
    d_y = jax.jacrev(lambda y: solve(y, 1.5))(y)
    assert float(jnp.max(jnp.abs(d_y[0, 1]))) < 1e-12
    # every other entry matches central finite differences (bound set kept)
    h = 1e-6
    for k, j in [(0, 3), (1, 5), (1, 11)]:
        e = jnp.zeros_like(y).at[k, j].set(h)
        fd = (solve(y + e, 1.5) - solve(y - e, 1.5)) / (2 * h)
        np.testing.assert_allclose(np.asarray(d_y[:, :, k, j]), np.asarray(fd), rtol=1e-4,
                                   atol=1e-7)


@pytest.mark.parametrize("bounds, match", [
    ((np.zeros(3), np.array([2.5, 0.5, 1.0])), "infeasible"),
    ((np.zeros(3), np.array([2.5, 0.0, 1.0])), "strictly less"),
    ((np.zeros(2), UB), "shape"),
    ((np.array([0.0, np.nan, 0.0]), UB), "NaN"),
    ((LB,), "pair"),
])
def test_bad_bounds_are_rejected_at_the_boundary(bounds, match):
    with pytest.raises(ValueError, match=match):
        ap.solve_nlsq_batch(decay, X0, (T,), in_axes=None, ydata=Y, bounds=bounds)


def test_pytree_bounds_must_match_x0():
    x0 = {"a": jnp.ones(B), "k": jnp.ones(B), "c": jnp.zeros(B)}
    model = lambda p, t: p["a"] * jnp.exp(-p["k"] * t) + p["c"]
    with pytest.raises(ValueError, match="structure"):
        ap.solve_nlsq_batch(model, x0, (T,), in_axes=None, ydata=Y,
                            bounds=({"a": 0.0, "k": 0.0}, np.inf))
