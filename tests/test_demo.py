"""`python -m adaptprec demo` runs every section with no environment set-up (the CLI, an
application, turns float64 on for its own process), and rejects unknown sections. Its run
time (~20 s quiet) is a benchmark figure, not asserted here: a wall-clock assertion fails
on a loaded machine (60.8 s at load 5) and says nothing about the code."""

import pytest

from _subprocess import run_python

DEMO = "from adaptprec.cli import main; raise SystemExit(main({argv!r}))"


# slow: ~20 s; CI also runs the demo from an installed wheel on every push
@pytest.mark.slow
def test_demo_runs_without_x64_in_the_environment():
    proc = run_python(DEMO.format(argv=["demo"]), x64=False, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "== foundation" in proc.stdout and "demo finished" in proc.stdout


@pytest.mark.slow
def test_unknown_section_exits_nonzero_and_lists_the_sections():
    proc = run_python(DEMO.format(argv=["demo", "no_such_section"]), x64=False, timeout=120)
    assert proc.returncode == 2
    assert "no_such_section" in proc.stderr and "foundation" in proc.stderr
    assert "== foundation" not in proc.stdout
