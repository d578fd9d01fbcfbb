"""Griffe extension for the API reference: a public function that shares its name with
the module defining it is documented as the function, not the module.

``adaptprec.curve_fit`` is the function ``adaptprec.nlsq.curve_fit.curve_fit``, and
``adaptprec.explain`` the function ``adaptprec._autocast.explain.explain``; griffe follows
the import to ``adaptprec.nlsq.curve_fit``, which in its view is the submodule of that
name, so the reference showed the module's docstring and internal helpers
(``covariance_numpy``) before the function (issue 34, bug 4). After the package is loaded,
each top-level alias whose target is a module holding a same-named function or class is
pointed at that function or class. The entries of the public modules
(``adaptprec.nlsq.curve_fit.curve_fit``) already name the definition
(``tools/docs_hooks.py``).
"""

from __future__ import annotations

from griffe import Alias, Extension


def _retarget(pkg) -> list[str]:
    changed = []
    for name, member in list(pkg.members.items()):
        if not isinstance(member, Alias):
            continue
        try:
            target = member.final_target
        except Exception:  # noqa: BLE001 - external or unresolvable: leave it to griffe
            continue
        if not target.is_module:
            continue
        inner = target.members.get(name)
        if inner is None or inner.is_module:
            continue
        pkg.set_member(name, Alias(name, f"{target.path}.{name}", parent=pkg,
                                   lineno=member.alias_lineno,
                                   endlineno=member.alias_endlineno))
        changed.append(name)
    return changed


class ShadowedFunctions(Extension):
    """Point ``pkg.<name>`` at ``<module>.<name>`` when the alias lands on a module."""

    def on_package(self, *, pkg, **kwargs) -> None:  # noqa: ARG002 (griffe signature)
        _retarget(pkg)
