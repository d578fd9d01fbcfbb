"""NIST StRD nonlinear regression (all 27 problems): LRE >= 6 on every parameter (certified
values), both starts, default adaptive precision (float64 alone at these sizes on CPU,
with the ladder's stopping rules), the ladder f32 -> f64 and float64, default tolerances.

The default run covers a representative handful (lower and average difficulty,
exponential / rational / multi-peak models); the full 2 x 27 x 2 sweep is ``slow``.
Known failures go in ``KNOWN_FAIL`` (strict ``xfail``); there are none.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import adaptprec as ap
from nist_problems import MODELS, load, lre
from robust_sweep import residual_for

HANDFUL = ["Misra1a", "Kirby2", "MGH17"]  # MGH17: start 1 used to stall (fixed)
# MGH17 start 1 fixed: rank test on s, MINPACK radius. Bennett5 start 1 (adaptive) fixed:
# a float32 rung that uses up its budget no longer hands float64 its point in the valley.
KNOWN_FAIL: set = set()


@functools.cache
def _problem(name):
    return load(name)


def _solve(name, start, precision):
    # One residual function object per problem (robust_sweep.residual_for, as the sweep
    # uses), not the bound method ``p.residual`` of a freshly parsed problem. (Measured: the
    # bound method did not recompile either, the second solve of a fresh load took 0.02 s;
    # the default NIST tests take the same CPU time, 12.4 s before and 12.7 s after.)
    p = _problem(name)
    res = ap.solve_nlsq(residual_for(name), jnp.asarray(p.starts[start]),
                        args=(jnp.asarray(p.x), jnp.asarray(p.y)), precision=precision)
    return p, res


def _check(name, start, precision):
    p, res = _solve(name, start, precision)
    score = lre(res.x, p.certified)
    assert bool(res.success), res.message
    assert res.rung_name == "f64"
    assert score >= 6.0, f"{name} start {start + 1} ({precision}): LRE {score:.2f}"
    # the certified residual sum of squares too (Lanczos1's is 1.4e-25, at the rounding
    # level of its 13-digit data: compared absolutely there)
    rss = 2.0 * float(res.cost)
    assert lre(rss, p.certified_rss) >= 6.0 or abs(rss - p.certified_rss) < 1e-20


@pytest.mark.parametrize("precision", ["adaptive", "f64"])
@pytest.mark.parametrize("name", HANDFUL)
def test_nist_handful(name, precision):
    for start in (0, 1):  # same compiled solver for both starts
        _check(name, start, precision)


def test_nist_adaptive_starts_low():
    # the ladder asked for; "adaptive" runs float64 alone at NIST's sizes on CPU
    # (common.SMALL_F64_MN), with the ladder's top-rung stopping rules
    p, res = _solve("Misra1a", 0, "f32,f64")
    tr = res.trace()
    assert tr[0]["rung"] == "f32" and tr[0]["nfev"] > tr[-1]["nfev"]
    p, res = _solve("Misra1a", 0, "adaptive")
    assert [t["rung"] for t in res.trace()] == ["f64"]


def _full_params():
    out = []
    for name in MODELS:
        for start in (0, 1):
            for precision in ("adaptive", "f32,f64", "f64"):
                marks = [pytest.mark.slow]
                if (name, start, precision) in KNOWN_FAIL:
                    marks.append(pytest.mark.xfail(reason="creeps along the valley",
                                                   strict=True))
                out.append(pytest.param(name, start, precision, marks=marks))
    return out


@pytest.mark.parametrize("name,start,precision", _full_params())
def test_nist_full_sweep(name, start, precision):
    _check(name, start, precision)


@pytest.mark.slow
def test_parser_reads_all_problems():
    for name in MODELS:
        p = load(name)
        assert p.starts[0].shape == p.starts[1].shape == p.certified.shape
        assert p.y.shape[0] == (p.x.shape[0]) and p.certified_rss > 0
        # certified values really minimise the model: the residual at them matches RSS
        # one jitted call per model (eager op-by-op dispatch took ~14 s for the 27)
        rss = float(np.sum(np.asarray(jax.jit(p.residual)(jnp.asarray(p.certified),
                                                 jnp.asarray(p.x), jnp.asarray(p.y))) ** 2))
        # (Lanczos1's RSS is 1e-25: data rounded to 13 digits; compare absolutely there)
        np.testing.assert_allclose(rss, p.certified_rss, rtol=1e-6, atol=1e-20)
