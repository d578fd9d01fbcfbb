"""Batch progress displays: they say when the solver compiles, and rates exclude it."""

import io

import jax.numpy as jnp
import numpy as np
import pytest

import adaptprec as ap
from adaptprec.batch import TextProgress, TqdmProgress
from adaptprec.batch import chunking

T = jnp.linspace(0.0, 1.0, 8)
K = jnp.linspace(0.5, 2.0, 20)
Y = 3.0 * jnp.exp(-K[:, None] * T)
KW = dict(args=(T,), in_axes=None, ydata=Y, precision="f64")


def decay(p, t):
    return p[0] * jnp.exp(-p[1] * t)


class _Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


class _Recorder:
    def __init__(self):
        self.events = []

    def __call__(self, done, total):
        self.events.append(("progress", done, total))

    def compiling(self, on):
        self.events.append(("compiling", on))


@pytest.mark.slow
def test_solver_announces_compilation_before_the_first_chunk():
    rec = _Recorder()
    res = ap.solve_nlsq_batch(decay, jnp.ones((20, 2)), chunk_size=7, progress=rec, **KW)
    # compiled ahead of the first chunk: no chunk runs while the display says compiling
    assert rec.events == [("progress", 0, 20), ("compiling", True), ("compiling", False),
                          ("progress", 7, 20), ("progress", 14, 20), ("progress", 20, 20)]
    ref = ap.solve_nlsq_batch(decay, jnp.ones((20, 2)), **KW)
    np.testing.assert_array_equal(np.asarray(res.x), np.asarray(ref.x))


def test_without_ahead_of_time_compilation_the_first_chunk_counts_as_compiling():
    rec = _Recorder()
    out = chunking.run_chunked(lambda x, b, s: {"y": x * 2}, jnp.arange(5.0)[:, None], (),
                               (), 2, progress=rec)
    assert out["y"][:, 0].tolist() == [0.0, 2.0, 4.0, 6.0, 8.0]
    assert rec.events == [("progress", 0, 5), ("compiling", True), ("progress", 2, 5),
                          ("compiling", False), ("progress", 4, 5), ("progress", 5, 5)]


def test_text_rate_excludes_compilation(monkeypatch):
    clock = _Clock()
    monkeypatch.setattr(chunking.time, "perf_counter", clock)
    buf = io.StringIO()
    p = TextProgress(stream=buf)
    p(0, 100)
    p.compiling(True)
    assert buf.getvalue().endswith("0/100 fits (compiling...)")
    clock.t = 10.0                                   # 10 s of compilation
    p.compiling(False)
    clock.t = 10.5
    p(50, 100)
    assert buf.getvalue().split("\r")[-1].endswith("50/100 fits ( 50.0%), 100 fits/s")
    clock.t = 11.0
    p(100, 100)
    assert buf.getvalue().endswith("100/100 fits (100.0%), 100 fits/s\n")


def test_text_rate_when_the_first_chunk_compiled(monkeypatch):
    clock = _Clock()
    monkeypatch.setattr(chunking.time, "perf_counter", clock)
    buf = io.StringIO()
    p = TextProgress(stream=buf)
    p(0, 30)
    p.compiling(True)
    clock.t = 5.0
    p(10, 30)                                        # the first chunk, run while compiling
    assert buf.getvalue().split("\r")[-1].endswith("10/30 fits (compiling...)")
    p.compiling(False)
    assert buf.getvalue().split("\r")[-1].endswith("-- fits/s")
    clock.t = 6.0
    p(20, 30)
    assert buf.getvalue().split("\r")[-1].endswith("10 fits/s")     # not 20 / 6


def test_tqdm_bar_says_compiling_and_its_rate_excludes_it():
    pytest.importorskip("tqdm")
    buf = io.StringIO()
    p = TqdmProgress(file=buf, mininterval=0, ascii=True)
    p(0, 100)
    clock = _Clock()
    p.bar._time = clock
    p.compiling(True)
    assert "solve_nlsq_batch (compiling)" in buf.getvalue().split("\r")[-1]
    clock.t = 10.0
    p.compiling(False)                               # the clock restarts here
    clock.t = 10.5
    p(50, 100)
    line = buf.getvalue().split("\r")[-1]
    assert "compiling" not in line and "50/100" in line
    assert p.bar.format_dict["elapsed"] == pytest.approx(0.5)
    assert "100.00fit/s" in line
    p(100, 100)
    assert p.bar.disable or p.bar.n == 100


def test_progress_true_uses_tqdm_on_stderr(capsys):
    pytest.importorskip("tqdm")
    ap.solve_nlsq_batch(decay, jnp.ones((20, 2)), chunk_size=10, progress=True, **KW)
    err = capsys.readouterr().err
    assert "solve_nlsq_batch (compiling)" in err and "20/20" in err


def test_bad_progress_argument():
    with pytest.raises(TypeError, match="progress must be True"):
        ap.solve_nlsq_batch(decay, jnp.ones((20, 2)), chunk_size=10, progress="yes", **KW)
