"""The one backend switch: tricks that serve XLA:CPU on a small machine, and the plain
path everywhere else.

XLA:CPU compiles and runs small programs differently from an accelerator, and a few
measured tricks make the library's programs cheaper there (benchmarks/RESULTS.md holds
the figures). Each sits behind :func:`cpu_tricks`, so that on a GPU or TPU the plain
operation runs:

* :func:`materialise` -- a sort of a tiny vector (the identity permutation) that XLA
  cannot fuse, so a chain of scalar decisions is compiled once instead of being copied
  into every fusion that consumes it (halves a trust-region step's compile time on CPU);
  elsewhere the masks pass through unchanged;
* :func:`qr_r` -- the ``R`` factor of a tall, narrow matrix by Householder reflections
  in XLA ops for mid sizes (LAPACK's multi-threaded ``geqrf`` stalls on a loaded 2-core
  machine); elsewhere the library QR;
* :func:`serial_blocks` -- whether sums over data points run as a serial scan over
  cache-sized blocks (CPU) or as one vectorised reduction;
* :func:`host_alignment` -- the byte alignment of host arrays handed to the device
  without a copy (64 on CPU; 0, no special alignment, elsewhere);
* :func:`cpu_options` / :func:`cpu_jit` -- XLA:CPU compiler options that cut the compile
  time of small programs (the classic emitters, one LLVM module, LLVM ``-O0`` where run
  time is negligible); ``None`` (plain ``jit``) elsewhere.

``ADAPTPREC_CPU_TRICKS=0`` (or ``1``) forces the plain (or the CPU) path, for tests and
for measuring what a trick buys.

Example:
    >>> import jax.numpy as jnp
    >>> from adaptprec import _backend
    >>> [bool(m) for m in _backend.materialise(jnp.asarray(True), jnp.asarray(False))]
    [True, False]
"""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
from jax import lax

from ._lapack_init import ensure_lapack
from ._tracing import is_eager

__all__ = ["cpu_tricks", "materialise", "qr_r", "serial_blocks", "host_alignment",
           "cpu_options", "cpu_jit", "tuned_jit", "HOUSEHOLDER_MAX_COLUMNS",
           "HOUSEHOLDER_MIN_SIZE"]

#: Up to this many columns the CPU path's QR is Householder in XLA ops (:func:`qr_r`) ...
HOUSEHOLDER_MAX_COLUMNS = 32
#: ... from this many entries on: below it LAPACK's call stays single-threaded and is
#: 3-4x faster than the loop (benchmarks/RESULTS.md, "QR of [J f]").
HOUSEHOLDER_MIN_SIZE = 12288


def cpu_tricks() -> bool:
    """Whether the CPU tricks apply: the default backend is CPU, unless
    ``ADAPTPREC_CPU_TRICKS`` says otherwise (read at trace time).

    Example:
        >>> from adaptprec._backend import cpu_tricks
        >>> isinstance(cpu_tricks(), bool)
        True
    """
    forced = os.environ.get("ADAPTPREC_CPU_TRICKS", "").strip()
    if forced in ("0", "1"):
        return forced == "1"
    return jax.default_backend() == "cpu"


def materialise(*masks):
    """``masks`` (boolean scalars) unchanged, each computed once.

    On CPU they pass through a sort of a small vector (the identity permutation), which
    XLA cannot fuse: XLA:CPU's loop fusion otherwise copies the whole chain of scalar
    decisions that produced them (a few hundred elementwise ops) into every fusion that
    consumes one of them. ``lax.optimization_barrier`` is expanded away before fusion on
    CPU, and a one-trip while loop is inlined, so a sort is the barrier that holds.
    """
    if not cpu_tricks():
        return tuple(jnp.asarray(m_, bool) for m_ in masks)
    v = jnp.stack([jnp.asarray(m_, jnp.int32) for m_ in masks])
    _, v = lax.sort((jnp.arange(len(masks), dtype=jnp.int32), v), num_keys=1)
    return tuple(v[i] > 0 for i in range(len(masks)))


def qr_r(A):
    """The ``R`` factor (``(k, k)``, ``k = A.shape[1]``) of a tall ``A``: on CPU, for
    ``k <=`` :data:`HOUSEHOLDER_MAX_COLUMNS` and ``A.size >=``
    :data:`HOUSEHOLDER_MIN_SIZE`, :func:`householder_r`; otherwise ``jnp.linalg.qr``."""
    if (cpu_tricks() and A.shape[1] <= HOUSEHOLDER_MAX_COLUMNS
            and A.size >= HOUSEHOLDER_MIN_SIZE):
        return householder_r(A)
    return jnp.linalg.qr(A, mode="r")


def householder_r(A):
    """The ``R`` factor (``(k, k)``, rows ``>= k`` dropped) of a tall ``A`` (``m >= k``)
    by Householder reflections: one reflection ``A <- (I - beta v v^T) A`` per column in a
    ``fori_loop`` (``O(m k^2)``, backward stable as LAPACK's ``geqrf``; row signs may
    differ from it). A zero column is left as it is.

    Example:
        >>> import jax.numpy as jnp
        >>> from adaptprec._backend import householder_r
        >>> R = householder_r(jnp.array([[3.0, 1.0], [4.0, 2.0], [0.0, 2.0]]))
        >>> [[round(abs(float(v)), 6) for v in row] for row in R]
        [[5.0, 2.2], [0.0, 2.039608]]
    """
    m, k = A.shape
    rows = jnp.arange(m)

    def reflect(j, A):
        x = jnp.where(rows >= j, A[:, j], 0.0)
        norm_x = jnp.linalg.norm(x)
        xj = A[j, j]
        alpha = -jnp.where(xj >= 0, 1.0, -1.0).astype(A.dtype) * norm_x
        v = x.at[j].add(-alpha)
        vv = jnp.vdot(v, v)
        beta = jnp.where(vv > 0, 2.0 / jnp.where(vv > 0, vv, 1.0), 0.0)
        return A - (beta * v)[:, None] * (v @ A)[None, :]

    A = lax.fori_loop(0, k, reflect, A)
    return jnp.triu(A[:k])


def serial_blocks() -> bool:
    """Whether sums over data points run as a serial scan over cache-sized blocks (CPU:
    each block's residual and Jacobian are formed and consumed while in cache) rather
    than one vectorised reduction over all points (accelerators)."""
    return cpu_tricks()


def host_alignment() -> int:
    """The byte alignment of host arrays that the device can alias without a copy (64 on
    CPU, where ``jax.device_put`` aliases 64-byte-aligned NumPy buffers; 0 elsewhere:
    the transfer copies anyway)."""
    return 64 if cpu_tricks() else 0


# ---------------------------------------------------------------- compiler options
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
        >>> from adaptprec._backend import tuned_jit
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
        >>> from adaptprec._backend import cpu_jit
        >>> f = cpu_jit(lambda x: 2.0 * x, optimise=False)
        >>> float(f(jnp.asarray(1.5)))
        3.0
    """
    return tuned_jit(fn, cpu_options(optimise), **jit_kwargs)


def cpu_options(optimise: bool = True) -> dict | None:
    """The compiler options :func:`cpu_jit` uses (a fresh dict), ``None`` off CPU."""
    if not cpu_tricks():
        return None
    return {**_CPU_COMPILER_OPTIONS, **({} if optimise else _CPU_UNOPTIMISED)}
