"""The import graph of adaptprec, built from the source (``ast``), against the layers that
docs/architecture.md writes down ("Layers" table: the modules column lists the files and
folders of each layer, top layer first).

What counts as an import: every ``import``/``from ... import`` statement of a module,
at module level and inside functions alike (a lazy import is still an arrow: it only
runs later); imports under ``if TYPE_CHECKING:`` are left out (they never run). A
package's ``__init__.py``, which Python runs before any of its submodules, is not an
implied import of every submodule: only the statements written are arrows.

The rules: no cycle between modules; every module sits in one layer; and a module
imports only modules of its own layer or of layers above it. ``adaptprec/__init__.py``
(the public facade) is a layer of its own near the bottom.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "adaptprec"
DOC = ROOT / "docs" / "architecture.md"


def _layers() -> list[tuple[str, list[str]]]:
    """``[(layer, [path pattern, ...]), ...]`` from the doc's "Layers" table, in order."""
    text = DOC.read_text()
    section = text.split("\n## Layers", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not line.startswith("|") or len(cells) < 2 or set(cells[0]) <= set("-: "):
            continue
        if cells[0] == "layer":
            continue
        rows.append((cells[0], re.findall(r"`([^`]+)`", cells[1])))
    assert rows, "docs/architecture.md has no Layers table"
    return rows


def _modules() -> dict[str, Path]:
    """``{"adaptprec.nlsq.solve": path, ...}`` (a package by its own name)."""
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _is_type_checking(node) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def _from_target(module: str, is_pkg: bool, node: ast.ImportFrom) -> str:
    """The absolute module name of ``from ... import`` in ``module`` (relative levels
    resolved against the package, or the module's own package)."""
    if not node.level:
        return node.module or ""
    base = module.split(".")
    base = base if is_pkg else base[:-1]
    base = base[:len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _imports(module: str, path: Path, modules) -> set[str]:
    """The adaptprec modules ``module`` imports (see the module docstring)."""
    is_pkg = path.name == "__init__.py"
    found: set[str] = set()

    def resolve(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    def visit(node):
        for child in ast.iter_child_nodes(node):
            if _is_type_checking(child):
                continue
            if isinstance(child, ast.Import):
                found.update(resolve(a.name) for a in child.names
                             if a.name.split(".")[0] == "adaptprec")
            elif isinstance(child, ast.ImportFrom):
                prefix = _from_target(module, is_pkg, child)
                if prefix.split(".")[0] != "adaptprec":
                    continue
                for a in child.names:  # `from pkg import submodule` names the submodule
                    sub = f"{prefix}.{a.name}"
                    found.add(sub if sub in modules else resolve(prefix))
            visit(child)

    visit(ast.parse(path.read_text()))
    found.discard(None)
    found.discard(module)
    return found


def _graph():
    modules = _modules()
    return modules, {m: _imports(m, p, modules) for m, p in modules.items()}


def _layer_of(module: str, path: Path, layers) -> int | None:
    """The index of the layer whose most specific pattern matches ``path``."""
    rel = path.relative_to(PACKAGE).as_posix()
    best, best_len = None, -1
    for i, (_, patterns) in enumerate(layers):
        for pat in patterns:
            hit = rel == pat or (pat.endswith("/") and rel.startswith(pat))
            if hit and len(pat) > best_len:
                best, best_len = i, len(pat)
    return best


def _cycles(edges) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def strong(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            strong(v)
    return out


def test_no_import_cycles():
    _, edges = _graph()
    cycles = _cycles(edges)
    assert not cycles, "import cycles (module-level and function-level imports):\n" + \
        "\n".join(" <-> ".join(c) for c in cycles)


def test_every_module_has_a_layer():
    layers = _layers()
    modules = _modules()
    missing = [m for m, p in modules.items() if _layer_of(m, p, layers) is None]
    assert not missing, ("modules in no layer of docs/architecture.md's Layers table "
                         f"(add them to a row): {missing}")


def test_each_layer_imports_only_layers_above_it():
    layers = _layers()
    modules, edges = _graph()
    layer = {m: _layer_of(m, p, layers) for m, p in modules.items()}
    bad = []
    for src, targets in sorted(edges.items()):
        for dst in sorted(targets):
            if None in (layer[src], layer[dst]) or layer[dst] <= layer[src]:
                continue
            bad.append(f"{src} ({layers[layer[src]][0]}) imports {dst} "
                       f"({layers[layer[dst]][0]}, a layer below it)")
    assert not bad, "imports that reach down the layers:\n" + "\n".join(bad)


@pytest.mark.parametrize("case, expected", [
    ({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}, [["a", "b", "c"]]),
    ({"a": {"b"}, "b": set()}, []),
])
def test_cycle_finder(case, expected):
    assert _cycles(case) == expected


def test_imports_are_read_from_the_source(tmp_path):
    # a function-level import counts; a TYPE_CHECKING one does not; relative imports
    # resolve to the module (or the package) they name
    mods = {"adaptprec", "adaptprec.a", "adaptprec.pkg", "adaptprec.pkg.b",
            "adaptprec.pkg.c"}
    src = tmp_path / "b.py"
    src.write_text("from typing import TYPE_CHECKING\n"
                   "from . import c\n"
                   "if TYPE_CHECKING:\n    from ..a import X\n"
                   "def f():\n    from .. import a\n    from ..pkg import thing\n")
    assert _imports("adaptprec.pkg.b", src, mods) == {"adaptprec.pkg.c", "adaptprec.a",
                                                     "adaptprec.pkg"}


def test_every_imported_adaptprec_module_exists():
    """A ``from .moved import x`` inside a function is found only when it runs: after a
    module moves (``_autocast/opkind.py`` -> ``_opkind.py``), a stale lazy import must fail
    here, not in a user's first call."""
    modules = _modules()
    stale = []
    for module, path in modules.items():
        is_pkg = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                name = _from_target(module, is_pkg, node)
                if not name.startswith("adaptprec"):
                    continue
                if name not in modules:
                    stale.append(f"{module}: from {name} import ...")
                else:
                    # `from .pkg import _sub`: a private name of a package is a submodule
                    # unless the package's __init__ defines it
                    for a in node.names:
                        sub = f"{name}.{a.name}"
                        if (sub not in modules and name in modules
                                and modules[name].name == "__init__.py"
                                and a.name.startswith("_")
                                and not _defines(modules[name], a.name)):
                            stale.append(f"{module}: from {name} import {a.name}")
            elif isinstance(node, ast.Import):
                for a in node.names:
                    if a.name.startswith("adaptprec") and a.name not in modules:
                        stale.append(f"{module}: import {a.name}")
    assert not stale, f"imports of adaptprec modules that do not exist: {stale}"


def _defines(path: Path, name: str) -> bool:
    return re.search(rf"^\s*(def |class )?{re.escape(name)}\b", path.read_text(), re.M) is not None
