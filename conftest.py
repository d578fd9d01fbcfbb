"""Test-session configuration: the tests use float64 rungs, so they turn x64 on.

The library itself never flips this flag; tests of the x64-off error run in a subprocess.
"""

import atexit
import os
import shutil
import tempfile

import jax
import pytest

jax.config.update("jax_enable_x64", True)

# adaptprec's on-disk program cache (adaptprec/_disk_cache.py): a fresh directory for this
# session (inherited by subprocesses), never the user's
_CACHE = tempfile.mkdtemp(prefix="adaptprec-test-cache-")
os.environ["ADAPTPREC_CACHE_DIR"] = _CACHE
atexit.register(shutil.rmtree, _CACHE, True)
# and its secret key (adaptprec/_cache_trust.py): never the user's
_KEY_DIR = tempfile.mkdtemp(prefix="adaptprec-test-key-")
os.environ["ADAPTPREC_CACHE_KEY_FILE"] = os.path.join(_KEY_DIR, "cache-key")
atexit.register(shutil.rmtree, _KEY_DIR, True)


collect_ignore_glob = ["adaptprec/__main__.py"]

# Doctests in the slow set (CI's `pytest -m slow`) beyond the internal helpers' examples
# (`_is_public` below): public examples that compile a whole solver (seconds each); each
# helper's behaviour is tested in the default run through its entry point.
_SLOW_DOCTESTS = {
    "adaptprec.batch.compaction.run_compacted",
    "adaptprec.batch.compaction.run_streaming",
    "adaptprec.batch.escalation.escalation_reasons",
    "adaptprec.batch.escalation.solve_ladder",
    "adaptprec.batch.implicit.implicit_solution",
    "adaptprec.batch.lm_batched.lm_init",
    "adaptprec.batch.lm_batched.lm_run",
    "adaptprec.batch.lm_batched.lm_step",
    "adaptprec.batch.verify.verify_handoff",
    "adaptprec.linalg._blocked_lu.blocked_lu",
    "adaptprec.nlsq._lsmr.solve_trust_region_2d",
    "adaptprec.nlsq._multistart",
    "adaptprec.nlsq.dogbox",
    "adaptprec.nlsq.trf.trf_lsmr_step",
    "adaptprec._plot.plot_fit_result",
    # public examples that compile a whole solver or several plans (CI runs them in the
    # slow set; each entry point keeps a cheaper example or test in the default run)
    "adaptprec._accuracy.spot_check",
    "adaptprec._basic_guards.matrix_condition",
    "adaptprec._plot.plot_batch",
    "adaptprec._plot.plot_fit",
    "adaptprec.analysis.batch_summary",
    "adaptprec.linalg.solve.solve",
    "adaptprec.batch.api.solve_nlsq_batch",
    "adaptprec.linalg",
    # module examples of the solvers' building blocks, each compiling a solve of its own
    # shapes (4-11 s each, ~65 s of compilation together); the default run tests each
    # through its entry point (tests/test_nlsq_core.py for MoreLM and the TrustRegion
    # steps, test_krylov*.py for the preconditioners and KrylovInfo, test_nlsq_stream.py,
    # test_compaction.py, test_fit_odr.py, test_fit_report.py's profile intervals)
    "adaptprec.nlsq.optx_solver",
    "adaptprec.nlsq.solver",
    "adaptprec.nlsq.trf",
    "adaptprec.nlsq.lm",
    "adaptprec.nlsq.gn",
    "adaptprec.nlsq.common",
    "adaptprec.nlsq._stream.Chunks",
    "adaptprec.linalg.krylov.preconditioners",
    "adaptprec.linalg.krylov.info",
    "adaptprec.batch.compaction",
    "adaptprec.analysis.odr",
    "adaptprec.analysis.intervals",
}


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    from _pytest.doctest import DoctestItem

    for item in items:
        if isinstance(item, DoctestItem) and (item.name in _SLOW_DOCTESTS
                                              or not _is_public(item.name)):
            item.add_marker(pytest.mark.slow)


def _is_public(name: str) -> bool:
    """A docstring example of the public API: a name ``adaptprec`` exports, or the
    docstring of a module with no private part. The default run keeps these (a user's
    first read); the examples of internal helpers (~130, ~75 s of compiles) run in the
    slow set, which CI runs on every push."""
    import importlib.util

    import adaptprec

    parts = name.split(".")
    try:
        is_module = importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        is_module = False
    if is_module:
        return not any(p.startswith("_") for p in parts[1:])
    if parts[-1] in adaptprec.__all__ or (
            len(parts) > 2 and parts[-2] in adaptprec.__all__):  # a public class's method
        return True
    # a name of the public ``adaptprec.guards`` defined in one of its private modules
    from adaptprec import guards
    return len(parts) > 2 and parts[1] in _GUARD_MODULES and (
        parts[2] in guards.__all__)


#: the private modules whose public names ``adaptprec.guards`` re-exports
_GUARD_MODULES = frozenset({"_guard_base", "_basic_guards", "_accuracy"})
