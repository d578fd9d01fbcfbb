"""First-order rounding-error bounds at the working precision (no wider dtype).

Private engine of the cheap accuracy checks chosen by the runtime's cost model
(:mod:`adaptprec._cost`). The function is traced to a jaxpr and walked once; every
floating value ``y`` carries an absolute error bound ``e(y)`` (same shape, at least
float32) propagated to first order, the running error analysis of Wilkinson and the
derivative-based propagation of ADAPT (Menon et al., SC'18) and CHEF-FP:

* entrywise op ``y = f(a, b)``: ``e(y) = |df/da| e(a) + |df/db| e(b) + c u |y|`` — the
  derivative terms by ``jax.jvp`` of the primitive (its tangent rule), with nonnegative
  tangents so nothing cancels (a worst case, not a random sample); ``c`` is 1 for the
  basic operations, 2 for transcendentals (their implementations are within ~2 ulp);
  ``sin``/``cos``: ``e(x) + 4u`` absolute (their values and derivatives are at most 1),
  kept symbolic over a relative ``e(x)`` (:class:`~adaptprec._first_order_sums.Affine`);
* ``add``/``sub`` carry ``e(a) + e(b)`` into a result that may be much smaller than the
  operands: cancellation shows up as a large relative bound with no special case;
* sums over ``n`` entries: ``sum e`` plus the sum's own rounding error, *measured* below
  the top rung: ``|y - sum_wide(x)|``, the rung's result against the same summands summed
  one dtype wider (one more pass over them, which the bound needed anyway). On the top
  rung, where there is no wider dtype, the bound ``sqrt(n) u sum|x|`` (Higham & Mary's
  probabilistic ``lambda sqrt(n) u`` with ``lambda = 1``; not a proof); the same for
  cumulative sums (:mod:`adaptprec._first_order_sums`);
* contractions (``dot_general``): Cauchy-Schwarz per output entry, ``(|A| |B|)_ij <=
  ||A_i|| ||B_j||``, so ``e(C) = ||e(A)_i|| ||B_j|| + ||A_i|| ||e(B)_j|| + sqrt(k) u
  ||A_i|| ||B_j||`` costs O(n^2) for O(n^3) work (row and column norms, an outer
  product);
* data movement applies the same primitive to the error arrays;
* loops and branches (``scan``, ``while``, ``cond``): the walk runs inside a loop of the
  same kind whose carry holds the values and their bounds (:mod:`adaptprec._first_order_loops`);
* comparisons and ``argmax``/``argmin``: a decision is *unstable* when the operands are
  closer than their error bounds (the result could flip); counted, and an unstable
  decision fails the check.

Unsupported (the walk raises :class:`Unsupported`, the caller falls back to Monte Carlo
arithmetic): sorting, scatters, float-to-integer casts, and primitives not in the tables
below.

The bound is first order: it is reliable when the relative errors are small (well below
1), which is the only regime in which a result can be accepted anyway. It is not a proof:
the accumulation terms are probabilistic and a transcendental's ulp constant is the
library's documented accuracy.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from . import _jaxpr as jx
from ._autocast.interpret import _is_dynamic, _trace
from ._first_order_loops import LoopRules
from ._first_order_products import ProductRules
from ._first_order_sums import SUM_FAILURE, Affine, SumRules
from ._mca import wider as _wider
from ._opkind import OpKind, classify
from ._reductions import count_where as _count, materialized, nan_max_abs, nan_to_inf
from .precision import unit_roundoff as _u

__all__ = ["Unsupported", "first_order", "FirstOrderResult", "relative_bound",
           "materialized", "nan_to_inf", "nan_max_abs", "SUM_FAILURE"]


class Unsupported(Exception):
    """The function has an operation the first-order walk does not model."""


def _is_float(dtype) -> bool:
    return dtype is not None and jnp.issubdtype(dtype, jnp.floating)


# ops whose result is exact given exact operands (error = propagated only)
_EXACT_UNARY = frozenset("neg abs stop_gradient real copy copy_p".split())
_MOVE = frozenset(
    "reshape transpose broadcast_in_dim slice squeeze expand_dims rev copy copy_p "
    "dynamic_slice gather sharding_constraint optimization_barrier".split())
_MULTI_MOVE = frozenset({"concatenate", "stack", "dynamic_update_slice", "pad", "select_n"})
_COMPARE = frozenset("eq ne lt le gt ge".split())
_TRANS = frozenset(
    "exp exp2 log log1p expm1 pow logistic erf erfc sqrt rsqrt cbrt tanh tan sinh cosh "
    "asin acos atan asinh acosh atanh atan2 integer_pow square".split())
_TRIG = frozenset({"sin", "cos"})
_INT_SAFE = frozenset(  # integer-valued ops that cannot be affected by float rounding
    "iota and or not xor shift_left shift_right_arithmetic shift_right_logical "
    "population_count clz".split())
# ops that round nothing: with exact operands their results are exact
#: Entrywise operations (same-shaped operands): an entry's errors stay its own
_OWN_OPS = frozenset("add sub mul div max min select_n clamp square integer_pow sign "
                     "sqrt rsqrt cbrt exp exp2 expm1 log log1p tanh logistic erf erfc sin "
                     "cos tan sinh cosh atan atan2 asin acos asinh acosh atanh pow".split())
_EXACT_OPS = (_MOVE | _MULTI_MOVE | _EXACT_UNARY | _INT_SAFE | _COMPARE | frozenset(
    "argmax argmin sign max min clamp is_finite floor ceil round reduce_max reduce_min "
    "reduce_and reduce_or".split()))


class _Rel:
    """An error bound that is ``scale * |value|`` (an input's rounding, ``u |x|``), kept
    symbolic: data movement keeps it, a contraction takes its norms from the value's
    (``||e_i|| = scale ||x_i||``: no pass over the error), anything else materializes it.
    ``tag``: as :class:`_Own`'s (an input's rounding is its entries' own); ``orig``: at an
    input, the input as the user passed it (``u |x|`` bounds its rounding as well)."""

    __slots__ = ("scale", "tag", "orig")

    def __init__(self, scale: float, tag=None, orig=None):
        self.scale, self.tag, self.orig = scale, tag, orig


class _Own:
    """An error bound ``e`` (array) made only of roundings private to each entry: entry
    ``i``'s error comes from the inputs' entry ``i`` and the operations on it alone, so
    under the model of independent roundings (Higham & Mary 2019) the errors of
    different entries are independent. ``tag`` names the index map (arrays combined
    entrywise must share it: ``x[1:] + x[:-1]`` mixes neighbours and is not own).
    A sum of own errors combines them in quadrature (Hoeffding), see ``p_reduce_sum``."""

    __slots__ = ("e", "tag")

    def __init__(self, e, tag):
        self.e, self.tag = e, tag


#: The inputs' index map, the tag of their roundings.
_INPUT_TAG = "input"

#: Moves that keep each entry's own errors its own (a bijection or a subset of the
#: entries): a new index map; and entrywise identities, which keep it.
_OWN_MOVES = frozenset("reshape transpose slice squeeze expand_dims rev dynamic_slice".split())
_OWN_SAME = frozenset("neg abs stop_gradient copy copy_p real convert_element_type".split())


class FirstOrderResult:
    """Outputs (as the function returns them, flat; ``tree`` their structure), their
    error bounds (``None``: exact) and the number of unstable decisions (float32
    scalar)."""

    def __init__(self, outs, errs, unstable, tree=None):
        self.outs, self.errs, self.unstable, self.tree = outs, errs, unstable, tree


class _Walk(LoopRules, ProductRules, SumRules):
    Rel, Unsupported = _Rel, Unsupported     # for the mixins' rules

    def __init__(self, rung):
        self.rung = np.dtype(rung)
        self.u = _u(self.rung)
        self.unstable: list = []

    def fresh(self) -> "_Walk":
        """A walk of the same rung with its own decision count (a loop body's)."""
        return _Walk(self.rung)

    def edt(self, dtype):
        return np.dtype(jnp.promote_types(dtype, jnp.float32))

    def zeros_like(self, v):
        return jnp.zeros(jnp.shape(v), self.edt(jnp.result_type(v)))

    def local(self, y, c=1.0):
        a = jnp.abs(y).astype(self.edt(y.dtype))
        return a * a.dtype.type(c * _u(y.dtype))

    # -------------------------------------------------------------------- the walk
    def run(self, jaxpr, consts, vals, errs):
        env: dict = {}

        def read(atom):
            if isinstance(atom, jx.Literal):
                return jx.literal_value(atom), None
            return env[atom]

        for var, c in zip(jaxpr.constvars, consts):
            env[var] = (c, None)
        for var, v, e in zip(jaxpr.invars, vals, errs):
            env[var] = (v, e)
        for eqn in jaxpr.eqns:
            ins = [read(a) for a in eqn.invars]
            outs = self.step(eqn, [v for v, _ in ins], [e for _, e in ins])
            for var, ve in zip(eqn.outvars, outs):
                env[var] = ve
        return [read(a) for a in jaxpr.outvars]

    def step(self, eqn, vals, errs):
        name = eqn.primitive.name
        body = jx.call_body(eqn, remat=True, custom=True)
        if body is not None:
            jaxpr, consts = body
            return self.run(jaxpr, consts, vals, errs)
        if name in ("scan", "while", "cond"):
            return getattr(self, "p_" + name)(eqn, vals, errs)
        if jx.has_sub_jaxpr(eqn):
            raise Unsupported(name)
        outs = jx.bind(eqn, vals)
        if errs and isinstance(errs[0], _Rel) and (name in _MOVE or name in _EXACT_UNARY):
            same = name in _OWN_SAME
            tag = errs[0].tag if same else (
                object() if name in _OWN_MOVES and errs[0].tag is not None else None)
            # still relative to the value (and to the user's input, entry for entry)
            return [(outs[0], _Rel(errs[0].scale, tag, errs[0].orig if same else None))]
        if name in _TRIG and _is_float(outs[0].dtype) and _wider(outs[0].dtype) and (
                errs[0] is None or isinstance(errs[0], _Rel)):
            # symbolic below the top rung only: there a sum's bound is the a-priori
            # sqrt(n) u sum|x|, 1e2-1e5x the error of a cancelling sum, and made cheaper
            # the plan would prefer it to the cancellation screen (a right sum of sines
            # reported unverified, float32 with x64 off)
            return [(outs[0], self.trig(vals[0], errs[0], outs[0]))]
        tags = [getattr(e, "tag", None) if e is not None else False for e in errs]
        self.own_in = tags
        if name == "reduce_sum":        # reads a symbolic bound from its base
            pass
        elif name not in ("dot_general", "conv_general_dilated"):
            errs = [self.dense(e, v) for e, v in zip(errs, vals)]
        else:                   # contractions read a _Rel bound from the values' norms
            errs = [self.dense(e, v) if isinstance(e, Affine) else
                    e.e if isinstance(e, _Own) else e for e, v in zip(errs, vals)]
        res = self._rule(name, eqn, vals, errs, outs)
        return self._own(name, tags, vals, res)

    def _own(self, name, tags, vals, res):
        """The results' errors marked own (:class:`_Own`) when the operation keeps every
        entry's errors to itself."""
        if len(res) != 1 or res[0][1] is None or isinstance(res[0][1], (_Own, _Rel, Affine)):
            return res
        y, e = res[0]
        inexact = [t for t, v in zip(tags, vals) if t is not False
                   and _is_float(jnp.result_type(v))]
        if not inexact or any(t is None for t in inexact) or len(set(map(id, inexact))) > 1:
            return res
        if name in _OWN_SAME or (name in _OWN_OPS and all(
                jnp.shape(v) == jnp.shape(y) for t, v in zip(tags, vals)
                if t is not False)):
            return [(y, _Own(e, inexact[0]))]
        if name in _OWN_MOVES:
            return [(y, _Own(e, object()))]
        return res

    def _rule(self, name, eqn, vals, errs, outs):
        fl_in = [i for i, v in enumerate(vals) if _is_float(jnp.result_type(v))]
        if name in _EXACT_OPS and all(errs[i] is None for i in fl_in):
            return [(o, None) for o in outs]
        if not fl_in and not any(_is_float(jnp.result_type(o)) for o in outs) and (
                name in _INT_SAFE or classify(name) in (
                    OpKind.ELEMENTWISE, OpKind.DATA_MOVEMENT, OpKind.REDUCTION,
                    OpKind.COMPUTE)):
            return [(o, None) for o in outs]     # integer arithmetic is exact (wraps)
        rule = getattr(self, "p_" + name.replace("-", "_"), None)
        if rule is not None:
            return rule(eqn, vals, errs, outs)
        if name in _MOVE:
            return self.move(eqn, vals, errs, outs)
        if name in _EXACT_UNARY:
            return [(outs[0], errs[0])]
        if name in _TRANS or name in _TRIG:
            return self.entrywise(eqn, vals, errs, outs)
        if not fl_in and not any(_is_float(jnp.result_type(o)) for o in outs):
            if name in _INT_SAFE or classify(name) in (OpKind.ELEMENTWISE,
                                                       OpKind.DATA_MOVEMENT):
                return [(o, None) for o in outs]
        raise Unsupported(name)

    # ------------------------------------------------------------------- helpers
    def err(self, e, v):
        return self.zeros_like(v) if e is None else self.dense(e, v)

    def dense(self, e, v):
        """``e`` as an array (a :class:`_Rel` or :class:`Affine` bound materialized, an
        :class:`_Own` one unwrapped; ``None`` stays)."""
        if isinstance(e, _Own):
            return e.e
        if isinstance(e, Affine):
            return e.array(self.edt(jnp.result_type(v)))
        if isinstance(e, _Rel):
            a = jnp.abs(jnp.asarray(v))
            a = a.astype(self.edt(a.dtype))
            return a * a.dtype.type(e.scale)
        return e

    def move(self, eqn, vals, errs, outs):
        """Apply the data-movement primitive to the errors (float operand 0)."""
        args = [self.err(errs[0], vals[0])] + list(vals[1:])
        (eo,) = jx.bind(eqn, args)
        return [(outs[0], eo)]

    def entrywise(self, eqn, vals, errs, outs):
        """|f'| e by the primitive's own tangent rule, plus the local rounding."""
        (y,) = outs
        name = eqn.primitive.name
        if name in _TRIG:       # a bound from no value of the kernel (SumRules.trig)
            w = self.edt(y.dtype)
            loc = jnp.full(jnp.shape(y), 4 * _u(y.dtype), w)
            ins = [e.astype(w) for v, e in zip(vals, errs)
                   if e is not None and _is_float(jnp.result_type(v))]
            return [(y, sum(ins, loc))]
        total = None
        for i, (v, e) in enumerate(zip(vals, errs)):
            if e is None or not _is_float(jnp.result_type(v)):
                continue

            def f(x, i=i):
                a = list(vals)
                a[i] = x
                return jx.bind(eqn, a)[0]

            # the derivative in the wide error dtype: exact-enough and no overflow games
            t = jax.jvp(f, (v,), (e.astype(jnp.result_type(v)),))[1]
            t = jnp.abs(t).astype(self.edt(y.dtype))
            total = t if total is None else total + t
        c = 1.0 if name in ("square", "integer_pow", "sqrt") else 2.0
        loc = self.local(y, c)
        if name == "integer_pow":
            loc = loc * loc.dtype.type(abs(eqn.params["y"]))
        return [(y, loc if total is None else total + loc)]

    # -------------------------------------------------------------- arithmetic
    def p_add(self, eqn, vals, errs, outs):
        (y,) = outs
        if not _is_float(y.dtype):
            return [(y, None)]
        e = self.local(y)
        for v, ev in zip(vals, errs):
            if ev is not None:
                e = e + ev
        return [(y, e)]

    p_sub = p_add
    p_add_any = p_add

    def p_mul(self, eqn, vals, errs, outs):
        (y,) = outs
        if not _is_float(y.dtype):
            return [(y, None)]
        (a, b), (ea, eb) = vals, errs
        w = self.edt(y.dtype)
        e = self.local(y)
        if ea is not None:
            e = e + ea * jnp.abs(jnp.asarray(b)).astype(w)
        if eb is not None:
            e = e + eb * jnp.abs(jnp.asarray(a)).astype(w)
        if ea is not None and eb is not None:
            e = e + ea * eb
        return [(y, e)]

    def p_div(self, eqn, vals, errs, outs):
        (y,) = outs
        if not _is_float(y.dtype):
            return [(y, None)]
        (_, b), (ea, eb) = vals, errs
        w = self.edt(y.dtype)
        ab = jnp.abs(jnp.asarray(b)).astype(w)
        num = jnp.zeros((), w)
        if ea is not None:
            num = num + ea
        if eb is not None:
            num = num + eb * jnp.abs(y).astype(w)
            # a divisor within its own error of zero: no digit of the quotient is known
            ab = jnp.where(eb >= ab, 0.0, ab - eb)
        e = jnp.where(num == 0, 0.0, num / ab) + self.local(y)
        return [(y, e)]

    def p_max(self, eqn, vals, errs, outs):
        (y,) = outs
        if not _is_float(y.dtype):
            return [(y, None)]
        es = [self.err(e, v) for v, e in zip(vals, errs)]
        e = jnp.broadcast_to(jnp.maximum(es[0], es[1]), y.shape)
        return [(y, e)]

    p_min = p_max

    def p_clamp(self, eqn, vals, errs, outs):
        (y,) = outs
        es = [self.err(e, v) for v, e in zip(vals, errs)]
        e = jnp.maximum(jnp.maximum(es[0], es[1]), es[2])
        return [(y, jnp.broadcast_to(e, y.shape))]

    def p_is_finite(self, eqn, vals, errs, outs):
        return [(outs[0], None)]

    def p_sign(self, eqn, vals, errs, outs):
        (x,), (e,) = vals, errs
        if e is not None:
            self.unstable.append(_count(lambda x, e: (jnp.abs(x).astype(e.dtype) <= e)
                                        & (x != 0), x, e))
        return [(outs[0], None)]

    def p_convert_element_type(self, eqn, vals, errs, outs):
        (x,), (e,), (y,) = vals, errs, outs
        if not _is_float(y.dtype):
            if _is_float(jnp.result_type(x)) and e is not None:
                raise Unsupported("float-to-integer convert")
            return [(y, None)]
        if not _is_float(jnp.result_type(x)):
            return [(y, None)]
        e = self.err(e, x).astype(self.edt(y.dtype))
        if jnp.finfo(y.dtype).nmant < jnp.finfo(jnp.result_type(x)).nmant:
            e = e + self.local(y)
        return [(y, e)]

    def p_select_n(self, eqn, vals, errs, outs):
        (y,) = outs
        if not _is_float(y.dtype):
            return [(y, None)]
        pred = vals[0]
        es = [self.err(e, v) for v, e in zip(vals[1:], errs[1:])]
        es = [jnp.broadcast_to(e, y.shape) for e in es]
        return [(y, lax.select_n(pred, *es))]

    def p_concatenate(self, eqn, vals, errs, outs):
        (y,) = outs
        es = [self.err(e, v).astype(self.edt(y.dtype)) for v, e in zip(vals, errs)]
        return [(y, jx.bind(eqn, es)[0])]

    p_stack = p_concatenate

    def p_pad(self, eqn, vals, errs, outs):
        (y,) = outs
        e = self.err(errs[0], vals[0])
        return [(y, jx.bind(eqn, [e, jnp.zeros((), e.dtype)])[0])]

    def p_scatter(self, eqn, vals, errs, outs):
        """``x.at[idx].set(u)``: the same scatter of the errors (indices are exact)."""
        (y,) = outs
        w = self.edt(y.dtype)
        es = [self.err(errs[0], vals[0]).astype(w), vals[1],
              self.err(errs[2], vals[2]).astype(w)]
        return [(y, jx.bind(eqn, es)[0])]

    def p_scatter_add(self, eqn, vals, errs, outs):
        """``x.at[idx].add(u)``: the errors scatter-added, plus one rounding per entry
        (an entry updated ``m`` times rounds ``m`` times: ``m u |y|`` would be exact; the
        bound charges ``u |y|`` per update through the summed updates' own bound)."""
        (y,) = self.p_scatter(eqn, vals, errs, outs)
        upd = jnp.abs(jnp.asarray(vals[2])).astype(y[1].dtype) * y[1].dtype.type(
            _u(jnp.result_type(y[0])))
        ones = jx.bind(eqn, [jnp.zeros_like(y[1]), vals[1], upd])[0]
        return [(y[0], y[1] + ones + self.local(y[0]))]

    def p_dynamic_update_slice(self, eqn, vals, errs, outs):
        (y,) = outs
        w = self.edt(y.dtype)
        es = [self.err(errs[0], vals[0]).astype(w), self.err(errs[1], vals[1]).astype(w)]
        return [(y, jx.bind(eqn, es + list(vals[2:]))[0])]

    # ---------------------------------------------------------------- decisions
    def _near(self, a, b, ea, eb):
        w = self.edt(jnp.promote_types(jnp.result_type(a), jnp.result_type(b)))
        bound = jnp.zeros((), w)
        if ea is not None:
            bound = bound + ea
        if eb is not None:
            bound = bound + eb
        d = jnp.abs(jnp.asarray(a).astype(w) - jnp.asarray(b).astype(w))
        return (d <= bound) & (bound > 0)

    def _compare(self, eqn, vals, errs, outs):
        (a, b), (ea, eb) = vals, errs
        if ea is not None or eb is not None:
            self.unstable.append(_count(self._near, a, b, ea, eb))
        return [(outs[0], None)]

    p_eq = p_ne = p_lt = p_le = p_gt = p_ge = _compare

    def _argext(self, eqn, vals, errs, outs):
        (a,), (e,), (idx,) = vals, errs, outs
        if e is not None:
            (axis,) = eqn.params["axes"]
            i = jnp.expand_dims(idx, axis).astype(jnp.int32)
            m = jnp.take_along_axis(a, i, axis=axis)
            em = jnp.take_along_axis(e, i, axis=axis)
            pos = lax.broadcasted_iota(jnp.int32, a.shape, axis)
            self.unstable.append(_count(
                lambda a, m, e, em, pos, i: self._near(a, m, e, em) & (pos != i),
                a, m, e, em, pos, i))
        return [(idx, None)]

    p_argmax = p_argmin = _argext


def trace_with_originals(fn: Callable, args: tuple, kwargs: dict, inputs: tuple | None):
    """``(closed jaxpr, output tree, dynamic leaves at the rung, the same leaves as the
    user passed them)`` of ``fn(*args, **kwargs)``: an error walk starts each input with
    the rounding of its cast to the rung."""
    closed, tree, dyn = _trace(fn, args, kwargs)
    leaves = jax.tree_util.tree_leaves((args, kwargs))
    orig = jax.tree_util.tree_leaves(inputs) if inputs is not None else leaves
    dyn_idx = [i for i, x in enumerate(leaves) if _is_dynamic(x)]
    originals = [orig[i] if len(orig) == len(leaves) else leaves[i] for i in dyn_idx]
    return closed, tree, dyn, originals


def first_order(fn: Callable, args: tuple, kwargs: dict, inputs: tuple | None,
                rung_dtype) -> FirstOrderResult:
    """Walk ``fn(*args, **kwargs)`` (inputs at the rung) propagating error bounds.

    ``inputs = (args, kwargs)`` as the user passed them: a floating input wider than the
    rung starts with the error of its rounding, ``u |x|``. Raises :class:`Unsupported`.
    """
    walk = _Walk(rung_dtype)
    closed, tree, dyn, originals = trace_with_originals(fn, args, kwargs, inputs)
    errs = []
    for x, o in zip(dyn, originals):
        if _is_float(x.dtype) and _is_float(getattr(o, "dtype", None)) and \
                jnp.finfo(o.dtype).nmant > jnp.finfo(x.dtype).nmant:
            errs.append(_Rel(_u(x.dtype), _INPUT_TAG, lax.stop_gradient(o)))  # its rounding
        else:
            errs.append(None)
    dyn = [lax.stop_gradient(x) for x in dyn]
    consts = [lax.stop_gradient(jnp.asarray(c)) for c in closed.consts]
    res = walk.run(closed.jaxpr, consts, dyn, errs)
    unstable = sum(walk.unstable, jnp.float32(0))
    return FirstOrderResult([v for v, _ in res], [walk.dense(e, v) for v, e in res],
                            unstable, tree)


def relative_bound(outs, errs, componentwise: bool = False, floor: float = 0.0) -> jax.Array:
    """The largest normwise (or componentwise) relative error bound over the floating
    outputs (float32; inf for NaN/0-with-error); ``floor`` (``atol / rtol``) is added to
    the magnitude the bound is relative to."""
    est = jnp.float32(0)
    for y, e in zip(outs, errs):
        if e is None or not _is_float(jnp.result_type(y)):
            continue
        a = jnp.abs(y).astype(e.dtype)
        if componentwise:
            r = materialized(lambda e, a: jnp.max(nan_to_inf(
                jnp.where(e == 0, 0.0, e / (a + floor))), initial=0.0), e, a)
        else:
            emax, amax = materialized(lambda e, a: (jnp.max(nan_to_inf(e), initial=0.0),
                                                    jnp.max(a, initial=0.0)), e, a)
            r = jnp.where(emax == 0, 0.0, emax / (amax + floor))
        est = jnp.maximum(est, jnp.asarray(r, jnp.float32))
    return jnp.where(jnp.isnan(est), jnp.inf, est)
