"""Run scipy's own least_squares / curve_fit tests (models in jax.numpy) against adaptprec
and report the pass rate over the applicable items (issue 20's measure).

An item is *not applicable* when it exercises an option adaptprec does not offer (listed
below with the option); every other item counts. Items that mix an offered and a
not-offered option (the rosenbrock loops over ``tr_solver in ('exact', 'lsmr')``) are
reported separately, so both readings are visible.

Usage (from the repository root): ``python benchmarks/scipy_suite/run.py [-k EXPR]``.
Takes several minutes (every test compiles its own solver).
"""

import os
import re
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))

#: test-name pattern -> the option not offered that the item exercises
NOT_APPLICABLE = {
    r"::test_workers$": "workers",
}
#: items that loop over an offered and a not-offered option
MIXED: dict = {}  # none since tr_solver="lsmr" is offered (the rosenbrock loops)


class Collect:
    def __init__(self):
        self.outcomes = {}

    def pytest_runtest_logreport(self, report):
        if report.when == "call" or (report.when == "setup" and report.outcome != "passed"):
            self.outcomes[report.nodeid] = report.outcome


def _match(table, nodeid):
    return next((v for k, v in table.items() if re.search(k, nodeid)), None)


def main(argv):
    col = Collect()
    args = ["-q", "-p", "no:cacheprovider", "--rootdir", HERE, "-c", os.devnull,
            "--tb=no", "-W", "ignore", HERE, *argv]
    pytest.main(args, plugins=[col])
    na = {k: v for k, v in col.outcomes.items() if _match(NOT_APPLICABLE, k)}
    mixed = {k: v for k, v in col.outcomes.items() if _match(MIXED, k)}
    core = {k: v for k, v in col.outcomes.items() if k not in na and k not in mixed}
    passed = sum(v == "passed" for v in core.values())
    mixed_passed = sum(v == "passed" for v in mixed.values())
    print("\n== scipy's tests against adaptprec (models in jax.numpy) ==")
    print(f"items run: {len(col.outcomes)}; not applicable (option not offered): {len(na)}; "
          f"mixed offered/not offered: {len(mixed)}")
    print(f"applicable items passing: {passed}/{len(core)} = "
          f"{100.0 * passed / max(len(core), 1):.1f}%")
    tot = len(core) + len(mixed)
    print(f"counting the mixed items as applicable: {passed + mixed_passed}/{tot} = "
          f"{100.0 * (passed + mixed_passed) / max(tot, 1):.1f}%")
    print("failing applicable items:")
    for k, v in sorted(core.items()):
        if v != "passed":
            print(f"  {v}: {k}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
