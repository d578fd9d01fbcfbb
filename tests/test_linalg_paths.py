"""adaptprec.linalg.solve: per-element fallback under vmap (compaction), SPD (Cholesky,
dsposv), the per-backend factor choice and the half-precision (tensor-core) factor path.

References are numpy float64 solves; the compaction is checked both by what runs (a
callback in the recompute function records the rows it was given) and by the compiled
program (the working-precision LU inside the compacted branch has the buffer's shape).
"""

import importlib
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import adaptprec as ap
from adaptprec._compaction import capacity_for, recompute_rows
from adaptprec.linalg._blocked_lu import blocked_lu

solve_mod = importlib.import_module("adaptprec.linalg.solve")

N = 16
U64 = 2.0 ** -53
CONVERGED = int(ap.Status.CONVERGED)


def prescribed(kappa, n=N, seed=0):
    rng = np.random.default_rng(seed)
    u, _ = np.linalg.qr(rng.standard_normal((n, n)))
    v, _ = np.linalg.qr(rng.standard_normal((n, n)))
    return (u * np.logspace(0, -np.log10(kappa), n)) @ v.T


def eta(A, x, b):
    A, x, b = (np.asarray(t, np.float64) for t in (A, x, b))
    r = np.abs(b - A @ x).max()
    return float(r / (np.abs(A).sum(1).max() * np.abs(x).max() + np.abs(b).max()))


# ---- compaction ----------------------------------------------------------------------

def test_recompute_rows_runs_only_the_buffer():
    seen = []

    def fn(v):
        jax.debug.callback(lambda s: seen.append(int(s)), v.shape[0])
        return -v

    f = jax.jit(lambda need, x: recompute_rows(need, fn, x, x, capacity=4))
    x = jnp.arange(16.0)
    for k, expect in ((0, []), (1, [4]), (4, [4]), (5, [16])):
        seen.clear()
        need = jnp.arange(16) >= 16 - k
        out = f(need, x)
        jax.block_until_ready(out)
        assert seen == expect
        np.testing.assert_array_equal(out, np.where(np.asarray(need), -np.arange(16.0),
                                                    np.arange(16.0)))


def test_capacity_for_validates():
    assert capacity_for(0.125, 64) == 8 and capacity_for(2, 64) == 2
    for bad in (0, -1, 0.0, 1.5, True, "x"):
        with pytest.raises(ValueError, match="capacity"):
            capacity_for(bad, 8)


# ---- vmap: per-element fallback ----------------------------------------------------

def _batch_one_bad(size=64, bad=37):
    A = np.stack([prescribed(1e2, seed=s) for s in range(size)])
    A[bad] = prescribed(1e12, seed=999)            # LU-IR from float32 cannot converge
    b = np.random.default_rng(1).standard_normal((size, N))
    return A, b


def _lu_shapes(jaxpr, inside_switch=False, out=None):
    """(f64 LU operand shape, inside a 3-branch switch?) for every LU in the program."""
    out = [] if out is None else out
    for eqn in jaxpr.eqns:
        getrf = eqn.primitive.name == "lu" or (
            eqn.primitive.name == "ffi_call" and "getrf" in str(eqn.params.get("target_name")))
        if getrf and eqn.invars[0].aval.dtype == np.float64:
            out.append((tuple(eqn.invars[0].aval.shape), inside_switch))
        for p in eqn.params.values():
            subs = p if isinstance(p, (tuple, list)) else [p]
            for sub in subs:
                j = getattr(sub, "jaxpr", sub)
                if hasattr(j, "eqns"):
                    _lu_shapes(j, inside_switch or (eqn.primitive.name == "cond"
                                                    and len(eqn.params["branches"]) == 3),
                               out)
    return out


_vsolve = jax.jit(jax.vmap(lambda A, b: ap.linalg.solve(A, b)))


@pytest.mark.slow
def test_vmap_one_of_64_falls_back_alone():
    A, b = _batch_one_bad()
    x, info = _vsolve(A, b)
    assert info.fell_back.tolist() == [i == 37 for i in range(64)]
    assert set(info.status.tolist()) == {CONVERGED}
    assert int(info.reason[37]) == ap.Reason.STAGNATION
    assert int(info.reason[0]) == ap.Reason.NONE
    for i in (0, 37, 63):
        ref = np.linalg.solve(A[i], b[i])
        assert eta(A[i], x[i], b[i]) <= math.sqrt(N) * U64
        assert np.abs(x[i] - ref).max() <= 1e3 * np.linalg.cond(A[i]) * U64 * np.abs(ref).max()
    # equals the leading-batch-dimension call and a loop
    xb, ib = ap.linalg.solve(A, b)
    np.testing.assert_allclose(x, xb, rtol=1e-13, atol=1e-14)
    assert ib.fell_back.tolist() == info.fell_back.tolist()


def test_vmap_fallback_is_compacted_not_selected():
    A, b = _batch_one_bad()
    jaxpr = jax.make_jaxpr(jax.vmap(lambda A, b: ap.linalg.solve(A, b)))(A, b).jaxpr
    shapes = _lu_shapes(jaxpr)
    # the working-precision LU exists for the 8-slot buffer and for the overflow case
    # (whole batch), both only inside the none / buffer / whole switch
    assert ((8, N, N), True) in shapes and ((64, N, N), True) in shapes
    assert all(inside for _, inside in shapes)


@pytest.mark.slow
def test_vmap_many_failures_take_the_whole_batch_branch():
    A = np.stack([prescribed(1e12 if s % 2 else 1e2, seed=s) for s in range(16)])
    b = np.ones((16, N))
    x, info = jax.jit(jax.vmap(lambda A, b: ap.linalg.solve(A, b, fallback_capacity=2)))(
        A, b)
    assert info.fell_back.tolist() == [bool(s % 2) for s in range(16)]
    for i in range(16):
        assert eta(A[i], x[i], b[i]) <= math.sqrt(N) * U64


@pytest.mark.slow  # ~25 s of compilation (nested vmaps of the whole solve)
def test_nested_vmap_and_vmap_over_b_only():
    A, b = _batch_one_bad(size=8, bad=3)
    x, info = jax.jit(jax.vmap(jax.vmap(lambda A, b: ap.linalg.solve(A, b))))(
        A.reshape(2, 4, N, N), b.reshape(2, 4, N))
    assert info.fell_back.reshape(-1).tolist() == [i == 3 for i in range(8)]
    xb, _ = ap.linalg.solve(A, b)
    np.testing.assert_allclose(x.reshape(8, N), xb, rtol=1e-13, atol=1e-14)
    # only b mapped: A and its factors are shared, the members become right-hand sides
    f1 = jax.vmap(lambda b: ap.linalg.solve(A[3], b))
    x1, i1 = jax.jit(f1)(b)
    assert i1.fell_back.tolist() == [True] * 8
    # one system: every float64 LU in the program (solve and adjoint) is (1, N, N)
    assert {s for s, _ in _lu_shapes(jax.make_jaxpr(f1)(b).jaxpr)} == {(1, N, N)}
    x0, i0 = jax.jit(jax.vmap(lambda b: ap.linalg.solve(A[0], b)))(b)
    assert not any(i0.fell_back.tolist())
    np.testing.assert_allclose(x0, np.linalg.solve(A[0], b.T).T, rtol=1e-12)
    for i in range(8):                       # kappa = 1e12: check the backward error
        assert eta(A[3], x1[i], b[i]) <= math.sqrt(N) * U64


@pytest.mark.slow
def test_jacfwd_matches_inverse():
    A = prescribed(1e2, seed=11)
    J = jax.jit(jax.jacfwd(lambda b: ap.linalg.solve(A, b)[0]))(np.ones(N))
    np.testing.assert_allclose(J, np.linalg.inv(A), rtol=1e-10, atol=1e-12)


@pytest.mark.slow
def test_grad_of_vmapped_solve():
    A, b = _batch_one_bad(size=4, bad=2)

    def loss(A, b):
        return jnp.sum(jax.vmap(lambda A, b: ap.linalg.solve(A, b)[0])(A, b) ** 2)

    def ref(A, b):
        return jnp.sum(jnp.linalg.solve(A, b[..., None])[..., 0] ** 2)

    g, gr = jax.jit(jax.grad(loss, (0, 1)))(A, b), jax.jit(jax.grad(ref, (0, 1)))(A, b)
    for u, v in zip(g, gr):
        u, v = np.asarray(u), np.asarray(v)
        for i in (0, 1, 3):                      # refined members: tight
            np.testing.assert_allclose(u[i], v[i], rtol=1e-9, atol=1e-12)
        # the kappa = 1e12 member: both are float64 solves, agreeing to ~kappa * u
        assert np.abs(u[2] - v[2]).max() <= 1e-2 * np.abs(v[2]).max()


# ---- SPD: Cholesky-based refinement (dsposv) -----------------------------------------

def spd(kappa, seed=0, n=N):
    rng = np.random.default_rng(seed)
    q, _ = np.linalg.qr(rng.standard_normal((n, n)))
    return (q * np.logspace(0, -np.log10(kappa), n)) @ q.T


_solve_pos = jax.jit(lambda A, b: ap.linalg.solve(A, b, assume_a="pos"))


@pytest.mark.slow
@pytest.mark.parametrize("kappa", [1e1, 1e5, 1e12])
def test_spd_refines_or_falls_back(kappa):
    A = spd(kappa, seed=2)
    A = (A + A.T) / 2
    b = np.random.default_rng(3).standard_normal(N)
    x, info = _solve_pos(A, b)
    assert int(info.status) == CONVERGED and bool(info.success)
    assert eta(A, x, b) <= math.sqrt(N) * U64
    assert bool(info.fell_back) == (kappa > 1e6)
    if kappa <= 1e6:
        assert int(info.reason) == ap.Reason.NONE and int(info.iterations) <= 6
    else:       # float32 Cholesky breaks down or refinement stagnates
        assert int(info.reason) in (ap.Reason.SINGULAR_FACTOR, ap.Reason.STAGNATION)
    ref = np.linalg.solve(A, b)
    assert np.abs(x - ref).max() <= 100 * kappa * U64 * N * np.abs(ref).max()
    true = np.linalg.cond(A, np.inf)
    assert true / 3 <= float(info.cond_estimate) <= true * 1.01


def test_spd_uses_cholesky_factors():
    A = spd(1e3, seed=4)
    b = np.ones(N)
    jaxpr = str(jax.make_jaxpr(lambda A, b: ap.linalg.solve(A, b, assume_a="pos"))(A, b))
    assert "cholesky" in jaxpr
    x, info = _solve_pos(A, b)
    assert not bool(info.fell_back)
    scipy_linalg = pytest.importorskip("scipy.linalg")
    np.testing.assert_allclose(x, scipy_linalg.solve(A, b, assume_a="pos"), rtol=1e-11)


def test_spd_indefinite_is_a_status_and_nan():
    A = spd(10.0, seed=5)
    A[0, 0] = -1.0                      # symmetric, indefinite
    x, info = _solve_pos(A, np.ones(N))
    assert int(info.status) == ap.Status.NOT_POSITIVE_DEFINITE and not bool(info.success)
    assert int(info.reason) == ap.Reason.SINGULAR_FACTOR and bool(info.fell_back)
    assert bool(jnp.all(jnp.isnan(x))) and float(info.backward_error) == np.inf
    assert "positive definite" in info.message.lower()


@pytest.mark.slow
def test_spd_grad_and_vmap():
    A = spd(1e2, seed=6)
    b = np.random.default_rng(7).standard_normal(N)
    f = lambda A, b: jnp.sum(jnp.sin(ap.linalg.solve(A, b, assume_a="pos")[0]))  # noqa: E731
    r = lambda A, b: jnp.sum(jnp.sin(jnp.linalg.solve(A, b)))                     # noqa: E731
    ga, gr = jax.jit(jax.grad(f, (0, 1)))(A, b), jax.jit(jax.grad(r, (0, 1)))(A, b)
    for u, v in zip(ga, gr):
        np.testing.assert_allclose(u, v, rtol=1e-10, atol=1e-13)
    As = np.stack([spd(1e2, seed=s) for s in range(3)])
    xs, infos = jax.vmap(_solve_pos)(As, np.ones((3, N)))
    assert infos.status.tolist() == [CONVERGED] * 3
    np.testing.assert_allclose(xs[1], np.linalg.solve(As[1], np.ones(N)), rtol=1e-12)


def test_assume_a_validation():
    with pytest.raises(ValueError, match="assume_a"):
        ap.linalg.solve(np.eye(2), np.ones(2), assume_a="sym")


# ---- per-backend factor choice and the half-precision (tensor-core) path --------------

def test_auto_is_float32_lu_on_cpu():
    assert solve_mod.AUTO_FACTOR["cpu"] == ("f32", "lu")
    jaxpr = str(jax.make_jaxpr(lambda A, b: ap.linalg.solve(A, b))(np.eye(N), np.ones(N)))
    assert "f32[1,16,16]" in jaxpr and "bf16" not in jaxpr and "f16[" not in jaxpr


# (slow: ~6s; CI runs the slow job too: keeps the default run near 10 min on 2 cores)
@pytest.mark.slow
@pytest.mark.parametrize("low", [pytest.param(jnp.bfloat16, marks=pytest.mark.slow),
                                 jnp.float16])
def test_blocked_lu_has_half_precision_backward_error(low):
    a = jnp.asarray(np.random.default_rng(8).standard_normal((64, 64)), jnp.float32)
    lu, perm = jax.jit(lambda a: blocked_lu(a, low=low, block=16))(a)
    L = np.tril(np.asarray(lu, np.float64), -1) + np.eye(64)
    U = np.triu(np.asarray(lu, np.float64))
    err = np.abs(np.asarray(a, np.float64)[np.asarray(perm)] - L @ U).max() / np.abs(a).max()
    u_low = float(jnp.finfo(low).eps) / 2
    assert 2 ** -24 * 100 < err < 64 * u_low          # half-level, not float32-level
    assert sorted(np.asarray(perm).tolist()) == list(range(64))
    lu32, perm32 = blocked_lu(a, low=jnp.float32, block=16)   # no rounding: LAPACK's LU
    ref, _, ref_perm = jax.lax.linalg.lu(a)
    np.testing.assert_array_equal(perm32, ref_perm)
    np.testing.assert_allclose(lu32, ref, rtol=1e-4, atol=1e-4)


# (slow: ~7s; CI runs the slow job too: keeps the default run near 10 min on 2 cores)
@pytest.mark.slow
@pytest.mark.parametrize("backend, low", [("gpu", "float16"), pytest.param(
    "tpu", "bfloat16", marks=pytest.mark.slow)])
def test_accelerator_auto_path_half_factors_gmres_ir(monkeypatch, backend, low):
    monkeypatch.setattr(solve_mod, "_backend", lambda: backend)
    A = prescribed(1e3, n=64, seed=9)
    b = np.random.default_rng(10).standard_normal(64)
    f = lambda A, b: ap.linalg.solve(A, b)          # noqa: E731  (factor="auto")
    jaxpr = str(jax.make_jaxpr(f)(A, b))
    short = {"float16": "f16[", "bfloat16": "bf16["}[low]
    assert short in jaxpr and "dot_general" in jaxpr   # half-precision GEMM updates
    x, info = jax.jit(f)(A, b)
    assert int(info.status) == CONVERGED and not bool(info.fell_back)
    assert eta(A, x, b) <= math.sqrt(64) * U64
    assert int(info.iterations) >= 1


# ---- lstsq: per-element fallback under vmap ------------------------------------------

def _tall(kappa, m=24, n=8, seed=0):
    rng = np.random.default_rng(seed)
    u, _ = np.linalg.qr(rng.standard_normal((m, n)))
    v, _ = np.linalg.qr(rng.standard_normal((n, n)))
    return (u * np.logspace(0, -np.log10(kappa), n)) @ v.T


def _qr_shapes(jaxpr, inside_switch=False, out=None):
    """(f64 QR operand shape, inside a 3-branch switch?) for every QR in the program."""
    out = [] if out is None else out
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "qr" and eqn.invars[0].aval.dtype == np.float64:
            out.append((tuple(eqn.invars[0].aval.shape), inside_switch))
        for p in eqn.params.values():
            for sub in (p if isinstance(p, (tuple, list)) else [p]):
                j = getattr(sub, "jaxpr", sub)
                if hasattr(j, "eqns"):
                    _qr_shapes(j, inside_switch or (eqn.primitive.name == "cond"
                                                    and len(eqn.params["branches"]) == 3),
                               out)
    return out


# (slow: ~6s; CI runs the slow job too: keeps the default run near 10 min on 2 cores)
@pytest.mark.slow
def test_lstsq_vmap_one_of_64_falls_back_alone_and_compacted():
    A = np.stack([_tall(1e2, seed=s) for s in range(64)])
    A[37] = _tall(1e12, seed=999)                 # f32 QR refinement cannot converge
    b = np.random.default_rng(2).standard_normal((64, 24))
    f = jax.vmap(lambda A, b: ap.linalg.lstsq(A, b))
    x, info = jax.jit(f)(A, b)
    assert info.fell_back.tolist() == [i == 37 for i in range(64)]
    assert int(info.reason[37]) == ap.Reason.STAGNATION and int(info.reason[0]) == 0
    for i in (0, 37, 63):
        ref = np.linalg.lstsq(A[i], b[i], rcond=None)[0]
        np.testing.assert_allclose(x[i], ref, rtol=1e-6 if i == 37 else 1e-12,
                                   atol=1e-6 if i == 37 else 1e-12)
    xb, ib = ap.linalg.lstsq(A, b)                # leading batch dimension: the same
    np.testing.assert_allclose(x, xb, rtol=1e-13, atol=1e-14)
    # the float64 QR runs on the 8-slot buffer (or the whole batch when > 8 fail), only
    # inside the none / buffer / whole switch, never as a select over all 64
    shapes = _qr_shapes(jax.make_jaxpr(f)(A, b).jaxpr)
    assert ((8, 24, 8), True) in shapes and ((64, 24, 8), True) in shapes
    assert all(inside for _, inside in shapes)
