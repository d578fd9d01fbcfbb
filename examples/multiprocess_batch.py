"""Batched fits across processes: ``solve_nlsq_batch`` on JAX's distributed runtime.

Every process holds its own share of the fits (here: rows of one synthetic data set of
2-D Gaussian spots; on a cluster: the files it reads), puts them on its devices as part of
one global array, and all processes make the same ``solve_nlsq_batch`` call (SPMD). Each
device solves only its own fits: the compiled solve has no collective, so nothing crosses
processes while fitting. At the end the small per-fit summaries are gathered with
``multihost_utils.process_allgather`` and process 0 prints them, and checks them against a
one-process solve of the same fits.

Run on one machine (starts the processes itself; gloo CPU collectives on localhost):

    python examples/multiprocess_batch.py --processes 2

On a SLURM cluster (one process per host or per GPU; ``jax.distributed.initialize()``
reads the coordinator, process count and id from SLURM's environment):

    srun --nodes=2 --ntasks-per-node=1 python examples/multiprocess_batch.py --worker

Mostly compilation: each process compiles the solver, and process 0 once more for the
one-process check (1,024 fits, 2 x 2 devices: 60 s wall on a shared 2-core machine).
"""

import argparse
import os
import socket
import subprocess
import sys
import time


def launch(processes: int, devices: int, fits: int) -> int:
    """Start ``processes`` workers on localhost and wait for them (the single-machine run)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, JAX_PLATFORMS="cpu",
               XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}",
               ADAPTPREC_COORDINATOR=f"127.0.0.1:{port}",
               ADAPTPREC_NUM_PROCESSES=str(processes))
    procs = [subprocess.Popen([sys.executable, __file__, "--worker", "--fits", str(fits)],
                              env=dict(env, ADAPTPREC_PROCESS_ID=str(i)))
             for i in range(processes)]
    while any([p.poll() is None for p in procs]):
        if any(p.returncode not in (None, 0) for p in procs):   # a worker failed: its
            for p in procs:                                       # peers would wait forever
                if p.poll() is None:
                    p.kill()
            break
        time.sleep(0.1)
    codes = [p.wait() for p in procs]
    return max(codes, key=abs)


def worker(fits: int) -> None:
    import jax

    jax.config.update("jax_enable_x64", True)   # the f64 rung needs it
    if "ADAPTPREC_COORDINATOR" in os.environ:    # started by launch() on this machine
        jax.distributed.initialize(os.environ["ADAPTPREC_COORDINATOR"],
                                   int(os.environ["ADAPTPREC_NUM_PROCESSES"]),
                                   int(os.environ["ADAPTPREC_PROCESS_ID"]))
    else:                                        # SLURM (or another detected cluster)
        jax.distributed.initialize()

    import numpy as np
    from jax.experimental import multihost_utils
    from jax.sharding import NamedSharding, PartitionSpec as P

    import adaptprec as ap
    from _spots import gauss2d, spots   # the problem, shared with batched_fits.py

    mesh = jax.make_mesh((jax.device_count(),), ("fits",))
    sharding = NamedSharding(mesh, P("fits"))
    if fits % jax.device_count():
        raise SystemExit(f"--fits {fits} must be a multiple of the {jax.device_count()} "
                         "devices (or pad each process's rows)")
    xy, data, _, x0 = spots(fits)           # every process makes the same data here ...
    # the first fit of the second half has photon counts of 1e20: float32 overflows, so
    # that fit escalates to float64 (on one process, not the other)
    data[fits // 2] *= 1e20
    x0[fits // 2, [0, 4]] *= 1e20
    per = fits // jax.process_count()
    mine = slice(jax.process_index() * per, (jax.process_index() + 1) * per)
    x0_g = jax.make_array_from_process_local_data(sharding, x0[mine])   # ... keeps its rows
    data_g = jax.make_array_from_process_local_data(sharding, data[mine])

    kw = dict(args=(xy,), in_axes=None, compaction=None)
    t0 = time.perf_counter()
    res = ap.solve_nlsq_batch(gauss2d, x0_g, ydata=data_g, **kw)
    jax.block_until_ready(res)
    elapsed = time.perf_counter() - t0

    # per-process view: only this process's fits, and which of them left float32
    why = np.concatenate([np.asarray(s.data) for s in res.escalation_reason.addressable_shards])
    mine_escalated = int(((why != ap.Reason.NONE) & (why != ap.Reason.VERIFY)).sum())
    print(f"process {jax.process_index()}: {per} fits on {jax.local_device_count()} devices, "
          f"{mine_escalated} escalated", flush=True)

    # gather the per-fit results (collective: every process calls it)
    x = np.asarray(multihost_utils.process_allgather(res.x, tiled=True))
    status = np.asarray(multihost_utils.process_allgather(res.status, tiled=True))
    counts, escalated = res.status_counts(), res.num_escalated   # these gather too
    if jax.process_index() == 0:
        one = ap.solve_nlsq_batch(gauss2d, x0, ydata=data, **kw)   # one process, one device
        same = np.array_equal(x, np.asarray(one.x)) and np.array_equal(
            status, np.asarray(one.status))
        print(f"{fits} fits on {jax.process_count()} processes x "
              f"{jax.local_device_count()} devices in {elapsed:.1f} s (with compilation); "
              f"status counts {counts}; {escalated} escalated; equal to the "
              f"one-process solve: {same}")
        if not same:
            raise SystemExit(1)


if __name__ == "__main__":
    ap_ = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap_.add_argument("--processes", type=int, default=2)
    ap_.add_argument("--devices-per-process", type=int, default=2)
    ap_.add_argument("--fits", type=int, default=1024)
    ap_.add_argument("--worker", action="store_true",
                     help="run as one process of a job (SLURM: under srun)")
    a = ap_.parse_args()
    if a.worker:
        worker(a.fits)
    else:
        sys.exit(launch(a.processes, a.devices_per_process, a.fits))
