"""Walking jaxprs: the plumbing shared by every jaxpr interpreter in adaptprec.

Three analyses re-read a traced function equation by equation, each with its own meaning
for a value: autocast's interpreter (:mod:`adaptprec._autocast.interpret`, values are
arrays re-cast per op, also hosting the accuracy guard's Monte Carlo arithmetic), the
pointwise analysis of a residual (:mod:`adaptprec._pointwise`, values are abstract
"which axis is the data axis" states) and the fits-last evaluator
(:mod:`adaptprec.batch._fits_last`, values are arrays with a batch flag). What they share
lives here: the forward walk over the equations with its environment and literal
handling (:func:`eval_jaxpr`), binding an equation again (:func:`bind`), the body of a call
primitive (:func:`call_body`) and the sub-jaxprs any equation carries
(:func:`sub_jaxprs`, :func:`iter_eqns`). Which primitive is what (entrywise, a reduction
over axes, a call...) is :mod:`adaptprec._opkind`'s one table.

Primitive names are JAX 0.10's: ``jit`` (formerly ``pjit``, both accepted),
``closed_call``, ``remat2``, ``custom_jvp_call``, ``custom_vjp_call``, ``scan``, ``while``,
``cond``.

Example:
    >>> import jax, jax.numpy as jnp
    >>> from adaptprec._jaxpr import eval_jaxpr, bind, iter_eqns
    >>> closed = jax.make_jaxpr(lambda x: jax.jit(jnp.sin)(x) * 2.0)(1.0)
    >>> [e.primitive.name for e in iter_eqns(closed.jaxpr)]
    ['jit', 'sin', 'mul']
    >>> double = lambda eqn, vals: bind(eqn, vals)          # re-evaluate as traced
    >>> out = eval_jaxpr(closed.jaxpr, closed.consts, [0.5], double)
    >>> bool(jnp.isclose(out[0], 2 * jnp.sin(0.5)))
    True
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

try:  # jax.extend.core's classes, without importing all of jax.extend (its pallas
    # module alone costs ~15 ms of `import adaptprec`)
    from jax._src.core import ClosedJaxpr, Jaxpr, Literal
except ImportError:  # pragma: no cover
    from jax.extend.core import ClosedJaxpr, Jaxpr, Literal

from ._opkind import CALLS

__all__ = ["open_jaxpr", "call_body", "sub_jaxprs", "has_sub_jaxpr", "iter_eqns", "bind",
           "eval_jaxpr", "literal_value"]

#: Calls whose body (``params["jaxpr"]``, no consts of its own) is applied to the operands.
_REMAT = frozenset(("remat2", "checkpoint"))
#: Custom-derivative calls: the primal body is ``params["call_jaxpr"]``.
_CUSTOM = frozenset(("custom_jvp_call", "custom_vjp_call"))


def open_jaxpr(j: Jaxpr | ClosedJaxpr) -> tuple[Jaxpr, Sequence[Any]]:
    """``(jaxpr, consts)`` of a closed or open jaxpr (an open one has no consts)."""
    if isinstance(j, ClosedJaxpr):
        return j.jaxpr, j.consts
    return j, ()


def call_body(eqn, *, custom: bool = True, remat: bool = True):
    """``(jaxpr, consts)`` that the call equation ``eqn`` applies to its operands, or
    ``None`` when ``eqn`` is not such a call.

    Calls are the ``jit``-like primitives of :data:`~adaptprec._opkind.CALLS`,
    plus (unless switched off) ``remat2``/``checkpoint`` and the primal body of
    ``custom_jvp_call``/``custom_vjp_call``; inlining the latter drops their custom
    derivative rule, which is fine for a forward analysis but not for an evaluation that
    will be differentiated.
    """
    name = eqn.primitive.name
    if name in CALLS:   # jit's body is "jaxpr", closed_call's / core_call's "call_jaxpr"
        return open_jaxpr(eqn.params.get("jaxpr", eqn.params.get("call_jaxpr")))
    if remat and name in _REMAT:
        return open_jaxpr(eqn.params["jaxpr"])
    if custom and name in _CUSTOM:
        return open_jaxpr(eqn.params["call_jaxpr"])
    return None


def sub_jaxprs(eqn) -> list[Jaxpr]:
    """Every jaxpr in ``eqn``'s parameters (open), including tuples such as ``cond``'s
    branches; empty for a first-order primitive."""
    found: list[Jaxpr] = []

    def visit(v):
        if isinstance(v, ClosedJaxpr):
            found.append(v.jaxpr)
        elif isinstance(v, Jaxpr):
            found.append(v)
        elif isinstance(v, (tuple, list)):
            for x in v:
                visit(x)

    for v in eqn.params.values():
        visit(v)
    return found


def has_sub_jaxpr(eqn) -> bool:
    """Whether ``eqn`` carries a jaxpr (a call, a loop, a branch, a custom reduction...)."""
    return bool(sub_jaxprs(eqn))


def iter_eqns(jaxpr: Jaxpr | ClosedJaxpr, recursive: bool = True) -> Iterator:
    """The equations of ``jaxpr`` in order; with ``recursive``, each followed by those of
    its sub-jaxprs (depth first)."""
    jaxpr, _ = open_jaxpr(jaxpr)
    for eqn in jaxpr.eqns:
        yield eqn
        if recursive:
            for sub in sub_jaxprs(eqn):
                yield from iter_eqns(sub)


def bind(eqn, args: Sequence[Any], params: dict | None = None) -> list:
    """Bind ``eqn``'s primitive to ``args`` (with ``params``, default the equation's own);
    always a list of outputs."""
    prim = eqn.primitive
    out = prim.bind(*args, **prim.get_bind_params(eqn.params if params is None else params))
    return list(out) if prim.multiple_results else [out]


def literal_value(lit: Literal) -> Any:
    """The Python/numpy value of a jaxpr literal (the default ``literal`` of
    :func:`eval_jaxpr`)."""
    return lit.val


def eval_jaxpr(jaxpr: Jaxpr, consts: Sequence[Any], args: Sequence[Any],
               step: Callable[[Any, list], Sequence[Any]],
               literal: Callable[[Literal], Any] = literal_value) -> list:
    """Walk ``jaxpr`` forward: bind ``consts`` and ``args`` to its variables, then for each
    equation ``outs = step(eqn, invals)`` (one value per ``eqn.outvars``); returns the
    values of the outputs. A literal operand reads as ``literal(lit)``.

    The values are whatever the walker computes with: arrays, abstract states, or
    (array, flag) pairs.
    """
    env: dict = {}

    def read(atom):
        return literal(atom) if isinstance(atom, Literal) else env[atom]

    for var, val in zip(jaxpr.constvars, consts):
        env[var] = val
    for var, val in zip(jaxpr.invars, args):
        env[var] = val
    for eqn in jaxpr.eqns:
        outs = step(eqn, [read(a) for a in eqn.invars])
        for var, val in zip(eqn.outvars, outs):
            env[var] = val
    return [read(a) for a in jaxpr.outvars]
