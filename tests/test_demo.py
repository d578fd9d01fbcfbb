"""`python -m adaptprec demo` runs every section and finishes within the one-minute budget."""

import subprocess
import sys
import time


def test_demo_runs_under_a_minute():
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "adaptprec", "demo"], capture_output=True,
                          text=True, timeout=120)
    elapsed = time.perf_counter() - t0
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "== foundation" in proc.stdout and "demo finished" in proc.stdout
    assert elapsed < 60, f"demo took {elapsed:.1f} s"
