"""Every ```python block of docs/*.md and README.md runs, each on its own.

One subprocess per page (so a page cannot disturb the test process's JAX configuration);
inside it every block runs in a fresh namespace, so a block that uses a name it does not
define or import fails here as it would for a reader who copies it. ``jax_enable_x64`` is
reset before every block: off (JAX's default), or on for a page that says
``<!-- docs-test: x64 ... -->`` (pages whose prose states that all examples assume it).

``mkdocs build --strict`` (the site, with the API reference generated from docstrings)
runs in the last test when mkdocs is installed (``pip install adaptprec[docs]``; about
5 s).
"""

import json
import os
import pathlib
import re
import subprocess
import sys
import textwrap

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PAGES = sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]
_BLOCK = re.compile(r"^```python[ \t]*\n(.*?)^```[ \t]*$", re.S | re.M)
_X64 = re.compile(r"<!--\s*docs-test:\s*x64\b")

_RUNNER = textwrap.dedent("""
    import json, pathlib, re, sys, time, traceback
    import jax

    page, x64 = pathlib.Path(sys.argv[1]), sys.argv[2] == "1"
    text = page.read_text()
    for m in re.finditer(sys.argv[3], text, flags=re.S | re.M):
        line = text[:m.start()].count("\\n") + 1
        jax.config.update("jax_enable_x64", x64)
        t0 = time.perf_counter()
        try:
            exec(compile(m.group(1), f"{page.name}:{line}", "exec"), {"__name__": "__main__"})
        except BaseException:
            print("BLOCK-FAILED " + json.dumps({"line": line,
                                                "error": traceback.format_exc()}))
            sys.exit(1)
        print("BLOCK-OK " + json.dumps({"line": line, "s": time.perf_counter() - t0}))
""")


def blocks(page: pathlib.Path) -> list[str]:
    return _BLOCK.findall(page.read_text())


def test_block_extraction_finds_fenced_python_only():
    text = "a\n```python\nx = 1\n```\n```bash\nls\n```\n```python\ny = 2\n```\n"
    assert _BLOCK.findall(text) == ["x = 1\n", "y = 2\n"]


# slow: one fresh JAX process per page, ~200 s in all on 2 cores -- a fifth of the default
# run's budget. CI's slow set runs it on every push.
@pytest.mark.slow
@pytest.mark.parametrize("page", [p for p in PAGES if blocks(p)],
                         ids=lambda p: p.name)
def test_page_code_blocks_run_standalone(page, tmp_path):
    x64 = bool(_X64.search(page.read_text()))
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(ROOT),
               MPLBACKEND="Agg")
    out = subprocess.run([sys.executable, "-c", _RUNNER, str(page), "1" if x64 else "0",
                          _BLOCK.pattern], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=900)
    done = [json.loads(ln.split(" ", 1)[1]) for ln in out.stdout.splitlines()
            if ln.startswith("BLOCK-OK ")]
    failed = [json.loads(ln.split(" ", 1)[1]) for ln in out.stdout.splitlines()
              if ln.startswith("BLOCK-FAILED ")]
    if failed:
        pytest.fail(f"{page.name}:{failed[0]['line']} failed on its own "
                    f"(x64={'on' if x64 else 'off'}):\n{failed[0]['error']}", pytrace=False)
    assert out.returncode == 0, out.stderr[-3000:]
    assert len(done) == len(blocks(page)), (out.stdout, out.stderr[-3000:])


def _load_tool(name):
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, ROOT / "tools" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_no_placeholders_in_code_blocks(page):
    """No ``...`` standing in for code (``def f(x): ...``, ``fn(...)``)."""
    import ast

    for code in blocks(page):
        tree = ast.parse(code)
        in_index = {id(n) for sub in ast.walk(tree) if isinstance(sub, ast.Subscript)
                    for n in ast.walk(sub.slice)}            # x[..., 0] is real code
        for node in ast.walk(tree):
            assert not (isinstance(node, ast.Constant) and node.value is Ellipsis
                        and id(node) not in in_index), (
                f"{page.name}: a python block uses ... as a placeholder:\n{code}")


def test_every_public_name_is_in_the_api_reference():
    import adaptprec as ap

    hooks = _load_tool("docs_hooks")
    assert hooks.public_names() == list(ap.__all__)
    assert hooks.MARKER in (ROOT / "docs" / "api.md").read_text()
    ref = hooks.reference()
    listed = re.findall(r"^::: adaptprec\.(\w+)\s*$", ref, flags=re.M)
    assert sorted(listed) == sorted(ap.__all__)
    for mod in hooks.MODULES:            # and every public name of the public modules
        names = getattr(ap, mod).__all__
        entries = re.findall(rf"^::: (adaptprec\.{mod}\.[\w.]+)\s*$", ref, flags=re.M)
        assert [e.rsplit(".", 1)[-1] for e in entries] == list(names), mod


def test_docstring_rewrite_for_the_reference():
    pytest.importorskip("griffe")
    ext = _load_tool("griffe_examples")
    text = ("Run it with :func:`~adaptprec.adaptive` or :class:`adaptprec.Ladder`.\n\n"
            "    Example (x64 on):\n        >>> 1 + 1\n        2\n")
    out = ext._rewrite(text)
    assert "`adaptive` or `adaptprec.Ladder`" in out
    assert "    Examples:\n        X64 on:\n" in out and ">>> 1 + 1" in out
    assert ext._rewrite("Example:\n    >>> 1") == "Examples:\n    >>> 1"


def test_nav_lists_every_page():
    yml = (ROOT / "mkdocs.yml").read_text()
    nav = set(re.findall(r":\s*([\w./-]+\.md)\s*$", yml, flags=re.M))
    pages = {p.name for p in (ROOT / "docs").glob("*.md")}
    assert pages <= nav, pages - nav
    assert {"scipy.md", "architecture.md", "api.md", "coming-from.md"} <= nav


@pytest.mark.slow
def test_mkdocs_build_strict(tmp_path):
    pytest.importorskip("mkdocs", reason="mkdocs not installed: pip install 'adaptprec[docs]'")
    pytest.importorskip("mkdocstrings")
    pytest.importorskip("material")
    out = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict",
                          "--site-dir", str(tmp_path / "site")], cwd=ROOT,
                         capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-5000:]
    assert (tmp_path / "site" / "api" / "index.html").exists()
