"""The one backend switch (adaptprec/_backend.py): the CPU-only tricks run on CPU, the
plain operations elsewhere (``ADAPTPREC_CPU_TRICKS=0`` stands in for another backend)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from adaptprec import _backend


def _primitives(fn, *args):
    from adaptprec._jaxpr import iter_eqns

    return {eqn.primitive.name for eqn in iter_eqns(jax.make_jaxpr(fn)(*args).jaxpr)}


def test_plain_branch_has_no_cpu_tricks(monkeypatch):
    A = jnp.asarray(np.random.default_rng(0).standard_normal((5000, 4)))
    m = jnp.asarray(True)
    monkeypatch.setenv("ADAPTPREC_CPU_TRICKS", "1")
    assert _backend.cpu_tricks() and _backend.serial_blocks()
    assert _backend.host_alignment() == 64
    assert "sort" in _primitives(lambda a: _backend.materialise(a, ~a), m)
    assert {"while", "scan"} & _primitives(lambda a: _backend.qr_r(a), A)  # Householder fori_loop
    monkeypatch.setenv("ADAPTPREC_CPU_TRICKS", "0")
    assert not _backend.cpu_tricks() and not _backend.serial_blocks()
    assert _backend.host_alignment() == 0
    assert "sort" not in _primitives(lambda a: _backend.materialise(a, ~a), m)
    prims = _primitives(lambda a: _backend.qr_r(a), A)
    assert not {"while", "scan"} & prims and "qr" in prims      # the library QR


def test_both_branches_agree(monkeypatch):
    A = jnp.asarray(np.random.default_rng(1).standard_normal((4000, 5)))
    out = {}
    for flag in ("0", "1"):
        monkeypatch.setenv("ADAPTPREC_CPU_TRICKS", flag)
        R = jax.jit(_backend.qr_r)(A)
        out[flag] = np.abs(np.asarray(R))        # (row signs may differ)
        assert [bool(v) for v in _backend.materialise(jnp.asarray(True),
                                                       jnp.asarray(False))] == [True, False]
    np.testing.assert_allclose(out["0"], out["1"], rtol=1e-10, atol=1e-10)


@pytest.mark.slow
def test_solver_jaxpr_plain_off_cpu(monkeypatch):
    # the whole solve, traced with the plain branch: no fusion-breaking sort anywhere
    import adaptprec as ap

    t = jnp.linspace(0.0, 1.0, 20)
    y = 3.0 * jnp.exp(-2.0 * t)

    def solve(y):
        return ap.solve_nlsq(lambda p, t, y: p[0] * jnp.exp(-p[1] * t) - y,
                             jnp.ones(2), args=(t, y), precision="f32,f64").x

    from adaptprec._jaxpr import iter_eqns

    def prims():
        jax.clear_caches()   # (the solve's jit would reuse the other branch's trace)
        return {e.primitive.name for e in iter_eqns(jax.make_jaxpr(solve)(y).jaxpr)}

    monkeypatch.setenv("ADAPTPREC_CPU_TRICKS", "0")
    assert "sort" not in prims()
    monkeypatch.setenv("ADAPTPREC_CPU_TRICKS", "1")
    assert "sort" in prims()
