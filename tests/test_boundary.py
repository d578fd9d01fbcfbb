"""The package boundary: what `import adaptprec` pulls in, what it exports, and that no
public name shadows a module (issue 13)."""

import importlib
import pkgutil
import types

import pytest

import adaptprec as ap
from _subprocess import run_python


def test_import_pulls_in_no_optional_or_slow_dependency():
    proc = run_python(
        "import sys, adaptprec\n"
        "print(sorted(m for m in ('equinox', 'jaxtyping', 'scipy', 'optimistix', 'lineax',"
        " 'matplotlib', 'tqdm', 'optax', 'pandas') if m in sys.modules))",
        x64=False, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "[]"


def test_all_names_exist_and_are_unique():
    assert len(ap.__all__) == len(set(ap.__all__))
    missing = [n for n in ap.__all__ if not hasattr(ap, n)]
    assert not missing


def test_no_public_name_shadows_a_submodule():
    """`ap.policy` must be the function or the module, never both by accident: every
    submodule whose name is also a public attribute IS that attribute."""
    for info in pkgutil.iter_modules(ap.__path__):
        if info.name.startswith("_") or info.name in ("cli",):
            continue
        attr = getattr(ap, info.name, None)
        if attr is None:
            continue
        module = importlib.import_module(f"adaptprec.{info.name}")
        assert attr is module, (info.name, attr)


def test_functions_that_used_to_shadow_modules():
    assert isinstance(ap.policy, types.FunctionType)
    assert isinstance(ap.monitor, types.FunctionType)
    assert callable(ap.autocast) and not isinstance(ap.autocast, types.ModuleType)


@pytest.mark.slow
def test_optimistix_adapter_loads_lazily():
    proc = run_python("import sys, adaptprec.nlsq as n\n"
                      "assert 'optimistix' not in sys.modules\n"
                      "n.MoreLM\n"
                      "print('optimistix' in sys.modules)", timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "True"
