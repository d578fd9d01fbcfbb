"""`import adaptprec` imports the rarely used parts on first use (module ``__getattr__``
in adaptprec/__init__.py and adaptprec/_autocast/__init__.py): every public name still
resolves to the same object as its defining module's. (That a fresh ``import adaptprec``
leaves them unimported is checked in a fresh process in tests/test_disk_cache.py.)"""

import importlib
import types

import pytest

import adaptprec as ap


def test_every_public_name_resolves_and_is_listed_by_dir():
    names = dir(ap)
    for name in ap.__all__:
        assert getattr(ap, name) is not None and name in names


@pytest.mark.parametrize("name, module", [
    ("explain", "adaptprec._autocast.explain"),
    ("autocast", "adaptprec._autocast.interpret"),
    ("solve_nlsq_batch", "adaptprec.batch"), ("profile", "adaptprec._profile"),
    ("train_step", "adaptprec._training"), ("adaptive", "adaptprec.runtime"),
    ("AUTO_MIXED_BF16", "adaptprec._autocast.presets"), ("monitor", "adaptprec._monitor"),
])
def test_lazy_names_are_the_defining_objects(name, module):
    assert getattr(ap, name) is getattr(importlib.import_module(module), name)
    # `explain` is also a submodule's name: the public name stays the function
    assert not isinstance(getattr(ap, name), types.ModuleType)


def test_subpackages_and_unknown_names():
    assert isinstance(ap.linalg, types.ModuleType) and ap.linalg.solve is not None
    assert isinstance(ap.guards, types.ModuleType) and ap.schedule.iterate is ap.iterate
    with pytest.raises(AttributeError, match="no attribute 'not_a_name'"):
        ap.not_a_name  # noqa: B018
    import adaptprec._autocast as ac

    assert ac.autocast is ap.autocast and "explain" in ac.__all__
    with pytest.raises(AttributeError):
        ac.not_a_name  # noqa: B018


def test_import_leaves_the_backend_alone_so_fork_workers_run():
    # newcomer audit 6: `import adaptprec` initialised XLA's backend (a module-level
    # cpu_jit asked for the default backend), and a fork-started worker (ProcessPoolExecutor's
    # default on Linux) then deadlocked in its first fit
    from _subprocess import run_python

    proc = run_python("""
    import multiprocessing as mp
    import numpy as np
    import adaptprec
    from jax._src import xla_bridge
    print(bool(xla_bridge._backends))

    def fit(_):
        import jax.numpy as jnp
        x = np.linspace(0, 3, 40)
        y = 2.5 * np.exp(-1.3 * x) + 0.5
        p, _ = adaptprec.curve_fit(lambda x, a, b, c: a * jnp.exp(-b * x) + c, x, y,
                                   p0=[1.0, 1.0, 0.0])
        return [round(float(v), 6) for v in p]

    with mp.get_context("fork").Pool(1) as pool:
        print(pool.apply_async(fit, (0,)).get(timeout=120))
    """, x64=False, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split("\n")[:2] == ["False", "[2.5, 1.3, 0.5]"]
