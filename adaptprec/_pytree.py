"""A minimal immutable pytree dataclass: the subset of ``equinox.Module`` adaptprec uses.

Results, reports, infos and schedule states are frozen dataclasses whose array fields are
pytree leaves and whose ``field(static=True)`` fields are static metadata (part of the
treedef, hashed by ``jit``). Writing this in ~40 lines instead of importing equinox keeps
``import adaptprec`` within 0.2 s of ``import jax`` (equinox alone costs ~0.12 s to import);
equinox stays a dependency for the few runtime helpers that need it (``error_if``).

Example:
    >>> import jax, jax.numpy as jnp
    >>> from adaptprec._pytree import Module, field
    >>> class Point(Module):
    ...     x: jax.Array
    ...     label: str = field(default="p", static=True)
    >>> p = jax.jit(lambda p: Point(p.x * 2, p.label))(Point(jnp.ones(2)))
    >>> p.x.tolist(), p.label, jax.tree.leaves(p)[0].shape
    ([2.0, 2.0], 'p', (2,))
"""

from __future__ import annotations

import abc
import dataclasses

import jax

__all__ = ["Module", "field", "replace"]

_MISSING = dataclasses.MISSING


def field(*, static: bool = False, default=_MISSING, default_factory=_MISSING, **kwargs):
    """A dataclass field; ``static=True`` makes it metadata instead of a pytree leaf."""
    metadata = dict(kwargs.pop("metadata", None) or {}, static=static)
    return dataclasses.field(default=default, default_factory=default_factory,
                             metadata=metadata, **kwargs)


class Module(metaclass=abc.ABCMeta):
    """Base class: subclasses become frozen dataclasses registered as pytrees.

    A subclass may define ``__check_init__(self)`` to validate its fields after
    construction (as in equinox); it runs for every instance, including those rebuilt by
    JAX transformations only when the leaves are not tracers or placeholders.
    """

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        dataclasses.dataclass(frozen=True, repr=True, eq=False)(cls)
        fields = dataclasses.fields(cls)
        data = [f.name for f in fields if not f.metadata.get("static", False)]
        meta = [f.name for f in fields if f.metadata.get("static", False)]
        jax.tree_util.register_dataclass(cls, data_fields=data, meta_fields=meta)

    def __post_init__(self):
        check = getattr(self, "__check_init__", None)
        if check is not None:
            check()


def replace(obj: Module, **changes) -> Module:
    """A copy of ``obj`` with some fields changed (``dataclasses.replace``)."""
    return dataclasses.replace(obj, **changes)
