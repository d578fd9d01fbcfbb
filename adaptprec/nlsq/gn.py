"""Damped Gauss–Newton step.

The Gauss–Newton step ``p = -J^+ f`` (minimum-norm least-squares solution by SVD of the
``n x n`` factor ``R D^-1``, with scipy's rank threshold) is damped by a step length
``t = min(1, Delta / ||D p||)``; ``Delta`` shrinks when a step does not reduce the cost
and grows again after good steps, so the radius acts as a backtracking line search along
the fixed Gauss–Newton direction (no Levenberg–Marquardt regularisation).

Example:
    >>> import jax.numpy as jnp
    >>> from adaptprec.nlsq.gn import gn_step
    >>> st = gn_step(jnp.zeros(2), 2.0 * jnp.eye(2), jnp.array([-2.0, 4.0]), jnp.ones(2),
    ...              0.5, 0.0, m=2)
    >>> [float(v) for v in st.x_new]       # full step (1, -2) damped to length 0.5
    [0.22360679774997896, -0.4472135954999579]
"""

from __future__ import annotations

import jax.numpy as jnp

from .lm import Step, predicted_reduction

__all__ = ["gn_step"]


def gn_step(x, R, qtf, scale_inv, Delta, alpha, *, m: int) -> Step:
    """One damped Gauss–Newton step from the factored model ``(R, qtf)``."""
    d = 1.0 / scale_inv
    U, s, VT = jnp.linalg.svd(R * d[None, :], full_matrices=False)
    uf = U.T @ qtf
    n = s.shape[0]
    keep = s > jnp.finfo(s.dtype).eps * jnp.maximum(m, n) * s[0]  # m may be traced
    y = jnp.where(keep, -uf / jnp.where(keep, s, 1.0), 0.0)
    full = jnp.linalg.norm(y)
    t = jnp.minimum(1.0, Delta / jnp.where(full > 0, full, 1.0))
    y = t * y
    pred = predicted_reduction(s, s * uf, y)
    p_h = VT.T @ y
    return Step(x + d * p_h, pred, t * full, t < 1.0, jnp.zeros_like(alpha), s)
