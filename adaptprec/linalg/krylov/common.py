r"""What the Krylov solvers share: the solver interface, the cycle's context, dot
products with wide accumulation, and the tuned constants (each with its source).

A solve runs in *cycles* (``_loop.py``). A cycle starts from the true residual ``r``
(top rung's dtype) and its norm ``s``, rounds ``r / s`` to the rung's dtype and iterates
on the *correction equation* ``A d = r / s`` there; the loop then adds ``s d`` to ``x`` in
the top dtype and recomputes ``r = b - A x`` (a reliable update, Clark et al. 2010). The
scaling by ``1 / s`` keeps the rung's vectors near unit size, so a residual of 1e-12 does
not underflow a float16 rung. A solver is a :class:`KrylovSolver`: ``init`` builds its
state on the rung from the scaled residual and what the previous cycle carried over,
``step`` is one iteration, ``terminate`` says when the cycle ends, ``postprocess`` returns
the correction, the carry for the next cycle and a breakdown code.
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

import jax
import jax.numpy as jnp

from ..._pytree import Module

__all__: list[str] = []

#: Reliable-update threshold: a cycle of CG or BiCGStab ends when its recursive residual
#: has dropped to ``RELIABLE_DELTA`` times the cycle's starting (true) residual (Clark,
#: Babich, Barros, Brower and Rebbi, "Solving lattice QCD systems of equations using
#: mixed precision solvers on GPUs", Comput. Phys. Commun. 181, 2010; QUDA's default
#: ``reliable_delta = 0.1``): about one float64 residual check per decade of reduction.
RELIABLE_DELTA = 0.1

#: A cycle aims below ``TARGET_MARGIN * tol`` (recursive residual), so that the true
#: residual, which trails the recursive one by the rung's rounding, passes ``tol``
#: without one more cycle (QUDA forces the reliable update once the recursive residual
#: passes the tolerance, and checks it there).
TARGET_MARGIN = 0.5

#: A cycle of CG or BiCGStab ends after this many iterations even when the residual has
#: not dropped by RELIABLE_DELTA (a system with b outside the range of A never gets
#: there): the loop then checks the true residual anyway.
MAX_CYCLE_ITERATIONS = 1000

#: Which cycles the schedule sees. The true residual at the end of a cycle says something
#: about the rung when the cycle (a) reached its target, (b) failed the method's own
#: progress test or was unfaithful to the rung's claim (``KrylovSolver.judge``): the
#: truth RESIDUAL_GAP times worse than the rung's recursion says, i.e. the rung's
#: rounding is as large as the progress (the *residual gap* of van der Vorst and Ye,
#: "Residual replacement strategies for Krylov subspace iterative methods for the
#: convergence of true residuals", SIAM J. Sci. Comput. 22(3), 2000), or (c) used its
#: whole length and ``KrylovSolver.capped_cycle_counts`` says so: GMRES and BiCGStab when
#: the best recursive residual stayed above STAGNATION times the start (no progress at
#: all), CG and BiCGStab on a lower rung always (the rung is too slow: float32 CG on a
#: 60 x 60 SPD matrix of condition 3e7 took 20000 iterations without getting to 1e-9,
#: float64 CG 1816). A capped CG cycle on the top rung is not shown: CG's residual is not
#: monotone, and its value where the cap falls (17 times the start after 2000 float64
#: iterations on an anisotropic 128^2 operator that then converges) is no measure of
#: progress.
RESIDUAL_GAP = 2.0
STAGNATION = 0.99

#: The top rung ends the solve as STALLED when, in this many consecutive cycles the
#: schedule saw, the true residual did not fall below ``STALL_PROGRESS`` times the best
#: true residual so far (QUDA's reliable_break with ``max_res_increase = 1`` ends on the
#: second consecutive increase at a reliable update).
STALL_CYCLES = 2

#: A seen cycle on the top rung aimed at a tenth (RELIABLE_DELTA) of its start, or at the
#: tolerance; when its true residual does not even halve the best so far, the iterate
#: sits at the top dtype's rounding floor ``~ u ||A|| ||x|| / ||b||``, around which the
#: residual wanders by a few percent (so "did not decrease" alone would keep restarting
#: the count).
STALL_PROGRESS = 0.5

# breakdown codes of a cycle (postprocess)
OK = 0
INDEFINITE = 1      # CG: p^T A p <= 0 (or p^T M p)
BREAKDOWN = 2       # BiCGStab: rho = 0 or omega = 0
NONFINITE = 3       # NaN/Inf in the rung's iteration


class CycleContext(NamedTuple):
    """One rung of one cycle: the products and the constants the iteration needs."""

    matvec: Callable        # x -> A x, x in `dtype`
    precond: Callable       # r -> M r, r in `dtype`
    preconditioned: bool    # False when M is the identity (saves a dot per step)
    dtype: np.dtype         # the rung's dtype (vectors)
    compute: np.dtype       # products, dots and scalars: the rung's dtype, >= float32
    top: np.dtype           # the top rung's dtype (the carry between cycles)
    target: jax.Array       # end the cycle when ||r_rung|| <= target (r_rung ~ unit)


def compute_dtype(dtype) -> np.dtype:
    """A rung's arithmetic: its own dtype, at least float32 (bfloat16 and float16 vectors
    are accumulated in float32: their sums stall at 256 ulps)."""
    return np.dtype(np.promote_types(dtype, np.float32))


def dot(ctx: CycleContext, a, b) -> jax.Array:
    """``a . b`` of two rung vectors, accumulated in ``ctx.compute``."""
    return jnp.dot(a, b, preferred_element_type=ctx.compute)


def cast(ctx: CycleContext, x) -> jax.Array:
    return jnp.asarray(x).astype(ctx.dtype)


def finite(*xs) -> jax.Array:
    out = jnp.asarray(True)
    for x in xs:
        out = out & jnp.all(jnp.isfinite(x))
    return out


class KrylovSolver(Module):
    """One Krylov method: a cycle's ``init`` / ``step`` / ``terminate`` /
    ``postprocess`` on one rung (the loop in ``_loop.py`` runs every solver)."""

    #: "cg", "gmres" or "bicgstab" (the info's ``method``)
    name = "krylov"
    #: whether the cycle stops at RELIABLE_DELTA (CG, BiCGStab) or runs its length (GMRES)
    reliable_delta = RELIABLE_DELTA
    def cycle_length(self) -> int:
        """Cap on one cycle's iterations."""
        return MAX_CYCLE_ITERATIONS

    @abc.abstractmethod
    def carry_init(self, n: int, dtype) -> Any:
        """What the first cycle receives from "the previous one" (top dtype)."""

    @abc.abstractmethod
    def init(self, ctx: CycleContext, r, s, carry) -> Any:
        """State on the rung from the scaled residual ``r`` (rung dtype, norm ~1), the
        scale ``s`` (top dtype) and the previous cycle's carry."""

    @abc.abstractmethod
    def step(self, ctx: CycleContext, state) -> Any:
        """One iteration."""

    @abc.abstractmethod
    def terminate(self, ctx: CycleContext, state) -> jax.Array:
        """Whether the cycle is over (target reached or a breakdown)."""

    @abc.abstractmethod
    def postprocess(self, ctx: CycleContext, state, s, carry):
        """``(d, carry, breakdown)``: the correction on the rung (``A d ~ r / s``), the
        carry for the next cycle (top dtype) and a breakdown code."""

    def iterations(self, state) -> jax.Array:
        return state.k

    def capped_cycle_counts(self, top, best) -> jax.Array:
        """Whether a cycle that used its whole length is shown to the schedule, given
        whether it ran on the top rung and its best recursive residual (``STAGNATION``
        above): by default when it made no progress at all."""
        return best > STAGNATION

    def claim(self, state) -> jax.Array:
        """What the rung's recursion says the cycle achieved (scaled units): by default
        its final residual norm."""
        return self.residual(state)

    def judge(self, d, r_old, r_new, s, claim):
        """``(useful, faithful)`` of a cycle, in the top dtype: ``d`` took the true residual
        from ``r_old`` (norm ``s``) to ``r_new``. Not useful: the correction is discarded
        (a failed guard). Not faithful: the truth is RESIDUAL_GAP times worse than the
        rung's ``claim`` (the schedule sees a stalled cycle). Residual-based here: faithful
        when ``||r_new|| <= RESIDUAL_GAP s claim``."""
        return jnp.asarray(True), jnp.linalg.norm(r_new) <= RESIDUAL_GAP * s * claim

    @abc.abstractmethod
    def residual(self, state) -> jax.Array:
        """The recursive residual norm on the rung (relative to the cycle's start)."""
