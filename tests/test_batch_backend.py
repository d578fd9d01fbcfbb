"""The batched solver's CPU tricks sit behind the one backend switch
(``adaptprec._backend``, ``ADAPTPREC_CPU_TRICKS``): with it off, the plain path runs --
one lockstep batch instead of a serial map over cache-sized blocks, no fusion-breaking
copies, host arrays handed over without the 64-byte alignment."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import adaptprec as ap
from adaptprec import _backend
from adaptprec.batch._run import aligned_empty

T = np.linspace(0.0, 2.0, 8)


def _model(p, t):
    return p[0] * jnp.exp(-p[1] * t)


def _jaxpr_text(y, x0):
    """The jaxpr of a traced solve of 12 fits in blocks of 4 (tracing only, no compile)."""
    def solve(x0):
        return ap.solve_nlsq_batch(_model, x0, (T,), in_axes=None, ydata=y, precision="f64",
                                   block_size=4, compaction=None).x
    return str(jax.make_jaxpr(solve)(x0))


def _problem():
    k = np.linspace(0.5, 2.0, 12)
    return 2.0 * np.exp(-k[:, None] * T), np.ones((12, 2))


@pytest.mark.parametrize("tricks", ["1", "0"])
def test_blocks_follow_the_switch(monkeypatch, tricks):
    monkeypatch.setenv("ADAPTPREC_CPU_TRICKS", tricks)
    y, x0 = _problem()
    text = _jaxpr_text(y, x0)
    # the CPU path maps the solve over blocks (lax.map: a scan); the plain path has none
    assert ("scan[" in text) == (tricks == "1")


@pytest.mark.slow
def test_plain_path_gives_the_same_fits(monkeypatch):
    y, x0 = _problem()
    kw = dict(args=(T,), in_axes=None, ydata=y, precision="f64", block_size=4,
              compaction=None)
    monkeypatch.setenv("ADAPTPREC_CPU_TRICKS", "0")
    plain = ap.solve_nlsq_batch(_model, x0, **kw)
    monkeypatch.setenv("ADAPTPREC_CPU_TRICKS", "1")
    cpu = ap.solve_nlsq_batch(_model, x0, **kw)
    np.testing.assert_allclose(plain.x, cpu.x, rtol=1e-10)
    np.testing.assert_array_equal(plain.status, cpu.status)


@pytest.mark.parametrize("tricks,aligned", [("1", True), ("0", False)])
def test_host_alignment_follows_the_switch(monkeypatch, tricks, aligned):
    monkeypatch.setenv("ADAPTPREC_CPU_TRICKS", tricks)
    assert _backend.host_alignment() == (64 if aligned else 0)
    a = aligned_empty((1000, 7), np.float64)
    assert a.shape == (1000, 7) and a.dtype == np.float64
    # the CPU path over-allocates a byte buffer and views it at a 64-byte boundary; the
    # plain path is NumPy's own allocation (no alignment copy)
    assert (a.base is not None) == aligned
    if aligned:
        assert a.ctypes.data % 64 == 0
