"""Moré, Garbow & Hillstrom (1981), "Testing unconstrained optimization software", ACM TOMS
7(1): least-squares test problems written from the paper's formulas, standard starting
points, and the published minima f* = sum f_i^2 (our cost is f / 2).

The default run covers a few of them (badly scaled, singular Jacobian, exponential
data fit); the rest are ``slow``.
"""

import jax.numpy as jnp
import numpy as np
import pytest

import adaptprec as ap


def rosenbrock(x):
    return jnp.stack([10 * (x[1] - x[0] ** 2), 1 - x[0]])


def freudenstein_roth(x):
    return jnp.stack([-13 + x[0] + ((5 - x[1]) * x[1] - 2) * x[1],
                      -29 + x[0] + ((x[1] + 1) * x[1] - 14) * x[1]])


def powell_badly_scaled(x):
    return jnp.stack([1e4 * x[0] * x[1] - 1, jnp.exp(-x[0]) + jnp.exp(-x[1]) - 1.0001])


def brown_badly_scaled(x):
    return jnp.stack([x[0] - 1e6, x[1] - 2e-6, x[0] * x[1] - 2])


def beale(x):
    y = jnp.array([1.5, 2.25, 2.625])
    i = jnp.arange(1.0, 4.0)
    return y - x[0] * (1 - x[1] ** i)


def helical_valley(x):
    theta = jnp.arctan(x[1] / x[0]) / (2 * jnp.pi) + jnp.where(x[0] < 0, 0.5, 0.0)
    return jnp.stack([10 * (x[2] - 10 * theta),
                      10 * (jnp.sqrt(x[0] ** 2 + x[1] ** 2) - 1), x[2]])


_BARD_Y = jnp.array([0.14, 0.18, 0.22, 0.25, 0.29, 0.32, 0.35, 0.39, 0.37, 0.58, 0.73,
                     0.96, 1.34, 2.10, 4.39])


def bard(x):
    u = jnp.arange(1.0, 16.0)
    v = 16.0 - u
    w = jnp.minimum(u, v)
    return _BARD_Y - (x[0] + u / (v * x[1] + w * x[2]))


_MEYER_Y = jnp.array([34780., 28610., 23650., 19630., 16370., 13720., 11540., 9744., 8261.,
                      7030., 6005., 5147., 4427., 3820., 3307., 2872.])


def meyer(x):
    t = 45.0 + 5.0 * jnp.arange(1.0, 17.0)
    return x[0] * jnp.exp(x[1] / (t + x[2])) - _MEYER_Y


def box3d(x):
    t = 0.1 * jnp.arange(1.0, 11.0)
    return (jnp.exp(-t * x[0]) - jnp.exp(-t * x[1])
            - x[2] * (jnp.exp(-t) - jnp.exp(-10 * t)))


def powell_singular(x):
    return jnp.stack([x[0] + 10 * x[1], jnp.sqrt(5.0) * (x[2] - x[3]),
                      (x[1] - 2 * x[2]) ** 2, jnp.sqrt(10.0) * (x[0] - x[3]) ** 2])


def wood(x):
    return jnp.stack([10 * (x[1] - x[0] ** 2), 1 - x[0], jnp.sqrt(90.0) * (x[3] - x[2] ** 2),
                      1 - x[2], jnp.sqrt(10.0) * (x[1] + x[3] - 2),
                      (x[1] - x[3]) / jnp.sqrt(10.0)])


_KO_Y = jnp.array([0.1957, 0.1947, 0.1735, 0.1600, 0.0844, 0.0627, 0.0456, 0.0342, 0.0323,
                   0.0235, 0.0246])
_KO_U = jnp.array([4.0, 2.0, 1.0, 0.5, 0.25, 0.167, 0.125, 0.1, 0.0833, 0.0714, 0.0625])


def kowalik_osborne(x):
    u = _KO_U
    return _KO_Y - x[0] * (u ** 2 + u * x[1]) / (u ** 2 + u * x[2] + x[3])


_OS1_Y = jnp.array([0.844, 0.908, 0.932, 0.936, 0.925, 0.908, 0.881, 0.850, 0.818, 0.784,
                    0.751, 0.718, 0.685, 0.658, 0.628, 0.603, 0.580, 0.558, 0.538, 0.522,
                    0.506, 0.490, 0.478, 0.467, 0.457, 0.448, 0.438, 0.431, 0.424, 0.420,
                    0.414, 0.411, 0.406])


def osborne1(x):
    t = 10.0 * jnp.arange(33.0)
    return _OS1_Y - (x[0] + x[1] * jnp.exp(-t * x[3]) + x[2] * jnp.exp(-t * x[4]))


def biggs_exp6(x):
    t = 0.1 * jnp.arange(1.0, 14.0)
    y = jnp.exp(-t) - 5 * jnp.exp(-10 * t) + 3 * jnp.exp(-4 * t)
    return (x[2] * jnp.exp(-t * x[0]) - x[3] * jnp.exp(-t * x[1])
            + x[5] * jnp.exp(-t * x[4]) - y)


_OS2_Y = jnp.array([
    1.366, 1.191, 1.112, 1.013, 0.991, 0.885, 0.831, 0.847, 0.786, 0.725, 0.746, 0.679,
    0.608, 0.655, 0.616, 0.606, 0.602, 0.626, 0.651, 0.724, 0.649, 0.649, 0.694, 0.644,
    0.624, 0.661, 0.612, 0.558, 0.533, 0.495, 0.500, 0.423, 0.395, 0.375, 0.372, 0.391,
    0.396, 0.405, 0.428, 0.429, 0.523, 0.562, 0.607, 0.653, 0.672, 0.708, 0.633, 0.668,
    0.645, 0.632, 0.591, 0.559, 0.597, 0.625, 0.739, 0.710, 0.729, 0.720, 0.636, 0.581,
    0.428, 0.292, 0.162, 0.098, 0.054])


def osborne2(x):
    t = jnp.arange(65.0) / 10.0
    return _OS2_Y - (x[0] * jnp.exp(-t * x[4]) + x[1] * jnp.exp(-((t - x[8]) ** 2) * x[5])
                     + x[2] * jnp.exp(-((t - x[9]) ** 2) * x[6])
                     + x[3] * jnp.exp(-((t - x[10]) ** 2) * x[7]))


def watson(x):  # n = len(x), m = 31
    n = x.shape[0]
    t = jnp.arange(1.0, 30.0) / 29.0
    j = jnp.arange(n, dtype=x.dtype)
    s1 = jnp.sum(j[1:] * x[1:] * t[:, None] ** (j[1:] - 1), axis=1)
    s2 = jnp.sum(x * t[:, None] ** j, axis=1)
    return jnp.concatenate([s1 - s2 ** 2 - 1, jnp.stack([x[0], x[1] - x[0] ** 2 - 1])])


# name: (residual, x0, accepted published minima f* = sum f_i^2)
PROBLEMS = {
    "rosenbrock": (rosenbrock, [-1.2, 1.0], [0.0]),
    "freudenstein_roth": (freudenstein_roth, [0.5, -2.0], [0.0, 48.9842536]),
    "powell_badly_scaled": (powell_badly_scaled, [0.0, 1.0], [0.0]),
    "brown_badly_scaled": (brown_badly_scaled, [1.0, 1.0], [0.0]),
    "beale": (beale, [1.0, 1.0], [0.0]),
    "helical_valley": (helical_valley, [-1.0, 0.0, 0.0], [0.0]),
    "bard": (bard, [1.0, 1.0, 1.0], [8.21487e-3, 17.4286]),
    "meyer": (meyer, [0.02, 4000.0, 250.0], [87.9458]),
    "box3d": (box3d, [0.0, 10.0, 20.0], [0.0]),
    "powell_singular": (powell_singular, [3.0, -1.0, 0.0, 1.0], [0.0]),
    "wood": (wood, [-3.0, -1.0, -3.0, -1.0], [0.0]),
    "kowalik_osborne": (kowalik_osborne, [0.25, 0.39, 0.415, 0.39], [3.07505e-4]),
    "osborne1": (osborne1, [0.5, 1.5, -1.0, 0.01, 0.02], [5.46489e-5]),
    "biggs_exp6": (biggs_exp6, [1.0, 2.0, 1.0, 1.0, 1.0, 1.0], [0.0, 5.65565e-3]),
    "osborne2": (osborne2, [1.3, 0.65, 0.65, 0.7, 0.6, 3.0, 5.0, 7.0, 2.0, 4.5, 5.5],
                 [4.01377e-2]),
    "watson6": (watson, [0.0] * 6, [2.28767e-3]),
    "watson9": (watson, [0.0] * 9, [1.39976e-6]),
}
DEFAULT = {"brown_badly_scaled", "powell_singular", "meyer"}


def _params():
    return [pytest.param(k, marks=() if k in DEFAULT else pytest.mark.slow)
            for k in PROBLEMS]


@pytest.mark.parametrize("name", _params())
def test_mgh_reaches_published_minimum(name):
    fn, x0, minima = PROBLEMS[name]
    res = ap.solve_nlsq(fn, jnp.asarray(x0), max_steps=2000)
    f = 2.0 * float(res.cost)
    assert bool(res.success), res.message
    assert res.rung_name == "f64"
    ok = [abs(f - fs) <= 1e-5 * fs if fs > 0 else f <= 1e-16 for fs in minima]
    assert any(ok), f"{name}: f = {f!r}, published {minima}"
    # first-order optimality at the answer
    g = np.asarray(res.grad)
    assert np.max(np.abs(g)) <= 1e-6 * max(1.0, np.max(np.abs(np.asarray(res.jac)))), g
