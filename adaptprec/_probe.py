"""Matrix products checked by random probes (Freivalds' idea), at O(n^2) for O(n^3) work.

A kernel whose output is a *product expression* of its inputs -- matrix products
(``dot_general`` in matrix-matrix or matrix-vector form), sums and differences, scalings
by constants, transposes and casts, e.g. ``A^8`` by repeated squaring or ``A @ B + C`` --
can be applied to a few random vectors without forming any product: ``(A B) V =
A (B V)``. The check runs that re-associated expression in the widest dtype from the
user's inputs, ``Z = X V``, against the rung's answer times the same vectors,
``Y = X_rung V``: ``Y - Z = E V`` is the rung's actual error ``E`` (input casts and every
product's rounding) seen through ``V``. With ``V`` of random signs, ``(E V)_i`` has mean
square ``||E_i||_2^2`` (row ``i`` of the error), so

    estimate = SAFETY * max_i rms_p (E V)_ip / max_i ||X_rung,i||_2,

the largest row-wise relative error in the 2-norm. It is statistical (a sample of
``PROBES`` directions; the report says so), and normwise by rows: an error concentrated
in a few entries of a row counts with the row's norm. Depth costs: a product of ``d``
factors applies each factor to the probes once per path, ``2^depth`` matrix-vector
products for repeated squaring (8 for ``A^8``).

The structure is decided on the jaxpr (:func:`product_jaxpr`): only those primitives, a
single floating output of rank 1 or 2, constants as scale factors.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from . import _jaxpr as jx
from ._autocast.interpret import _is_dynamic, _trace
from ._reductions import materialized, nan_to_inf

__all__ = ["product_jaxpr", "probe_error", "PROBES", "SAFETY"]

#: random sign vectors per check, and the factor on the measured row error (the max over
#: rows of a 4-sample root mean square against the true row norm)
PROBES, SAFETY = 4, 2.0

_LINEAR = frozenset({"add", "sub", "neg", "convert_element_type", "transpose", "mul",
                     "div", "dot_general", "copy", "copy_p"})


class _NotProduct(Exception):
    pass


def _is_float(dtype) -> bool:
    return jnp.issubdtype(dtype, jnp.floating)


def _matmul_dims(eqn) -> bool:
    """A plain matrix-matrix or matrix-vector product (no batch dimensions)."""
    (ca, cb), (ba, bb) = eqn.params["dimension_numbers"]
    a, b = (v.aval for v in eqn.invars)
    return (not ba and not bb and a.ndim == 2 and b.ndim in (1, 2) and tuple(ca) == (1,)
            and tuple(cb) == (0,))


def product_jaxpr(closed) -> bool:
    """Whether the traced kernel ``closed`` is a product expression of its inputs (see
    the module docstring): one floating output of rank 1 or 2, built only from inputs,
    products, sums, constant scalings, transposes and casts."""
    if len(closed.out_avals) != 1:
        return False
    out = closed.out_avals[0]
    if not _is_float(out.dtype) or out.ndim not in (1, 2):
        return False
    try:
        _analyse(closed.jaxpr, [True] * len(closed.jaxpr.invars))
    except _NotProduct:
        return False
    return True


def _analyse(jaxpr, dyn) -> list:
    """Which values depend on the inputs (``True``); raises :class:`_NotProduct` on an
    operation a probe cannot re-associate."""
    env = {v: d for v, d in zip(jaxpr.invars, dyn)}

    def read(a):
        return False if isinstance(a, jx.Literal) else env.get(a, False)

    for eqn in jaxpr.eqns:
        ins = [read(a) for a in eqn.invars]
        body = jx.call_body(eqn, remat=True, custom=True)
        if body is not None:
            outs = _analyse(body[0], ins)
        elif not any(ins):
            outs = [False] * len(eqn.outvars)
        else:
            name = eqn.primitive.name
            if name not in _LINEAR:
                raise _NotProduct(name)
            if name == "dot_general" and not _matmul_dims(eqn):
                raise _NotProduct("dot_general with batch dimensions")
            if name in ("mul", "div") and (ins[1] if name == "div" else all(ins)):
                raise _NotProduct(f"{name} of two input-dependent values")
            if name in ("mul", "div") and any(
                    np.ndim(a.aval) for a, d in zip(eqn.invars, ins) if not d):
                raise _NotProduct(f"{name} by a non-scalar constant")
            if name in ("add", "sub") and not all(ins):
                raise _NotProduct("a constant added to a product")
            outs = [True] * len(eqn.outvars)
        for v, d in zip(eqn.outvars, outs):
            env[v] = d
    return [read(a) for a in jaxpr.outvars]


class _Expr:
    """The kernel's jaxpr as an expression that can be multiplied by probe matrices
    from the right (``rmul``) or the left (``lmul``) without forming its products."""

    def __init__(self, closed, inputs, ref):
        self.ref = ref
        self.inputs = set(closed.jaxpr.invars)
        self.defs = {}
        self.values = {}
        for v, x in zip(closed.jaxpr.invars, inputs):
            self.values[v] = jnp.asarray(x).astype(ref)
        for v, c in zip(closed.jaxpr.constvars, closed.consts):
            self.values[v] = jnp.asarray(c)
        self._index(closed.jaxpr, {})

    def _index(self, jaxpr, rename):
        for eqn in jaxpr.eqns:
            body = jx.call_body(eqn, remat=True, custom=True)
            if body is not None:
                inner = dict(zip(body[0].invars, [rename.get(a, a) for a in eqn.invars]))
                for v, c in zip(body[0].constvars, body[1]):
                    self.values[v] = jnp.asarray(c)
                self._index(body[0], inner)
                for o, i in zip(eqn.outvars, body[0].outvars):
                    self.defs[o] = ("alias", rename.get(i, inner.get(i, i)))
                    inner[o] = self.defs[o][1]
                continue
            ins = [a if isinstance(a, jx.Literal) else rename.get(a, a) for a in eqn.invars]
            self.defs[eqn.outvars[0]] = (eqn, ins)

    def scalar(self, a):
        if isinstance(a, jx.Literal):
            return jx.literal_value(a)
        return self.value(a)

    def value(self, v):
        """A constant (input-independent) operand, evaluated."""
        if v in self.values:
            return self.values[v]
        kind = self.defs[v]
        if kind[0] == "alias":
            return self.value(kind[1])
        eqn, ins = kind
        out = jx.bind(eqn, [self.scalar(a) for a in ins])[0]
        self.values[v] = out
        return out

    def rmul(self, v, m):
        """``X_v @ m`` (``m``: a matrix of probes, or a vector)."""
        if v in self.values and v not in self.defs:
            return jnp.matmul(self.values[v], m, precision=lax.Precision.HIGHEST)
        kind = self.defs[v]
        if kind[0] == "alias":
            return self.rmul(kind[1], m)
        eqn, ins = kind
        name = eqn.primitive.name
        if name == "dot_general":
            a, b = ins
            if eqn.invars[1].aval.ndim == 1:      # matrix @ vector: a column (m unused)
                return self.rmul(a, self.column(b))
            return self.rmul(a, self.rmul(b, m))
        if name in ("add", "sub"):
            x, y = self.rmul(ins[0], m), self.rmul(ins[1], m)
            return x + y if name == "add" else x - y
        if name == "neg":
            return -self.rmul(ins[0], m)
        if name in ("convert_element_type", "copy", "copy_p"):
            return self.rmul(ins[0], m)
        if name == "transpose":
            return self.lmul(m.T, ins[0]).T
        if name == "mul":
            dep = 0 if self._dependent(ins[0]) else 1
            return self.rmul(ins[dep], m) * self.scalar(ins[1 - dep])
        if name == "div":
            return self.rmul(ins[0], m) / self.scalar(ins[1])
        raise _NotProduct(name)

    def column(self, v):
        """The vector ``X_v`` itself (a matrix-vector product's right operand)."""
        if v in self.values and v not in self.defs:
            return self.values[v]
        kind = self.defs[v]
        if kind[0] == "alias":
            return self.column(kind[1])
        eqn, ins = kind
        if eqn.primitive.name == "dot_general":
            return self.rmul(ins[0], self.column(ins[1]))
        return jx.bind(eqn, [self.column(a) if not isinstance(a, jx.Literal)
                             and self._dependent(a) else self.scalar(a) for a in ins])[0]

    def lmul(self, m, v):
        """``m @ X_v``."""
        if v in self.values and v not in self.defs:
            return jnp.matmul(m, self.values[v], precision=lax.Precision.HIGHEST)
        kind = self.defs[v]
        if kind[0] == "alias":
            return self.lmul(m, kind[1])
        eqn, ins = kind
        name = eqn.primitive.name
        if name == "dot_general":
            return self.lmul(self.lmul(m, ins[0]), ins[1])
        if name in ("add", "sub"):
            x, y = self.lmul(m, ins[0]), self.lmul(m, ins[1])
            return x + y if name == "add" else x - y
        if name == "neg":
            return -self.lmul(m, ins[0])
        if name in ("convert_element_type", "copy", "copy_p"):
            return self.lmul(m, ins[0])
        if name == "transpose":
            return self.rmul(ins[0], m.T).T
        if name == "mul":
            dep = 0 if self._dependent(ins[0]) else 1
            return self.lmul(m, ins[dep]) * self.scalar(ins[1 - dep])
        if name == "div":
            return self.lmul(m, ins[0]) / self.scalar(ins[1])
        raise _NotProduct(name)

    def _dependent(self, a) -> bool:
        if isinstance(a, jx.Literal):
            return False
        if a in self.values and a not in self.defs:
            return a in self.inputs
        kind = self.defs.get(a)
        if kind is None:
            return False
        if kind[0] == "alias":
            return self._dependent(kind[1])
        return any(self._dependent(x) for x in kind[1])


def probe_error(fn: Callable, inputs: tuple, out, out_dtype, ref_dtype,
                seed: int = 0, floor: float = 0.0) -> jax.Array:
    """The check's estimate (module docstring) for the rung's output ``out`` (returned
    in ``out_dtype``) of the product expression ``fn`` on the user's ``inputs``
    (``(args, kwargs)``), re-associated in ``ref_dtype``. float32, ``inf`` for NaN.
    ``floor`` (``atol / rtol``) is added to every entry's magnitude."""
    args, kwargs = inputs
    leaves = [lax.stop_gradient(x) for x in jax.tree_util.tree_leaves((args, kwargs))
              if _is_dynamic(x)]
    closed = _trace(fn, args, kwargs)[0]
    expr = _Expr(closed, leaves, ref_dtype)
    (o,) = closed.jaxpr.outvars
    y = jnp.asarray(out).astype(out_dtype).astype(ref_dtype)
    if y.ndim == 1:     # a vector: its own entries, re-associated (no probe needed)
        z = expr.column(o)
        d = jnp.max(nan_to_inf(jnp.abs(y - z)))
        return jnp.asarray(jnp.where(d == 0, 0.0, d / (jnp.max(jnp.abs(z)) + floor)),
                           jnp.float32)
    n = y.shape[1]
    signs = jax.random.rademacher(jax.random.PRNGKey(seed), (n, PROBES), jnp.int8)
    v = signs.astype(ref_dtype)
    z = expr.rmul(o, v)
    ev = materialized(lambda y, v: jnp.matmul(y, v, precision=lax.Precision.HIGHEST), y, v) - z
    row_err = jnp.sqrt(jnp.mean(jnp.square(ev), axis=1))
    row_norm = jnp.sqrt(jnp.sum(jnp.square(y), axis=1))
    top = jnp.max(nan_to_inf(row_err))
    est = jnp.where(top == 0, 0.0, SAFETY * top / (jnp.max(row_norm) + floor * n ** 0.5))
    return jnp.where(jnp.isnan(est), jnp.inf, est).astype(jnp.float32)
