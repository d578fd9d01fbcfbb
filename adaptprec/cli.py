"""Command line: ``python -m adaptprec demo``.

Each capability contributes one demo section: a module in ``adaptprec/_demos`` with an
integer ``ORDER``, a ``TITLE`` and a ``run()`` that prints. Sections are discovered, so a
new capability adds a file without touching this one.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys
import time


def _sections():
    from . import _demos

    mods = [importlib.import_module(f"{_demos.__name__}.{m.name}")
            for m in pkgutil.iter_modules(_demos.__path__) if not m.name.startswith("_")]
    return sorted(mods, key=lambda m: (m.ORDER, m.__name__))


def demo(only: list[str] | None = None) -> int:
    import jax

    # The demo is an application, so it may choose float64; the library never does.
    jax.config.update("jax_enable_x64", True)
    start = time.perf_counter()
    for mod in _sections():
        name = mod.__name__.rsplit(".", 1)[-1]
        if only and name not in only:
            continue
        print(f"\n== {mod.TITLE} ==")
        t0 = time.perf_counter()
        mod.run()
        print(f"   ({time.perf_counter() - t0:.1f} s)")
    print(f"\ndemo finished in {time.perf_counter() - start:.1f} s")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m adaptprec")
    sub = parser.add_subparsers(dest="command", required=True)
    p_demo = sub.add_parser("demo", help="tour of adaptprec's capabilities (< 1 min)")
    p_demo.add_argument("sections", nargs="*", help="only these sections (module names)")
    args = parser.parse_args(argv)
    if args.command == "demo":
        return demo(args.sections or None)
    return 2


if __name__ == "__main__":
    sys.exit(main())
