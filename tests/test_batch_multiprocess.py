"""Batched fits across processes: 2 local processes x 2 CPU devices on jax.distributed.

Every test starts its processes with ``tests/_multiprocess.py: run_processes``
(localhost coordinator, gloo CPU collectives).
"""

import pytest

from _multiprocess import run_processes

pytestmark = pytest.mark.slow


def test_launcher_psum_over_all_processes():
    outs = run_processes("""
        import jax, numpy as np
        from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
        mesh = Mesh(np.array(jax.devices()), ("d",))
        local = np.arange(2.0) + 2 * jax.process_index()
        x = jax.make_array_from_process_local_data(NamedSharding(mesh, P("d")), local, (4,))
        f = jax.jit(jax.shard_map(lambda a: jax.lax.psum(a, "d"), mesh=mesh,
                                  in_specs=P("d"), out_specs=P("d")))
        y = f(x)
        print(jax.process_index(), jax.process_count(), jax.device_count(),
              [float(s.data[0]) for s in y.addressable_shards])
    """, timeout=300)
    assert [o.stdout.strip() for o in outs] == ["0 2 4 [6.0, 6.0]", "1 2 4 [6.0, 6.0]"]


def test_launcher_reports_a_failed_process_without_waiting():
    with pytest.raises(RuntimeError, match="(?s)process 1 \\(exit 1\\).*ZeroDivisionError"):
        run_processes("""
            import jax, time
            if jax.process_index() == 1:
                1 / 0
            time.sleep(120)
        """, timeout=100)
