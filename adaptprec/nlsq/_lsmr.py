"""``tr_solver="lsmr"``: scipy's ``tr_options`` and the 2-D trust-region subproblem of
scipy's ``trf``/``dogbox`` lsmr variants; the LSMR iteration itself is
:func:`adaptprec.linalg._lsmr.lsmr`.

How the trust-region methods use it (as scipy): ``trf`` solves the regularised
least-squares problem ``min ||[J_h; diag(diag_h + reg)^(1/2)] p - [f; 0]||`` (plus the
user's ``damp``) by LSMR, then minimises the quadratic model over the 2-D subspace
spanned by the scaled gradient and that LSMR direction (:func:`solve_trust_region_2d`);
``dogbox`` takes LSMR's Gauss-Newton step over the free variables for its dogleg.

The operator LSMR iterates on is the factored model the solver's loop keeps: ``R``
(``R^T R = J^T J``) and ``qtf`` (``R^T qtf = J^T f``), which define the same
least-squares problem as ``(J, f)``. The step is therefore scipy's lsmr step, but the
Jacobian is still formed and QR-factored by the loop: ``tr_solver="lsmr"`` gives scipy's
iterates, not scipy's memory saving for very large sparse problems (for those, use
``linear_solver="normal"``).

Example:
    >>> from adaptprec.nlsq._lsmr import check_tr_options
    >>> dict(check_tr_options({"atol": 1e-8}, "dogbox"))["atol"]
    1e-08
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

__all__ = ["solve_trust_region_2d", "LSMR_DEFAULTS", "check_tr_options",
           "tr_solver_options"]

#: scipy's ``lsmr`` defaults (``maxiter=None`` means ``min(m, n)``).
LSMR_DEFAULTS = {"damp": 0.0, "atol": 1e-6, "btol": 1e-6, "conlim": 1e8, "maxiter": None}


def check_tr_options(tr_options, method: str):
    """scipy's ``tr_options`` for ``tr_solver="lsmr"`` as a hashable, sorted tuple of
    ``(key, value)``: ``regularize`` (``trf`` only; dropped with a warning for
    ``dogbox`` as scipy does) and ``lsmr``'s ``damp``, ``atol``, ``btol``, ``conlim``,
    ``maxiter``. An unknown key raises ``TypeError`` (scipy's ``lsmr`` does);
    ``show=True`` (printing) and ``x0`` are not offered.

    Example:
        >>> from adaptprec.nlsq._lsmr import check_tr_options
        >>> check_tr_options({"btol": 1e-10}, "trf")
        (('atol', 1e-06), ('btol', 1e-10), ('conlim', 100000000.0), ('damp', 0.0), ('maxiter', None), ('regularize', True))
    """
    import warnings

    from ._arguments import OptionNotOffered

    opts = dict(tr_options or {})
    if method == "dogbox" and "regularize" in opts:
        warnings.warn("The keyword 'regularize' in `tr_options` is not relevant for "
                      "'dogbox' method.", UserWarning, stacklevel=4)
        del opts["regularize"]
    if opts.pop("show", False):
        raise OptionNotOffered("tr_options show=True (printing LSMR's iterations) is not "
                               "offered; the solver reports through res.message/res.nfev.")
    if opts.pop("x0", None) is not None:
        raise OptionNotOffered("tr_options x0 (LSMR's starting point) is not offered; "
                               "LSMR starts from 0 at every step, as scipy's trf does.")
    out = dict(LSMR_DEFAULTS)
    if method == "trf":
        out["regularize"] = bool(opts.pop("regularize", True))
    for k, v in opts.items():
        if k not in LSMR_DEFAULTS:
            raise TypeError(f"lsmr() got an unexpected keyword argument {k!r} (in "
                            f"tr_options); the keys are {sorted(LSMR_DEFAULTS)} and, for "
                            "trf, 'regularize'.")
        if k == "maxiter":
            out[k] = None if v is None else int(v)
        else:
            out[k] = float(v)
    return tuple(sorted(out.items()))


def solve_trust_region_2d(B, g, Delta):
    """``min 0.5 p^T B p + g^T p`` subject to ``||p|| <= Delta`` in two dimensions
    (scipy's ``solve_trust_region_2d``): the Newton step if ``B`` is positive definite
    and the step is inside; otherwise the best point on the circle, from the real roots
    of scipy's quartic in ``t = tan(phi / 2)`` (every candidate is a point on the
    circle, so the minimum over them is feasible even when the roots are inexact).

    Example:
        >>> import jax.numpy as jnp
        >>> from adaptprec.nlsq._lsmr import solve_trust_region_2d
        >>> p = solve_trust_region_2d(jnp.eye(2), jnp.array([-3.0, 0.0]), 1.0)
        >>> [round(float(v), 8) for v in p]
        [1.0, 0.0]
    """
    B = jnp.asarray(B)
    g = jnp.asarray(g)
    det = B[0, 0] * B[1, 1] - B[0, 1] * B[1, 0]
    pd = (B[0, 0] > 0) & (det > 0)
    safe_det = jnp.where(pd, det, 1.0)
    p_newton = -jnp.array([B[1, 1] * g[0] - B[0, 1] * g[1],
                           -B[1, 0] * g[0] + B[0, 0] * g[1]]) / safe_det
    inside = pd & (jnp.dot(p_newton, p_newton) <= Delta ** 2)
    a = B[0, 0] * Delta ** 2
    b = B[0, 1] * Delta ** 2
    c = B[1, 1] * Delta ** 2
    d = g[0] * Delta
    f = g[1] * Delta
    coeffs = jnp.stack([-b + d, 2 * (a - c + f), 6 * b, 2 * (-a + c + f), -b - d])
    # the quartic's roots, and the cubic's for a vanishing leading coefficient (np.roots
    # strips it); a zero leading coefficient is replaced by 1 (its roots are then
    # only extra candidates)
    quart = coeffs.at[0].set(jnp.where(coeffs[0] != 0, coeffs[0], 1.0))
    cub = coeffs[1:].at[0].set(jnp.where(coeffs[1] != 0, coeffs[1], 1.0))
    t = jnp.real(jnp.concatenate([jnp.roots(quart, strip_zeros=False),
                                  jnp.roots(cub, strip_zeros=False)]))
    t = jnp.where(jnp.isfinite(t), t, 0.0)
    # extra candidates on the circle: t = inf's point (0, -1), and a coarse ring so a
    # degenerate polynomial still leaves a feasible minimum
    ring = jnp.tan(0.5 * jnp.linspace(-np.pi, np.pi, 33)[1:-1])
    t = jnp.concatenate([t, ring.astype(t.dtype)])
    P = Delta * jnp.stack([2 * t / (1 + t ** 2), (1 - t ** 2) / (1 + t ** 2)])
    P = jnp.concatenate([P, jnp.array([[0.0], [-1.0]], P.dtype) * Delta], axis=1)
    value = 0.5 * jnp.sum(P * (B @ P), axis=0) + g @ P
    p_circle = P[:, jnp.argmin(value)]
    return jnp.where(inside, p_newton, p_circle)


def tr_solver_options(tr_solver, tr_options, method: str, host_kind):
    """scipy's ``tr_solver``/``tr_options``: ``None`` (exact step) or the lsmr options.

    ``tr_solver=None`` is ``"exact"`` unless the Jacobian is sparse (``host_kind``: ``jac``
    returns a sparse matrix or a ``LinearOperator``, or finite differences with
    ``jac_sparsity``): then ``"lsmr"``, as scipy chooses; ``tr_options`` with the exact
    solver are ignored with a warning (scipy ignores them silently), and ``lm``/``gn``
    ignore ``tr_solver`` with a warning (scipy's ``lm`` ignores it silently)."""
    import warnings

    if tr_solver is None:
        tr_solver = "lsmr" if host_kind is not None else "exact"
    if method in ("lm", "gn"):
        if tr_solver == "lsmr" or tr_options:
            warnings.warn(f"tr_solver / tr_options have no effect with method={method!r} "
                          "(its step is MINPACK's exact one); use method='trf' or "
                          "'dogbox' for tr_solver='lsmr'.", UserWarning, stacklevel=4)
        return None
    if tr_solver == "exact":
        if tr_options:
            warnings.warn("tr_options are ignored with tr_solver='exact' (they are "
                          "LSMR's options); pass tr_solver='lsmr' to use them.",
                          UserWarning, stacklevel=4)
        return None
    return check_tr_options(tr_options, method)
