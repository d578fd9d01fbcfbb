"""``jax.jit`` with XLA:CPU options that cut compile time, for eager calls.

Compilation dominates a small solve (a NIST problem runs in well under a millisecond and
compiled in ~1.5 s): XLA:CPU's newer fusion emitters spend most of that on ~100 tiny
fusions of scalar trust-region bookkeeping; the classic emitters give the same results
(bit for bit on the NIST suite) in about half the time. LLVM code generation in one module
instead of split across threads saves another ~25% for programs this size. Where run time
is negligible next to compilation (small problems; the covariance, whose work is LAPACK
and dot calls) LLVM's optimisation level is dropped to 0 as well (another ~1.7x less
compile time; results change in the last bits only). Measured: benchmarks/RESULTS.md.

Compiler options are only legal on a top-level ``jit``: inside a user's
``jit``/``vmap``/``grad`` (tracers in the inputs) the plain ``jit`` is inlined instead.
"""

from __future__ import annotations

import jax

from .._lapack_init import ensure_lapack
from .._tracing import is_eager

__all__ = ["cpu_jit", "cpu_options", "tuned_jit"]

_CPU_COMPILER_OPTIONS = {"xla_cpu_use_fusion_emitters": False,
                         "xla_cpu_parallel_codegen_split_count": 1}
# Small programs (the host driver's, the promoted whole solve, small fused solves) spend
# their run time in XLA:CPU's thunk executor, not in arithmetic: perf of a promoted
# 3-parameter fit showed 6% of samples in generated code and ~45% in the executor and
# its thread pool (work stealing, futex wake-ups), because the default scheduler leaves
# parallel branches in the DAG of ~130 tiny thunks per iteration. The memory-optimised
# scheduler and region-based copy insertion order and alias the same work into a DAG
# with fewer branches and copies (one fewer copy per carried value): ~25% less run time,
# the same bits (ordering and aliasing never change arithmetic). Measured: benchmarks/RESULTS.md.
_CPU_UNOPTIMISED = {"xla_backend_optimization_level": 0,
                    "xla_cpu_scheduler_type": "CPU_SCHEDULER_TYPE_MEMORY_OPTIMIZED",
                    "xla_cpu_copy_insertion_use_region_analysis": True}


def tuned_jit(fn, options: dict | None, *, plain_fn=None, **jit_kwargs):
    """``jax.jit(fn, compiler_options=options)`` for calls on concrete inputs, and
    ``jax.jit(plain_fn or fn)`` (no options: they are only legal on a top-level ``jit``)
    when traced inside a user's ``jit``/``vmap``/``grad``. ``options=None`` gives the
    plain jit. ``.plain`` / ``.tuned`` expose both (for ``.lower(...)``/profiling).

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from adaptprec.nlsq._compile import tuned_jit
        >>> f = tuned_jit(lambda x: 2.0 * x, {"xla_cpu_use_fusion_emitters": False})
        >>> float(f(jnp.asarray(1.5))), float(jax.jit(f)(jnp.asarray(1.5)))
        (3.0, 3.0)
    """
    plain = jax.jit(plain_fn or fn, **jit_kwargs)
    if not options:
        plain.plain = plain.tuned = plain
        plain.plain_fn = plain_fn or fn
        plain.options = None
        return plain
    tuned = jax.jit(fn, compiler_options=dict(options), **jit_kwargs)

    def call(*args, **kwargs):
        if is_eager((args, kwargs)):
            ensure_lapack()  # a no-op after the first call (see adaptprec._lapack_init)
            return tuned(*args, **kwargs)
        return plain(*args, **kwargs)

    call.plain, call.tuned = plain, tuned
    call.__wrapped__, call.plain_fn = fn, plain_fn or fn
    call.options = dict(options)
    return call


def cpu_jit(fn, *, optimise: bool = True, **jit_kwargs):
    """:func:`tuned_jit` with the options above on CPU (``optimise=False``: also LLVM
    ``-O0``).

    Example:
        >>> import jax.numpy as jnp
        >>> from adaptprec.nlsq._compile import cpu_jit
        >>> f = cpu_jit(lambda x: 2.0 * x, optimise=False)
        >>> float(f(jnp.asarray(1.5)))
        3.0
    """
    return tuned_jit(fn, cpu_options(optimise), **jit_kwargs)


def cpu_options(optimise: bool = True) -> dict | None:
    """The compiler options :func:`cpu_jit` uses (a fresh dict), ``None`` off CPU."""
    if jax.default_backend() != "cpu":
        return None
    return {**_CPU_COMPILER_OPTIONS, **({} if optimise else _CPU_UNOPTIMISED)}
