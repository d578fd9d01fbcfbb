"""mkdocs hook: fill docs/api.md with one mkdocstrings entry per public name.

The list comes from ``adaptprec.__all__`` (read with ``ast``, so building the site does
not import JAX), grouped by the sections below; a public name in no section lands in
"More", so the reference can never miss a name.
"""

from __future__ import annotations

import ast
import pathlib

MARKER = "<!-- api-reference -->"
ROOT = pathlib.Path(__file__).resolve().parents[1]

SECTIONS = {
    "Precisions and ladders": [
        "Ladder", "ALIASES", "FLOATING_DTYPES", "DTypeLike", "canonical_dtype", "dtype_name",
        "half_dtype", "max_value", "smallest_normal", "unit_roundoff", "require_x64",
        "x64_enabled"],
    "Policies and loss scaling (jmp-compatible)": [
        "Policy", "SemanticDType", "DTypeish", "cast_floating", "current_policy", "policy",
        "DynamicLossScale", "StaticLossScale", "NoOpLossScale", "all_finite",
        "select_tree"],
    "Status and reasons": ["Status", "Reason", "status_message", "reason_name"],
    "Adaptive execution": [
        "adaptive", "MixedPrecisionManager", "Report", "GuardResult", "guards", "monitor",
        "schedule", "PrecisionSchedule", "iterate"],
    "Linear algebra": ["linalg"],
    "Nonlinear least squares": ["solve_nlsq", "curve_fit", "NLSQResult", "nlsq"],
    "Batched fits": ["solve_nlsq_batch", "BatchResult"],
    "Fit reports, global fits, errors in x": [
        "fit", "FitResult", "profile_intervals", "ProfileIntervals", "fit_band", "Band",
        "summarize_batch", "BatchSummary", "fit_global", "GlobalFitResult", "fit_odr",
        "ODRResult"],
    "Autocast": [
        "autocast", "explain", "Explanation", "PrecisionPolicy", "Rule", "OpKind",
        "classify", "PRIMITIVE_KINDS", "PRESETS", "ALWAYS_F32", "ALWAYS_F16", "ALWAYS_BF16",
        "AUTO_MIXED_CONSERVATIVE", "AUTO_MIXED", "AUTO_MIXED_BF16"],
    "Profiling and plots": [
        "profile", "Profile", "ProfileRow", "plot_fit", "plot_batch", "FitTrace"],
}
MODULES = {"guards", "schedule", "linalg", "nlsq"}


def _all(tree: ast.Module, where: str) -> list[str]:
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            return [ast.literal_eval(e) for e in node.value.elts]
    raise RuntimeError(f"{where} has no __all__")


def public_names() -> list[str]:
    return _all(ast.parse((ROOT / "adaptprec" / "__init__.py").read_text()),
                "adaptprec/__init__.py")


def module_members(name: str) -> list[str]:
    """Import paths of the public names of ``adaptprec.<name>``, where they are defined.

    A package re-exports names from its modules (``from .solve import solve``); the
    entry must name the definition (``adaptprec.linalg.solve.solve``), since the bare
    path would be the submodule of the same name.
    """
    pkg = ROOT / "adaptprec" / name
    path = pkg / "__init__.py" if pkg.is_dir() else pkg.with_suffix(".py")
    tree = ast.parse(path.read_text())
    where = {}
    if pkg.is_dir():
        for node in ast.walk(tree):      # also imports inside a lazy __getattr__
            if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module:
                for alias in node.names:
                    where[alias.asname or alias.name] = (
                        f"adaptprec.{name}.{node.module}.{alias.name}")
    return [where.get(n, f"adaptprec.{name}.{n}") for n in _all(tree, str(path))]


def reference() -> str:
    names = public_names()
    known = set(names)
    out = []
    placed = set()
    groups = list(SECTIONS.items())
    rest = [n for n in names if not any(n in g for _, g in groups)]
    if rest:
        groups.append(("More", rest))
    for title, group in groups:
        entries = [n for n in group if n in known]
        if not entries:
            continue
        out.append(f"## {title}\n")
        for n in entries:
            placed.add(n)
            if n not in MODULES:
                out.append(f"::: adaptprec.{n}\n")
                continue
            out.append(f"::: adaptprec.{n}\n    options:\n      members: false\n")
            for member in module_members(n):
                out.append(f"::: {member}\n    options:\n      heading_level: 4\n")
    missing = known - placed
    assert not missing, missing
    return "\n".join(out)


def on_page_markdown(markdown, page, config, files):  # noqa: ARG001 (mkdocs signature)
    if page.file.src_uri == "api.md" and MARKER in markdown:
        return markdown.replace(MARKER, reference())
    return markdown
