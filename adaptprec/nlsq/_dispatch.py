"""Which driver runs a solve: the one policy the entry points consult.

A call of :func:`adaptprec.solve_nlsq` (and so of :func:`adaptprec.curve_fit` and of
every start of ``starts=K``) is routed in this order:

1. **data source**: a :class:`~adaptprec.nlsq.Chunks` source, ``chunk_size=``, data
   sharded over a mesh, or host NumPy data of at least ``_stream.STREAM_MIN_POINTS``
   points goes to the streamed driver (:mod:`._stream`, :func:`._stream.wants_stream`);
2. **starts**: ``starts=K > 1`` runs :mod:`._multistart` (the starts on the batched
   engine, the plain solve and the polish back through ``solve_nlsq``);
3. **in memory**: :func:`choose_driver` below, after validation: the host driver
   (:mod:`._host`; a model solved repeatedly is promoted there to one whole-solve
   program, :mod:`._promote`) or the fused driver (:mod:`._fused`).

Example:
    >>> from adaptprec.nlsq._dispatch import choose_driver
    >>> choose_driver("fused", None, None, False)
    'fused'
"""

from __future__ import annotations

from ._host import host_eligible

__all__ = ["choose_driver", "DRIVERS"]

#: the values of ``solve_nlsq(driver=)``.
DRIVERS = ("auto", "host", "fused")


def choose_driver(driver: str, cfg, tr, throw: bool, *trees) -> str:
    """``"host"`` or ``"fused"`` for a validated in-memory solve (``cfg`` its
    :class:`._loop.LoopConfig`, ``tr`` the ``tr_solver="lsmr"`` options or ``None``,
    ``trees`` the solve's arrays: ``x0``, ``args``, bounds, ``f_scale``).

    ``"auto"`` takes the host driver whenever it can run the solve
    (:func:`._host.host_eligible`: eager, autodiff Jacobian, the QR model, no ``throw``,
    ``max_nfev``, ``callback`` or ``tr_solver="lsmr"``): small eager fits then compile
    nothing per residual but its evaluation. ``"host"`` insists (a ``ValueError`` saying
    what stands in the way), ``"fused"`` always compiles the whole solve.
    """
    if driver not in DRIVERS:
        raise ValueError(f"driver must be 'auto', 'host' or 'fused', got {driver!r}")
    if driver == "fused":
        return "fused"
    if tr is None and host_eligible(cfg, bool(throw), *trees):
        return "host"
    if driver == "host":
        raise ValueError("driver='host' needs an eager call (no tracers in x0, args, "
                         "bounds), jac='fwd'/'rev', the QR model (linear_solver='qr' "
                         "or fewer than 4096 residuals), throw=False, no max_nfev, "
                         "callback or tr_solver='lsmr' and a hashable loss and "
                         "schedule; use "
                         "driver='auto'")
    return "fused"
