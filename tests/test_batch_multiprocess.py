"""Batched fits across processes: 2 local processes x 2 CPU devices on jax.distributed.

Every test starts its processes with ``tests/_multiprocess.py: run_processes``
(localhost coordinator, gloo CPU collectives).
"""

import os

import numpy as np
import pytest

import adaptprec as ap
from _multiprocess import run_processes
from adaptprec._demos.batch import gauss2d

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
        # the HLO counter used below sees this program's collective
        from adaptprec.batch.sharding import collective_counts
        print(collective_counts(f.lower(x).compile().as_text())["all-reduce"])
    """, timeout=300)
    assert [o.stdout.split("\n")[0] for o in outs] == ["0 2 4 [6.0, 6.0]", "1 2 4 [6.0, 6.0]"]
    assert all(int(o.stdout.split()[-1]) >= 1 for o in outs)


def test_launcher_reports_a_failed_process_without_waiting():
    with pytest.raises(RuntimeError, match="(?s)process 1 \\(exit 1\\).*ZeroDivisionError"):
        run_processes("""
            import jax, time
            if jax.process_index() == 1:
                1 / 0
            time.sleep(120)
        """, timeout=100)


# ---- solve_nlsq_batch on global arrays: 2 processes x 2 devices vs one process ----------

B = 16          # 8 fits per process, 4 per device
# process 0 holds rows 0..7, process 1 rows 8..15: only process 0's fits leave float32
ESCALATES = 2   # float32 overflows, a guard sends the fit to float64
NAN_FIT = 5     # non-finite data: status -3 for that fit only (a guard fires too)
FIELDS = ("x", "cost", "status", "success", "rung", "nfev", "njev", "nit", "optimality",
          "escalation_reason")


def _problem():
    from adaptprec._demos.batch import make_problem
    xy, data, truth, x0 = make_problem(B, seed=2)
    data[ESCALATES] *= 1e20
    x0[ESCALATES, [0, 4]] *= 1e20
    data[NAN_FIT, 3] = np.nan
    return xy, data, x0


SOLVE = r"""
import glob, os, re
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
from jax.experimental import multihost_utils
import adaptprec as ap
from adaptprec._demos.batch import gauss2d
from adaptprec.batch.sharding import collective_counts, local_rows
from test_batch_multiprocess import B, FIELDS, _problem

xy, data, x0 = _problem()
mesh = Mesh(np.array(jax.devices()), ("fits",))
sh = NamedSharding(mesh, P("fits"))
pid, nproc = jax.process_index(), jax.process_count()
mine = slice(pid * B // nproc, (pid + 1) * B // nproc)   # this process's rows
gx0 = jax.make_array_from_process_local_data(sh, x0[mine], x0.shape)
gy = jax.make_array_from_process_local_data(sh, data[mine], data.shape)
res = ap.solve_nlsq_batch(gauss2d, gx0, args=(xy,), in_axes=None, ydata=gy)
jax.block_until_ready(res)
# chunks of 12 fits = 3 per device, cut from each device's 4 rows: [0, 3) and [1, 4)
seen = []
chunked = ap.solve_nlsq_batch(gauss2d, gx0, args=(xy,), in_axes=None, ydata=gy,
                              chunk_size=12, progress=lambda d, t: seen.append((d, t)))
jax.block_until_ready(chunked)
print("PROGRESS", seen)

# everything compiled so far (inputs, the sharded solve, its eager glue, the chunk
# slicing and joining) has no collective
counts = {}
dumped = glob.glob(os.path.join(os.environ["DUMP"], "*after_optimizations.txt"))
for path in dumped:
    for k, v in collective_counts(open(path).read()).items():
        counts[k] = counts.get(k, 0) + v
solves = sum("jit_solve" in os.path.basename(p) for p in dumped)
print("COLLECTIVES", solves, sum(counts.values()), counts)

# results keep the inputs' sharding; each process holds only its rows
for f in FIELDS:
    a = getattr(res, f)
    assert a.sharding.is_equivalent_to(sh, a.ndim), (f, a.sharding)
    assert not a.is_fully_addressable
for f in FIELDS:
    a, b = getattr(res, f), getattr(chunked, f)
    assert b.sharding.is_equivalent_to(sh, b.ndim), (f, b.sharding)
    np.testing.assert_array_equal(local_rows(a)[1], local_rows(b)[1], err_msg=f)
rows, why = local_rows(res.escalation_reason)
assert rows.tolist() == list(range(B))[mine]
local = int(((why != ap.Reason.NONE) & (why != ap.Reason.VERIFY)).sum())
print("LOCAL_ESCALATED", pid, local)
print("SUMMARY", res.num_escalated, sorted(res.status_counts().items()))

gathered = {f: np.asarray(multihost_utils.process_allgather(getattr(res, f), tiled=True))
            for f in FIELDS}
if pid == 0:
    np.savez(os.environ["OUT"], **gathered)
"""


@pytest.fixture(scope="module")
def multiprocess_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("mp")
    dump = tmp / "hlo" / "{process_id}"       # one dump directory per process
    outs = run_processes(SOLVE, timeout=900, cwd=os.path.dirname(os.path.dirname(__file__)),
                         env={"OUT": str(tmp / "res.npz"), "DUMP": str(dump),
                              "PYTHONPATH": os.path.dirname(__file__),
                              "XLA_FLAGS": f"--xla_dump_to={dump} --xla_dump_hlo_as_text"})
    return outs, dict(np.load(tmp / "res.npz"))


def _lines(outs, tag):
    return [line.split()[1:] for o in outs for line in o.stdout.splitlines()
            if line.startswith(tag)]


def test_two_processes_equal_one_process_field_by_field(multiprocess_run):
    outs, gathered = multiprocess_run
    xy, data, x0 = _problem()
    one = ap.solve_nlsq_batch(gauss2d, x0, args=(xy,), in_axes=None, ydata=data)
    for f in FIELDS:
        np.testing.assert_array_equal(gathered[f], np.asarray(getattr(one, f)), err_msg=f)
    # the cases the test is about happened: one fit escalated (process 0), one NaN fit
    assert int(one.status[NAN_FIT]) == -3
    assert int(one.escalation_reason[ESCALATES]) not in (ap.Reason.NONE, ap.Reason.VERIFY)
    # the summaries gather across processes and agree with the one-process result
    summaries = _lines(outs, "SUMMARY")
    assert len(summaries) == 2 and summaries[0] == summaries[1]
    assert int(summaries[0][0]) == one.num_escalated == 2


def test_chunks_are_cut_from_each_devices_rows(multiprocess_run):
    # chunked == unchunked field by field (asserted in the processes); progress counts
    # the fits of all devices
    outs, _ = multiprocess_run
    assert [o.stdout.count("PROGRESS [(0, 16), (12, 16), (16, 16)]") for o in outs] == [1, 1]


def test_fits_escalate_on_one_process_only(multiprocess_run):
    outs, _ = multiprocess_run
    assert sorted(_lines(outs, "LOCAL_ESCALATED")) == [["0", "2"], ["1", "0"]]


def test_sharded_solve_compiles_no_collective(multiprocess_run):
    outs, _ = multiprocess_run
    lines = _lines(outs, "COLLECTIVES")
    assert len(lines) == 2
    for solves, total, *_ in lines:
        assert int(solves) >= 1        # the solver's program was dumped: the check can fail
        assert int(total) == 0, outs[0].stdout


def test_bad_input_on_one_process_stops_every_process():
    # checked before anything compiles: fit 9 (process 1) is infeasible / has a NaN
    outs = run_processes(r"""
        import jax, numpy as np
        from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
        import adaptprec as ap
        mesh = Mesh(np.array(jax.devices()), ("fits",))
        sh = NamedSharding(mesh, P("fits"))
        mine = slice(8 * jax.process_index(), 8 * jax.process_index() + 8)
        x0 = np.ones((16, 2)); x0[9, 1] = 5.0
        y = np.ones((16, 3)); y[9, 2] = np.nan
        g = lambda a: jax.make_array_from_process_local_data(sh, a[mine])
        model = lambda p, t: p[0] + p[1] * t
        for kw in (dict(bounds=(0.0, 2.0)), dict(nan_policy="raise")):
            try:
                ap.solve_nlsq_batch(model, g(x0), args=(np.arange(3.0),), in_axes=None,
                                    ydata=g(y), **kw)
            except ValueError as e:
                print("RAISED", jax.process_index(), str(e).replace(" ", "_")[:60])
        # not sharded over the fits axis: a clear error, no hang
        rep = jax.make_array_from_process_local_data(NamedSharding(mesh, P()), x0, x0.shape)
        try:
            ap.solve_nlsq_batch(model, rep, args=(np.arange(3.0),), in_axes=None,
                                ydata=g(y))
        except ValueError as e:
            print("REFUSED", jax.process_index(), str(e).replace(" ", "_")[:40])
    """, timeout=300)
    lines = sorted(_lines(outs, "RAISED"))
    assert [pid for pid, _ in lines] == ["0", "0", "1", "1"], lines
    assert "invalid_input_on_process(es)_[1]" in lines[0][1] + lines[1][1]
    assert any("fit_9" in msg for pid, msg in lines if pid == "1"), lines
    assert any("1_fit(s)_have_non-finite" in msg for pid, msg in lines if pid == "1"), lines
    refused = sorted(_lines(outs, "REFUSED"))
    assert refused == [[pid, "the_inputs_span_processes_but_x0_is_not_"] for pid in "01"]


def test_x64_off_returns_float64_global_arrays():
    # with jax_enable_x64 off the float64 rung runs in an x64 scope; the result cannot go
    # to host NumPy (no process holds it all), so it stays a global float64 jax.Array
    outs = run_processes(r"""
        import jax, numpy as np
        from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
        from jax.experimental import multihost_utils
        import adaptprec as ap
        assert not ap.x64_enabled()
        mesh = Mesh(np.array(jax.devices()), ("fits",))
        sh = NamedSharding(mesh, P("fits"))
        mine = slice(4 * jax.process_index(), 4 * jax.process_index() + 4)
        t = np.arange(3.0)
        x0 = np.ones((8, 2)); y = 1.0 + np.arange(8.0)[:, None] * t
        g = lambda a: jax.make_array_from_process_local_data(sh, a[mine])
        r = ap.solve_nlsq_batch(lambda p, t: p[0] + p[1] * t, g(x0), args=(t,),
                                in_axes=None, ydata=g(y), compaction=None)
        assert r.x.dtype == np.float64 and r.x.sharding.is_equivalent_to(sh, 2)
        x = np.asarray(multihost_utils.process_allgather(r.x, tiled=True))
        print("MAXERR", np.abs(x - np.stack([np.ones(8), np.arange(8.0)], 1)).max())
    """, x64=False, timeout=300)
    errs = [float(e[0]) for e in _lines(outs, "MAXERR")]
    assert len(errs) == 2 and max(errs) < 1e-10, errs
