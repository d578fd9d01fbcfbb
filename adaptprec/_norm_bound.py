"""A first-order error bound carried as a few numbers per value: the normwise check.

The first-order walk of :mod:`adaptprec._first_order` keeps an error bound per *entry*,
which doubles or triples the work of a loop whose body is cheap (a stencil sweep, a
quadrature step). This walk keeps, for every floating value ``y``, three scalars: ``M``,
a bound on ``max|y|``, and the bound on ``max|error(y)|`` in two parts,
:class:`ErrorBound` ``(D, R)``:

* ``D`` bounds the *deterministic* part: the propagated input errors, the transcendental
  functions' own errors (not correctly rounded: no model of their sign), the measured
  roundings of sums;
* ``R`` bounds the *rounding* part under Higham & Mary's model (each correctly rounded
  operation ``fl(a op b) = (a op b)(1 + delta)``, ``|delta| <= u``, the deltas mean-zero
  and independent of the ones before): to first order an entry's rounding error is
  ``sum_k c_k delta_k``, and ``R`` bounds ``sqrt(sum_k (c_k u |y_k|)^2)`` over the
  entries. A new rounding adds in quadrature (``R' = hypot(R, u My)``); errors that may
  share their roundings (two operands of one sum) add linearly (the triangle inequality
  of the 2-norm), so ``R`` never assumes independence it cannot see.

The rules, written in norms:

* ``y = a +- b``: ``E = Ea + Eb``, rounding ``u My``, ``My = Ma + Mb``;
* ``y = a b``: ``E = Mb Ea + Ma Eb``, plus ``|Ea| |Eb|`` (second order, into ``D``),
  rounding ``u My``, ``My = Ma Mb``;
* ``y = a / b``, ``sqrt``, ``log``, ``exp`` and other transcendentals: the largest
  ``|f'|`` over the values (one pass over them), plus ``c u My`` (``c`` = 2 for
  transcendentals, into ``D``); ``sin``/``cos``/``tanh``/``erf``/``logistic``: ``|f'|``
  and ``|y|`` bounded by constants (no pass);
* data movement, ``max``/``min``, selects, scatters: the larger of the operands' bounds;
* a sum over ``n`` entries: ``n Ex`` (``sqrt(n) Ex`` into ``R`` where each entry's errors
  are its own) plus the sum's own rounding, measured below the top rung (``|y -
  sum_wide(x)|``, one pass) or ``sqrt(n) u n Mx`` on the top rung; contractions: ``k (Ma
  Eb + Mb Ea + Ea Eb) + sqrt(k) u k Ma Mb``;
* loops carry ``(D, R, M)`` with their values, so a loop costs its own body plus a few
  scalar operations per iteration, and the roundings of successive iterations add in
  quadrature; comparisons count as unstable where operands are within their bounds (one
  pass), a ``while`` loop's exit test included.

The estimate is ``(D + lambda R) / max|y|`` per output, ``lambda = sqrt(2 ln(2 N /
FAILURE))`` for an output of ``N`` entries: by the Azuma-Hoeffding inequality each
entry's rounding error exceeds ``lambda R`` with probability at most ``FAILURE / N``, so
the bound holds for the whole output with probability at least ``1 - FAILURE`` (the
concentration argument of Higham & Mary, "A new approach to probabilistic rounding error
analysis", SIAM J. Sci. Comput. 41(5), 2019). It is a first-order bound of the *normwise*
relative error, looser than the per-entry walk (the largest derivative and value of an
array stand for every entry), and blind to which entry is wrong: it cannot check
componentwise. Unsupported (:class:`~adaptprec._first_order.Unsupported`):
convolutions, ``argmax``, sorting, float-to-integer casts of inexact values, and any
primitive outside the tables below.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from . import _jaxpr as jx
from ._first_order import (_INPUT_TAG, SUM_FAILURE, Unsupported, _wider,
                           trace_with_originals)
from ._reductions import count_where, materialized, nan_to_inf
from .precision import unit_roundoff as _u

__all__ = ["norm_bound", "NormBoundResult", "ErrorBound", "FAILURE"]

#: The probability that a bound on an output (or an operand of a comparison) fails
#: under the rounding model: the same as the per-entry walk's probabilistic sums.
FAILURE = SUM_FAILURE

_MOVE = frozenset(
    "reshape transpose broadcast_in_dim slice squeeze expand_dims rev copy copy_p "
    "dynamic_slice gather sharding_constraint optimization_barrier concatenate stack pad "
    "dynamic_update_slice scatter select_n max min clamp neg abs stop_gradient real "
    "reduce_max reduce_min".split())
_COMPARE = frozenset("eq ne lt le gt ge".split())
#: |f'| <= D and |f| <= F for every argument: no pass over the values
_BOUNDED = {"sin": (1.0, 1.0), "cos": (1.0, 1.0), "tanh": (1.0, 1.0),
            "logistic": (0.25, 1.0), "erf": (2 / math.sqrt(math.pi), 1.0)}
_PASS_UNARY = frozenset("exp exp2 expm1 log log1p sqrt rsqrt cbrt atan asinh".split())


def _is_float(dtype) -> bool:
    return dtype is not None and jnp.issubdtype(dtype, jnp.floating)


def confidence(size: int) -> float:
    """``lambda``: a sum of mean-independent terms bounded by ``b_k`` exceeds ``lambda
    sqrt(sum b_k^2)`` with probability at most ``2 exp(-lambda^2 / 2)`` (Azuma-Hoeffding),
    ``FAILURE / size`` here, so ``size`` entries all hold with ``1 - FAILURE``."""
    return math.sqrt(2.0 * math.log(2.0 * max(int(size), 1) / FAILURE))


class ErrorBound(NamedTuple):
    """A bound on ``max|error|`` of an array: ``d`` deterministic, ``r`` the 2-norm of the
    bounds of its rounding terms (module docstring); scalars."""
    d: jax.Array
    r: jax.Array

    def total(self, size: int) -> jax.Array:
        """``d + lambda r``: holds for ``size`` entries with probability ``1 - FAILURE``."""
        return self.d + confidence(size) * self.r

    def times(self, c) -> ErrorBound:
        return ErrorBound(c * self.d, c * self.r)

    def rounded(self, x) -> ErrorBound:
        """Plus one more rounding of at most ``x``, independent of the ones before
        (``hypot``: no underflow of the squares at tiny magnitudes)."""
        return ErrorBound(self.d, jnp.hypot(self.r, x))

    def plus(self, x) -> ErrorBound:
        """Plus a deterministic ``x``."""
        return ErrorBound(self.d + x, self.r)


def _add(*errs) -> ErrorBound | None:
    """The bound of a sum of errors (each ``None``: exact): both parts add linearly."""
    errs = [e for e in errs if e is not None]
    if not errs:
        return None
    return ErrorBound(sum(e.d for e in errs[1:]) + errs[0].d,
                      sum(e.r for e in errs[1:]) + errs[0].r)


def _size(v) -> int:
    return int(np.prod(jnp.shape(v)))


class NormBoundResult:
    """Outputs (flat, ``tree`` their structure), each one's :class:`ErrorBound` (``None``:
    exact) and the number of unstable decisions."""

    def __init__(self, outs, errs, unstable, tree):
        self.outs, self.errs, self.unstable, self.tree = outs, errs, unstable, tree

    def relative(self, floor: float = 0.0) -> jax.Array:
        """The largest ``(D + lambda R) / (max|y| + floor)`` over the floating outputs
        (float32; ``inf`` for NaN); ``floor`` is ``atol / rtol``. Each output's bound holds
        with probability ``1 - FAILURE`` under the rounding model."""
        est = jnp.float32(0)
        for v, err in zip(self.outs, self.errs):
            if err is None or not _is_float(jnp.result_type(v)):
                continue
            e = err.total(_size(v))
            top = materialized(lambda v: jnp.max(nan_to_inf(jnp.abs(
                v.astype(e.dtype))), initial=0.0), v) if jnp.ndim(v) else jnp.abs(v)
            est = jnp.maximum(est, jnp.where(e == 0, 0.0, e / (top + floor))
                              .astype(jnp.float32))
        return jnp.where(jnp.isnan(est), jnp.inf, est)


class _Walk:
    def __init__(self, rung):
        self.rung = np.dtype(rung)
        self.w = np.dtype(jnp.promote_types(self.rung, jnp.float32))
        self.unstable: list = []

    def s(self, x):
        """A bound as a scalar of the bound dtype."""
        return jnp.asarray(x, self.w)

    def mag(self, v, m):
        """``M``: the given bound, else ``max|v|`` (a scalar's own magnitude)."""
        if m is not None:
            return m
        v = jnp.asarray(v)
        if v.ndim == 0:
            return jnp.abs(v).astype(self.w)
        return materialized(lambda v: jnp.max(nan_to_inf(jnp.abs(v.astype(self.w))),
                                              initial=0.0), v)

    def run(self, jaxpr, consts, vals, tags=None):
        """``vals``: ``(value, E, M)`` per input (``E`` an :class:`ErrorBound`, ``None``:
        exact); returns the
        outputs' triples (their own-error tags in ``self.out_tags``). ``tags``: per
        input, the index map of errors private to each entry (as
        :class:`adaptprec._first_order._Own`), ``None`` when shared."""
        env: dict = {}
        tag_of: dict = {}

        def read(atom):
            if isinstance(atom, jx.Literal):
                return (jx.literal_value(atom), None, None)
            return env[atom]

        def tag(atom):
            return False if isinstance(atom, jx.Literal) else tag_of.get(atom)

        for var, c in zip(jaxpr.constvars, consts):
            env[var], tag_of[var] = (c, None, None), False
        for var, t, g in zip(jaxpr.invars, vals, tags or [None] * len(vals)):
            env[var], tag_of[var] = t, (False if t[1] is None else g)
        for eqn in jaxpr.eqns:
            ins = [read(a) for a in eqn.invars]
            self.in_tags = [tag(a) for a in eqn.invars]
            in_tags = self.in_tags
            outs = self.step(eqn, ins)
            out_tags = self._tags(eqn, ins, in_tags, outs)
            for var, t, g in zip(eqn.outvars, outs, out_tags):
                env[var], tag_of[var] = t, (False if t[1] is None else g)
        self.out_tags = [tag(a) for a in jaxpr.outvars]
        return [read(a) for a in jaxpr.outvars]

    def _tags(self, eqn, ins, in_tags, outs):
        """The outputs' own-error tags (:mod:`adaptprec._first_order`'s rules)."""
        from ._first_order import _OWN_MOVES, _OWN_OPS, _OWN_SAME
        name = eqn.primitive.name
        if jx.call_body(eqn, remat=True, custom=True) is not None:
            return self.out_tags
        inexact = [g for g, t in zip(in_tags, ins) if t[1] is not None]
        if len(outs) != 1 or not inexact or any(g is None or g is False for g in inexact) \
                or len(set(map(id, inexact))) > 1:
            return [None] * len(outs)
        shape = jnp.shape(outs[0][0])
        if name in _OWN_SAME or (name in _OWN_OPS and all(
                jnp.shape(t[0]) == shape for t in ins if t[1] is not None)):
            return [inexact[0]]
        if name in _OWN_MOVES:
            return [object()]
        return [None]

    def step(self, eqn, ins):
        name = eqn.primitive.name
        body = jx.call_body(eqn, remat=True, custom=True)
        if body is not None:
            return self.run(body[0], body[1], ins, self.in_tags)
        if name in ("scan", "while", "cond"):
            return getattr(self, "p_" + name)(eqn, ins)
        if jx.has_sub_jaxpr(eqn):
            raise Unsupported(name)
        vals = [t[0] for t in ins]
        outs = jx.bind(eqn, vals)
        floats = [i for i, v in enumerate(vals) if _is_float(jnp.result_type(v))]
        exact = all(ins[i][1] is None for i in floats)
        if not any(_is_float(jnp.result_type(o)) for o in outs):
            # integer arithmetic is exact; a decision on inexact floats may flip
            if name in _COMPARE and not exact:
                self.compare(*ins)
            elif not exact:
                raise Unsupported(f"{name} of an inexact value")
            return [(o, None, None) for o in outs]
        rule = getattr(self, "p_" + name.replace("-", "_"), None)
        if rule is not None:
            return rule(eqn, ins, outs)
        if name in _MOVE:
            return self.move(ins, outs)
        if name in _BOUNDED or name in _PASS_UNARY:
            return self.unary(eqn, ins, outs)
        raise Unsupported(name)

    # ------------------------------------------------------------------ rules
    def zero(self) -> ErrorBound:
        return ErrorBound(self.s(0), self.s(0))

    def one(self, y, e, m, c=1.0):
        """``(y, e + c u m, m)``: a result and its own correctly rounded operation (into
        ``R``)."""
        loc = self.s(c * _u(jnp.result_type(y))) * m
        return [(y, (self.zero() if e is None else e).rounded(loc), m)]

    def own(self, y, e, m, c=2.0):
        """``(y, e + c u m, m)``: a result and its own error, not a correct rounding (a
        transcendental function's: into ``D``)."""
        loc = self.s(c * _u(jnp.result_type(y))) * m
        return [(y, (self.zero() if e is None else e).plus(loc), m)]

    def total(self, t, size=None):
        """A triple's ``D + lambda R`` (0 when exact)."""
        v, e, _ = t
        return self.s(0) if e is None else e.total(_size(v) if size is None else size)

    def move(self, ins, outs):
        es = [t[1] for t in ins if t[1] is not None and _is_float(jnp.result_type(t[0]))]
        ms = [self.mag(t[0], t[2]) for t in ins if _is_float(jnp.result_type(t[0]))]
        e = None if not es else ErrorBound(jnp.max(jnp.stack([x.d for x in es])),
                                           jnp.max(jnp.stack([x.r for x in es])))
        m = jnp.max(jnp.stack(ms)) if ms else None
        return [(o, e, m) for o in outs]

    def p_add(self, eqn, ins, outs):
        (a, ea, ma), (b, eb, mb) = ins
        m = self.mag(a, ma) + self.mag(b, mb)
        return self.one(outs[0], _add(ea, eb), m)

    p_sub = p_add_any = p_add

    def p_mul(self, eqn, ins, outs):
        (a, ea, ma), (b, eb, mb) = ins
        ma, mb = self.mag(a, ma), self.mag(b, mb)
        e = _add(None if ea is None else ea.times(mb), None if eb is None else eb.times(ma))
        if ea is not None and eb is not None:
            size = _size(outs[0])
            e = e.plus(ea.total(size) * eb.total(size))
        return self.one(outs[0], e, ma * mb)

    def p_div(self, eqn, ins, outs):
        (a, ea, ma), (b, eb, mb) = ins
        low = jnp.asarray(b)
        low = (jnp.abs(low).astype(self.w) if low.ndim == 0 else materialized(
            lambda b: jnp.min(jnp.abs(b.astype(self.w)), initial=jnp.inf), low))
        if eb is not None:       # a divisor within its bound of zero: no digit is known
            tb = self.total(ins[1])
            low = jnp.where(tb >= low, 0.0, low - tb)
        m = self.mag(a, ma) / low
        e = _add(self.zero(), ea, None if eb is None else eb.times(m))
        e = ErrorBound(*(jnp.where(x == 0, 0.0, x / low) for x in e))
        return self.one(outs[0], e, m)

    def p_integer_pow(self, eqn, ins, outs):
        (x, e, m), n = ins[0], abs(eqn.params["y"])
        m = self.mag(x, m)
        if eqn.params["y"] < 0:
            raise Unsupported("integer_pow with a negative exponent")
        my = m ** n
        de = None if e is None else e.times(self.s(n) * m ** (n - 1))
        return self.one(outs[0], de, my, float(n))

    def p_square(self, eqn, ins, outs):
        (x, e, m), = ins
        m = self.mag(x, m)
        return self.one(outs[0], None if e is None else e.times(2 * m), m * m)

    def p_convert_element_type(self, eqn, ins, outs):
        (x, e, m), (y,) = ins[0], outs
        if not _is_float(jnp.result_type(x)):
            return [(y, None, self.mag(y, None))]
        m = self.mag(x, m)
        if jnp.finfo(y.dtype).nmant < jnp.finfo(jnp.result_type(x)).nmant:
            return self.one(y, e, m)
        return [(y, e, m)]

    def unary(self, eqn, ins, outs):
        """``y = f(x)``: ``|f'|`` and ``|y|`` from constants or one pass each."""
        name = eqn.primitive.name
        (x, e, _), (y,) = ins[0], outs
        if name in _BOUNDED:
            d, my = (self.s(c) for c in _BOUNDED[name])
        else:
            def deriv(x):
                t = jax.jvp(lambda v: jx.bind(eqn, [v] + [t[0] for t in ins[1:]])[0],
                            (x,), (jnp.ones_like(x),))[1]
                return jnp.max(nan_to_inf(jnp.abs(t.astype(self.w))), initial=0.0)
            d = materialized(deriv, jnp.asarray(x)) if jnp.ndim(x) else deriv(x)
            my = self.mag(y, None)
        return self.own(y, None if e is None else e.times(d), my, 2.0)

    def p_reduce_sum(self, eqn, ins, outs):
        (x, e, m), (y,) = ins[0], outs
        axes = eqn.params["axes"]
        n = int(np.prod([jnp.shape(x)[a] for a in axes])) if axes else 1
        m = self.mag(x, m)
        ref = _wider(y.dtype)
        if ref is not None:     # the sum's own rounding, measured
            acc = materialized(lambda x, y: jnp.max(jnp.abs(
                y.astype(ref) - jnp.sum(x.astype(ref), axis=axes)), initial=0.0)
                .astype(self.w), x, y)
        else:
            acc = self.s(math.sqrt(n) * _u(y.dtype) * n) * m
        if e is not None and self.in_tags[0]:
            # errors private to each summand: independent and mean-zero (roundings), so
            # both parts add in quadrature, as the per-entry walk's sums
            r = self.s(math.sqrt(n)) * (e.d + e.r)
            return [(y, ErrorBound(acc, r), n * m)]
        return [(y, (self.zero() if e is None else e.times(n)).plus(acc), n * m)]

    def p_cumsum(self, eqn, ins, outs):
        (x, e, m), (y,) = ins[0], outs
        n = jnp.shape(x)[eqn.params["axis"]]
        m = self.mag(x, m)
        acc = self.s(math.sqrt(n) * _u(y.dtype) * n) * m
        return [(y, (self.zero() if e is None else e.times(n)).plus(acc), n * m)]

    def p_dot_general(self, eqn, ins, outs):
        (a, ea, ma), (b, eb, mb) = ins
        (ca, _), _ = eqn.params["dimension_numbers"]
        k = int(np.prod([jnp.shape(a)[d] for d in ca])) if ca else 1
        ma, mb = self.mag(a, ma), self.mag(b, mb)
        acc = self.s(math.sqrt(k) * _u(outs[0].dtype) * k) * ma * mb
        e = _add(self.zero(), None if ea is None else ea.times(k * mb),
                 None if eb is None else eb.times(k * ma)).plus(acc)
        if ea is not None and eb is not None:
            size = _size(outs[0])
            e = e.plus(k * ea.total(size) * eb.total(size))
        return [(outs[0], e, k * ma * mb)]

    def compare(self, a, b):
        """A comparison decided within the operands' bounds is unstable (counted)."""
        (va, _, _), (vb, _, _) = a, b
        size = max(_size(va), _size(vb))
        bound = self.total(a, size) + self.total(b, size)
        self.unstable.append(count_where(
            lambda a, b: jnp.abs(jnp.asarray(a).astype(self.w)
                                 - jnp.asarray(b).astype(self.w)) <= bound, va, vb))

    # ------------------------------------------------------------------ loops
    def carried(self, t):
        """A loop operand's triple with ``E``/``M`` as scalars (floats; ``E`` 0 when
        exact, so a carry's structure is the same every iteration) or ``None``."""
        v, e, m = t
        if not _is_float(jnp.result_type(v)):
            return (v, None, None)
        e = self.zero() if e is None else ErrorBound(self.s(e.d), self.s(e.r))
        return (v, e, self.mag(v, m))

    def sub_walk(self, closed, ins):
        walk = _Walk(self.rung)
        res = walk.run(closed.jaxpr, closed.consts, ins)
        return res, sum(walk.unstable, jnp.float32(0))

    def p_scan(self, eqn, ins):
        p = eqn.params
        nc, ncar = p["num_consts"], p["num_carry"]
        # the bounds of loop-invariant values, once outside the loop
        consts = [self.carried(t) for t in ins[:nc]]
        xs = [self.carried(t) for t in ins[nc + ncar:]]

        def body(state, x):
            carry, count = state
            res, seen = self.sub_walk(p["jaxpr"], consts + list(carry) + [
                (xv, xe, xm) for xv, (_, xe, xm) in zip(x, xs)])
            ys = [r[0] for r in res[ncar:]]
            return ([self.carried(r) for r in res[:ncar]], count + seen), ys

        init = [self.carried(t) for t in ins[nc:nc + ncar]]
        (carry, count), ys = lax.scan(body, (init, jnp.float32(0)), [t[0] for t in xs],
                                      length=p["length"], reverse=p["reverse"],
                                      unroll=p["unroll"])
        if any(_is_float(jnp.result_type(y)) for y in ys):
            raise Unsupported("scan stacking floating outputs")
        self.unstable.append(count)
        return list(carry) + [(y, None, None) for y in ys]

    def p_while(self, eqn, ins):
        p = eqn.params
        cn, bn = p["cond_nconsts"], p["body_nconsts"]
        cc = [self.carried(t) for t in ins[:cn]]
        bc = [self.carried(t) for t in ins[cn:cn + bn]]

        def decide(carry):
            (pred,), seen = self.sub_walk(p["cond_jaxpr"], cc + list(carry))
            return pred[0], seen

        def body(state):
            carry, count = state
            _, entered = decide(carry)
            res, seen = self.sub_walk(p["body_jaxpr"], bc + list(carry))
            return [self.carried(r) for r in res], count + entered + seen

        carry, count = lax.while_loop(lambda s: decide(s[0])[0], body,
                                      ([self.carried(t) for t in ins[cn + bn:]],
                                       jnp.float32(0)))
        self.unstable.append(count + decide(carry)[1])
        return list(carry)

    def p_cond(self, eqn, ins):
        floats = [_is_float(np.dtype(v.aval.dtype)) for v in eqn.outvars]

        def make(closed):
            def run(ops):
                res, seen = self.sub_walk(closed, ops)
                return [self.carried(r) if f else (r[0], None, None)
                        for r, f in zip(res, floats)], seen
            return run

        ops = [self.carried(t) for t in ins[1:]]
        res, count = lax.switch(ins[0][0], [make(b) for b in eqn.params["branches"]], ops)
        self.unstable.append(count)
        return res


def norm_bound(fn: Callable, args: tuple, kwargs: dict, inputs: tuple | None,
               rung_dtype) -> NormBoundResult:
    """Walk ``fn(*args, **kwargs)`` (inputs at the rung) with normwise bounds.

    ``inputs = (args, kwargs)`` as the user passed them: a floating input wider than the
    rung starts with its rounding, ``u max|x|``. Raises
    :class:`~adaptprec._first_order.Unsupported`.
    """
    walk = _Walk(rung_dtype)
    closed, tree, dyn, originals = trace_with_originals(fn, args, kwargs, inputs)
    ins = []
    for x, o in zip(dyn, originals):
        x = lax.stop_gradient(x)
        m = walk.mag(x, None) if _is_float(x.dtype) else None
        rounded = _is_float(x.dtype) and _is_float(getattr(o, "dtype", None)) and \
            jnp.finfo(o.dtype).nmant > jnp.finfo(x.dtype).nmant
        ins.append((x, walk.zero().plus(walk.s(_u(x.dtype)) * m) if rounded else None, m))
    consts = [lax.stop_gradient(jnp.asarray(c)) for c in closed.consts]
    res = walk.run(closed.jaxpr, consts, ins, [_INPUT_TAG] * len(ins))
    return NormBoundResult([t[0] for t in res], [t[1] for t in res],
                           sum(walk.unstable, jnp.float32(0)), tree)
