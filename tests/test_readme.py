"""The README's setup commands, and .ci/run runs the README's test command verbatim.

(The README's python blocks run, each on its own, in tests/test_docs.py.)
"""

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def _blocks(lang):
    return re.findall(rf"```{lang}\n(.*?)```", README, flags=re.S)


def test_readme_has_exactly_two_setup_commands_and_ci_runs_the_test_one():
    commands = [b.strip() for b in _blocks("bash")]
    assert len(commands) == 2, commands
    demo, test = commands
    assert "pip install" in demo and "python -m adaptprec demo" in demo
    assert 'pip install -q -e ".[test]"' in test and "-m pytest" in test
    ci = (ROOT / ".ci" / "run").read_text()
    assert test in ci.splitlines(), ".ci/run must run the README test command verbatim"
    assert "set -euo pipefail" in ci
