"""``jax.jit`` with XLA:CPU options that cut compile time, for eager calls.

Compilation dominates a small solve (a NIST problem runs in well under a millisecond and
compiled in ~1.5 s): XLA:CPU's newer fusion emitters spend most of that on ~100 tiny
fusions of scalar trust-region bookkeeping; the classic emitters give the same results
(bit for bit on the NIST suite) in about half the time. LLVM code generation in one module
instead of split across threads saves another ~25% for programs this size. Where run time
is negligible next to compilation (small problems; the covariance, whose work is LAPACK
and dot calls) LLVM's optimisation level is dropped to 0 as well (another ~1.7x less
compile time; results change in the last bits only). Measured in docs/nlsq.md.

Compiler options are only legal on a top-level ``jit``: inside a user's
``jit``/``vmap``/``grad`` (tracers in the inputs) the plain ``jit`` is inlined instead.
"""

from __future__ import annotations

import jax

from .._tracing import is_concrete

__all__ = ["cpu_jit"]

_CPU_COMPILER_OPTIONS = {"xla_cpu_use_fusion_emitters": False,
                         "xla_cpu_parallel_codegen_split_count": 1}
_CPU_UNOPTIMISED = {"xla_backend_optimization_level": 0}


def cpu_jit(fn, *, optimise: bool = True, **jit_kwargs):
    """``jax.jit(fn)`` that, called with concrete inputs on CPU, compiles with the options
    above (``optimise=False``: also LLVM ``-O0``). ``.plain`` / ``.tuned`` expose both.

    Example:
        >>> import jax.numpy as jnp
        >>> from adaptprec.nlsq._compile import cpu_jit
        >>> f = cpu_jit(lambda x: 2.0 * x, optimise=False)
        >>> float(f(jnp.asarray(1.5)))
        3.0
    """
    plain = jax.jit(fn, **jit_kwargs)
    if jax.default_backend() != "cpu":
        return plain
    opts = dict(_CPU_COMPILER_OPTIONS)
    if not optimise:
        opts.update(_CPU_UNOPTIMISED)
    tuned = jax.jit(fn, compiler_options=opts, **jit_kwargs)

    def call(*args, **kwargs):
        return (tuned if is_concrete((args, kwargs)) else plain)(*args, **kwargs)

    call.plain, call.tuned = plain, tuned  # for profiling (.lower(...).compile())
    return call
