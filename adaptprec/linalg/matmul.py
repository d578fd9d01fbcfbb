"""Matrix products with low-precision inputs and float32 (or wider) accumulation.

A bfloat16 dot product that accumulates in bfloat16 stops growing once the running sum
reaches 256 times a term (8-bit mantissa); accumulating in float32 — what tensor cores and
``preferred_element_type`` do — keeps the error of an n-term sum at about
``u_bf16 + n u_f32`` instead of ``n u_bf16``. :func:`matmul` makes that the default, and
:func:`pad_to_multiple` pads operands to tensor-core friendly sizes (multiples of 8).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

import jax.numpy as jnp

from functools import partial

from .._policy import Policy
from .._x64_rule import float64_call
from ..precision import unit_roundoff
from ._common import check_array, x64_need_arrays

__all__ = ["matmul", "pad_to_multiple"]


def _accumulator(dtype: np.dtype) -> np.dtype:
    """float32 for half-precision inputs, else the input dtype (never narrower than f32)."""
    if unit_roundoff(dtype) > unit_roundoff(np.float32):
        return np.dtype(np.float32)
    return np.dtype(dtype)


@partial(float64_call, describe=lambda a, b, *, policy=None, precision=None: x64_need_arrays(
    "matmul", (a, b), policy=policy, trees=(a, b)))
def matmul(a, b, *, policy=None, precision=None):
    """``a @ b`` with inputs in a compute dtype and accumulation in float32 or wider.

    Args:
        a, b: floating arrays with ``jnp.matmul`` shapes (batch dimensions broadcast).
        policy: ``None`` (keep the inputs' common dtype), a :class:`adaptprec.Policy` or a
            policy string such as ``"c=bf16,o=f32"``: inputs are cast to ``policy.compute``
            and the result to ``policy.output``.
        precision: forwarded to ``jnp.matmul`` (``jax.lax.Precision``, a string, or a
            ``jax.lax.DotAlgorithmPreset`` such as ``"BF16_BF16_F32"``).

    The product accumulates in ``preferred_element_type = float32`` for bf16/f16 inputs
    (the input dtype otherwise). The result dtype is ``policy.output``, or the inputs'
    common dtype without a policy. Never lowers the precision of float64 inputs unless a
    policy asks for it.

    Example:
        >>> import jax.numpy as jnp
        >>> import adaptprec as ap
        >>> a = jnp.ones((1, 4096), jnp.bfloat16)   # bf16 sums stall at 256 without this
        >>> c = ap.linalg.matmul(a, a.T, policy="c=bf16,o=f32")
        >>> c.dtype.name, float(c[0, 0])
        ('float32', 4096.0)
    """
    a = check_array(a, "a", "matmul")
    b = check_array(b, "b", "matmul")
    if policy is not None:
        pol = Policy.parse(policy)
        compute, output = pol.compute, pol.output
    else:
        # (float64 NumPy inputs with x64 off: JAX would compute and return float32
        # silently; the x64 rule runs this call in the float64 scope instead)
        compute = output = np.dtype(jnp.result_type(a.dtype, b.dtype))
    acc = _accumulator(compute)
    out = jnp.matmul(jnp.asarray(a, compute), jnp.asarray(b, compute), precision=precision,
                     preferred_element_type=acc)
    return out.astype(output)


def pad_to_multiple(x, multiple: int = 8, *, axes: Sequence[int] = (-2, -1)):
    """Zero-pad ``x`` at the end of ``axes`` so each has a length divisible by ``multiple``.

    Zero rows/columns leave the leading block of a product unchanged, so
    ``matmul(pad(a), pad(b))[:m, :n] == a @ b``; tensor cores want dimensions that are
    multiples of 8 (16 for some formats).

    Example:
        >>> import jax.numpy as jnp
        >>> import adaptprec as ap
        >>> ap.linalg.pad_to_multiple(jnp.ones((3, 10)), 8).shape
        (8, 16)
        >>> ap.linalg.pad_to_multiple(jnp.ones(5), 4, axes=(0,)).shape
        (8,)
    """
    if isinstance(multiple, bool) or not isinstance(multiple, (int, np.integer)) \
            or multiple < 1:
        raise ValueError(f"pad_to_multiple: multiple must be a positive int, got {multiple!r}")
    x = jnp.asarray(x)
    pads = [(0, 0)] * x.ndim
    for ax in axes:
        if not -x.ndim <= ax < x.ndim:
            raise ValueError(
                f"pad_to_multiple: axis {ax} is out of range for an array of shape {x.shape}")
        size = x.shape[ax]
        pads[ax] = (0, (-size) % multiple)
    return jnp.pad(x, pads)
