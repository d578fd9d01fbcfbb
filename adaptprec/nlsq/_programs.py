"""The in-memory solve: one compiled program per (residual computation, data bucket,
options), run by one driver; docs/architecture.md ("One program per residual
computation, bucket and options") describes it. :func:`whole_solve` is the program;
:func:`run_identity` keys it on the residual's jaxpr (eager, autodiff, dense),
:func:`run_object` on the residual object (everything else)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from .. import _disk_cache
from .._policy import cast_floating
from .._tracing import is_concrete
from . import _caches
from ._buckets import masked, pad_points, padded_avals
from .._backend import cpu_jit, cpu_options
from .._identity import jaxpr_function, trace_residual
from .._user_fn import hashable
from ._state import Context, Options, Outputs, Solution
from .common import covariance_at
from .solver import TrustRegion, iterate, lean_capable
from .trf import make_strictly_feasible

__all__ = ["whole_solve", "run", "run_identity", "run_object", "final_program",
           "NO_HOIST_PASSES"]

#: XLA passes a small program is compiled without: hoisting loop-invariant code out of the
#: while loop changes, at LLVM ``-O0``, which multiply-adds become FMAs, so the bits would
#: depend on the program's shape rather than on the arithmetic.
NO_HOIST_PASSES = "while-loop-invariant-code-motion"
#: From this many residuals on a program is compiled with LLVM's optimisations (below it,
#: compilation dominates a fit's cost).
OPTIMISE_MIN_M = 4096


def _options(opts: Options, m: int) -> dict | None:
    optimise = m >= OPTIMISE_MIN_M
    out = cpu_options(optimise=optimise)
    if out is not None and not optimise:
        out["xla_disable_hlo_passes"] = NO_HOIST_PASSES
    return out


def whole_solve(opts: Options, outputs: Outputs, funs, padded_to: int | None = None):
    """The solve as one traceable function ``solve(ctxv, consts, args, m) -> Solution``.

    ``funs(consts)`` gives the residual ``fun(x, *args)`` of each rung (``consts``: the
    arrays it captures, as arguments so that derivatives reach them); ``ctxv`` packs
    ``(x0, lb, ub, scale_inv0, f_scale, ftol, xtol, gtol)`` (:func:`context_packer`);
    ``padded_to``: the bucket length of padded data (rows ``>= m`` masked)."""
    rungs, top_dt = opts.rungs, opts.rungs[-1]
    packer = context_packer(opts.n, top_dt)

    def residual(consts, m):
        by_dtype = {np.dtype(d): f for d, f in zip(rungs, funs(consts))}

        def fun(x, *a):
            return by_dtype[np.dtype(x.dtype)](x, *a)
        return masked(fun, jnp.arange(padded_to) < m if padded_to is not None else None)

    def cost_at(x, consts, args, f_scale, m):
        from .common import robust_cost
        return robust_cost(opts.loss, residual(consts, m)(x, *args).astype(top_dt), f_scale)

    @jax.custom_jvp
    def implicit_x(x, consts, args, f_scale, free, m):
        return x

    @implicit_x.defjvp
    def _implicit_jvp(primals, tangents):
        # x*(data) solves grad_x cost(x, data) = 0, so H dx = -d(grad_x cost)/d(data)
        # (parameters at an active bound held fixed)
        x, consts, args, f_scale, free, m = primals
        _, dconsts, dargs, dfs, _, _ = tangents
        grad_x = jax.grad(cost_at)
        H = jax.jacfwd(grad_x)(x, consts, args, f_scale, m)
        fz = free.astype(H.dtype)
        H = H * fz[:, None] * fz[None, :] + jnp.diag(1.0 - fz)
        _, rhs = jax.jvp(lambda c, a, s: grad_x(x, c, a, s, m), (consts, args, f_scale),
                         (dconsts, dargs, dfs))
        return x, -jnp.linalg.solve(H, rhs * fz)

    def solve(ctxv, consts, args, m):
        x0, lb, ub, scale_inv0, f_scale, ftol, xtol, gtol = packer.unpack(ctxv)
        fun = residual(consts, m)
        solver = TrustRegion(fun, opts)
        args_top = cast_floating(args, top_dt)
        args_c = jax.lax.stop_gradient(args)
        args_all = tuple(cast_floating(args_c, d) for d in rungs)
        if solver.blocks is not None:   # once, outside the loop: the data in blocks
            args_all = tuple(b.block(a) for b, a in zip(solver.blocks, args_all))
        x0c = jax.lax.stop_gradient(x0)
        if opts.has_bounds and opts.method == "trf":
            x0c = make_strictly_feasible(x0c, lb, ub)
        ctx = Context(args_all, lb, ub, scale_inv0, jax.lax.stop_gradient(f_scale), ftol,
                      xtol, gtol, x0c, m)
        if opts.max_nfev == 1:   # one evaluation, at x0: the final one below
            st = solver.at_x0_only(x0c, ctx)
        else:
            st = iterate(solver, x0c, ctx)
        free = solver.active_mask(jax.lax.stop_gradient(st.x), ctx) == 0
        x = implicit_x(jax.lax.stop_gradient(st.x), consts, args_top, f_scale, free, m)
        return solver.postprocess(st, ctx, x, args_top, f_scale, outputs)

    return solve


def context_packer(n: int, top_dt) -> "Packer":
    """The :class:`Packer` of ``(x0, lb, ub, scale_inv0, f_scale, ftol, xtol, gtol)``."""
    vec, sca = jax.ShapeDtypeStruct((n,), top_dt), jax.ShapeDtypeStruct((), top_dt)
    return Packer((vec, vec, vec, vec, sca, sca, sca, sca))


def _arg_sig(tree) -> tuple:
    """The structure, shapes and dtypes of ``tree`` (Python scalars by type: weakly typed)."""
    leaves, treedef = jax.tree.flatten(tree)
    return treedef, tuple((a.shape, a.dtype) if isinstance(a, (np.ndarray, jax.Array,
                                                                 np.generic))
                          else type(a) for a in leaves)


def _rung_aval(a, dt):
    dtype = jnp.result_type(a)
    if jnp.issubdtype(dtype, jnp.floating):
        return jax.ShapeDtypeStruct(np.shape(a), dt)
    return jax.ShapeDtypeStruct(np.shape(a), dtype,
                                weak_type=isinstance(a, (bool, int, float, complex)))


def _trace_rungs(residual, fun_flat, x0, shaped, rungs, pad) -> tuple:
    """The residual traced on each rung at the (padded) data shapes, memoised per
    residual object and shapes (a new object is traced again and finds its program by
    the computation)."""
    def trace():
        out = []
        for dt in rungs:
            avals = jax.tree.map(lambda a: _rung_aval(a, dt), shaped)
            out.append(trace_residual(fun_flat, jax.ShapeDtypeStruct((x0.shape[0],), dt),
                                      avals))
        return tuple(out)

    return _caches.TRACES.get_or_build((residual, _arg_sig(x0), _arg_sig(shaped), rungs,
                                        pad), trace)


def run(prob, outputs: Outputs) -> Solution:
    """Solve ``prob`` (a :class:`._inputs.Problem`) on its program. A lean solve (eager,
    :func:`.solver.lean_capable`) reads cost, gradient and covariance off the loop's last
    model and forms only what was asked in a final evaluation of its own
    (:func:`final_program`): ``fun``/``jac``, or the covariance where the last model does
    not describe the iterate."""
    opts = prob.opts
    full = Outputs(True, outputs.covariance, outputs.throw)
    if prob.identity:
        return run_identity(prob, full)
    if not (lean_capable(opts) and is_concrete((prob.context, prob.args))):
        return run_object(prob, full)
    sol = run_object(prob, outputs._replace(fun_jac=False, covariance=True))
    f_scale = prob.context[4]
    if outputs.fun_jac:
        f, Js, g, cost = final_program(prob, "full")(sol.x, prob.args, f_scale)
        sol = sol._replace(fun=f, jac=Js, grad=g, cost=cost, optimality=jnp.max(jnp.abs(g)))
        if outputs.covariance and not bool(sol.model_holds):
            sol = sol._replace(cov=covariance_at(Js))
    elif outputs.covariance and not bool(sol.model_holds):
        cost, g, cov = final_program(prob, "covariance")(sol.x, prob.args, f_scale)
        sol = sol._replace(cost=cost, grad=g, cov=cov, optimality=jnp.max(jnp.abs(g)))
    return sol._replace(cov=sol.cov if outputs.covariance else None, model_holds=None)


def run_identity(prob, outputs: Outputs) -> Solution:
    """An eager, dense, autodiff solve on the program keyed by the residual's computation;
    results come back as NumPy. A memoised problem (:func:`._inputs.prepare`) keeps its
    runner: a repeat traces and looks up nothing."""
    key = ("runner", prob.memo_key, outputs) if prob.memo_key is not None else None
    runner = _caches.PROGRAMS.get(key) if key is not None else None
    if runner is None:
        runner = _identity_runner(prob, outputs)
        if key is not None:
            _caches.PROGRAMS.put(key, runner)
    return runner(prob)


class _Runner:
    """One identity program with what its calls share: the residual's hoisted arrays,
    the layouts of its packed operands and results, the bucket's padding (every data
    length of the bucket runs on it)."""

    def __init__(self, prog, consts, out: Packer, ctx: Packer, pad):
        self.prog, self.consts, self.out, self.ctx = prog, consts, out, ctx
        self.pad = pad
        self.rows = (None, None)   # (m, the data rows of the bucket) of the last call

    def __call__(self, prob) -> Solution:
        args, m = prob.args, prob.m
        if self.pad is not None:   # the last point repeated to the bucket (masked)
            rows = self.rows   # (read once: another thread may replace it)
            if rows[0] != m:
                rows = self.rows = (m, np.minimum(np.arange(self.pad[1]), m - 1))
            idx = rows[1]
            leaves, treedef = jax.tree.flatten(args)
            args = jax.tree.unflatten(treedef, [
                a if ax is None else np.take(np.asarray(a), idx, axis=ax)
                for a, ax in zip(leaves, self.pad[0])])
        packed = self.prog(self.ctx.pack_numpy(prob.context), self.consts, args,
                           np.asarray(m, np.int32))
        return Solution(**{**_NO_SOLUTION, **self.out.unpack_numpy(packed)})


_NO_SOLUTION = dict.fromkeys(Solution._fields)


def _identity_runner(prob, outputs: Outputs) -> _Runner:
    opts, pad, m, args = prob.opts, prob.pad, prob.m, prob.args
    shaped = padded_avals(args, *pad) if pad is not None else args
    traced = _trace_rungs(prob.residual, prob.fun_flat, prob.context[0], shaped, opts.rungs,
                          pad)
    padded_to = pad[1] if pad is not None else None
    consts = tuple(tr.consts for tr in traced)
    ctx = context_packer(opts.n, opts.rungs[-1])
    out = solution_packer(opts, outputs, padded_to or m)
    runner = _Runner(None, consts, out, ctx, pad)
    operands = (ctx.pack_numpy(prob.context), consts,
                pad_points(args, pad[0], m, padded_to) if pad is not None else args,
                np.asarray(m, np.int32))
    key = ("nlsq-solve", tuple(tr.key for tr in traced), _options_key(opts, prob.jac_key),
           outputs, padded_to, _arg_sig(operands[2]))
    prog = _caches.PROGRAMS.get(key)
    if prog is None:
        def funs(cs):
            return tuple(jaxpr_function(tr.jaxpr, c) for tr, c in zip(traced, cs))

        solve = whole_solve(opts, outputs, funs, padded_to)

        def packed(*a):
            sol = solve(*a)._asdict()
            tree = {k: sol[k] for k in out.names}
            got = [(np.shape(v), np.dtype(v.dtype)) for v in jax.tree.leaves(tree)]
            if got != out.avals:
                raise AssertionError(f"solution layout {got} is not {out.avals}")
            return out.pack(tree)

        options = _options(opts, m)
        jitted = jax.jit(packed, **({"compiler_options": options} if options else {}))
        prog = _disk_cache.compiled(jitted, key, operands, options)
        _caches.PROGRAMS.put(key, prog)
    runner.prog = prog
    return runner


def run_object(prob, outputs: Outputs) -> Solution:
    """A solve on the program that closes over the flat residual (keyed on the residual
    object and shapes): traced calls (inlined in the user's program), user and
    finite-difference Jacobians, blocked fits."""
    opts, m = prob.opts, prob.m
    packer = context_packer(opts.n, opts.rungs[-1])
    ctxv = packer.pack_numpy(prob.context) if is_concrete(prob.context) else \
        packer.pack(prob.context)
    key = ("nlsq-object", hashable(prob.residual), _options_key(opts, prob.jac_key),
           outputs, prob.x0_sig, _arg_sig(prob.args))
    nr = len(opts.rungs)
    fun_flat = prob.fun_flat
    prog = _caches.PROGRAMS.get_or_build(key, lambda: cpu_jit(
        whole_solve(opts, outputs, lambda cs: (fun_flat,) * nr),
        optimise=m >= OPTIMISE_MIN_M))
    return prog(ctxv, (), prob.args, np.asarray(m, np.int32))


def solution_packer(opts: Options, outputs: Outputs, rows: int) -> "Packer":
    """The :class:`Packer` of a :class:`._state.Solution` (``rows``: the evaluated
    residuals, the bucket length of padded data)."""
    sds, n, nr = jax.ShapeDtypeStruct, opts.n, len(opts.rungs)
    top, i32 = np.dtype(opts.rungs[-1]), np.dtype(np.int32)
    vec, sca, cnt, per_rung = sds((n,), top), sds((), top), sds((), i32), sds((nr,), i32)
    return Packer(dict(
        x=vec, cost=sca, grad=vec, optimality=sca, active_mask=sds((n,), i32), nfev=cnt,
        njev=cnt, nit=cnt, status=cnt, rung=cnt, escalations=cnt, rung_entered=per_rung,
        rung_nfev=per_rung, escalation_reason=per_rung,
        **({"fun": sds((rows,), top), "jac": sds((rows, n), top)} if outputs.fun_jac
           else {}),
        **({"cov": sds((n, n), top)} if outputs.covariance else {})), bool_as=np.int32)


def _options_key(opts: Options, jac_key):
    """``opts`` as a key: the Jacobian by its key, user objects by identity when
    unhashable."""
    return opts._replace(loss=hashable(opts.loss), jac=hashable(jac_key),
                         schedule=hashable(opts.schedule), callback=hashable(opts.callback))


def final_program(prob, kind: str):
    """The final evaluation of a lean solve at its iterate ``x``, kept per residual and
    options: ``kind="full"``: ``(fun, jac, g, cost)``; ``"covariance"``: ``(cost, g,
    (J^T J)^+)``. Not inside the solve's program, where its ``m x n`` Jacobian would be a
    temporary of every call."""
    from ._evaluate import final_evaluation
    from .common import covariance

    opts, fun_flat = prob.opts, prob.fun_flat
    top_dt = opts.rungs[-1]

    def final(x, args, f_scale):
        f, Js, g, cost = final_evaluation(fun_flat, opts, x, cast_floating(args, top_dt),
                                          f_scale)
        return (f, Js, g, cost) if kind == "full" else (cost, g, covariance(Js))

    return _caches.FINAL_PROGRAMS.get_or_build(
        (hashable(prob.residual), _options_key(opts, prob.jac_key), prob.x0_sig, kind),
        lambda: cpu_jit(final, optimise=opts.m >= OPTIMISE_MIN_M))


class Packer:
    """Packs trees shaped as ``avals`` (a pytree of ``ShapeDtypeStruct``) into one 1-D
    array per dtype (booleans as 0/1 in the ``bool_as`` group), and back: a compiled
    program's call costs a few microseconds per argument and result.

    Example:
        >>> import jax, jax.numpy as jnp, numpy as np
        >>> from adaptprec.nlsq._programs import Packer
        >>> tree = {"a": jnp.ones((2, 2)), "b": jnp.asarray(3, jnp.int32)}
        >>> p = Packer(jax.eval_shape(lambda: tree))
        >>> [v.shape for v in p.pack(tree)], int(p.unpack_numpy(p.pack(tree))["b"])
        ([(4,), (1,)], 3)
    """

    def __init__(self, avals, bool_as=np.int32):
        leaves, self.treedef = jax.tree.flatten(avals)
        self.dtypes: list = []
        self.slots: list = []          # per leaf: (group, start, size, shape)
        self.bools: list = []          # per leaf: stored as bool_as, given back as bool
        sizes: dict = {}
        for a in leaves:
            dt = np.dtype(a.dtype)
            self.bools.append(dt == np.bool_ and bool_as is not None)
            if self.bools[-1]:
                dt = np.dtype(bool_as)
            if dt not in sizes:
                sizes[dt] = 0
                self.dtypes.append(dt)
            size = int(np.prod(a.shape, dtype=np.int64))
            self.slots.append((self.dtypes.index(dt), sizes[dt], size, tuple(a.shape)))
            sizes[dt] += size
        self.sizes = tuple(sizes[d] for d in self.dtypes)
        self.avals = [(tuple(a.shape), np.dtype(a.dtype)) for a in leaves]
        self.names = list(avals) if isinstance(avals, dict) else None

    def _pack(self, tree, xnp):
        leaves = self.treedef.flatten_up_to(tree)
        groups = [[] for _ in self.dtypes]
        for (g, _, _, _), leaf in zip(self.slots, leaves):
            groups[g].append(xnp.asarray(leaf, self.dtypes[g]).reshape(-1))
        return tuple(xnp.concatenate(g) if len(g) > 1 else g[0] for g in groups)

    def pack(self, tree):
        """The tree's leaves concatenated per dtype (traceable)."""
        return self._pack(tree, jnp)

    def pack_numpy(self, tree):
        """:meth:`pack` on the host (NumPy; no compilation)."""
        return self._pack(tree, np)

    def unpack(self, vecs):
        """The tree back from :meth:`pack`'s vectors (traceable)."""
        leaves = [vecs[g][s:s + k].reshape(shape) for g, s, k, shape in self.slots]
        return jax.tree.unflatten(self.treedef, [v != 0 if b else v for v, b in
                                                 zip(leaves, self.bools)])

    def unpack_numpy(self, vecs):
        """:meth:`unpack` on the host (NumPy views; no compilation)."""
        return self.unpack([np.asarray(v) for v in vecs])
