"""Dots under autocast: accumulation dtype, precision, and a form the backend runs.

:func:`dot_params` gives a ``dot_general``/``conv`` its ``preferred_element_type`` (the
policy's accumulator when the rule is ``accumulate`` and the accumulator is at least as
wide as the operands) and its ``precision``.

:func:`runnable` keeps every mixed dot runnable on the backend. XLA:CPU (jaxlib 0.10)
runs a dot in one of two places: the YNNPACK library, which has ``bf16 x bf16 -> f32``
kernels for dots whose left operand contracts its last dimension (``A @ B`` and
``A @ B^T``, batch dimensions leading), or its own Eigen ``DotThunk``, which has none.
Its operand upcaster decides early, on the dot as first canonicalized: a dot YNNPACK
takes keeps its bfloat16 operands, any other gets float32 ones. Algebraic simplification
runs *after* that decision and folds a transpose of the dot's result into the dot
(``transpose(A @ B) -> B^T @ A^T``): an ``A @ B`` whose result is transposed becomes a
``B^T @ A^T`` with bfloat16 operands, which YNNPACK does not take and ``DotThunk``
rejects at run time ("Unsupported element type for DotThunk::Execute: BF16 x BF16 =
F32"). The backward pass of ``x @ w`` makes exactly that: the gradient of ``w`` is
``x^T @ g`` transposed. (``f16 x f16 -> f32`` and dots accumulating in the operand dtype
are upcast later in the pipeline and run; measured by ``tests/test_autocast_dots.py``.)

The fix: on XLA:CPU, a ``bf16 x bf16 -> f32`` dot's result passes through
:func:`jax.lax.optimization_barrier`, so no transpose is folded into the dot; the dot keeps
the form the upcaster judged, and YNNPACK's kernel (or float32 operands) runs it. The
barrier moves no data and keeps the bfloat16 speed of the dots YNNPACK runs; it stops
XLA from fusing the dot's consumers into it. ``explain`` counts these dots
(``Explanation.guarded_dots``). Other backends run the plain dot (:data:`GUARDED`, the
one backend switch).

Example:
    >>> import jax, jax.numpy as jnp
    >>> import adaptprec as ap
    >>> def loss(w, x):
    ...     return jnp.sum(jnp.einsum("btf,fd->btd", x, w) ** 2)
    >>> w, x = jnp.ones((4, 3), jnp.float32), jnp.ones((2, 5, 4), jnp.float32)
    >>> g = jax.jit(ap.autocast(jax.grad(loss), ap.AUTO_MIXED_BF16))(w, x)
    >>> g.dtype.name, g.shape
    ('float32', (4, 3))
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from .presets import PrecisionPolicy, Rule

__all__ = ["GUARDED", "dot_params", "needs_barrier", "runnable"]

#: Backend -> operand dtypes whose dots into a wider accumulator are kept behind an
#: optimization barrier (the XLA:CPU case above). The one backend switch of this module.
GUARDED: dict[str, frozenset] = {"cpu": frozenset({np.dtype(jnp.bfloat16)})}


def dot_params(policy: PrecisionPolicy, rule, target, params: dict) -> dict:
    """``preferred_element_type`` / ``precision`` of dot_general and conv under the
    policy."""
    params = dict(params)
    acc = target
    pet = policy.preferred_element_type
    if (rule is Rule.ACCUMULATE and pet is not None
            and jnp.promote_types(pet, target) == pet):
        acc = pet
    params["preferred_element_type"] = np.dtype(acc)
    if policy.dot_precision is not None and "precision" in params:
        params["precision"] = (policy.dot_precision, policy.dot_precision)
    return params


def needs_barrier(operand_dtype, result_dtype, backend: str | None = None) -> bool:
    """Whether a ``dot_general`` with these operand and result dtypes is kept behind a
    barrier on ``backend`` (default: JAX's default backend, where the trace will run).

    Example:
        >>> import jax.numpy as jnp
        >>> from adaptprec._autocast.dots import needs_barrier
        >>> needs_barrier(jnp.bfloat16, jnp.float32, "cpu"), needs_barrier(
        ...     jnp.bfloat16, jnp.float32, "gpu"), needs_barrier(jnp.float16, jnp.float32, "cpu")
        (True, False, False)
    """
    guarded = GUARDED.get(backend or jax.default_backend(), frozenset())
    operand, result = np.dtype(operand_dtype), np.dtype(result_dtype)
    return operand in guarded and result != operand


def runnable(stats, operand_dtype, outs: list) -> list:
    """The results of a ``dot_general`` in a form the backend runs (see the module
    docstring); a guarded dot is counted in ``stats.guarded_dots``."""
    if not needs_barrier(operand_dtype, outs[0].dtype):
        return outs
    stats.guarded_dots += 1
    return [lax.optimization_barrier(outs[0])]
