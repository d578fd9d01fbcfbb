"""Batched nonlinear least squares: many independent small fits at once.

:func:`solve_nlsq_batch` runs Levenberg–Marquardt with an explicit leading batch axis
(:mod:`~adaptprec.batch.lm_batched`), compacts stragglers
(:mod:`~adaptprec.batch.compaction`), escalates precision per fit
(:mod:`~adaptprec.batch.escalation`), chunks batches larger than memory
(:mod:`~adaptprec.batch.chunking`) and splits the batch across devices
(:mod:`~adaptprec.batch.sharding`).

Example:
    >>> import jax.numpy as jnp
    >>> from adaptprec.batch import solve_nlsq_batch
    >>> y = jnp.array([[1.0, 2.0], [3.0, 5.0]])
    >>> res = solve_nlsq_batch(lambda p, y: p - y, jnp.zeros((2, 2)), (y,), precision="f32")
    >>> res.x.tolist(), res.rung.tolist()
    ([[1.0, 2.0], [3.0, 5.0]], [0, 0])
"""

from .api import solve_nlsq_batch
from .chunking import TextProgress, TqdmProgress
from .result import BatchResult

__all__ = ["solve_nlsq_batch", "BatchResult", "TextProgress", "TqdmProgress"]
