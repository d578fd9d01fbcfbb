"""scipy's ``callback``: called on the host (an ``io_callback`` inside the loop, so also
under ``jit``/``vmap``) after every accepted step with an ``OptimizeResult``-like
``intermediate_result`` (``x``, ``nit``, ``nfev``, ``cost``), or with ``x`` alone when its
signature is not ``callback(intermediate_result)``. ``StopIteration`` ends the solve with
status ``-2`` (:attr:`adaptprec.Status.CALLBACK_STOP`), as in scipy.

Example:
    >>> import jax.numpy as jnp
    >>> import adaptprec as ap
    >>> seen = []
    >>> res = ap.solve_nlsq(lambda x: x - 2.0, jnp.zeros(1), precision="f64",
    ...                     callback=lambda intermediate_result: seen.append(
    ...                         float(intermediate_result.x[0])))
    >>> seen[-1] == float(res.x[0]) == 2.0
    True
"""

from __future__ import annotations

import functools
import inspect

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import io_callback

__all__ = ["IntermediateResult", "host_callback", "call_callback"]


class IntermediateResult(dict):
    """scipy's ``OptimizeResult`` in miniature: a dict with attribute access."""

    def __getattr__(self, name):
        try:
            return self[name]
        except KeyError as exc:
            raise AttributeError(name) from exc


def _wants_result(callback) -> bool:
    try:
        return set(inspect.signature(callback).parameters) == {"intermediate_result"}
    except (TypeError, ValueError):
        return False


@functools.lru_cache(maxsize=64)
def host_callback(callback):
    """The host function ``(x, nit, nfev, cost, accepted) -> stop`` for ``callback``."""
    wants = _wants_result(callback)

    def host(x, nit, nfev, cost, accepted):
        if not bool(accepted):
            return np.bool_(False)
        x = np.array(x)
        res = IntermediateResult(x=x, nit=int(nit), nfev=int(nfev), cost=float(cost))
        try:
            callback(intermediate_result=res) if wants else callback(x)
        except StopIteration:
            return np.bool_(True)
        return np.bool_(False)

    return host


def call_callback(callback, x, nit, nfev, cost, accepted):
    """Inside the loop: run ``callback`` on the host after an accepted step; returns the
    stop flag (a traced bool)."""
    return io_callback(host_callback(callback), jax.ShapeDtypeStruct((), jnp.bool_),
                       x, nit, nfev, cost, accepted, ordered=False)
