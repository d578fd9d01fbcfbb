"""Griffe extension for the API reference: adaptprec's docstrings as mkdocstrings reads them.

* adaptprec's docstrings head their doctests ``Example:`` (or ``Example (x64 on):``);
  Google-style parsing only turns ``Examples:`` into code, so the doctests would otherwise
  render as plain text. The heading is rewritten (a parenthetical remark is kept as the
  section's first line).
* Sphinx roles (``:func:`~adaptprec.adaptive```) become inline code (``adaptive``), the
  ``~`` keeping only the last component as Sphinx does.

The docstrings in the source are unchanged.
"""

from __future__ import annotations

import re

from griffe import Extension

_HEADING = re.compile(r"^(?P<indent>[ \t]*)Example(?:s)?(?:[ \t]*\((?P<note>[^)]*)\))?:[ \t]*$",
                      re.M)


_ROLE = re.compile(r":(?:py:)?[a-z]+:`(?P<tilde>~?)(?P<target>[^`]+)`")


def _role(m: re.Match) -> str:
    target = m.group("target")
    if m.group("tilde"):
        target = target.rsplit(".", 1)[-1]
    return f"`{target}`"


def _rewrite(text: str) -> str:
    def sub(m: re.Match) -> str:
        indent, note = m.group("indent"), m.group("note")
        head = f"{indent}Examples:"
        return head if not note else f"{head}\n{indent}    {note[0].upper()}{note[1:]}:\n"

    return _ROLE.sub(_role, _HEADING.sub(sub, text))


class ExampleSections(Extension):
    """Rewrite ``Example:`` headings before the docstrings are parsed."""

    def on_object(self, *, obj, **kwargs) -> None:  # noqa: ARG002 (griffe signature)
        if obj.docstring is not None:
            obj.docstring.value = _rewrite(obj.docstring.value)
