"""Convolution kernels and their sampled-outputs check (checks cheaper than the
work they verify).

A kernel that is one convolution (``lax.conv_general_dilated``, any layout, strides,
padding and kernel dilation; no feature/batch groups, no input dilation), with at most
floating casts around it, has outputs that each depend on one window of the input. Then
``k`` output positions (all their channels) can be re-evaluated in the widest dtype from
the user's inputs, each a convolution of one window: ``k / positions`` of the work and no
pass over the whole input. On float64 data a float32 rung already pays ~0.25 of float64
for its casts, so the first-order bound's passes over the input and the output (~0.1)
decided whether the rung paid at all; the sample costs ~1%.

The structure is decided on the jaxpr (not on sample data). The check is statistical, like
the sampled entries of entrywise kernels: a bad output position between the samples is
missed, and the report says "sampled".
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ._reductions import materialized
from ._sampled import error_of_samples

__all__ = ["ConvKernel", "conv_kernel", "conv_kernel_jaxpr", "sampled_conv_error", "POSITIONS"]

#: output positions re-evaluated by the check (each with all its channels)
POSITIONS = 256


class ConvKernel(NamedTuple):
    """``lhs``/``rhs``: indices of the dynamic inputs feeding the convolution;
    ``params``: the convolution's parameters (as in the jaxpr)."""

    lhs: int
    rhs: int
    params: dict


def _float_cast(eqn) -> bool:
    if eqn.primitive.name != "convert_element_type":
        return False
    a, b = eqn.invars[0].aval.dtype, eqn.outvars[0].aval.dtype
    return jnp.issubdtype(a, jnp.floating) and jnp.issubdtype(b, jnp.floating)


def conv_kernel(flat_fn: Callable, avals) -> ConvKernel | None:
    """The convolution ``flat_fn(*arrays)`` is, or ``None``: its jaxpr must be one
    ``conv_general_dilated`` of two inputs (through floating casts only) whose result,
    through floating casts only, is the single output."""
    try:
        closed = jax.make_jaxpr(flat_fn)(*avals)
    except Exception:       # noqa: BLE001 -- not analysable: not a convolution
        return None
    return conv_kernel_jaxpr(closed)


def conv_kernel_jaxpr(closed) -> ConvKernel | None:
    """:func:`conv_kernel` on the kernel's traced ``closed`` jaxpr (the one structure
    trace of :mod:`adaptprec._structure`)."""
    jaxpr = closed.jaxpr
    source = {v: i for i, v in enumerate(jaxpr.invars)}   # var -> input index
    conv, conv_out = None, None
    for eqn in jaxpr.eqns:
        if _float_cast(eqn):
            v = eqn.invars[0]
            if v in source:
                source[eqn.outvars[0]] = source[v]
            elif v is conv_out:
                conv_out = eqn.outvars[0]
            else:
                return None
        elif eqn.primitive.name == "conv_general_dilated" and conv is None:
            p = eqn.params
            lhs, rhs = eqn.invars
            if (lhs not in source or rhs not in source
                    or p["feature_group_count"] != 1 or p["batch_group_count"] != 1
                    or any(d != 1 for d in p["lhs_dilation"])
                    or any(lo < 0 or hi < 0 for lo, hi in p["padding"])):
                return None
            conv, conv_out = ConvKernel(source[lhs], source[rhs], dict(p)), eqn.outvars[0]
        else:
            return None
    if conv is None or list(jaxpr.outvars) != [conv_out] or conv.lhs == conv.rhs:
        return None
    return conv


def sampled_conv_error(conv: ConvKernel, dyn: list, outs, dtypes, ref_dtype,
                       k: int = POSITIONS, seed: int = 0, floor: float = 0.0) -> jax.Array:
    """Normwise relative difference, on ``k`` evenly spaced output positions (offset by
    ``seed``; every output channel), between the rung's output ``outs`` (one leaf, its
    samples cast to ``dtypes``)
    and the convolution re-evaluated in ``ref_dtype`` on the windows of the user's
    inputs ``dyn`` (the dynamic leaves) that those positions read."""
    p = conv.params
    dn = p["dimension_numbers"]
    lhs_spec, rhs_spec, out_spec = dn.lhs_spec, dn.rhs_spec, dn.out_spec
    x = lax.stop_gradient(dyn[conv.lhs]).astype(ref_dtype)
    w = lax.stop_gradient(dyn[conv.rhs]).astype(ref_dtype)
    (y,), (dt,) = outs, dtypes
    nsp = len(lhs_spec) - 2
    strides, rdil = p["window_strides"], p["rhs_dilation"]
    pad = [(0, 0)] * x.ndim
    for s, (lo, hi) in enumerate(p["padding"]):
        pad[lhs_spec[2 + s]] = (lo, hi)
    x = jnp.pad(x, pad)
    win = [(w.shape[rhs_spec[2 + s]] - 1) * rdil[s] + 1 for s in range(nsp)]
    grid = (y.shape[out_spec[0]],) + tuple(y.shape[out_spec[2 + s]] for s in range(nsp))
    total = int(np.prod(grid))
    k = min(k, total)
    off = (seed * 0x9E3779B1) % max(total // k, 1)
    pos = (np.arange(k, dtype=np.int64) * total) // k + off
    coords = np.stack(np.unravel_index(pos, grid), axis=1).astype(np.int32)  # (k, 1+nsp)

    sizes = [0] * x.ndim
    sizes[lhs_spec[0]], sizes[lhs_spec[1]] = 1, x.shape[lhs_spec[1]]
    for s in range(nsp):
        sizes[lhs_spec[2 + s]] = win[s]

    def one(c):
        start = [jnp.int32(0)] * x.ndim
        start[lhs_spec[0]] = c[0]
        for s in range(nsp):
            start[lhs_spec[2 + s]] = c[1 + s] * strides[s]
        patch = lax.dynamic_slice(x, start, sizes)
        out = lax.conv_general_dilated(
            patch, w, (1,) * nsp, "VALID", rhs_dilation=rdil, dimension_numbers=dn,
            precision=lax.Precision.HIGHEST, preferred_element_type=ref_dtype)
        return out.reshape(-1)

    ref = jax.vmap(one)(jnp.asarray(coords))                  # (k, O)

    def take(y):
        def at(c):
            start = [jnp.int32(0)] * y.ndim
            size = [1] * y.ndim
            start[out_spec[0]] = c[0]
            size[out_spec[1]] = y.shape[out_spec[1]]
            for s in range(nsp):
                start[out_spec[2 + s]] = c[1 + s]
            return lax.dynamic_slice(y, start, size).reshape(-1)
        return jax.vmap(at)(jnp.asarray(coords))

    # read from the materialized output (a cond's operand), as the other sampled checks
    mine = materialized(take, lax.stop_gradient(y)).astype(dt)
    return error_of_samples([mine], [ref], floor)
