"""adaptprec's on-disk cache of compiled programs (adaptprec/_disk_cache.py), across fresh
processes: a cold process compiles and writes, a warm one loads (no compilation at all)
and answers identically, corrupt entries are recompiled, ``off`` writes nothing. Every
test uses its own temporary cache directory (the session's is set in conftest.py)."""

import json
import os
import pickle
import stat
import threading
import warnings

import jax
import jax.numpy as jnp
import pytest

from _subprocess import run_python
from adaptprec import _cache_trust as trust

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
import warnings
with warnings.catch_warnings(record=True) as seen:
    warnings.simplefilter("always")
    popt, pcov = ap.curve_fit(lambda t, a, k, c: a * jnp.exp(-k * t) + c, t, y,
                              p0=[1.0, 1.0, 0.0])
from adaptprec import _lapack_init
out = {{"popt": [float(v).hex() for v in popt],
       "pcov": [float(v).hex() for v in np.ravel(pcov)],
       "compiles": len(compiles), "stats": _disk_cache.stats(),
       "lapack": list(_lapack_init._state), "scipy_linalg": "scipy.linalg" in sys.modules,
       "eager": eager,
       "warnings": [str(w.message) for w in seen if "program cache" in str(w.message)]}}
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
    assert first["stats"]["compiles"] >= 1 and first["stats"]["disk_writes"] >= 1
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
    assert second["compiles"] == 0          # no XLA compilation anywhere in the fit
    assert second["popt"] == first["popt"] and second["pcov"] == first["pcov"]  # bits
    assert second["lapack"] == ["fast"] and not second["scipy_linalg"]
    assert second["later_scipy"]
    assert _entries(d) == written


@pytest.mark.slow
def test_corrupt_entries_are_recompiled(cold, tmp_path):
    d0, first = cold
    d = str(tmp_path)
    names = _entries(d0)
    for name in names:
        with open(os.path.join(d0, name), "rb") as src:
            data = src.read()
        with open(os.path.join(d, name), "wb") as dst:   # truncated or garbage
            dst.write(data[: len(data) // 3] if len(name) % 2 else b"not a program")
    # and an entry with one changed byte in its executable: it reached XLA and aborted
    # the process (in every later process too, since the entry stayed); its tag now
    # refuses it before it is unpickled
    name = max(names, key=lambda n: os.path.getsize(os.path.join(d0, n)))
    with open(os.path.join(d0, name), "rb") as src:
        data = bytearray(src.read())
    data[len(data) // 2] ^= 0x20
    with open(os.path.join(d, name), "wb") as dst:
        dst.write(data)
    res = _fit({"ADAPTPREC_CACHE_DIR": d})
    assert res["stats"]["disk_refused"] >= 1 and res["stats"]["compiles"] >= 1
    assert res["stats"]["disk_errors"] >= res["stats"]["disk_refused"]
    assert res["popt"] == first["popt"] and res["warnings"] == []
    # the bad entries were replaced: a further process loads everything
    again = _fit({"ADAPTPREC_CACHE_DIR": d})
    assert again["stats"]["compiles"] == 0 and again["stats"]["disk_errors"] == 0
    assert again["popt"] == first["popt"]


class _Plant:
    """Unpickling this creates the file ``marker``: what a planted entry could run."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def _plant(d0: str, d: str, marker: str, sealed_with) -> list:
    """Put ``_Plant`` pickles in ``d`` under the names of ``d0``'s entries (the programs
    the fit looks up): sealed with the secret ``sealed_with(i)``, or bare when it is
    ``None``."""
    names = _entries(d0)
    for i, name in enumerate(names):
        body = pickle.dumps(_Plant(marker))
        secret = sealed_with(i)
        with open(os.path.join(d, name), "wb") as fh:
            fh.write(body if secret is None else trust.seal(secret, name, body))
    return names


def test_planted_entry_in_a_world_writable_directory_does_not_run(cold, tmp_path):
    # a shared scratch directory (mode 0777): entries planted there by another user,
    # even ones carrying your own key's tag, are never read, and the user is told why
    d0, first = cold
    d, marker = tmp_path / "shared", str(tmp_path / "ran")
    d.mkdir()
    names = _plant(d0, str(d), marker, lambda i: trust.secret())
    d.chmod(0o777)
    before = {n: (d / n).read_bytes() for n in names}
    res = _fit({"ADAPTPREC_CACHE_DIR": str(d)})
    assert not os.path.exists(marker)
    assert res["popt"] == first["popt"] and res["pcov"] == first["pcov"]
    assert res["stats"]["disk_hits"] == 0 and res["stats"]["disk_writes"] == 0
    assert {n: (d / n).read_bytes() for n in os.listdir(d)} == before  # nothing written
    assert len(res["warnings"]) == 1, res["warnings"]   # once, for the whole process
    message = res["warnings"][0]
    assert str(d) in message and "writable by group or others (mode 0777)" in message
    assert "memory only" in message and f"chmod 700 {d}` if it is yours alone" in message
    assert "ADAPTPREC_CACHE_DIR=off" in message


@pytest.mark.slow
def test_planted_entry_without_your_tag_does_not_run(cold, tmp_path):
    # a directory of yours (0700) holding entries you did not write: bare pickles, and
    # pickles tagged with another user's key (a copied cache): refused before unpickling
    d0, first = cold
    d, marker = tmp_path / "mine", str(tmp_path / "ran")
    d.mkdir(mode=0o700)
    names = _plant(d0, str(d), marker, lambda i: None if i % 2 else b"another key" * 3)
    res = _fit({"ADAPTPREC_CACHE_DIR": str(d)})
    assert not os.path.exists(marker)
    assert res["popt"] == first["popt"] and res["pcov"] == first["pcov"]
    assert res["stats"]["disk_refused"] >= 1 and res["stats"]["disk_hits"] == 0
    assert res["warnings"] == []   # (nothing for the user to fix: recompiled, replaced)
    # each was refused (deleted), its program compiled and stored under your key
    assert res["stats"]["disk_refused"] == len(names)
    key = trust.secret()
    assert all(trust.unseal(key, n, (d / n).read_bytes()) is not None for n in names)


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


# --- trust and authentication in this process (adaptprec/_cache_trust.py) ---


@pytest.fixture
def fresh_trust(monkeypatch, tmp_path):
    """A process-fresh trust state (nothing refused or warned, no secret read) with a
    key file of its own; returns the key file's path."""
    monkeypatch.setattr(trust, "_refused", {})
    monkeypatch.setattr(trust, "_warned_entries", set())
    monkeypatch.setattr(trust, "_secrets", {})
    key_file = tmp_path / "keys" / "cache-key"
    monkeypatch.setenv("ADAPTPREC_CACHE_KEY_FILE", str(key_file))
    return key_file


def _cache_warnings(seen) -> list:
    return [str(w.message) for w in seen if "program cache" in str(w.message)]


def _compile_two(dc):
    """Two programs through the cache (two lookups each way); their values."""
    x = jnp.arange(4.0)
    f = dc.compiled(jax.jit(lambda x: 3.0 * x + 1.0), ("test", "trust", "f"), (x,))
    g = dc.compiled(jax.jit(lambda x: x * x), ("test", "trust", "g"), (x,))
    return float(f(x)[1]), float(g(x)[3])


def test_an_entry_round_trips_and_a_changed_byte_is_refused(fresh_trust, tmp_path,
                                                            monkeypatch):
    from adaptprec import _disk_cache as dc

    d = tmp_path / "cache"
    monkeypatch.setenv("ADAPTPREC_CACHE_DIR", str(d))
    dc.clear_memory()
    assert _compile_two(dc) == (4.0, 9.0) and dc.stats()["disk_writes"] == 2
    assert stat.S_IMODE(d.stat().st_mode) == 0o700
    assert stat.S_IMODE(fresh_trust.stat().st_mode) == 0o600
    assert fresh_trust.stat().st_size == 32 and len(os.listdir(fresh_trust.parent)) == 1
    names = _entries(d)
    assert [stat.S_IMODE((d / n).stat().st_mode) for n in names] == [0o600, 0o600]
    dc.clear_memory()   # a correct entry loads
    assert _compile_two(dc) == (4.0, 9.0)
    assert dc.stats()["disk_hits"] == 2 and dc.stats()["compiles"] == 0
    for name in names:   # one byte changed, at the start and deep in the executable
        data = bytearray((d / name).read_bytes())
        data[len(data) // 2 if name == names[0] else len(trust.MAGIC) + 3] ^= 0x01
        (d / name).write_bytes(bytes(data))
    dc.clear_memory()
    with warnings.catch_warnings():
        warnings.simplefilter("error")   # (nothing to tell the user: recompiled)
        assert _compile_two(dc) == (4.0, 9.0)
    assert dc.stats()["disk_refused"] == 2 and dc.stats()["compiles"] == 2
    key = trust.secret()
    assert all(trust.unseal(key, n, (d / n).read_bytes()) is not None for n in names)


def test_a_world_writable_directory_is_not_used(fresh_trust, tmp_path, monkeypatch,
                                                capsys):
    from adaptprec import _disk_cache as dc
    from adaptprec.cli import main

    d, marker = tmp_path / "shared", tmp_path / "ran"
    monkeypatch.setenv("ADAPTPREC_CACHE_DIR", str(d))
    dc.clear_memory()
    _compile_two(dc)
    names = _entries(d)
    for name in names:   # planted with your own key's tag: the directory alone refuses
        (d / name).write_bytes(trust.seal(trust.secret(), name,
                                          pickle.dumps(_Plant(str(marker)))))
    d.chmod(0o777)
    before = {n: (d / n).read_bytes() for n in names}
    dc.clear_memory()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert _compile_two(dc) == (4.0, 9.0)
    assert not marker.exists()
    assert {n: (d / n).read_bytes() for n in os.listdir(d)} == before   # nothing written
    assert dc.stats()["disk_hits"] == 0 and dc.stats()["compiles"] == 2
    [message] = _cache_warnings(seen)
    assert "writable by group or others (mode 0777)" in message and str(d) in message
    assert dc.disk_info()["refused"] == "it is writable by group or others (mode 0777)"
    assert dc.clear_disk() == 0 and sorted(os.listdir(d)) == names   # not touched
    assert main(["cache"]) == 0
    out = capsys.readouterr().out
    assert "not used:  it is writable by group or others" in out and str(d) in out


@pytest.mark.parametrize("what", ["key mode 0644", "key directory mode 0777"])
def test_a_key_open_to_others_is_refused(fresh_trust, tmp_path, monkeypatch, what):
    from adaptprec import _disk_cache as dc

    fresh_trust.parent.mkdir(mode=0o700)
    fresh_trust.write_bytes(os.urandom(32))
    if what == "key mode 0644":
        fresh_trust.chmod(0o644)
    else:
        fresh_trust.chmod(0o600)
        fresh_trust.parent.chmod(0o777)
    d = tmp_path / "cache"
    monkeypatch.setenv("ADAPTPREC_CACHE_DIR", str(d))
    dc.clear_memory()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert _compile_two(dc) == (4.0, 9.0)
    [message] = _cache_warnings(seen)
    if what == "key mode 0644":
        assert f"key file {str(fresh_trust)!r}" in message
        assert "readable by group or others (mode 0644" in message
        assert f"chmod 600 {fresh_trust}" in message
    else:
        assert f"key directory {str(fresh_trust.parent)!r}" in message
        assert "ADAPTPREC_CACHE_KEY_FILE" in message
    assert trust.secret() is None and _entries(d) == []   # memory only
    assert dc.stats()["disk_writes"] == 0


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0,
                    reason="giving files to another user needs root")
def test_files_of_another_user_are_not_read(fresh_trust, tmp_path, monkeypatch):
    from adaptprec import _disk_cache as dc

    d, marker = tmp_path / "cache", tmp_path / "ran"
    monkeypatch.setenv("ADAPTPREC_CACHE_DIR", str(d))
    dc.clear_memory()
    _compile_two(dc)
    names = _entries(d)

    def plant(name):   # (with your key's tag: the ownership check alone refuses it)
        (d / name).write_bytes(trust.seal(trust.secret(), name,
                                          pickle.dumps(_Plant(str(marker)))))

    plant(names[0])
    os.chown(d / names[0], 4242, 4242)   # an entry file of someone else's: deleted
    dc.clear_memory()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        _compile_two(dc)
    assert not marker.exists() and dc.stats()["disk_refused"] >= 1
    [message] = _cache_warnings(seen)
    assert "did not load" in message and "owned by" in message and "uid 4242" in message
    for name in names:
        plant(name)
    os.chown(d, 4242, 4242)   # the directory of someone else's: memory only
    monkeypatch.setattr(trust, "_refused", {})
    dc.clear_memory()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert _compile_two(dc) == (4.0, 9.0)
    [message] = _cache_warnings(seen)
    assert "owned by" in message and "uid 4242" in message and not marker.exists()
    assert "chmod" not in message   # (not yours to change: a directory of your own)
    assert f"ADAPTPREC_CACHE_DIR={d}{os.sep}adaptprec-" in message
    assert dc.stats()["disk_hits"] == 0 and dc.stats()["disk_writes"] == 0


def test_the_key_is_created_once_when_threads_race(fresh_trust):
    start = threading.Barrier(8)
    got = []

    def make():
        start.wait()
        got.append(trust.secret())

    threads = [threading.Thread(target=make) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(got) == 8 and len(set(got)) == 1 and got[0] == fresh_trust.read_bytes()
    assert os.listdir(fresh_trust.parent) == ["cache-key"]   # no temporary file left
    assert stat.S_IMODE(fresh_trust.stat().st_mode) == 0o600


def test_a_shared_directory_is_never_to_be_changed(tmp_path):
    # /tmp or a scratch disk (sticky bit): the advice is a directory of your own, not
    # chmod; a directory of yours that others can write: chmod first
    shared, mine = tmp_path / "scratch", tmp_path / "mine"
    shared.mkdir()
    mine.mkdir()
    shared.chmod(0o1777)
    mine.chmod(0o775)
    why = trust.problem(shared.stat(), str(shared), "directory")
    assert why.reason == "it is writable by group or others (mode 1777)"
    assert "chmod" not in why.fix and f"ADAPTPREC_CACHE_DIR={shared}{os.sep}" in why.fix
    why = trust.problem(mine.stat(), str(mine), "directory")
    assert why.fix.startswith(f"run `chmod 700 {mine}` if it is yours alone")
    assert trust.problem((tmp_path / "mine").stat(), "", "entry").reason == \
        "it is not a regular file"
