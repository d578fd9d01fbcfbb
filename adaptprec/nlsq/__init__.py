"""Nonlinear least squares with adaptive precision: :func:`solve_nlsq`, :func:`curve_fit`,
:class:`NLSQResult`.

One concept per module (docs/architecture.md, "One solve"): the boundary (``_inputs``,
``_residual``), the solver (``solver``: ``init``/``step``/``terminate``/``postprocess``;
its rules in ``_rules``; one algorithm per module as scipy's ``optimize/_lsq``: ``lm``,
``gn``, ``trf``, ``dogbox``; shared helpers in ``common``), the in-memory program
(``_programs``, every memo in ``_caches``), the streamed loop (``_stream``), and the entry
points ``solve`` (whose ``route`` is the decision tree) and ``curve_fit``.

Example:
    >>> import jax.numpy as jnp
    >>> from adaptprec import nlsq
    >>> res = nlsq.solve_nlsq(lambda x: jnp.array([x[0] - 1.0, x[0] + 1.0]), jnp.ones(1))
    >>> round(abs(float(res.x[0])), 8), round(float(res.cost), 12)
    (0.0, 1.0)
"""

from .common import LOSSES, STATUS_MESSAGES, Status, covariance
from .result import ESCALATION_REASONS, NLSQResult
from ._arguments import OptionNotOffered, resolve_ladder
from .solve import cache_info, clear_cache, solve_nlsq
from .curve_fit import OptimizeWarning, curve_fit
from ._stream import Chunks


def __getattr__(name):
    # optimistix is imported only by its adapter, and only when asked for (import cost).
    if name == "MoreLM":
        from .optx_solver import MoreLM
        return MoreLM
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["solve_nlsq", "curve_fit", "Chunks", "MoreLM", "OptimizeWarning",
           "OptionNotOffered", "NLSQResult", "Status", "STATUS_MESSAGES", "LOSSES",
           "ESCALATION_REASONS", "covariance", "cache_info", "clear_cache",
           "resolve_ladder"]
