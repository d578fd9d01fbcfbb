"""`BatchResult`: the per-fit answers of :func:`~adaptprec.solve_nlsq_batch` as one pytree."""

from __future__ import annotations

from typing import Optional

import jax
import numpy as np

from .._pytree import Module, field
from .._status import Reason
from . import _status as st
from .sharding import host_array

__all__ = ["BatchResult"]


class BatchResult(Module):
    """Per-fit results of a batched least-squares solve; every array has the batch axis first.

    Fields follow :class:`scipy.optimize.OptimizeResult` where one exists:

    - ``x`` ``(B, n)`` solutions; ``cost`` ``(B,)`` ``0.5 * ||f||^2`` at ``x``;
    - ``status`` ``(B,)`` int32 codes, those of :class:`adaptprec.nlsq.common.Status`
      (scipy's 0..4; -3/-4 non-finite residual/Jacobian, -5 no finite trial point) plus
      -6 (stalled: no reduction possible at the precision); :meth:`message` explains one;
      ``success`` ``(B,)`` = ``status > 0``;
    - ``rung`` ``(B,)`` index into ``ladder`` of the precision that produced the fit;
    - ``nfev``, ``njev``, ``nit`` ``(B,)`` counts summed over rungs;
    - ``optimality`` ``(B,)`` ``||J^T f||_inf`` at ``x`` (with bounds: of the projected
      gradient, components held by a bound dropped);
    - ``pcov`` ``(B, n, n)`` parameter covariance when requested, else ``None``
      (``inf`` where a parameter is not identifiable or there are no degrees of freedom);
    - ``ladder`` (static) names of the rungs, e.g. ``("f32", "f64")``;
    - ``escalation_reason`` ``(B,)`` :class:`adaptprec.Reason` code per fit: why it left
      the lower rungs (``VERIFY``: no guard fired, it was finished and verified on the top
      rung, as every adaptive fit is; ``NONE`` for a one-rung precision);
    - ``dof`` ``(B,)`` int32 degrees of freedom, each fit's real points (``mask``) minus
      its free parameters (``fixed``): what ``pcov`` is scaled by.

    Being a pytree dataclass, a ``BatchResult`` passes through ``jit`` and
    ``jax.tree.map``.

    Example:
        >>> import jax.numpy as jnp
        >>> from adaptprec.batch import BatchResult
        >>> r = BatchResult(x=jnp.zeros((2, 1)), cost=jnp.zeros(2), status=jnp.array([1, -3]),
        ...                 success=jnp.array([True, False]), rung=jnp.array([0, 1]),
        ...                 nfev=jnp.ones(2, int), njev=jnp.ones(2, int), nit=jnp.ones(2, int),
        ...                 optimality=jnp.zeros(2), pcov=None, ladder=("f32", "f64"))
        >>> r.batch_size, r.num_escalated, r.message(1)[:30]
        (2, 1, 'The residual is non-finite (Na')
    """

    x: jax.Array
    cost: jax.Array
    status: jax.Array
    success: jax.Array
    rung: jax.Array
    nfev: jax.Array
    njev: jax.Array
    nit: jax.Array
    optimality: jax.Array
    pcov: Optional[jax.Array]
    ladder: tuple = field(static=True)
    escalation_reason: Optional[jax.Array] = None
    dof: Optional[jax.Array] = None
    #: the parameters set by ``expr=`` ties or by ``constraints=`` (their values and
    #: ``pcov`` rows follow from the free ones); empty for an unconstrained batch
    dependent: tuple = field(static=True, default=())

    @property
    def batch_size(self) -> int:
        """Number of fits ``B``."""
        return int(self.status.shape[0])

    @property
    def escalated(self) -> np.ndarray:
        """``(B,)`` host bool mask: the fits a lower rung's guard sent up. Fits that were
        only finished and verified on the top rung (``Reason.VERIFY``, as every adaptive
        fit is) are not escalated, although their ``rung`` is the top one."""
        if self.escalation_reason is None:
            return host_array(self.rung) > 0
        why = host_array(self.escalation_reason)
        return (why != Reason.NONE) & (why != Reason.VERIFY)

    @property
    def num_escalated(self) -> int:
        """How many fits a lower rung's guard sent up (host-side count of
        :attr:`escalated`).

        On a result spanning processes, these, :meth:`message` and :meth:`status_counts`
        gather the per-fit codes from every process (a collective: call them on all)."""
        return int(np.sum(self.escalated))

    def message(self, i: int) -> str:
        """The scipy-style message for fit ``i``."""
        return st.message(int(host_array(self.status)[i]))

    def status_counts(self) -> dict[int, int]:
        """``{status code: number of fits}`` (host-side).

        Example:
            >>> import jax.numpy as jnp
            >>> from adaptprec.batch import BatchResult
            >>> z = jnp.zeros(3)
            >>> BatchResult(z[:, None], z, jnp.array([2, 2, 0]), z > 0, z, z, z, z, z, None,
            ...             ("f64",)).status_counts()
            {0: 1, 2: 2}
        """
        codes, counts = np.unique(host_array(self.status), return_counts=True)
        return {int(c): int(k) for c, k in zip(codes, counts)}
