"""Run a Python snippet in N local processes joined by JAX's distributed runtime.

Multi-process tests (``jax.distributed`` on localhost, gloo CPU collectives, several host
devices per process) start their processes here. Each process runs ``script`` after a
preamble that calls ``jax.distributed.initialize`` with a free localhost port, so inside the
script ``jax.devices()`` lists the devices of ALL processes, ``jax.process_index()`` is this
process's id and the usual SPMD rules hold (every process runs the same program).

The environment of each process also carries ``ADAPTPREC_COORDINATOR``,
``ADAPTPREC_NUM_PROCESSES`` and ``ADAPTPREC_PROCESS_ID``, for scripts that pass
``initialize=False`` and call ``jax.distributed.initialize`` themselves.

Checked here: 2 processes x 2 CPU devices run a ``psum`` over a 4-device mesh (gloo is
JAX 0.10's default CPU collectives implementation; ``jax_cpu_collectives_implementation``).
Native writes to stdout (gloo's ``[Gloo] Rank ... connected`` lines) go to the returned
stderr; the script's prints alone make the returned stdout. A process
whose script raises exits at once (non-zero) instead of waiting in the runtime's exit
barrier, so a failure is reported without waiting for the timeout.

Example (not run as a doctest: it starts processes)::

    outs = run_processes('''
        import jax
        print(jax.process_index(), jax.device_count())
    ''')
    assert [o.stdout.split() for o in outs] == [["0", "4"], ["1", "4"]]
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import textwrap
import time

__all__ = ["free_port", "run_processes"]

_RUNNER = """\
import os, runpy, sys, traceback
# native writes to fd 1 go to stderr, the script's prints keep stdout: gloo's "[Gloo] Rank
# N is connected to ..." line, written in pieces, once split a print in two (CI, stop 27)
_stdout = os.dup(1)
os.dup2(2, 1)
sys.stdout = os.fdopen(_stdout, "w", buffering=1)
if {initialize}:
    import jax
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(os.environ["ADAPTPREC_COORDINATOR"],
                               int(os.environ["ADAPTPREC_NUM_PROCESSES"]),
                               int(os.environ["ADAPTPREC_PROCESS_ID"]))
try:
    runpy.run_path({script!r}, run_name="__main__")
except BaseException as e:
    # a failed process must exit now: the runtime's exit barrier would wait for its peers
    code = e.code if isinstance(e, SystemExit) else 1
    if code not in (0, None):
        if not isinstance(e, SystemExit) or not isinstance(code, int):
            traceback.print_exc()
        sys.stdout.flush(); sys.stderr.flush()
        os._exit(code if isinstance(code, int) else 1)
"""


def free_port() -> int:
    """A TCP port on localhost that is free right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_processes(script: str, n_processes: int = 2, devices_per_process: int = 2,
                  timeout: float = 600, *, x64: bool = True, initialize: bool = True,
                  env: dict | None = None, cwd: str | None = None
                  ) -> list[subprocess.CompletedProcess]:
    """Run ``script`` in ``n_processes`` Python processes, each with
    ``devices_per_process`` host CPU devices, joined by ``jax.distributed`` on localhost.

    Returns one :class:`subprocess.CompletedProcess` per process (index = process id),
    with text ``stdout``/``stderr``. Raises ``RuntimeError`` with every process's stderr if
    any exits non-zero or the run exceeds ``timeout`` seconds (all processes are killed).

    ``x64`` sets ``JAX_ENABLE_X64``; ``initialize=False`` skips the preamble that calls
    ``jax.distributed.initialize``; ``env`` adds environment variables (its
    ``XLA_FLAGS`` are appended to the device-count flag, its ``PYTHONPATH`` follows
    ``cwd``; the text ``{process_id}`` in a value becomes the process id, e.g. for
    ``--xla_dump_to=/tmp/dump/{process_id}``); ``cwd`` defaults
    to the current directory (so a worktree's ``adaptprec`` is imported, as in the tests).
    """
    if n_processes < 1 or devices_per_process < 1:
        raise ValueError("n_processes and devices_per_process must be >= 1")
    cwd = os.getcwd() if cwd is None else cwd
    coord = f"127.0.0.1:{free_port()}"
    base = dict(os.environ, JAX_PLATFORMS="cpu", JAX_ENABLE_X64="1" if x64 else "0",
                XLA_FLAGS=f"--xla_force_host_platform_device_count={devices_per_process}",
                ADAPTPREC_COORDINATOR=coord, ADAPTPREC_NUM_PROCESSES=str(n_processes),
                PYTHONPATH=os.pathsep.join(
                    p for p in (cwd, os.environ.get("PYTHONPATH")) if p))
    env = dict(env or {})
    if "XLA_FLAGS" in env:     # extra XLA flags go after the device count
        base["XLA_FLAGS"] += " " + env.pop("XLA_FLAGS")
    if "PYTHONPATH" in env:    # after cwd: the worktree's adaptprec stays first
        base["PYTHONPATH"] = os.pathsep.join((cwd, env.pop("PYTHONPATH"),
                                              os.environ.get("PYTHONPATH", "")))
    base.update(env)
    with tempfile.TemporaryDirectory(prefix="adaptprec_mp_") as tmp:
        script_path = os.path.join(tmp, "script.py")
        with open(script_path, "w") as f:
            f.write(textwrap.dedent(script))
        path = os.path.join(tmp, "runner.py")
        with open(path, "w") as f:
            f.write(_RUNNER.format(initialize=bool(initialize), script=script_path))
        procs, files = [], []
        try:
            for pid in range(n_processes):
                out = open(os.path.join(tmp, f"out{pid}"), "w+")
                err = open(os.path.join(tmp, f"err{pid}"), "w+")
                files.append((out, err))
                procs.append(subprocess.Popen(
                    [sys.executable, path], cwd=cwd, stdout=out, stderr=err, text=True,
                    env={k: v.replace("{process_id}", str(pid)) for k, v in
                         dict(base, ADAPTPREC_PROCESS_ID=str(pid)).items()}))
            deadline = time.monotonic() + timeout
            timed_out = False
            while any([p.poll() is None for p in procs]):   # a list: poll every one
                if any(p.returncode not in (None, 0) for p in procs):
                    break       # its peers would wait for it until the timeout: stop all
                if time.monotonic() > deadline:
                    timed_out = True
                    break
                time.sleep(0.05)
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        results = []
        for pid, (p, (out, err)) in enumerate(zip(procs, files)):
            out.seek(0)
            err.seek(0)
            # (gloo's "[Gloo] ..." lines are native writes: in stderr, see _RUNNER)
            results.append(subprocess.CompletedProcess(
                [sys.executable, path], p.returncode, out.read(), err.read()))
            out.close()
            err.close()
    if timed_out or any(r.returncode != 0 for r in results):
        what = f"timed out after {timeout} s" if timed_out else "failed"
        detail = "\n".join(f"--- process {i} (exit {r.returncode}) stderr:\n{r.stderr[-4000:]}"
                           for i, r in enumerate(results))
        raise RuntimeError(f"{n_processes}-process run {what}\n{detail}")
    return results
