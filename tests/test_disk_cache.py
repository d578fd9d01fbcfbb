"""adaptprec's on-disk cache of compiled programs (adaptprec/_disk_cache.py), across fresh
processes: a cold process compiles and writes, a warm one loads (no compilation at all)
and answers identically, corrupt entries are recompiled, ``off`` writes nothing. Every
test uses its own temporary cache directory (the session's is set in conftest.py)."""

import json
import os
import pickle

import jax
import jax.numpy as jnp
import pytest

from _subprocess import run_python

_FIT = """
import json, os, sys
os.environ.update({env!r})
import numpy as np, jax.numpy as jnp
from jax._src import monitoring
from jax._src.dispatch import BACKEND_COMPILE_EVENT
import adaptprec as ap
# what `import adaptprec` must not import (issue 14: import time; see adaptprec/__init__)
eager = sorted(m for m in ("scipy", "jax.extend", "adaptprec.batch", "adaptprec.linalg",
                           "adaptprec._profile", "adaptprec._plot", "adaptprec._training",
                           "adaptprec._autocast.interpret", "adaptprec.runtime")
               if m in sys.modules)
from adaptprec import _disk_cache

compiles = []
monitoring.register_event_duration_secs_listener(
    lambda e, d, **k: compiles.append(d) if e == BACKEND_COMPILE_EVENT else None)
t = np.linspace(0.0, 4.0, 120)
y = 2.5 * np.exp(-1.3 * t) + 0.5 + 0.01 * np.random.default_rng(0).standard_normal(120)
popt, pcov = ap.curve_fit(lambda t, a, k, c: a * jnp.exp(-k * t) + c, t, y,
                          p0=[1.0, 1.0, 0.0])
from adaptprec import _lapack_init
out = {{"popt": [float(v).hex() for v in popt],
       "pcov": [float(v).hex() for v in np.ravel(pcov)],
       "compiles": len(compiles), "stats": _disk_cache.stats(),
       "lapack": list(_lapack_init._state), "scipy_linalg": "scipy.linalg" in sys.modules,
       "eager": eager}}
# the fast LAPACK start-up leaves scipy.linalg whole for a later import
import scipy.linalg, scipy.optimize
from scipy.linalg import cython_lapack
a = np.array([[4.0, 1.0], [1.0, 3.0]])
out["later_scipy"] = (scipy.linalg.cython_blas is sys.modules["scipy.linalg.cython_blas"]
                      and scipy.linalg.cython_lapack is cython_lapack
                      and "dgesv" in cython_lapack.__pyx_capi__
                      and np.allclose(scipy.linalg.solve(a, [1.0, 2.0]), [1/11, 7/11])
                      and np.allclose(np.asarray(jnp.linalg.svd(a)[1]), np.linalg.svd(a)[1])
                      and np.allclose(scipy.optimize.curve_fit(
                          lambda t, k: k * t, t, 2 * t)[0], 2.0))
print(json.dumps(out))
"""


def _fit(env: dict) -> dict:
    proc = run_python(_FIT.format(env=env), x64=False)   # a scipy user's process
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _entries(d):
    return sorted(f for f in os.listdir(d) if f.endswith(".xla")) if os.path.isdir(d) \
        else []


@pytest.fixture(scope="module")
def cold(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("apcache"))
    return d, _fit({"ADAPTPREC_CACHE_DIR": d})


@pytest.mark.slow
def test_cold_process_writes_and_warm_process_loads_without_compiling(cold):
    d, first = cold
    assert first["stats"]["compiles"] >= 4 and first["stats"]["disk_writes"] >= 4
    # LAPACK started without importing scipy.linalg (adaptprec/_lapack_init.py), and a
    # later `import scipy.linalg` (and scipy's curve_fit) works as usual
    assert first["lapack"] == ["fast"] and not first["scipy_linalg"]
    assert first["eager"] == []   # lazily imported (module __getattr__)
    assert first["later_scipy"]
    written = _entries(d)
    assert len(written) >= first["stats"]["disk_writes"]
    second = _fit({"ADAPTPREC_CACHE_DIR": d})
    assert second["stats"]["compiles"] == 0
    assert second["stats"]["disk_hits"] == first["stats"]["compiles"]
    # the four programs were compiled (cold) or loaded (warm) in the background
    # (_disk_cache.prefetch: the step programs while the residual was traced): their keys
    # and shapes match the loop's calls
    assert first["stats"]["background_compiles"] == first["stats"]["compiles"] == 4
    assert first["stats"]["prefetched"] == 0 and second["stats"]["prefetched"] == 4
    assert second["compiles"] == 0          # no XLA compilation anywhere in the fit
    assert second["popt"] == first["popt"] and second["pcov"] == first["pcov"]  # bits
    assert second["lapack"] == ["fast"] and not second["scipy_linalg"]
    assert second["later_scipy"]
    assert _entries(d) == written


@pytest.mark.slow
def test_corrupt_entries_are_recompiled(cold, tmp_path):
    d0, first = cold
    d = str(tmp_path)
    for name in _entries(d0):
        with open(os.path.join(d0, name), "rb") as src:
            data = src.read()
        with open(os.path.join(d, name), "wb") as dst:   # truncated or garbage
            dst.write(data[: len(data) // 3] if len(name) % 2 else b"not a program")
    # and one well-formed entry whose payload has one changed byte: it reached XLA and
    # aborted the process, in every later process too (newcomer audit 6)
    def load(name):
        with open(os.path.join(d0, name), "rb") as src:
            return pickle.load(src)

    # (an executable's entry: others hold small host values, {"key", "value"})
    name = next(n for n in _entries(d0) if "payload" in load(n))
    entry = load(name)
    payload = bytearray(entry["payload"])
    payload[len(payload) // 2] ^= 0x20
    entry["payload"] = bytes(payload)
    with open(os.path.join(d, name), "wb") as dst:
        pickle.dump(entry, dst)
    res = _fit({"ADAPTPREC_CACHE_DIR": d})
    assert res["stats"]["disk_errors"] >= 1 and res["stats"]["compiles"] >= 1
    assert res["popt"] == first["popt"]
    # the bad entries were replaced: a further process loads everything
    again = _fit({"ADAPTPREC_CACHE_DIR": d})
    assert again["stats"]["compiles"] == 0 and again["stats"]["disk_errors"] == 0
    assert again["popt"] == first["popt"]


@pytest.mark.slow
def test_warm_cache_with_several_devices(tmp_path):
    # newcomer audit 6: with 4 CPU devices the warm process loaded the one-device
    # programs for all 4 and every fit crashed ("Expected ... 4 shards, got [1]")
    code = f"""
    import os
    os.environ["ADAPTPREC_CACHE_DIR"] = {str(tmp_path)!r}
    import numpy as np, jax, jax.numpy as jnp, adaptprec as ap
    from adaptprec import _disk_cache
    x = np.linspace(0, 3, 40); y = 2.5 * np.exp(-1.3 * x) + 0.5
    p, _ = ap.curve_fit(lambda x, a, b, c: a * jnp.exp(-b * x) + c, x, y, p0=[1., 1., 0.])
    print(jax.device_count(), _disk_cache.stats()["disk_hits"] > 0, [v.hex() for v in p])
    """
    runs = [run_python(code, x64=False, devices=4) for _ in range(2)]
    assert all(r.returncode == 0 for r in runs), runs[-1].stderr[-3000:]
    cold, warm = (r.stdout.split(maxsplit=2) for r in runs)
    assert cold[0] == warm[0] == "4" and warm[1] == "True" and warm[2] == cold[2]


@pytest.mark.slow
def test_off_writes_nothing(cold, tmp_path):
    _, first = cold
    home = str(tmp_path)
    # also jaxlib's own LAPACK start-up (fast path off): the same bits
    res = _fit({"ADAPTPREC_CACHE_DIR": "off", "HOME": home, "XDG_CACHE_HOME": home,
                "ADAPTPREC_FAST_LAPACK": "0"})
    assert res["stats"]["disk_writes"] == 0 and res["stats"]["disk_hits"] == 0
    assert res["lapack"] == ["normal"] and res["scipy_linalg"] and res["later_scipy"]
    assert res["popt"] == first["popt"] and res["pcov"] == first["pcov"]
    assert not any(files for _, _, files in os.walk(home))


def test_default_directory_follows_xdg(monkeypatch, tmp_path):
    from adaptprec import _disk_cache

    monkeypatch.delenv("ADAPTPREC_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert _disk_cache.cache_dir() == os.path.join(str(tmp_path), "adaptprec")
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert _disk_cache.cache_dir() == os.path.join(os.path.expanduser("~"), ".cache",
                                                   "adaptprec")
    for off in ("off", "OFF", "0", "none", ""):
        monkeypatch.setenv("ADAPTPREC_CACHE_DIR", off)
        assert _disk_cache.cache_dir() is None


def test_size_bound_drops_least_recently_used(monkeypatch, tmp_path):
    import jax

    from adaptprec import _disk_cache

    monkeypatch.setenv("ADAPTPREC_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("ADAPTPREC_CACHE_MAX_MB", "0.05")   # ~52 kB: a few small programs
    for k in range(12):
        _disk_cache.compiled(jax.jit(lambda x, k=k: x * k + jnp.sin(x)), ("size-test", k),
                             (jnp.ones(5),))
    total = sum(os.path.getsize(os.path.join(tmp_path, f)) for f in _entries(tmp_path))
    assert 0 < total <= 0.05 * 2 ** 20
    assert len(_entries(tmp_path)) < 12


@pytest.mark.slow
def test_unwritable_directory_warns_once_and_fits(tmp_path):
    # newcomer audit 6: a cache directory that cannot be written was used memory-only
    # with no word to the user (only a counter)
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    proc = run_python(f"""
    import os, warnings
    os.environ["ADAPTPREC_CACHE_DIR"] = {str(blocker / "cache")!r}
    import numpy as np, jax.numpy as jnp, adaptprec as ap
    x = np.linspace(0, 3, 40); y = 2.5 * np.exp(-1.3 * x) + 0.5
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for _ in range(2):
            p, _ = ap.curve_fit(lambda x, a, b, c: a * jnp.exp(-b * x) + c, x, y,
                                p0=[1., 1., 0.])
    print(sum("cannot be written" in str(w.message) for w in seen), np.round(p, 6).tolist())
    """, x64=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split(maxsplit=1) == ["1", "[2.5, 1.3, 0.5]\n"]


def test_cache_command_info_and_clear_touch_only_the_cache_entries(tmp_path, monkeypatch,
                                                                    capsys):
    """``python -m adaptprec cache``: info names the directory and counts the entries;
    clear deletes the programs (issue 32, item 5) and nothing else a user left there."""
    from adaptprec import _disk_cache as dc
    from adaptprec.cli import main

    monkeypatch.setenv("ADAPTPREC_CACHE_DIR", str(tmp_path))
    f = jax.jit(lambda x: 3.0 * x)
    dc.compiled(f, ("test", "cache-cli"), (jnp.ones(2),))
    (tmp_path / "notes.txt").write_text("mine")
    assert main(["cache", "info"]) == 0
    out = capsys.readouterr().out
    assert str(tmp_path) in out and "entries:   1" in out
    assert main(["cache", "clear"]) == 0
    assert "deleted 1 cached programs" in capsys.readouterr().out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]
    assert dc.disk_info()["entries"] == 0
    monkeypatch.setenv("ADAPTPREC_CACHE_DIR", "off")
    assert main(["cache"]) == 0 and "off" in capsys.readouterr().out


def test_held_prefetches_start_when_asked_for(tmp_path, monkeypatch):
    from adaptprec import _disk_cache as dc

    monkeypatch.setenv("ADAPTPREC_CACHE_DIR", str(tmp_path))
    x = jnp.ones(3)
    progs = {k: (("test-held", k), jax.jit(lambda x, c=c: x * c + 1.0))
             for k, c in (("f", 3.0), ("g", 5.0), ("h", 7.0))}
    with dc.held():
        assert all(dc.prefetch(key, (x,), None, fn) for key, fn in progs.values())
    pending = {k: dc._pending[(key, dc.signature((x,)))] for k, (key, _) in progs.items()}
    assert not any(p.started for p in pending.values())   # lowered, not compiling
    # a program asked for starts at once (no wait on a held thread) ...
    key, fn = progs["f"]
    assert float(dc.compiled(fn, key, (x,))(x)[0]) == 4.0
    assert pending["f"].started and not pending["g"].started
    # ... as does a prefetch of it, and start_held() starts the rest
    key, fn = progs["g"]
    assert not dc.prefetch(key, (x,), None, fn) and pending["g"].started
    ran = []
    dc.hold(("test-held", "task"), lambda: ran.append(1))
    dc.hold(("test-held", "task"), lambda: ran.append(2))   # (once per key)
    dc.start_held()
    assert ran == [1]
    assert pending["h"].started and pending["h"].done.wait(60)
    key, fn = progs["h"]
    assert float(dc.compiled(fn, key, (x,))(x)[0]) == 8.0
    assert all(p.done.wait(60) for p in pending.values())
    assert len(_entries(str(tmp_path))) == 3   # each compiled in the background, stored
