"""Chunking: batches larger than memory are solved ``chunk_size`` fits at a time.

(Inside one compiled solve, :func:`map_blocks` also cuts the batch into cache-sized
blocks; that is for speed, chunking is for memory and progress.)

Eagerly (concrete inputs) the chunks run in a host loop over ONE compiled program (the last
chunk is padded by repeating its first fit, so there is no recompilation), and an opt-in
``progress(done, total)`` callback is called after every chunk; nothing is printed unless
the user passes a callback such as :class:`TextProgress`. Under ``jit`` (traced inputs) the
chunks run through :func:`jax.lax.map`, which bounds the live memory the same way; the
progress callback is not available there.

Per-fit results do not depend on chunking: fits are independent and the iteration of
one fit never reads another's state.
"""

from __future__ import annotations

import sys
import time
from typing import Callable, Optional, TextIO

import jax
import jax.numpy as jnp
import numpy as np

from .._tracing import is_traced

__all__ = ["TextProgress", "map_blocks", "run_chunked", "auto_chunk_size"]


class TextProgress:
    """A progress display to pass as ``progress=``: one updating line on a text stream.

    Example:
        >>> import io
        >>> from adaptprec.batch import TextProgress
        >>> buf = io.StringIO()
        >>> p = TextProgress(stream=buf)
        >>> p(50, 100); p(100, 100)
        >>> buf.getvalue().split(chr(13))[-1].split(" fits")[0]
        'solve_nlsq_batch: 100/100'
    """

    def __init__(self, stream: Optional[TextIO] = None, label: str = "solve_nlsq_batch"):
        self.stream = stream
        self.label = label
        self._t0: Optional[float] = None

    def __call__(self, done: int, total: int) -> None:
        stream = self.stream if self.stream is not None else sys.stderr
        now = time.perf_counter()
        if self._t0 is None or done <= 0:
            self._t0 = now
        rate = done / max(now - self._t0, 1e-9)
        end = "\n" if done >= total else ""
        stream.write(f"\r{self.label}: {done}/{total} fits ({100.0 * done / total:5.1f}%), "
                     f"{rate:,.0f} fits/s{end}")
        stream.flush()


def auto_chunk_size(size: int, m: int, n: int, itemsize: int,
                    budget_bytes: int = 1 << 30) -> int:
    """Largest chunk whose working set (about ``6 m n`` values per fit) fits ``budget_bytes``.

    Example:
        >>> from adaptprec.batch.chunking import auto_chunk_size
        >>> auto_chunk_size(10_000_000, 25, 5, 8, budget_bytes=1 << 30)
        122461
        >>> auto_chunk_size(1000, 25, 5, 8)
        1000
    """
    per_fit = itemsize * (6 * m * n + 4 * m + 6 * n * n + 16 * n + 16)
    return int(max(1, min(size, budget_bytes // per_fit)))


def pad_rows(tree, rows: int):
    """Append ``rows`` copies of the first row to every leaf (padding never changes results:
    fits are independent, and padded rows are dropped)."""
    def pad(a):
        if rows == 0:
            return a
        reps = jnp.repeat(a[:1], rows, axis=0)
        return jnp.concatenate([a, reps], axis=0)
    return jax.tree.map(pad, tree)


def map_blocks(solve: Callable, x0, bargs, sargs, block_size: int):
    """``solve`` applied to cache-sized blocks of fits inside one program (``lax.map``).

    On CPU the per-iteration work of a small fit is tiny, so speed is set by memory
    traffic: a block of a few thousand fits keeps the iteration's working set
    (``B m n`` Jacobian entries and the normal equations) in cache. Measured on the 2-D
    Gaussian (5x5 pixels): 2,000-fit blocks run about 3x faster than one 100,000-fit
    lockstep batch. Blocks also bound lockstep: a slow fit delays only its own block.
    The batch is cut into ``ceil(B / block_size)`` blocks of equal size (at most
    ``block_size``), padding by repeating its first fit, so at most one fit per block is
    padding (10,000 fits with ``block_size=2048`` run as 5 blocks of 2,000, not 5 of
    2,048).

    Example:
        >>> import jax.numpy as jnp
        >>> from adaptprec.batch.chunking import map_blocks
        >>> out = map_blocks(lambda x, b, s: {"y": x + b[0]}, jnp.arange(5.0)[:, None],
        ...                  (jnp.ones((5, 1)),), (), 2)
        >>> out["y"][:, 0].tolist()
        [1.0, 2.0, 3.0, 4.0, 5.0]
    """
    size = x0.shape[0]
    if size <= block_size:
        return solve(x0, bargs, sargs)
    nblocks = -(-size // block_size)
    block_size = -(-size // nblocks)
    xs = pad_rows((x0, bargs), nblocks * block_size - size)
    xs = jax.tree.map(lambda a: a.reshape((nblocks, block_size) + a.shape[1:]), xs)
    out = jax.lax.map(lambda c: solve(c[0], c[1], sargs), xs)
    return jax.tree.map(lambda a: a.reshape((-1,) + a.shape[2:])[:size], out)


def run_chunked(solve: Callable, x0, bargs, sargs, chunk_size: int,
                progress: Optional[Callable[[int, int], None]] = None):
    """Apply ``solve(x0, bargs, sargs) -> result pytree`` chunk by chunk and concatenate.

    Example:
        >>> import jax.numpy as jnp
        >>> from adaptprec.batch.chunking import run_chunked
        >>> seen = []
        >>> out = run_chunked(lambda x, b, s: {"y": x * 2}, jnp.arange(5.0)[:, None], (), (),
        ...                   2, progress=lambda d, t: seen.append(d))
        >>> out["y"][:, 0].tolist(), seen
        ([0.0, 2.0, 4.0, 6.0, 8.0], [0, 2, 4, 5])
    """
    size = x0.shape[0]
    chunk_size = int(max(1, min(chunk_size, size)))
    nchunks = -(-size // chunk_size)
    if is_traced(x0, bargs, sargs):
        if progress is not None:
            raise ValueError("progress= needs concrete inputs (call solve_nlsq_batch "
                             "outside jit); under jit chunks run inside lax.map")
        return map_blocks(solve, x0, bargs, sargs, chunk_size)
    outs = []
    if progress is not None:
        progress(0, size)
    for c in range(nchunks):
        lo = c * chunk_size
        hi = min(lo + chunk_size, size)
        part = jax.tree.map(lambda a: a[lo:hi], (x0, bargs))
        part = pad_rows(part, chunk_size - (hi - lo))
        out = solve(part[0], part[1], sargs)
        outs.append(jax.tree.map(lambda a: a[: hi - lo], out))
        if progress is not None:
            jax.block_until_ready(out)
            progress(hi, size)
    if len(outs) == 1:
        return outs[0]
    return jax.tree.map(lambda *a: jnp.concatenate(a, axis=0), *outs)
