"""``python -m adaptprec demo|profile|bench``."""

from .cli import main

if __name__ == "__main__":
    raise SystemExit(main())
