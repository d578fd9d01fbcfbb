"""Command line: ``python -m adaptprec demo [SECTION ...]`` and
``python -m adaptprec profile MODULE:FUNCTION [--configs ...] [--plot PATH]``.

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


_PROFILE_HELP = """\
Profile a function across precision configurations (time, compile time, memory,
accuracy against float64). MODULE is an importable module name or a path to a .py
file; FUNCTION takes no arguments and returns (fn, args): the function to profile and
a tuple of its arguments. Configs: dtypes (f32, bf16), ladders (bf16,f32,f64), autocast
policies (auto_mixed_bf16) and adaptive settings (bf16,f32,f64;rtol=1e-3)."""


def _load(target: str):
    import importlib.util
    import os

    mod_name, sep, fn_name = target.rpartition(":")
    if not sep or not mod_name or not fn_name:
        raise ValueError(f"expected MODULE:FUNCTION (e.g. mykernels:setup or "
                         f"path/to/file.py:setup), got {target!r}")
    if mod_name.endswith(".py") or os.sep in mod_name:
        if not os.path.isfile(mod_name):
            raise ValueError(f"no such file: {mod_name!r}")
        spec = importlib.util.spec_from_file_location(
            os.path.splitext(os.path.basename(mod_name))[0], mod_name)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    else:
        if os.getcwd() not in sys.path:
            sys.path.insert(0, os.getcwd())
        module = importlib.import_module(mod_name)
    try:
        setup = getattr(module, fn_name)
    except AttributeError:
        raise ValueError(f"module {mod_name!r} has no function {fn_name!r}") from None
    got = setup()
    if not (isinstance(got, tuple) and len(got) == 2 and callable(got[0])):
        raise ValueError(f"{target} must return (fn, args), a callable and a tuple of its "
                         f"arguments; it returned {type(got).__name__}")
    fn, args = got
    return fn, (args if isinstance(args, tuple) else (args,))


def _require_matplotlib() -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise ImportError("--plot needs matplotlib, which is not installed: "
                          "pip install 'adaptprec[plot]' (or drop --plot)") from None


def profile(target: str, configs: list[str], plot: str | None, repeats: int,
            json_path: str | None) -> int:
    from ._profile import profile as run_profile

    try:
        if plot:
            # before minutes of profiling, and as one error line, not a traceback after
            # the table
            _require_matplotlib()
        fn, args = _load(target)
        # the table and plot name the profiled kernel, and where it came from (not the
        # setup function alone)
        kernel = getattr(fn, "__name__", None) or type(fn).__name__
        prof = run_profile(fn, *args, configs=configs, repeats=repeats,
                           name=f"{kernel} (from {target})")
    except (ValueError, TypeError, ImportError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(prof)
    if json_path:
        import json

        with open(json_path, "w") as fh:
            json.dump(prof.to_dict(), fh, indent=2, default=float)
        print(f"wrote {json_path}")
    if plot:
        try:
            prof.plot().savefig(plot, dpi=120)
        except (ImportError, OSError) as exc:   # a matplotlib part missing, a bad path
            print(f"error: {exc}", file=sys.stderr)
            return 2
        print(f"wrote {plot}")
    return 0


_CACHE_HELP = """\
adaptprec keeps the programs it compiles (the fits' trust-region step, each residual's
evaluation, ...) in an on-disk cache, so that the first call in a later process loads
them in milliseconds instead of compiling (0.2-1 s). 'info' prints where the cache is
and what it holds; 'clear' deletes its entries (nothing else in the directory). Its place:
$ADAPTPREC_CACHE_DIR, else $XDG_CACHE_HOME/adaptprec, else ~/.cache/adaptprec;
ADAPTPREC_CACHE_DIR=off turns it off; ADAPTPREC_CACHE_MAX_MB caps its size. Cached
programs run code when loaded, so the cache uses only a directory that is yours and
writable by you alone, and loads only entries signed with your key
($ADAPTPREC_CACHE_KEY_FILE, else ~/.local/share/adaptprec/cache-key)."""


def cache(action: str) -> int:
    """``python -m adaptprec cache [info|clear]``."""
    from . import _disk_cache

    info = _disk_cache.disk_info()
    if info["directory"] is None:
        print("the program cache is off (ADAPTPREC_CACHE_DIR=off)")
        return 0
    if info["refused"] is not None:
        print(f"directory: {info['directory']}")
        print(f"not used:  {info['refused']}; nothing is read from it or written to it "
              "(cached programs run code when loaded)")
        print(f"to fix it: {info['fix']}")
        return 0
    if action == "clear":
        n = _disk_cache.clear_disk()
        print(f"deleted {n} cached programs from {info['directory']}")
        return 0
    print(f"directory: {info['directory']}")
    print(f"entries:   {info['entries']}")
    print(f"size:      {info['bytes'] / 2**20:.1f} MB of at most "
          f"{info['max_bytes'] / 2**20:.0f} MB (ADAPTPREC_CACHE_MAX_MB)")
    print("clear it with: python -m adaptprec cache clear; "
          "turn it off with ADAPTPREC_CACHE_DIR=off")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m adaptprec")
    sub = parser.add_subparsers(dest="command", required=True)
    p_demo = sub.add_parser("demo", help="tour of adaptprec's capabilities (< 1 min)")
    p_demo.add_argument("sections", nargs="*", help="only these sections (module names)")
    p_prof = sub.add_parser("profile", help="time, memory and accuracy of your function "
                            "per precision configuration", description=_PROFILE_HELP)
    p_prof.add_argument("target", metavar="MODULE:FUNCTION",
                        help="FUNCTION() returns (fn, args)")
    p_prof.add_argument("--configs", nargs="+", default=None,
                        help="configurations (default: bf16 f32 f64 bf16,f32,f64 "
                        "auto_mixed_bf16)")
    p_prof.add_argument("--plot", metavar="PATH", help="write the time-vs-digits chart "
                        "here (needs matplotlib)")
    p_prof.add_argument("--json", metavar="PATH", help="write Profile.to_dict() as JSON")
    p_prof.add_argument("--repeats", type=int, default=5, help="timed repeats (median)")
    p_cache = sub.add_parser("cache", help="where the compiled-program cache lives, its "
                             "size; clear it", description=_CACHE_HELP)
    p_cache.add_argument("action", nargs="?", choices=("info", "clear"), default="info")
    args = parser.parse_args(argv)
    if args.command == "cache":   # no float64 switch, no JAX work: only files
        return cache(args.action)
    # The CLI is an application, not the library: it may turn float64 on for its own
    # process (the demo's top rungs are float64). The library never does this.
    import jax

    jax.config.update("jax_enable_x64", True)
    if args.command == "demo":
        return demo(args.sections or None)
    if args.command == "profile":
        return profile(args.target, args.configs, args.plot, args.repeats, args.json)
    return 2


if __name__ == "__main__":
    sys.exit(main())
