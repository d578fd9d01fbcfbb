"""The structure of one kernel on one set of input shapes, traced once.

The plan (:func:`adaptprec._plan.choose_plan`, through the runtime) asks of a kernel
whether it is entrywise, row-separable, one convolution or a product of matrices; the sampled checks of the
accuracy guard then need the row inputs or the convolution's parameters again, once per
rung and per compiled program. Each question used to trace the kernel with
``jax.make_jaxpr``: three traces at plan time and one more per sampled check, on the
first call of every kernel. :func:`kernel_structure` traces it once per (kernel, static
arguments, input avals) and answers all of them; the answers are memoized per kernel
(weakly: a kernel that is garbage collected takes its entries along).

Only the answers are kept, not the jaxpr: its constants may be large arrays the kernel
closes over.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import NamedTuple

import jax

from ._autocast.interpret import _is_dynamic
from ._convsample import ConvKernel, conv_kernel_jaxpr
from ._sampled import entrywise_jaxpr
from ._probe import product_jaxpr
from ._rowwise import row_inputs_jaxpr
from ._user_fn import returns_arrays

__all__ = ["Structure", "kernel_structure", "structure_of_inputs"]

#: entries kept per kernel (input shapes x static arguments); the oldest is dropped
_PER_KERNEL = 32


class Structure(NamedTuple):
    """What one trace of a kernel says. ``rows``: the row-input mask over the dynamic
    leaves (:func:`adaptprec._rowwise.row_inputs`) or ``None``; ``conv``: the
    convolution it is (:func:`adaptprec._convsample.conv_kernel`) or ``None``;
    ``product``: a product expression of its inputs (:func:`adaptprec._probe.product_jaxpr`);
    ``error``: the exception tracing raised (then nothing is row-separable or a
    convolution, and :attr:`entrywise` re-raises it, as the entrywise test always did;
    such a result is not memoized)."""

    entrywise_: bool
    rows: tuple | None
    conv: ConvKernel | None
    product: bool = False
    error: BaseException | None = None

    @property
    def entrywise(self) -> bool:
        if self.error is not None:
            raise self.error
        return self.entrywise_


def _analyse(flat: Callable, avals) -> Structure:
    try:
        closed = jax.make_jaxpr(flat)(*avals)
    except Exception as e:      # noqa: BLE001 -- not analysable: none of the three
        return Structure(False, None, None, False, e)
    return Structure(entrywise_jaxpr(closed, avals),
                     row_inputs_jaxpr(closed, flat, avals),
                     conv_kernel_jaxpr(closed), product_jaxpr(closed))


_memo: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def kernel_structure(fn: Callable, treedef, leaves: list, dyn_pos: tuple,
                     avals: tuple) -> Structure:
    """The structure of ``fn(*args, **kwargs)`` where ``(args, kwargs)`` is
    ``treedef`` unflattened from ``leaves`` with the dynamic leaves (positions
    ``dyn_pos``) replaced by arrays of ``avals`` (ShapeDtypeStructs); the other leaves
    are static. Traced once per (``fn``, ``treedef``, static leaves, ``avals``, x64,
    backend); a kernel that cannot be weakly referenced, or static leaves that cannot be
    hashed, are traced every time."""
    leaves = list(leaves)

    def flat(*d):
        full = list(leaves)
        for i, x in zip(dyn_pos, d):
            full[i] = x
        a, kw = jax.tree_util.tree_unflatten(treedef, full)
        return jax.tree_util.tree_leaves(returns_arrays(fn, fn(*a, **kw),
                                                        "adaptive kernel"))

    pos = set(dyn_pos)
    key = (treedef, tuple(dyn_pos),
           tuple((i, type(x), x) for i, x in enumerate(leaves) if i not in pos),
           tuple((tuple(a.shape), str(a.dtype)) for a in avals),
           bool(jax.config.jax_enable_x64), jax.default_backend())
    try:
        entries = _memo.get(fn)
        if entries is not None and key in entries:
            return entries[key]
        hash(key)
    except (TypeError, ValueError):  # unhashable static leaf, fn not weakly referable
        return _analyse(flat, avals)
    found = _analyse(flat, avals)
    if found.error is not None:     # not kept: its traceback holds the failed trace
        return found
    if entries is None:
        entries = _memo.setdefault(fn, {})
    if len(entries) >= _PER_KERNEL:
        del entries[next(iter(entries))]
    entries[key] = found
    return found


def structure_of_inputs(fn: Callable, inputs) -> Structure:
    """:func:`kernel_structure` of ``fn`` on the user's ``inputs`` (``(args, kwargs)``;
    the arrays among their leaves, concrete or traced, are the dynamic ones): what the
    accuracy guard's sampled checks look up."""
    leaves, treedef = jax.tree_util.tree_flatten(inputs)
    pos = tuple(i for i, x in enumerate(leaves) if _is_dynamic(x))
    avals = tuple(jax.ShapeDtypeStruct(leaves[i].shape, leaves[i].dtype) for i in pos)
    return kernel_structure(fn, treedef, leaves, pos, avals)
