"""Chunking: batches larger than memory are solved ``chunk_size`` fits at a time.

(Inside one compiled solve, :func:`map_blocks` also cuts the batch into cache-sized
blocks; that is for speed, chunking is for memory and progress.)

Eagerly (concrete inputs) the chunks run in a host loop over ONE compiled program (the last
chunk is padded by repeating its first fit, so there is no recompilation), and an opt-in
``progress(done, total)`` callback is called after every chunk; nothing is printed unless
the user passes ``progress=True`` (a :class:`TqdmProgress` bar when ``tqdm`` is installed,
else :class:`TextProgress`) or a callback. With a progress display the program is compiled
ahead of the first chunk; a display with a ``compiling(on)`` method is told when
compilation starts and ends, so it can say so and keep compilation out of its fits/s rate. Under ``jit`` (traced inputs) the
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

#: The fewest fits a compiled block, chunk or batch runs in lockstep. XLA:CPU compiles
#: the per-fit arithmetic of 1-3 lanes differently from 4 or more (measured: a fit's
#: float32 rounding, and so its final bits to ~4e-10, changed with block_size 1-3 and
#: with batches of 2 fits, and never from 4 lanes up), so narrower work is padded.
MIN_LANES = 4

__all__ = ["TextProgress", "TqdmProgress", "default_progress", "map_blocks", "run_chunked",
           "auto_chunk_size"]


class TextProgress:
    """A progress display to pass as ``progress=``: one updating line on a text stream.

    While the solver compiles the line says so; the fits/s rate counts only the time spent
    solving (it starts when compilation ends). Without ``tqdm`` installed this is what
    ``progress=True`` uses; with it, :class:`TqdmProgress`.

    Example:
        >>> import io
        >>> from adaptprec.batch import TextProgress
        >>> buf = io.StringIO()
        >>> p = TextProgress(stream=buf)
        >>> p(0, 100); p.compiling(True)
        >>> buf.getvalue().split(chr(13))[-1]
        'solve_nlsq_batch: 0/100 fits (compiling...)'
        >>> p.compiling(False); p(50, 100); p(100, 100)
        >>> buf.getvalue().split(chr(13))[-1].split(" fits")[0]
        'solve_nlsq_batch: 100/100'
    """

    def __init__(self, stream: Optional[TextIO] = None, label: str = "solve_nlsq_batch"):
        self.stream = stream
        self.label = label
        self._t0: Optional[float] = None
        self._n0 = 0
        self._done = 0
        self._total = 0
        self._compiling = False

    def _write(self, text: str, end: str = "") -> None:
        stream = self.stream if self.stream is not None else sys.stderr
        stream.write(f"\r{text}{end}")
        stream.flush()

    def compiling(self, on: bool) -> None:
        """Called by the solver around compilation; the rate starts when it ends."""
        self._compiling = bool(on)
        if on:
            self._write(f"{self.label}: {self._done}/{self._total} fits (compiling...)")
        else:
            self._t0, self._n0 = time.perf_counter(), self._done
            self(self._done, self._total)

    def __call__(self, done: int, total: int) -> None:
        now = time.perf_counter()
        self._done, self._total = done, total
        if self._compiling:       # fits solved while compiling do not enter the rate
            self._write(f"{self.label}: {done}/{total} fits (compiling...)")
            return
        if self._t0 is None or done <= 0:
            self._t0, self._n0 = now, done
        solved = done - self._n0
        elapsed = now - self._t0
        rate = f"{solved / elapsed:,.0f} fits/s" if solved > 0 and elapsed > 0 else "-- fits/s"
        end = "\n" if done >= total else ""
        pct = 100.0 * done / total if total else 100.0
        self._write(f"{self.label}: {done}/{total} fits ({pct:5.1f}%), {rate}", end)


class TqdmProgress:
    """A ``tqdm`` progress bar to pass as ``progress=`` (``pip install adaptprec[progress]``).

    The bar's description says ``compiling`` while the solver compiles, and its rate counts
    only the time spent solving: the bar's clock restarts when compilation ends.
    ``tqdm_kwargs`` go to ``tqdm.tqdm`` (e.g. ``file=``, ``disable=``, ``leave=``).

    Example:
        >>> import io
        >>> from adaptprec.batch import TqdmProgress
        >>> buf = io.StringIO()
        >>> p = TqdmProgress(file=buf, mininterval=0)
        >>> p(0, 100); p.compiling(True); p.compiling(False); p(100, 100)
        >>> "compiling" in buf.getvalue(), "100/100" in buf.getvalue()
        (True, True)
    """

    def __init__(self, label: str = "solve_nlsq_batch", **tqdm_kwargs):
        try:
            from tqdm.auto import tqdm
        except ImportError as exc:      # pragma: no cover - depends on the environment
            raise ImportError("TqdmProgress needs tqdm: pip install 'adaptprec[progress]' "
                              "(or pass progress=TextProgress())") from exc
        self._tqdm = tqdm
        self.label = label
        self.kwargs = dict(unit="fit", smoothing=0, **tqdm_kwargs)
        self.bar = None
        self._compiling = False

    def _ensure(self, total: int):
        if self.bar is None:
            self.bar = self._tqdm(total=total, desc=self.label, **self.kwargs)
        return self.bar

    def compiling(self, on: bool) -> None:
        """Called by the solver around compilation; the bar's clock restarts after it."""
        self._compiling = bool(on)
        bar = self.bar
        if bar is None:
            return
        if on:
            bar.set_description(f"{self.label} (compiling)")
        else:
            n = bar.n
            bar.set_description(self.label, refresh=False)
            bar.reset(total=bar.total)        # restarts the clock: the rate excludes compiling
            bar.initial = bar.n = bar.last_print_n = n   # fits solved while compiling
            bar.refresh()
            if n >= bar.total:
                bar.close()

    def __call__(self, done: int, total: int) -> None:
        bar = self._ensure(total)
        if done > bar.n:
            bar.update(done - bar.n)
        if done >= total and not self._compiling:
            bar.close()


def default_progress(label: str = "solve_nlsq_batch"):
    """What ``progress=True`` uses: :class:`TqdmProgress` if tqdm is installed, else
    :class:`TextProgress` on stderr.

    Example:
        >>> from adaptprec.batch.chunking import default_progress
        >>> type(default_progress()).__name__ in ("TqdmProgress", "TextProgress")
        True
    """
    try:
        import tqdm  # noqa: F401
    except ImportError:
        return TextProgress(label=label)
    return TqdmProgress(label=label)


def _resolve_progress(progress):
    if progress is True:
        return default_progress()
    if progress is False or progress is None:
        return None
    if not callable(progress):
        raise TypeError(f"progress must be True, a callable progress(done, total) (e.g. "
                        f"adaptprec.batch.TqdmProgress()) or None, got {progress!r}")
    return progress


def _notify_compiling(progress, on: bool) -> None:
    hook = getattr(progress, "compiling", None)
    if callable(hook):
        hook(on)


def _aot_compile(solve: Callable, args):
    """The compiled executable of ``solve`` for ``args`` when ``solve`` exposes its
    top-level ``jax.jit`` (``.tuned``), else None."""
    target = getattr(solve, "tuned", None)
    if target is None or not hasattr(target, "lower"):
        return None
    return target.lower(*args).compile()


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


def map_blocks(solve: Callable, x0, bargs, sargs, block_size: int, count=None):
    """``solve`` applied to cache-sized blocks of fits inside one program (``lax.map``).

    On CPU the per-iteration work of a small fit is tiny, so speed is set by memory
    traffic: a block of a few thousand fits keeps the iteration's working set
    (``B m n`` Jacobian entries and the normal equations) in cache. Measured on the 2-D
    Gaussian (5x5 pixels): 2,000-fit blocks run about 3x faster than one 100,000-fit
    lockstep batch. Blocks also bound lockstep: a slow fit delays only its own block.
    The batch is cut into ``ceil(B / block_size)`` blocks of equal size (at most
    ``block_size``; 10,000 fits with ``block_size=2048`` run as 5 blocks of 2,000, not 5
    of 2,048); when that size does not divide ``B``, the last block ends at the last fit
    and overlaps its predecessor by fewer fits than there are blocks (solved twice, kept
    once). Each block is sliced from the inputs where it starts: no padded copy of the
    whole batch.

    ``count`` (a traced int, optional): only the first ``count`` rows are fits, the rest
    padding. A block that starts at or past ``count`` holds padding only; ``solve`` is
    then called with ``live=`` that block's flag (a traced bool) and must skip its work
    where it is False (:func:`adaptprec.batch._run.run_solver` pads a batch to its
    bucket: 1e5 fits run as 131,072 rows, 12 of 53 blocks padding).

    Example:
        >>> import jax.numpy as jnp
        >>> from adaptprec.batch.chunking import map_blocks
        >>> out = map_blocks(lambda x, b, s: {"y": x + b[0]}, jnp.arange(5.0)[:, None],
        ...                  (jnp.ones((5, 1)),), (), 2)
        >>> out["y"][:, 0].tolist()
        [1.0, 2.0, 3.0, 4.0, 5.0]
    """
    size = x0.shape[0]
    block_size = max(int(block_size), MIN_LANES)
    if size <= block_size:
        return solve(x0, bargs, sargs)
    nblocks = -(-size // block_size)
    block_size = -(-size // nblocks)
    overlap = nblocks * block_size - size        # rows the last block shares (< nblocks)
    starts = np.minimum(np.arange(nblocks) * block_size, size - block_size).astype(np.int32)

    def one(start):
        xb, bb = jax.tree.map(
            lambda a: jax.lax.dynamic_slice_in_dim(a, start, block_size, 0), (x0, bargs))
        if count is None:
            return solve(xb, bb, sargs)
        return solve(xb, bb, sargs, live=start < count)

    out = jax.lax.map(one, jnp.asarray(starts))

    def rows(a):
        flat = a[:-1].reshape((-1,) + a.shape[2:])
        return jnp.concatenate([flat, a[-1, overlap:]], axis=0)

    return jax.tree.map(rows, out)


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
    lanes = max(chunk_size, MIN_LANES)  # each chunk is padded to this many fits
    nchunks = -(-size // chunk_size)
    progress = _resolve_progress(progress)
    if is_traced(x0, bargs, sargs):
        if progress is not None:
            raise ValueError("progress= needs concrete inputs (call solve_nlsq_batch "
                             "outside jit); under jit chunks run inside lax.map")
        return map_blocks(solve, x0, bargs, sargs, chunk_size)

    def chunk(c):
        lo = c * chunk_size
        hi = min(lo + chunk_size, size)
        part = jax.tree.map(lambda a: a[lo:hi], (x0, bargs))
        return hi, pad_rows(part, lanes - (hi - lo))

    run = solve
    compiling = progress is not None
    if compiling:
        progress(0, size)
        _notify_compiling(progress, True)
        _, first = chunk(0)
        compiled = _aot_compile(solve, (first[0], first[1], sargs))
        if compiled is not None:       # compiled ahead: the chunks' time is solve time only
            run = lambda x, b, s: compiled(x, b, s)  # noqa: E731
            _notify_compiling(progress, False)
            compiling = False
    outs = []
    for c in range(nchunks):
        hi, part = chunk(c)
        out = run(part[0], part[1], sargs)
        outs.append(jax.tree.map(lambda a, n=hi - c * chunk_size: a[:n], out))
        if progress is not None:
            jax.block_until_ready(out)
            progress(hi, size)
            if compiling:              # could not compile ahead: the first chunk compiled
                _notify_compiling(progress, False)
                compiling = False
    if len(outs) == 1:
        return outs[0]
    return jax.tree.map(lambda *a: jnp.concatenate(a, axis=0), *outs)
