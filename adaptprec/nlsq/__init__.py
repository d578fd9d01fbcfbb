"""Nonlinear least squares with adaptive precision: :func:`solve_nlsq`, :func:`curve_fit`,
:class:`NLSQResult`.

One concept per module, in layers that import only upwards (docs/architecture.md,
"Layers" and "One solve"): inputs (``_inputs``, ``_ladder``, ``common``: losses, status
codes, trust-region subproblem, covariance; ``result``), problem (``_residual``,
``_evaluation`` and the data behind it: ``_buckets``, ``_chunks``, ``_sharded``), step
(``_loop``, ``_methods`` and one algorithm per module, as scipy's ``optimize/_lsq``:
``lm``, ``gn``, ``trf``, ``dogbox``), drivers (``_fused``, ``_host``, ``_promote``,
``_stream``), and the entry points ``solve``, ``curve_fit`` and ``_multistart``, which
pick a driver with ``_dispatch.choose_driver``.

Example:
    >>> import jax.numpy as jnp
    >>> from adaptprec import nlsq
    >>> res = nlsq.solve_nlsq(lambda x: jnp.array([x[0] - 1.0, x[0] + 1.0]), jnp.ones(1))
    >>> round(abs(float(res.x[0])), 8), round(float(res.cost), 12)
    (0.0, 1.0)
"""

from .common import LOSSES, STATUS_MESSAGES, Status, covariance_from_jac
from .result import ESCALATION_REASONS, NLSQResult
from .solve import cache_info, clear_cache, resolve_ladder, solve_nlsq
from .curve_fit import OptimizeWarning, curve_fit
from ._inputs import OptionNotOffered
from ._stream import Chunks


def __getattr__(name):
    # optimistix is imported only by its adapter, and only when asked for (import cost).
    if name == "MoreLM":
        from .optx_solver import MoreLM
        return MoreLM
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["solve_nlsq", "curve_fit", "Chunks", "MoreLM", "OptimizeWarning", "OptionNotOffered", "NLSQResult", "Status", "STATUS_MESSAGES", "LOSSES",
           "ESCALATION_REASONS", "covariance_from_jac", "cache_info", "clear_cache",
           "resolve_ladder"]
