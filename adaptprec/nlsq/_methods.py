"""The method table: each trust-region method's step, gradient norm and initial radius
(the :class:`.solver.TrustRegion`'s step, ``gtol`` measure and first radius), and scipy's
per-method ``njev`` rule.

Example:
    >>> from adaptprec.nlsq._methods import method_fns
    >>> step_fn, gnorm_fn, delta0_fn = method_fns("lm", 10)
    >>> gnorm_fn.__name__, delta0_fn.__name__
    ('minpack_gnorm', 'minpack_delta0')
"""

from __future__ import annotations

import functools

import jax.numpy as jnp

from .dogbox import dogbox_delta0, dogbox_gnorm, dogbox_step
from .gn import gn_step
from .lm import lm_step, minpack_delta0, minpack_gnorm
from .trf import cl_scaling, trf_delta0, trf_lsmr_step, trf_step

__all__ = ["method_fns", "njev_is_none"]


def method_fns(method: str, m, tr=None):
    """``(step_fn, gnorm_fn, delta0_fn)`` for ``method`` (``m`` may be traced: the
    residual count of padded data is a program argument);
    ``tr`` is ``tr_solver="lsmr"``'s options (:func:`._lsmr.check_tr_options`), ``None``
    for the exact step."""
    if method == "trf":
        def step_fn(x, R, qtf, g, scale_inv, Delta, alpha, lb, ub):
            if tr is not None:
                return trf_lsmr_step(x, R, qtf, g, scale_inv, Delta, alpha, lb, ub, m=m,
                                     opts=tr)
            return trf_step(x, R, qtf, g, scale_inv, Delta, alpha, lb, ub, m=m)

        def gnorm_fn(x, g, R, fsn, lb, ub):
            v, _ = cl_scaling(x, g, lb, ub)
            return jnp.max(jnp.abs(g * v))

        return step_fn, gnorm_fn, trf_delta0
    if method == "dogbox":
        if tr is not None:
            return (functools.partial(dogbox_step, lsmr_opts=tr), dogbox_gnorm,
                    dogbox_delta0)
        return dogbox_step, dogbox_gnorm, dogbox_delta0
    inner = lm_step if method == "lm" else gn_step

    def step_fn(x, R, qtf, g, scale_inv, Delta, alpha, lb, ub):  # noqa: F811
        return inner(x, R, qtf, scale_inv, Delta, alpha, m=m)

    return step_fn, minpack_gnorm, minpack_delta0


def njev_is_none(opts) -> bool:
    """scipy's rule for ``njev``: ``None`` for ``method="lm"`` unless ``jac`` is the
    user's callable (MINPACK counts only "analytic" Jacobian evaluations). Here an
    autodiff (``"fwd"``/``"rev"``) or finite-difference Jacobian under ``lm`` gives
    ``None`` likewise."""
    return opts.method == "lm" and (isinstance(opts.jac, str) or
                                    getattr(opts.jac, "finite_diff", False))
