"""Run a Python snippet in a fresh interpreter: for x64-off checks and multi-device tests.

The main test process keeps one device and x64 on; anything that needs other global JAX
configuration runs here instead.
"""

import os
import subprocess
import sys
import textwrap


def run_python(code: str, *, x64: bool = True, devices: int | None = None,
               timeout: float = 600) -> subprocess.CompletedProcess:
    """Run ``code`` with ``JAX_ENABLE_X64`` set from ``x64`` and, if ``devices`` is given,
    that many host CPU devices (``--xla_force_host_platform_device_count``)."""
    env = dict(os.environ, JAX_ENABLE_X64="1" if x64 else "0", JAX_PLATFORMS="cpu")
    if devices is not None:
        env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env,
                          capture_output=True, text=True, timeout=timeout)
