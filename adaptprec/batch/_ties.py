"""Ties (``expr=``) and inequalities (``constraints=``) in a batch of fits.

The structure is shared by every fit: one
:class:`~adaptprec.modeling.parameters.ParameterSpec`, in the vocabulary of
:func:`~adaptprec.curve_fit` (``expr={"w2": "w1", "b": "2*a"}``, a callable of the
parameters by name, ``constraints=["a < b"]``); the values are per fit. The batch runs on
the **free coordinates** ``q``: the free parameters, then one slack ``s >= 0`` per
constraint (held by the batch's bounds, its lower bound 0), and the model sees
``p = expand(q)``. The result comes back in the caller's layout: ``x = expand(q)`` per
fit, ``pcov = T C_q T^T`` with ``T = dp/dq``
(:func:`~adaptprec.modeling.parameters.propagate`: a tied parameter's variance by
propagation, a fixed one's zero), and ``dof`` counts the free coordinates that ``fixed=``
does not hold.

Names: a dict or namedtuple ``x0`` of ``(B,)`` arrays names the parameters by its keys;
the columns of an array ``x0`` are ``p0, p1, ...``, as :func:`~adaptprec.curve_fit`
names the parameters of a model whose signature names none (a batch's model takes one
vector, so its signature never names them).

Example:
    >>> import numpy as np
    >>> from adaptprec.batch._ties import tie_parameters
    >>> x0 = {"a": np.array([1.0, 2.0]), "b": np.array([5.0, 9.0])}
    >>> model = lambda p, t: p["a"] + p["b"] * t
    >>> _, q0, bounds, _, ties = tie_parameters(model, x0, None, None, None, "a < b")
    >>> ties.params.free, np.asarray(q0).tolist(), bounds[0].tolist()
    (('a', 'b - a'), [[1.0, 4.0], [2.0, 7.0]], [[-inf, 0.0], [-inf, 0.0]])
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .._pytree import replace
from .._tracing import is_traced
from ..modeling.parameters import (ParameterSpec, Slack, parameter_structure, propagate,
                                   slack_start)
from ._problem import per_fit_limits, read_starts
from ._pytree import BatchedTreeSpec, TiedResidual

__all__ = ["Ties", "tie_parameters"]

#: the batch holds no parameter at a value through the spec (``fixed=`` is a box of
#: width zero on the free coordinates, per fit)
_NO_FIXED = np.zeros(0)


@dataclasses.dataclass(frozen=True)
class Ties:
    """How a batch on the free coordinates maps back to every parameter."""

    params: ParameterSpec
    tree: BatchedTreeSpec | None

    def full_result(self, result: Any):
        """``result`` with ``x`` (in ``x0``'s layout) and ``pcov`` over every parameter
        (jit/vmap/grad-safe: ``x`` stays differentiable)."""
        x = jax.vmap(lambda q: self.params.expand(q, _NO_FIXED))(result.x)
        pcov = result.pcov
        if pcov is not None:
            pcov = jax.vmap(lambda q, c: propagate(self.params, q, _NO_FIXED, c)[1])(
                result.x, pcov)
        return replace(result, x=x if self.tree is None else self.tree.unravel_batched(x),
                       pcov=pcov, dependent=self.dependent)

    @property
    def dependent(self) -> tuple:
        """Names of the parameters the free ones determine (ties, constraints)."""
        return tuple(name for name, _ in self.params.tied)


def _names(x0, tree: BatchedTreeSpec | None, n: int) -> tuple:
    """The parameters' names: ``x0``'s keys, or ``p0, p1, ...`` for an array."""
    if tree is None:
        return tuple(f"p{i}" for i in range(n))
    names = []
    for (path, _), shape in zip(jax.tree_util.tree_flatten_with_path(x0)[0], tree.shapes):
        key = path[0] if len(path) == 1 else None
        name = getattr(key, "key", getattr(key, "name", None))
        if shape != () or not isinstance(name, str):
            raise ValueError(
                "expr= and constraints= name the parameters by x0's keys: give x0 as a "
                "flat dict (or namedtuple) of (B,) arrays, one number per fit and "
                f"parameter, or as a (B, n) array (columns p0, p1, ...); got the leaf "
                f"x0{jax.tree_util.keystr(path)} of per-fit shape {shape}")
        names.append(name)
    return tuple(names)


def _check_inside(rule: Slack, target: str, start, other, s0) -> None:
    """A concrete start breaking the constraint: ``ValueError`` naming the fits."""
    bad = np.flatnonzero(np.asarray(s0) < 0)
    if bad.size:
        i = int(bad[0])
        side = ">=" if rule.sign > 0 else "<="
        raise ValueError(
            f"x0 breaks the constraint {rule.text} in {bad.size} fit(s), e.g. fit {i} "
            f"({target} = {float(start[i])}, the other side {float(other[i])}): start "
            f"every fit inside it, with {target} {side} {rule.other.text}")


def _free_starts(params: ParameterSpec, names: tuple, flat, concrete: bool):
    """``q0`` ``(B, n_q)``: the free parameters' starts, then each slack's distance to
    its bound (off the bound where it is 0); traceable."""
    values = {k: flat[:, i] for i, k in enumerate(names)}
    slack = {}
    for target, rule in params.tied:
        if not isinstance(rule, Slack):
            values[target] = jnp.asarray(rule(values), flat.dtype)
            continue
        other = jnp.broadcast_to(jnp.asarray(rule.other(values), flat.dtype),
                                 values[target].shape)
        s0 = rule.sign * (values[target] - other)
        if concrete:
            _check_inside(rule, target, values[target], other, s0)
        slack[rule.slack] = slack_start(s0, values[target], jnp)
        values[target] = other + rule.sign * slack[rule.slack]
    return jnp.stack([slack[k] if k in slack else values[k] for k in params.free], axis=1)


def _structure(names, tree, lo, hi, held, start, expr, constraints) -> ParameterSpec:
    """The shared structure, judged on every fit's bounds (a bound in one fit counts)."""
    held_any = np.zeros(len(names), bool) if held is None else np.asarray(held).any(0)
    try:
        return parameter_structure(
            names, dict(zip(names, np.asarray(lo).T)), dict(zip(names, np.asarray(hi).T)),
            start, expr=expr, constraints=constraints,
            held=tuple(k for k, h in zip(names, held_any) if h))
    except ValueError as exc:
        if tree is None and "parameters are" in str(exc):
            raise ValueError(f"{exc}. The columns of an array x0 are p0, p1, ...; give x0 "
                             "as a dict of (B,) arrays to name them") from None
        raise


def tie_parameters(fun, x0, bounds, fixed, expr, constraints):
    """``(fun, x0, bounds, fixed, ties)`` of the batch on the free coordinates, ``ties``
    (:class:`Ties`) mapping its result back; without ``expr``/``constraints`` the inputs
    unchanged and ``ties=None``. ``bounds`` and ``fixed`` must be concrete (they decide
    the structure); ``x0`` may be traced."""
    if not expr and not constraints:
        return fun, x0, bounds, fixed, None
    with jax.ensure_compile_time_eval():      # NumPy-valued bounds stay concrete in jit
        wrapped, flat, tree = read_starts(fun, x0)
        size, n = flat.shape
        names = _names(x0, tree, n)
        lo, hi, held = per_fit_limits(bounds, fixed, flat, tree)
        if is_traced(lo, hi, held):
            raise ValueError("with expr= or constraints=, bounds= and fixed= must be "
                             "concrete (NumPy arrays, not traced): they decide which "
                             "parameter each constraint solves for")
        concrete = not is_traced(flat)
        first = np.asarray(flat[0], np.float64) if concrete else np.ones(n)
        params = _structure(names, tree, lo, hi, held, dict(zip(names, first.tolist())),
                            expr, constraints)
        q0 = _free_starts(params, names, flat, concrete)
    free = [names.index(k) for k in params.free if k in names]
    slacks = len(params.free) - len(free)
    lo, hi = np.asarray(lo), np.asarray(hi)
    q_bounds = None if bounds is None and not slacks else (
        np.concatenate([lo[:, free], np.zeros((size, slacks), lo.dtype)], axis=1),
        np.concatenate([hi[:, free], np.full((size, slacks), np.inf, hi.dtype)], axis=1))
    q_fixed = None if held is None else np.concatenate(
        [np.asarray(held)[:, free], np.zeros((size, slacks), bool)], axis=1)
    user = wrapped.fun if tree is not None else fun
    return TiedResidual(user, params, tree), q0, q_bounds, q_fixed, Ties(params, tree)
