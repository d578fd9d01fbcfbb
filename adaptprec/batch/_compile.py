"""XLA:CPU compiler options for the batched solver's top-level ``jit``.

Measured on the Gpufit 2-D Gaussian (``benchmarks/bench_batch.py``, ``benchmarks/RESULTS.md``):
XLA:CPU hands reductions and batched ``dot``s to its YNNPACK library fusions by default;
for the per-fit reductions of this solver (the packed Gram matrix of
:func:`adaptprec.batch.lm_batched._gram`: sums of length ``m`` over a few thousand fits)
those library calls cost more than the loop XLA emits itself, so they are switched off.
The loop also sums every fit in a fixed order whatever the batch size, so a fit's result
does not depend on which fits share its block, device or compaction buffer (tested bit
for bit); with the YNNPACK reduction it did. (The classic, non-MLIR emitters,
``xla_cpu_use_fusion_emitters=False``, compiled faster and ran about as fast, but their
float32 results depended on the batch size in the adaptive program, so they are not used.)

Options are only allowed on a top-level ``jit``: inside a user's ``jit``/``vmap``/``grad``
the plain ``jit`` is inlined (same results up to rounding, default speed).
"""

from __future__ import annotations

from typing import Callable

import jax

from .._backend import tuned_jit as _tuned_jit

__all__ = ["CPU_COMPILER_OPTIONS", "compiler_options", "tuned_jit"]

CPU_COMPILER_OPTIONS = {"xla_cpu_experimental_ynn_fusion_type": ""}


def compiler_options() -> dict | None:
    """The options for the default backend (``None`` off CPU).

    Example:
        >>> from adaptprec.batch._compile import compiler_options
        >>> sorted(compiler_options() or {})[:1] in ([], ['xla_cpu_experimental_ynn_fusion_type'])
        True
    """
    if jax.default_backend() != "cpu":
        return None
    return dict(CPU_COMPILER_OPTIONS)


def tuned_jit(fn: Callable, plain_fn: Callable | None = None) -> Callable:
    """``jax.jit(fn)`` with :func:`compiler_options` when called on concrete inputs.

    On traced inputs (inside a user's ``jit``/``vmap``/``grad``) ``jax.jit(plain_fn)`` is
    called instead (default ``fn``): the same computation, possibly written in the form
    XLA's default options run best.

    The returned callable has ``.plain`` and ``.tuned`` (the two jitted functions) for
    ``.lower(...)``/profiling, and ``.__wrapped__``/``.plain_fn`` (the two functions).

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from adaptprec.batch._compile import tuned_jit
        >>> f = tuned_jit(lambda x: x * 2)
        >>> float(f(jnp.float32(3.0))), float(jax.jit(f)(jnp.float32(3.0)))
        (6.0, 6.0)
    """
    return _tuned_jit(fn, compiler_options(), plain_fn=plain_fn)
