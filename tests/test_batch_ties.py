"""Ties (``expr=``) and inequalities (``constraints=``) in solve_nlsq_batch, each fit
against scipy's curve_fit of the model rewritten by hand (parameters, covariance
propagated to the tied parameters, dof): ties ``w2 = w1`` and ``a2 = 2*a1`` and an
inequality active in some fits and not in others, with per-fit ``fixed=`` and a mask
(one compiled solver in the default run); an array ``x0`` (columns ``p0, p1, ...``) and
jit, vmap and grad through a constrained batch (slow: a second solver); the errors at
the boundary. Before, solve_nlsq_batch refused both keywords.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.optimize as so

import adaptprec as ap
from adaptprec.modeling.parameters import parameter_spec

F64 = dict(precision="f64", compaction=None, return_pcov=True)
TIGHT = dict(ftol=1e-14, xtol=1e-14, gtol=1e-14)
RNG = np.random.default_rng(43)

# ---- two peaks: ties w2 = w1 and a2 = 2*a1, the inequality c < a1 (active in fits 1 and
# 2: their data have c > a1), c fixed in fits 0 and 2, fits 1 and 3 masked
X = np.linspace(0.0, 10.0, 40)
NAMES = ("a1", "a2", "c", "m1", "m2", "w1", "w2")          # x0's keys in jax.tree order
TRUTH = [dict(a1=a1, m1=m1, w1=w1, a2=2 * a1, m2=m2, w2=w1, c=c) for a1, m1, w1, m2, c in
         [(1.0, 3.0, 0.8, 6.5, 0.3), (0.5, 2.7, 0.9, 6.9, 0.8),
          (0.6, 3.2, 0.7, 6.2, 0.9), (1.2, 3.0, 1.0, 7.1, 0.2)]]
HELD_C = np.array([True, False, True, False])
ACTIVE = [False, True, True, False]


def peaks(p, x):
    return (p["a1"] * jnp.exp(-0.5 * ((x - p["m1"]) / p["w1"]) ** 2)
            + p["a2"] * jnp.exp(-0.5 * ((x - p["m2"]) / p["w2"]) ** 2) + p["c"])


Y = np.stack([np.asarray(peaks(t, X)) for t in TRUTH]) + RNG.normal(0, 0.03, (4, 40))
MASK = np.ones((4, 40), bool)
MASK[1, 30:] = False                                         # a shorter fit
MASK[3, 5:12] = False                                        # a gap
X0 = {k: np.array([1.2, 1.2, 1.0, 1.2]) for k in ("a1", "a2", "w1", "w2")}
X0.update(m1=np.full(4, 2.8), m2=np.full(4, 6.8),
          c=np.where(HELD_C, [t["c"] for t in TRUTH], 0.2))
TIES = {"w2": "w1", "a2": "2*a1"}


@pytest.fixture(scope="module")
def tied_fits():
    res = ap.solve_nlsq_batch(peaks, X0, (X,), in_axes=None, ydata=Y, mask=MASK,
                              fixed={k: HELD_C if k == "c" else False for k in NAMES},
                              expr=TIES, constraints="c < a1", **F64)
    return jax.tree.map(np.asarray, res)


def _peaks_rewritten(i):
    """Fit i's scipy reference on its real points: the model with a1 = c + s (s >= 0),
    a2 = 2 a1, w2 = w1 written in, free (m1, w1, m2[, c], s); over every parameter."""
    def model(x, m1, w1, m2, *cs):
        c, s = (X0["c"][i], cs[0]) if HELD_C[i] else cs
        p = dict(a1=c + s, m1=m1, w1=w1, a2=2 * (c + s), m2=m2, w2=w1, c=c)
        return np.asarray(peaks(p, x))

    free = ["m1", "w1", "m2"] + ([] if HELD_C[i] else ["c"]) + ["s"]
    p0 = [X0[k][i] for k in free[:-1]] + [X0["a1"][i] - X0["c"][i]]
    lower = [-np.inf] * (len(free) - 1) + [0.0]
    q, cq = so.curve_fit(model, X[MASK[i]], Y[i][MASK[i]], p0=p0, bounds=(lower, np.inf),
                         **TIGHT)
    v = dict(zip(free, q))
    v.setdefault("c", X0["c"][i])
    v.update(a1=v["c"] + v["s"], a2=2 * (v["c"] + v["s"]), w2=v["w1"])
    T = np.zeros((7, len(free)))                  # dp/dq, by hand
    for j, k in enumerate(free):
        if k in NAMES:
            T[NAMES.index(k), j] = 1.0
    for k, f in (("a1", 1.0), ("a2", 2.0)):       # a1 = c + s, a2 = 2 (c + s)
        T[NAMES.index(k), free.index("s")] = f
        if "c" in free:
            T[NAMES.index(k), free.index("c")] = f
    T[NAMES.index("w2"), free.index("w1")] = 1.0
    return np.array([v[k] for k in NAMES]), T @ cq @ T.T, int(MASK[i].sum()) - len(free)


def test_ties_inequality_fixed_and_mask_match_the_rewritten_model(tied_fits):
    res = tied_fits
    assert sorted(res.x) == sorted(NAMES) and bool(np.all(res.success))
    x = np.stack([res.x[k] for k in NAMES], axis=1)
    a1, a2, c, w1, w2 = (NAMES.index(k) for k in ("a1", "a2", "c", "w1", "w2"))
    assert np.array_equal(x[:, w2], x[:, w1]) and np.allclose(x[:, a2], 2 * x[:, a1])
    assert np.array_equal(x[HELD_C, c], X0["c"][HELD_C])                # held exactly
    assert np.all(x[:, c] <= x[:, a1]) and (x[:, a1] - x[:, c] < 1e-9).tolist() == ACTIVE
    for i in range(4):
        p, cov, dof = _peaks_rewritten(i)
        assert int(res.dof[i]) == dof
        np.testing.assert_allclose(x[i], p, rtol=1e-6, atol=1e-8)
        np.testing.assert_allclose(res.pcov[i], cov, rtol=1e-4, atol=1e-5 * np.abs(cov).max())
    # the tied parameters' errors by propagation: var(a2) = 4 var(a1), w2's = w1's
    np.testing.assert_allclose(res.pcov[:, a2, a2], 4 * res.pcov[:, a1, a1], rtol=1e-12)
    np.testing.assert_allclose(res.pcov[:, w2, w2], res.pcov[:, w1, w1], rtol=1e-12)
    assert set(res.dependent) == {"a1", "a2", "w2"}
    # a summary would count the tied parameters as free: it refuses, and says where to look
    with pytest.raises(ValueError, match="ties or constraints.*return_pcov"):
        ap.summarize_batch(res, peaks, (X,), in_axes=None, ydata=Y, mask=MASK)


# ---- an inequality p2 < p0 on an array x0 (columns p0, p1, p2): active in fits 2 and 3
T_DECAY = np.linspace(0.0, 4.0, 30)
DECAY_TRUTH = np.array([[3.0, 1.0, 0.5], [2.5, 0.6, 0.2], [1.0, 1.2, 1.4], [0.9, 0.8, 1.6]])
DECAY_Y = (DECAY_TRUTH[:, :1] * np.exp(-DECAY_TRUTH[:, 1:2] * T_DECAY) + DECAY_TRUTH[:, 2:]
           + RNG.normal(0, 0.01, (4, 30)))
DECAY_X0 = np.tile([2.0, 1.0, 0.5], (4, 1))


def decay(p, t):
    return p[0] * jnp.exp(-p[1] * t) + p[2]


@pytest.fixture(scope="module")
def constrained_fits():      # (slow tests only: a second compiled solver)
    res = ap.solve_nlsq_batch(decay, DECAY_X0, (T_DECAY,), in_axes=None, ydata=DECAY_Y,
                              constraints="p2 < p0", **F64)
    return jax.tree.map(np.asarray, res)


def _decay_rewritten(i):
    """scipy on p0 = p2 + s, s >= 0 (the slack bounded): free coordinates (p1, p2, s)."""
    def model(t, k, c, s):
        return (c + s) * np.exp(-k * t) + c

    x0 = DECAY_X0[i]
    q, cq = so.curve_fit(model, T_DECAY, DECAY_Y[i], p0=[x0[1], x0[2], x0[0] - x0[2]],
                         bounds=([-np.inf, -np.inf, 0.0], np.inf), **TIGHT)
    T = np.array([[0.0, 1.0, 1.0], [1.0, 0.0, 0.0], [0.0, 1.0, 0.0]])
    return np.array([q[1] + q[2], q[0], q[1]]), T @ cq @ T.T


@pytest.mark.slow
def test_array_x0_inequality_active_in_some_fits_matches_the_rewritten_model(
        constrained_fits):
    res = constrained_fits
    assert bool(np.all(res.success)) and res.dof.tolist() == [27] * 4
    assert np.all(res.x[:, 2] <= res.x[:, 0])
    active = res.x[:, 0] - res.x[:, 2] < 1e-9
    assert active.tolist() == [False, False, True, True]
    for i in range(4):
        p, cov = _decay_rewritten(i)
        np.testing.assert_allclose(res.x[i], p, rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(res.pcov[i], cov, rtol=1e-4, atol=1e-12)
        free, _ = so.curve_fit(lambda t, a, k, c: a * np.exp(-k * t) + c, T_DECAY,
                               DECAY_Y[i], p0=DECAY_X0[i], **TIGHT)
        assert (free[2] > free[0]) == active[i]           # the data would break it
        if not active[i]:                                  # inside: the free fit
            np.testing.assert_allclose(res.x[i], free, rtol=1e-7)


# ---- jit, vmap and grad through a constrained batch
@pytest.mark.slow
def test_jit_vmap_grad_through_a_constrained_batch(constrained_fits):
    x0, y = DECAY_X0[:2], DECAY_Y[:2]          # both inside the constraint

    def solve(y):        # eager: constrained_fits' program (2 fits pad to its 4)
        return ap.solve_nlsq_batch(decay, x0, (T_DECAY,), in_axes=None, ydata=y,
                                   constraints="p2 < p0", **F64).x

    def loss(y):
        x = solve(y)
        return jnp.sum(x[:, 1] ** 2), x

    g, x = jax.jit(jax.vmap(jax.grad(loss, has_aux=True)))(jnp.stack([y, y[::-1]]))
    g, x = np.asarray(g), np.asarray(x)
    eager = np.asarray(solve(y))
    np.testing.assert_allclose(x[0], eager, rtol=1e-8)
    np.testing.assert_allclose(x[1], eager[::-1], rtol=1e-8)
    np.testing.assert_allclose(g[1], g[0][::-1], rtol=1e-8, atol=1e-12)
    h = 1e-4
    for i, j in [(0, 0), (1, 7), (0, 29)]:        # central differences of the eager solve
        e = np.zeros_like(y)
        e[i, j] = h
        fd = (np.sum(np.asarray(solve(y + e))[:, 1] ** 2)
              - np.sum(np.asarray(solve(y - e))[:, 1] ** 2)) / (2 * h)
        assert g[0][i, j] == pytest.approx(fd, rel=1e-4, abs=1e-8)


# ---- Poisson counts, a namedtuple x0
@pytest.mark.slow
def test_poisson_tie_on_a_namedtuple_equals_the_rewritten_model():
    import collections

    P = collections.namedtuple("P", "a b k")
    amp, rate = np.array([50.0, 80.0, 30.0, 60.0]), np.array([0.5, 0.8, 0.3, 1.0])
    counts = RNG.poisson(amp[:, None] * (np.exp(-rate[:, None] * T_DECAY) + 0.1)) * 1.0
    x0 = P(a=np.full(4, 40.0), b=np.zeros(4), k=np.full(4, 0.6))
    kw = dict(in_axes=None, ydata=counts, likelihood="poisson", **F64)
    res = ap.solve_nlsq_batch(lambda p, t: p.a * jnp.exp(-p.k * t) + p.b, x0, (T_DECAY,),
                              expr={"b": "0.1*a"}, **kw)
    ref = ap.solve_nlsq_batch(lambda p, t: p[0] * (jnp.exp(-p[1] * t) + 0.1),
                              np.tile([40.0, 0.6], (4, 1)), (T_DECAY,), **kw)
    assert isinstance(res.x, P) and res.dof.tolist() == ref.dof.tolist() == [28] * 4
    np.testing.assert_allclose(np.column_stack([res.x.a, res.x.k]), ref.x, rtol=1e-9)
    np.testing.assert_allclose(res.x.b, 0.1 * res.x.a, rtol=1e-15)
    T = np.array([[1.0, 0.0], [0.1, 0.0], [0.0, 1.0]])          # d(a, b, k)/d(a, k)
    np.testing.assert_allclose(res.pcov, T @ np.asarray(ref.pcov) @ T.T, rtol=1e-9,
                               atol=1e-15)


@pytest.mark.slow
def test_x64_off_tied_batch_as_in_the_docs():
    from tests._subprocess import run_python

    out = run_python("""
        import warnings; warnings.simplefilter("error")
        import numpy as np, jax.numpy as jnp
        import adaptprec as ap
        x = np.linspace(0.0, 4.0, 30)
        y = np.stack([3.0 * np.exp(-k * x) + 0.3 * k for k in (0.5, 1.0, 2.0)])
        x0 = {"a": np.full(3, 1.0), "k": np.full(3, 1.0), "c": np.zeros(3)}
        model = lambda p, x: p["a"] * jnp.exp(-p["k"] * x) + p["c"]
        for precision in ("adaptive", "f32"):
            r = ap.solve_nlsq_batch(model, x0, (x,), in_axes=None, ydata=y,
                                    expr={"c": "0.3*k"}, constraints="k < a",
                                    precision=precision, return_pcov=True)
            print(precision, r.x["k"].dtype, np.round(r.x["k"], 3).tolist(),
                  r.dof.tolist(), bool(np.allclose(r.x["c"], 0.3 * r.x["k"])))
    """, x64=False)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.splitlines() == ["adaptive float64 [0.5, 1.0, 2.0] [28, 28, 28] True",
                                       "f32 float32 [0.5, 1.0, 2.0] [28, 28, 28] True"]


# ---- errors at the boundary (before anything compiles)
def _call(**kw):
    args = dict(fun=peaks, x0=X0, args=(X,), in_axes=None, ydata=Y)
    args.update(kw)
    return ap.solve_nlsq_batch(**args)


@pytest.mark.parametrize("kw, match", [
    (dict(expr={"w3": "w1"}), r"expr names \['w3'\].*parameters are"),
    (dict(expr={"w2": "w1 + q"}), r"names \['q'\]"),
    (dict(expr={"w2": "w1", "w1": "2*w2"}), "cycle"),
    (dict(expr={"c": "a1"}, fixed={"c": HELD_C, **{k: False for k in NAMES if k != "c"}}),
     "both fixed and tied"),
    (dict(constraints="c < a1", fixed={k: HELD_C if k in ("a1", "c") else False
                                       for k in NAMES}),
     r"one side must be a single free parameter .*\(free parameters: \['a2', 'm1', 'm2'"),
    (dict(constraints="m1 < zz"), r"names \['zz'\]"),
    (dict(constraints="m2 < m1"), r"x0 breaks the constraint m2 <= m1 in 4 fit\(s\)"),
    (dict(constraints="m1 + m2 < 10"), "Write it as, e.g., 'a < 10 - b'"),
    (dict(expr={"w2": "__import__('os')"}), "calls __import__"),
    (dict(expr=["w2 = w1"]), "expr must be a dict"),
])
def test_bad_ties_and_constraints_are_named(kw, match):
    with pytest.raises(ValueError, match=match):
        _call(**kw)


def test_array_x0_names_its_columns():
    with pytest.raises(ValueError, match="columns of an array x0 are p0, p1"):
        ap.solve_nlsq_batch(decay, DECAY_X0, (T_DECAY,), in_axes=None, ydata=DECAY_Y,
                            expr={"a": "p0"})
    with pytest.raises(ValueError, match=r"leaf x0\['v'\] of per-fit shape \(2,\)"):
        ap.solve_nlsq_batch(lambda p, t: p["v"][0] + p["k"] * t, {"v": np.ones((4, 2)),
                            "k": np.ones(4)}, (T_DECAY,), in_axes=None, ydata=DECAY_Y,
                            expr={"k": "1.0"})


def test_two_constraints_start_in_the_order_of_their_slacks():
    # c = b + s1 is evaluated after b = a + s2 although its constraint comes first
    spec, values = parameter_spec(("a", "b", "c"), p0=[1.0, 2.0, 4.0],
                                  constraints=["c > b", "b > a"])
    assert spec.free == ("a", "c - b", "b - a")
    assert values.q0.tolist() == [1.0, 2.0, 1.0]
    assert np.asarray(spec.expand(values.q0, [])).tolist() == [1.0, 2.0, 4.0]
