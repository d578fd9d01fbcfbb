"""`python -m adaptprec demo` runs every section within the one-minute budget, and asks the
user to turn x64 on rather than turning it on itself."""

import time

from _subprocess import run_python

DEMO = "from adaptprec.cli import main; raise SystemExit(main(['demo']))"


def test_demo_runs_under_a_minute():
    t0 = time.perf_counter()
    proc = run_python(DEMO, x64=True, timeout=120)
    elapsed = time.perf_counter() - t0
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "== foundation" in proc.stdout and "demo finished" in proc.stdout
    assert elapsed < 60, f"demo took {elapsed:.1f} s"


def test_demo_without_x64_explains_how_to_enable_it():
    proc = run_python(DEMO, x64=False, timeout=120)
    assert proc.returncode == 2
    assert "JAX_ENABLE_X64=1 python -m adaptprec demo" in proc.stderr
    assert "== foundation" not in proc.stdout
