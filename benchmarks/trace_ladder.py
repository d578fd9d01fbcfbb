"""Per-iteration trace of one NIST sweep row through the adaptive ladder (issue 15):
rung, cost, predicted and actual decrease, ratio, scaled step norm, radius, whether the
step was accepted, and the escalation reason / final status. Runs the same ``propose`` /
evaluation / ``advance`` as the solver, one jitted iteration per host step.

Run:  python benchmarks/trace_ladder.py Bennett5 s1 [--seed 0] [--perturbed 3] [--f64]
"""

from __future__ import annotations

import argparse
import functools
import os
import sys

import jax

jax.config.update("jax_enable_x64", True)

_ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path[:0] = [_ROOT, os.path.join(_ROOT, "tests")]
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax import lax  # noqa: E402

import adaptprec as ap  # noqa: E402
from adaptprec.nlsq._loop import LoopConfig, build_loop, default_schedule  # noqa: E402
from adaptprec.nlsq._methods import method_fns  # noqa: E402
from adaptprec.nlsq._buckets import bucket  # noqa: E402
from adaptprec._backend import cpu_jit  # noqa: E402
from robust_sweep import problem_starts, residual_for, score  # noqa: E402


def trace(name, start, seed=0, perturbed=3, f64=False, max_steps=None, quiet=False):
    p, starts = problem_starts(name, perturbed, seed)
    x0 = jnp.asarray(dict(starts)[start], jnp.float64)
    res = residual_for(name)
    n, m = p.n, len(p.y)
    # as solve_nlsq: the data padded to the bucket length, padded residuals masked to 0
    M = bucket(m)
    idx = np.minimum(np.arange(M), m - 1)
    mask = jnp.asarray(np.arange(M) < m)

    def fun(b, x, y):
        return jnp.where(mask, res(b, x, y), 0.0)
    rungs = (jnp.dtype("float64"),) if f64 else (jnp.dtype("float32"), jnp.dtype("float64"))
    cfg = LoopConfig(m=M, n=n, rungs=rungs, method="lm", loss="linear", jac="fwd",
                     jac_scale=True, has_bounds=False,
                     max_steps=max_steps or 100 * (n + 1), linear_solver="qr",
                     max_rejections=4, cond_tol=1e-2,
                     schedule=None if f64 else default_schedule())
    run = build_loop(fun, cfg, *method_fns("lm", M))
    args = (jnp.asarray(np.take(p.x, idx, axis=0)), jnp.asarray(np.take(p.y, idx)))
    args_all = tuple(tuple(a.astype(d) for a in args) for d in rungs)
    inf = jnp.full((n,), jnp.inf)
    ctx = (args_all, -inf, inf, jnp.ones(n), jnp.asarray(1.0), jnp.asarray(1e-15),
           jnp.asarray(1e-10), jnp.asarray(1e-10), x0)

    # as the solver: XLA:CPU at LLVM -O0 (f32 rounding differs in the last bits with -O3)
    @functools.partial(cpu_jit, optimise=False)
    def it(st):
        prop = run.propose(st, ctx)
        ev = (run.fj_branches[0](prop.z, ctx[0], ctx[4]) if len(rungs) == 1 else
              lax.switch(st.rung, run.fj_branches, prop.z, ctx[0], ctx[4]))
        new = run.finish(run.advance(st, prop, ev, ctx))
        return (new, prop.step.predicted, prop.step.step_norm, ev[0], prop.step.alpha,
                prop.step.s[0] / prop.step.s[-1])

    st = cpu_jit(run.init, optimise=False)(x0, ctx)
    rows = []
    while int(st.status) == ap.Status.RUNNING:
        pend, rung, cost, Delta = bool(st.pending), int(st.rung), float(st.cost), \
            float(st.Delta)
        st, pred, hn, cost_z, alpha, cond = it(st)
        pred, hn, cost_z = float(pred), float(hn), float(cost_z)
        actual = cost - cost_z
        acc = (not pend) and float(st.cost) == cost_z and cost_z != cost
        row = dict(nfev=int(st.nfev), rung=rung, pending=pend, cost=cost, cost_z=cost_z,
                   pred=pred, actual=actual, ratio=actual / pred if pred > 0 else np.nan,
                   hn=hn, Delta=Delta, alpha=float(alpha), acc=acc, cond=float(cond),
                   up=int(st.rung) > rung,
                   reason=ap.reason_name(int(st.esc_reason[int(st.rung)]))
                   if int(st.rung) > rung else "", x=np.asarray(st.x))
        rows.append(row)
        if not quiet:
            tag = "eval" if pend else ("acc " if acc else "rej ")
            print(f"{row['nfev']:4d} r{rung} {tag} cost {cost:.16e} -> {cost_z:.6e} "
                  f"pred {pred:9.2e} act {actual:10.2e} ratio {row['ratio']:8.3f} "
                  f"|Ddx| {hn:9.2e} Delta {Delta:9.2e} alpha {float(alpha):8.2e} cond {float(cond):8.1e}"
                  + (f"  UP: {row['reason']}" if row["up"] else ""))
    lre = score(p, np.asarray(st.x), float(st.cost))
    if not quiet:
        print(f"status {int(st.status)} ({ap.status_message(int(st.status))}), nfev "
              f"{int(st.nfev)}, rung_nfev {np.asarray(st.rung_nfev).tolist()}, LRE {lre:.2f}")
    return rows, st, lre


if __name__ == "__main__":
    a_ = argparse.ArgumentParser()
    a_.add_argument("name")
    a_.add_argument("start")
    a_.add_argument("--seed", type=int, default=0)
    a_.add_argument("--perturbed", type=int, default=3)
    a_.add_argument("--f64", action="store_true")
    a = a_.parse_args()
    trace(a.name, a.start, a.seed, a.perturbed, a.f64)
