"""Command line: ``python -m adaptprec demo [SECTION ...]``.

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
    sections = _sections()
    names = [mod.__name__.rsplit(".", 1)[-1] for mod in sections]
    unknown = sorted(set(only or ()) - set(names))
    if unknown:
        print(f"error: unknown demo section(s) {', '.join(unknown)}; the sections are: "
              f"{', '.join(names)}", file=sys.stderr)
        return 2
    start = time.perf_counter()
    for name, mod in zip(names, sections):
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
    # The CLI is an application, not the library: it may turn float64 on for its own
    # process (the demo's top rungs are float64). The library never does this.
    import jax

    jax.config.update("jax_enable_x64", True)
    if args.command == "demo":
        return demo(args.sections or None)
    return 2


if __name__ == "__main__":
    sys.exit(main())
