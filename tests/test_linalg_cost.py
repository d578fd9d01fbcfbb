"""What the default ``ap.linalg.solve`` call costs, checked on its compiled program.

Issue 16: the default call (x and full info returned from jit) must be cheap. These tests
pin the structural reasons it is: the condition estimate is deferred (no extra triangular
solves in the call, the same value when read), the low-precision factor is produced by
one LAPACK call without ``lax.linalg.lu``'s NaN-select copy, and returning the factor for
the deferred estimate costs no copy either. Timings live in benchmarks/bench_linalg.py.
"""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import adaptprec as ap
from adaptprec.linalg._getrf import lu_factor, lu_factor_transposed

N = 48


def _entry(fn, *args):
    txt = jax.jit(fn).lower(*args).compile().as_text()
    return txt[txt.index("\nENTRY"):]


def _system(n=N, seed=0, batch=()):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(batch + (n, n)) + n ** 0.5 * np.eye(n),
            rng.standard_normal(batch + (n,)))


@pytest.fixture(scope="module")
def default_hlo():
    A, b = _system()
    return _entry(lambda A, b: ap.linalg.solve(A, b), A, b)


def _count(hlo, pattern):
    return len(re.findall(pattern, hlo))


@pytest.mark.slow
def test_default_call_runs_no_condition_solves(default_hlo):
    A, b = _system()
    eager = _entry(lambda A, b: ap.linalg.solve(A, b, estimate_cond=True), A, b)
    xonly = _entry(lambda A, b: ap.linalg.solve(A, b)[0], A, b)
    trsm = r"custom_call_target=\"lapack_strsm_ffi\""
    # x0: one pair of triangular solves outside the loop; the eager estimate adds 4 pairs
    assert _count(default_hlo, trsm) == _count(xonly, trsm) == 2
    assert _count(eager, trsm) == 2 + 8


@pytest.mark.slow
def test_factor_is_one_lapack_call_without_copies(default_hlo):
    # the only f32 n x n value computed is the cast of A; the factor is made in place and
    # returned (for the deferred estimate) as a bitcast of that buffer
    made = re.findall(rf"= f32\[(?:1,)?{N},{N}\]\S* (\w[\w-]*)\(", default_hlo)
    assert sorted(made) == ["bitcast", "bitcast", "fusion", "get-tuple-element"], made
    assert _count(default_hlo, "lapack_sgetrf_ffi") == 1


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [pytest.param(np.float32, marks=pytest.mark.slow), np.float64])
def test_direct_getrf_is_bit_identical_to_lax_lu(dtype):
    rng = np.random.default_rng(1)
    a = jnp.asarray(rng.standard_normal((3, 20, 20)), dtype)
    lu, perm = jax.jit(lu_factor)(a)
    lu2, _, perm2 = lax.linalg.lu(a)
    assert bool(jnp.all(lu == lu2)) and bool(jnp.all(perm == perm2))
    f, perm3 = jax.jit(lu_factor_transposed)(a)
    lu3, _, _ = lax.linalg.lu(jnp.swapaxes(a, -1, -2))
    assert bool(jnp.all(jnp.swapaxes(f, -1, -2) == lu3))
    # vmap (folded into LAPACK's batch) and an exactly singular matrix (zero pivot, no NaN)
    a4 = jnp.asarray(rng.standard_normal((2, 3, 8, 8)), dtype)
    lu4, perm4 = jax.jit(jax.vmap(lu_factor))(a4)
    lu5, _, perm5 = lax.linalg.lu(a4)
    assert bool(jnp.all(lu4 == lu5)) and bool(jnp.all(perm4 == perm5))
    s = jnp.zeros((1, 4, 4), dtype).at[0, 0, 0].set(1.0)
    assert bool(jnp.all(lu_factor(s)[0] == lax.linalg.lu(s)[0]))


# (slow: ~12s; CI runs the slow job too: keeps the default run near 10 min on 2 cores)
@pytest.mark.slow
def test_deferred_estimate_equals_eager_estimate():
    A, b = _system(batch=(3,), seed=2)
    lazy = jax.jit(lambda A, b: ap.linalg.solve(A, b))
    eager = jax.jit(lambda A, b: ap.linalg.solve(A, b, estimate_cond=True))
    _, il = lazy(A, b)
    _, ie = eager(A, b)
    assert il.cond_factors is not None and ie.cond_factors is None
    assert bool(jnp.all(jnp.isnan(il.cond_value)))
    np.testing.assert_allclose(il.cond_estimate, ie.cond_estimate, rtol=1e-12)
    true = np.array([np.linalg.cond(a, np.inf) for a in A])
    assert np.all(true / 3 <= il.cond_estimate) and np.all(il.cond_estimate <= true * 1.01)
    # read inside jit and under vmap: the same value
    inside = jax.jit(lambda A, b: ap.linalg.solve(A, b)[1].cond_estimate)(A, b)
    mapped = jax.vmap(lambda A, b: ap.linalg.solve(A, b)[1].cond_estimate)(A, b)
    np.testing.assert_allclose(inside, ie.cond_estimate, rtol=1e-12)
    np.testing.assert_allclose(mapped, ie.cond_estimate, rtol=1e-12)


@pytest.mark.slow
def test_deferred_estimate_after_fallback_is_the_working_precision_one():
    rng = np.random.default_rng(3)
    u, _ = np.linalg.qr(rng.standard_normal((N, N)))
    v, _ = np.linalg.qr(rng.standard_normal((N, N)))
    bad = (u * np.logspace(0, -12, N)) @ v.T                       # LU-IR cannot converge
    good, _ = _system(seed=4)
    A = np.stack([good, bad])
    x, info = jax.jit(lambda A, b: ap.linalg.solve(A, b))(A, np.ones((2, N)))
    assert info.fell_back.tolist() == [False, True]
    true = np.array([np.linalg.cond(a, np.inf) for a in A])
    est = np.asarray(info.cond_estimate)
    assert np.all(true / 3 <= est) and np.all(est <= true * 1.01)
    assert np.isnan(info.cond_value[0]) and info.cond_value[1] == est[1]


def test_estimate_cond_option_is_validated():
    with pytest.raises(ValueError, match="estimate_cond must be 'lazy'"):
        ap.linalg.solve(np.eye(3), np.ones(3), estimate_cond="sometimes")
    with pytest.raises(ValueError, match="estimate_cond"):
        ap.linalg.solve(np.eye(3), np.ones(3), estimate_cond=1)


# (37, 8): several panels and a ragged last one; the other shapes in the slow run
@pytest.mark.slow
@pytest.mark.parametrize("n, nb", [pytest.param(50, 16, marks=pytest.mark.slow), (37, 8),
                                   pytest.param(10, 256, marks=pytest.mark.slow)])
def test_panel_solves_match_lapack(n, nb):
    from adaptprec.linalg._common import lu_solve
    from adaptprec.linalg._trsv import make_panels, panel_solve
    rng = np.random.default_rng(n)
    M = jnp.asarray(rng.standard_normal((n, n)))
    lu, _, perm = lax.linalg.lu(M)
    p = make_panels(lu.T, nb)
    y = jnp.asarray(rng.standard_normal((n, 2)))
    for t in (False, True):
        x = panel_solve(p, perm, y, transpose=t)
        np.testing.assert_allclose(x, lu_solve(lu, perm, y, transpose=t), rtol=0,
                                   atol=1e-12 * float(jnp.max(jnp.abs(x))))
        np.testing.assert_allclose((M.T if t else M) @ x, y, rtol=0, atol=1e-12)


@pytest.mark.slow
def test_large_n_uses_panel_solves_and_reaches_f64_accuracy():
    from adaptprec.linalg._trsv import BLOCK, MIN_N
    n = MIN_N + 40                                     # several blocks, the last one short
    A, b = _system(n=n, seed=5)
    f = lambda A, b: ap.linalg.solve(A, b, estimate_cond=True)   # noqa: E731
    hlo = _entry(f, A, b)
    assert _count(hlo, rf"f32\[1,{BLOCK},1\]\{{1,2,0\}} custom-call\([^)]*\), "
                       r"custom_call_target=\"lapack_strsm") >= 4
    x, info = jax.jit(f)(A, b)
    r = np.abs(b - A @ np.asarray(x)).max()
    assert r / (np.abs(A).sum(1).max() * np.abs(x).max() + np.abs(b).max()) < 2e-16 * 4
    assert int(info.status) == ap.Status.CONVERGED and not bool(info.fell_back)
    true = np.linalg.cond(A, np.inf)
    assert true / 3 <= float(info.cond_estimate) <= true * 1.01


def test_panel_solves_only_for_factors_up_to_32_mb():
    """Cutting panels writes a second copy of the factor: a net loss at n = 4096 (64 MB)
    measured in bench_linalg.py, so LAPACK strsm is kept there."""
    from types import SimpleNamespace
    from adaptprec.linalg._factors import use_panels

    def uses(m, n, refine="lu", perm=True):
        lu = np.empty((m, n, n), np.float32)            # never touched: no real memory
        fac = SimpleNamespace(lu=lu, perm=np.empty((m, n), np.int32) if perm else None)
        return use_panels(fac, refine)
    assert uses(1, 2048) and uses(1, 512) and uses(2, 2048)
    assert not uses(1, 4096) and not uses(5, 2048) and not uses(1, 511)
    assert not uses(1, 2048, refine="gmres") and not uses(1, 2048, perm=False)  # Cholesky


@pytest.mark.slow
def test_factor_is_cut_into_panels_once():
    """Each panel of the factor is one buffer, shared by the solve of x0 and the
    refinement loop (issue 31: XLA:CPU had copied every slice into both, a second cut of
    the factor on every call)."""
    from adaptprec.linalg._trsv import BLOCK, MIN_N
    n = MIN_N + 40
    blocks = -(-n // BLOCK)                            # the last one short
    A, b = _system(n=n, seed=6)
    hlo = _entry(lambda A, b: ap.linalg.solve(A, b)[0], A, b)
    factor = re.search(rf"%(\S+) = f32\[1,{n},{n}\]\S* get-tuple-element\((%\S+)\), index=0",
                       hlo)
    assert factor and "lapack_sgetrf_ffi" in hlo.split(factor.group(2) + " =")[1].split("\n")[0]
    cuts = re.findall(rf"= f32\[(?:1,)?\d+,\d+\]\S* fusion\(%{re.escape(factor.group(1))}\)",
                      hlo)
    assert len(cuts) == 3 * blocks - 2, cuts       # lower, diagonal, upper panels
