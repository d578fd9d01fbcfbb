"""Test-session configuration: the tests use float64 rungs, so they turn x64 on.

The library itself never flips this flag; tests of the x64-off error run in a subprocess.
"""

import atexit
import os
import shutil
import tempfile

import jax

jax.config.update("jax_enable_x64", True)

# adaptprec's on-disk program cache (adaptprec/_disk_cache.py): a fresh directory for this
# session (inherited by subprocesses), never the user's
_CACHE = tempfile.mkdtemp(prefix="adaptprec-test-cache-")
os.environ["ADAPTPREC_CACHE_DIR"] = _CACHE
atexit.register(shutil.rmtree, _CACHE, True)

# promotion of repeated eager solves to one program (adaptprec/nlsq/_promote.py) compiles
# in a background thread by default; the suite runs without it (deterministic timing and
# no background compiles), and tests/test_promote.py turns it on
os.environ.setdefault("ADAPTPREC_PROMOTE", "off")

collect_ignore_glob = ["adaptprec/__main__.py"]
