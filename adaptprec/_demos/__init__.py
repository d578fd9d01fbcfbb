"""Demo sections for ``python -m adaptprec demo`` (one module per capability)."""
