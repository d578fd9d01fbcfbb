"""Test-session configuration: the tests use float64 rungs, so they turn x64 on.

The library itself never flips this flag; tests of the x64-off error run in a subprocess.
"""

import jax

jax.config.update("jax_enable_x64", True)

collect_ignore_glob = ["adaptprec/__main__.py"]
