"""The first-order error walk through contractions: ``dot_general`` and convolutions.

Cauchy-Schwarz per output entry, ``(|A| |B|)_ij <= ||A_i|| ||B_j||``, so the bound costs
O(n^2) for O(n^3) work (row and column norms, an outer product); a convolution bounds
each output's input patch by the input's largest entry. An input's rounding
(``_first_order._Rel``, ``u |x|``) takes its norms from the values' (no pass over an
error array). Mixed into the walk of :mod:`adaptprec._first_order` (``ProductRules``):
``self.edt``, ``self.local``, ``self.Rel`` and ``self.Unsupported`` are the walk's.
"""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np

from ._reductions import materialized
from .precision import unit_roundoff as _u

__all__ = ["ProductRules"]


def _is_float(dtype) -> bool:
    return dtype is not None and jnp.issubdtype(dtype, jnp.floating)


class ProductRules:
    """``dot_general`` and ``conv_general_dilated`` for the first-order walk."""

    def p_dot_general(self, eqn, vals, errs, outs):
        (a, b), (ea, eb), (y,) = vals, errs, outs
        if not _is_float(y.dtype):
            return [(y, None)]
        (ca, cb), (ba, bb) = eqn.params["dimension_numbers"]
        w = self.edt(y.dtype)
        k = int(np.prod([a.shape[d] for d in ca])) if ca else 1

        def norms(m, contract, batch):
            free = [d for d in range(m.ndim) if d not in contract and d not in batch]
            kept = [d for d in range(m.ndim) if d not in contract]
            # reduce in place (no transpose of the big operand), then order the small
            # result as (batch..., free...)
            n = materialized(lambda m: jnp.sqrt(jnp.sum(jnp.square(m.astype(w)),
                                                        axis=tuple(contract))), m)
            order = [kept.index(d) for d in tuple(batch) + tuple(free)]
            if order != sorted(order):
                n = jnp.transpose(n, order)
            return n, len(batch), len(free)

        def outer(na, nb_):
            (x, nbat, nfa), (z, _, nfb) = na, nb_
            x = x.reshape(x.shape + (1,) * nfb)
            z = z.reshape(z.shape[:nbat] + (1,) * nfa + z.shape[nbat:])
            return x * z

        na, nbn = norms(a, ca, ba), norms(b, cb, bb)

        def err_norms(e, base, m, contract, batch):
            if isinstance(e, self.Rel):        # ||scale |m|_i|| = scale ||m_i||
                return (base[0] * base[0].dtype.type(e.scale),) + base[1:]
            return norms(e, contract, batch)

        e = outer(na, nbn) * w.type(math.sqrt(k) * _u(y.dtype)) + self.local(y)
        nea = err_norms(ea, na, a, ca, ba) if ea is not None else None
        neb = err_norms(eb, nbn, b, cb, bb) if eb is not None else None
        if nea is not None:
            e = e + outer(nea, nbn)
        if neb is not None:
            e = e + outer(na, neb)
        if nea is not None and neb is not None:
            e = e + outer(nea, neb)
        return [(y, e.reshape(y.shape))]

    def p_conv_general_dilated(self, eqn, vals, errs, outs):
        """Cauchy-Schwarz per output: ||patch|| * ||kernel_o||, with ``||patch|| <=
        sqrt(window * in_channels) * max|x|`` (one max over the input; patch norms by a
        convolution of x^2 cost about as much as the convolution on XLA:CPU)."""
        (x, k), (ex, ek), (y,) = vals, errs, outs
        p = eqn.params
        if p["feature_group_count"] != 1 or p["batch_group_count"] != 1:
            raise self.Unsupported("grouped convolution")
        dn = p["dimension_numbers"]
        w = self.edt(y.dtype)
        rhs_spec, out_spec = dn.rhs_spec, dn.out_spec     # (O, I, spatial...) positions
        o_dim = rhs_spec[0]

        kk = int(np.prod(k.shape)) // k.shape[o_dim]

        def patch_norm(m):
            mx = materialized(lambda m: jnp.max(jnp.abs(m.astype(w)), initial=0.0), m)
            return mx * w.type(math.sqrt(kk))

        def kern_norm(m):
            m = m.astype(w)
            axes = tuple(d for d in range(m.ndim) if d != o_dim)
            n = jnp.sqrt(jnp.sum(m * m, axis=axes))          # (O,)
            shape = [1] * y.ndim
            shape[out_spec[1]] = n.shape[0]
            return n.reshape(shape)

        px, nk = patch_norm(x), kern_norm(k)
        e = px * nk * w.type(math.sqrt(kk) * _u(y.dtype)) + self.local(y)
        pex = nek = None
        if ex is not None:
            pex = px * w.type(ex.scale) if isinstance(ex, self.Rel) else patch_norm(ex)
            e = e + pex * nk
        if ek is not None:
            nek = nk * w.type(ek.scale) if isinstance(ek, self.Rel) else kern_norm(ek)
            e = e + px * nek
        if pex is not None and nek is not None:
            e = e + pex * nek
        return [(y, jnp.broadcast_to(e, y.shape))]
