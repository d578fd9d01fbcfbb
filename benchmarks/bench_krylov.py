"""Adaptive-precision Krylov solvers against float64 lineax, jax.scipy and scipy, one run.

Every problem is solved to a *verified* relative residual ``||b - A x|| / ||b|| <= 1e-10``
(``--target``; computed in extended precision from the assembled matrix, ``_verify``) by:

* ``adaptive``: ``ap.linalg.cg`` / ``gmres`` / ``bicgstab`` with the default ladder
  (``"f32,f64"``) and ``rtol=target`` (its stopping test *is* the float64 true residual);
* ``ours f64``: the same loop with ``ladder="f64"`` (plain float64, same checks);
* ``lineax``: ``lx.CG`` / ``lx.GMRES`` / ``lx.BiCGStab`` in float64;
* ``jax.scipy``: ``jax.scipy.sparse.linalg.cg`` / ``gmres`` / ``bicgstab`` in float64;
* ``scipy``: ``scipy.sparse.linalg`` on the assembled CSR matrix (host, float64).

The baselines stop on their own residual estimates (lineax on a max-norm test relative to
``|b|``), so each is calibrated once: its tolerance goes down a ladder of values (4x apart
for lineax, whose elementwise test overshoots, 3x otherwise) until its answer verifies at
the target; a baseline that never verifies is timed at the loosest setting of its floor
(the first whose tighter successor no longer improves the verified residual by 30%) and
flagged. scipy (host, minutes per solve at 1024^2) runs once, at the target, as the
reference answer; its time is that run's unless ``--time-scipy``.
Timings are medians of ``--rounds`` interleaved rounds in this one process (jitted,
compiled beforehand); ratios are adaptive / baseline. Each answer is also compared with
scipy's (``|x - x_scipy| / |x_scipy|``).

Problems (``--only`` picks some):

* ``poisson2d``: matrix-free 5-point Laplacian (flux form), ``--n2d`` squared (1024^2);
* ``poisson3d``: matrix-free 7-point Laplacian, ``--n3d`` cubed (128^3);
* ``varcoef``: 2-D diffusion with a piecewise coefficient (1 or 1e4 on an 8 x 8 checker
  of blocks) and anisotropy 0.1 in y, matrix-free in flux form with its face
  coefficients rounded to the rung (``--nvar`` squared, 384^2), Jacobi-preconditioned
  (every solver): float32 stalls near 1e-10 here and the schedule climbs;
* ``graph``: grounded graph Laplacian of the Delaunay triangulation of ``--points``
  random points (a BCOO matrix, for every JAX solver; the hull's nodes are held at 0);
* ``convdiff``: 2-D upwind convection-diffusion, wind (1, 0.5) * ``--peclet``,
  nonsymmetric, matrix-free (``--ncd`` squared), GMRES and BiCGStab.

Run:  python benchmarks/bench_krylov.py                      (10-20 minutes when idle)
      python benchmarks/bench_krylov.py --n2d 256 --n3d 48 --nvar 128 --points 20000 \\
          --ncd 128 --rounds 3                               (a quick look)
"""

from __future__ import annotations

import argparse
import os
import time

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import lineax as lx  # noqa: E402
import numpy as np  # noqa: E402
import scipy.sparse as sps  # noqa: E402
import scipy.sparse.linalg as spla  # noqa: E402
from jax.experimental import sparse  # noqa: E402

import adaptprec as ap  # noqa: E402

MAXITER = 60000


# ---------------------------------------------------------------- operators (any dtype)

def poisson2d(n):
    def apply(x):
        u = x.reshape(n, n)
        p = jnp.pad(u, 1)
        return ((u - p[:-2, 1:-1]) + (u - p[2:, 1:-1]) + (u - p[1:-1, :-2])
                + (u - p[1:-1, 2:])).reshape(-1)
    t = sps.diags([-1.0, 2.0, -1.0], [-1, 0, 1], shape=(n, n))
    eye = sps.identity(n)
    return apply, (sps.kron(eye, t) + sps.kron(t, eye)).tocsr()


def poisson3d(n):
    def apply(x):
        u = x.reshape(n, n, n)
        p = jnp.pad(u, 1)
        c = p[1:-1, 1:-1, 1:-1]
        return ((c - p[:-2, 1:-1, 1:-1]) + (c - p[2:, 1:-1, 1:-1]) + (c - p[1:-1, :-2, 1:-1])
                + (c - p[1:-1, 2:, 1:-1]) + (c - p[1:-1, 1:-1, :-2])
                + (c - p[1:-1, 1:-1, 2:])).reshape(-1)
    t = sps.diags([-1.0, 2.0, -1.0], [-1, 0, 1], shape=(n, n))
    eye = sps.identity(n)
    A = (sps.kron(sps.kron(eye, eye), t) + sps.kron(sps.kron(eye, t), eye)
         + sps.kron(sps.kron(t, eye), eye))
    return apply, A.tocsr()


def _faces(n, contrast=1e4, aniso=0.1, seed=0):
    blocks = np.random.default_rng(seed).integers(0, 2, size=(8, 8))
    k = np.where(np.kron(blocks, np.ones((n // 8, n // 8))) > 0, contrast, 1.0)
    harm = lambda a, b: 2 * a * b / (a + b)
    kx = np.empty((n, n + 1))
    kx[:, 1:-1] = harm(k[:, 1:], k[:, :-1])
    kx[:, 0], kx[:, -1] = k[:, 0], k[:, -1]
    ky = np.empty((n + 1, n))
    ky[1:-1, :] = harm(k[1:, :], k[:-1, :])
    ky[0, :], ky[-1, :] = k[0, :], k[-1, :]
    return kx, aniso * ky


def _assemble(n, kx, ky, cx=None, cy=None):
    """CSR of the 2-D flux-form operator with face coefficients kx (n, n+1), ky (n+1, n)
    and optional upwind convection coefficients cx, cy (added on the west/south faces)."""
    idx = np.arange(n * n).reshape(n, n)
    diag = (kx[:, 1:] + kx[:, :-1] + ky[1:, :] + ky[:-1, :])
    rows, cols, vals = [idx.ravel()], [idx.ravel()], []
    west, south = np.zeros((n, n)), np.zeros((n, n))
    if cx is not None:
        diag = diag + cx + cy
        west[:, 1:], south[1:, :] = cx[:, 1:], cy[1:, :]
    vals.append(diag.ravel())
    for (r, c, v) in ((idx[:, :-1], idx[:, 1:], -kx[:, 1:-1]),
                      (idx[:, 1:], idx[:, :-1], -kx[:, 1:-1] - west[:, 1:]),
                      (idx[:-1, :], idx[1:, :], -ky[1:-1, :]),
                      (idx[1:, :], idx[:-1, :], -ky[1:-1, :] - south[1:, :])):
        rows.append(r.ravel())
        cols.append(c.ravel())
        vals.append(v.ravel())
    return sps.csr_matrix((np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))),
                          shape=(n * n, n * n))


def varcoef(n):
    kx, ky = _faces(n)
    KX, KY = jnp.asarray(kx), jnp.asarray(ky)

    def apply(x):
        u = x.reshape(n, n)
        p = jnp.pad(u, 1)
        ax, ay = KX.astype(x.dtype), KY.astype(x.dtype)   # the rung's coefficients
        return (ax[:, 1:] * (u - p[1:-1, 2:]) + ax[:, :-1] * (u - p[1:-1, :-2])
                + ay[1:, :] * (u - p[2:, 1:-1]) + ay[:-1, :] * (u - p[:-2, 1:-1])).reshape(-1)
    inv_diag = 1.0 / (kx[:, 1:] + kx[:, :-1] + ky[1:, :] + ky[:-1, :]).ravel()
    return apply, _assemble(n, kx, ky), inv_diag


def convdiff(n, peclet):
    h = 1.0 / (n + 1)
    wx, wy = peclet * h, 0.5 * peclet * h            # upwind: flow towards +x, +y

    def apply(x):
        u = x.reshape(n, n)
        p = jnp.pad(u, 1)
        diff = ((u - p[1:-1, 2:]) + (u - p[1:-1, :-2]) + (u - p[2:, 1:-1])
                + (u - p[:-2, 1:-1]))
        return (diff + wx * (u - p[1:-1, :-2]) + wy * (u - p[:-2, 1:-1])).reshape(-1)
    one = np.ones((n, n + 1)), np.ones((n + 1, n))
    return apply, _assemble(n, *one, cx=np.full((n, n), wx), cy=np.full((n, n), wy))


def graph_laplacian(points, seed=0):
    from scipy.spatial import Delaunay
    pts = np.random.default_rng(seed).uniform(size=(points, 2))
    tri = Delaunay(pts)
    e = np.concatenate([tri.simplices[:, [0, 1]], tri.simplices[:, [1, 2]],
                        tri.simplices[:, [2, 0]]])
    e = np.unique(np.sort(e, axis=1), axis=0)
    W = sps.coo_matrix((np.ones(len(e)), (e[:, 0], e[:, 1])), shape=(points, points))
    W = (W + W.T).tocsr()
    L = (sps.diags(np.asarray(W.sum(1)).ravel()) - W).tocsr()
    hull = np.unique(tri.convex_hull)
    interior = np.setdiff1d(np.arange(points), hull)
    A = L[interior][:, interior].tocsr()                 # grounded at the hull
    A.sort_indices()
    return sparse.BCOO.from_scipy_sparse(A), A


# ---------------------------------------------------------------------- the solvers

def _verify(A_csr, x, b):
    """``||b - A x|| / ||b||`` in extended precision (``np.longdouble``, 64-bit mantissa
    on x86): a float64 product's own rounding, ``~u |||A| |x||| / ||b||``, is as large as
    the residuals near float64's floor (2e-10 on ``varcoef``), so "verified" uses the
    exact residual of the returned float64 ``x``."""
    L = np.longdouble
    A_csr = A_csr.tocsr()
    prod = A_csr.data.astype(L) * np.asarray(x, np.float64).astype(L)[A_csr.indices]
    empty = np.diff(A_csr.indptr) == 0
    Ax = np.add.reduceat(prod, np.minimum(A_csr.indptr[:-1], len(prod) - 1))
    Ax[empty] = 0
    r = np.asarray(b, np.float64).astype(L) - Ax
    return float(np.sqrt(np.sum(r * r)) / np.sqrt(np.sum(np.asarray(b, L) ** 2)))


def _timed(f):
    t0 = time.perf_counter()
    out = jax.block_until_ready(f())
    return out, time.perf_counter() - t0


def configurations(method, op, A_csr, b, target, inv_diag=None):
    """``{name: (tolerances to try, make(tol) -> (callable -> x, info or None))}``; with
    ``inv_diag``, every solver gets the Jacobi preconditioner ``diag(A)^{-1}``."""
    n = b.shape[0]
    bj = jnp.asarray(b)
    ours = getattr(ap.linalg, method)
    # a matrix is an argument of every jitted solve (as in an eager call), not a constant
    # baked into the program: XLA would fold a constant BCOO's index work at compile time
    mat = None if callable(op) else op
    fn_of = (lambda A: op) if callable(op) else (lambda A: (lambda x: A @ x))
    tag = lx.positive_semidefinite_tag if method == "cg" else ()
    lxop_of = lambda A: lx.FunctionLinearOperator(
        fn_of(A), jax.ShapeDtypeStruct((n,), jnp.float64), tags=tag)
    lx_solver = {"cg": lx.CG, "gmres": lx.GMRES, "bicgstab": lx.BiCGStab}[method]
    jsp = getattr(jax.scipy.sparse.linalg, method)
    sp = getattr(spla, method)
    kw_lx = {"restart": 20} if method == "gmres" else {}
    jac = None if inv_diag is None else jnp.asarray(inv_diag)
    M_ours = None if jac is None else ap.linalg.Jacobi(jac)
    lx_opts = {} if jac is None else {"preconditioner": lx.TaggedLinearOperator(
        lx.DiagonalLinearOperator(jac), lx.positive_semidefinite_tag)}
    M_jsp = None if jac is None else (lambda r: jac * r)
    M_sp = None if inv_diag is None else sps.diags(inv_diag)

    def ours_make(ladder):
        f = jax.jit(lambda A, b: ours(op if A is None else A, b, rtol=target,
                                      maxiter=MAXITER, ladder=ladder, M=M_ours))
        return lambda tol: (lambda: f(mat, bj)[0], lambda: f(mat, bj)[1])

    def lx_make(tol):
        f = jax.jit(lambda A, b: lx.linear_solve(
            lxop_of(A), b, lx_solver(rtol=tol, atol=0.0, max_steps=MAXITER, **kw_lx),
            options=lx_opts, throw=False).value)
        return lambda: f(mat, bj), None

    def jsp_make(tol):
        f = jax.jit(lambda A, b: jsp(fn_of(A), b, tol=tol, atol=0.0, maxiter=MAXITER,
                                     M=M_jsp)[0])
        return lambda: f(mat, bj), None

    def sp_make(tol):
        return lambda: sp(A_csr, b, rtol=tol, atol=0.0, maxiter=MAXITER, M=M_sp)[0], None

    down = lambda start, step, k: [start * step ** -i for i in range(k)]
    return {
        "adaptive": ([target], ours_make("f32,f64")),
        "ours f64": ([target], ours_make("f64")),
        "lineax": (down(10 * target, 4.0, 5), lx_make),
        "jax.scipy": (down(target, 3.0, 4), jsp_make),
        "scipy": ([target], sp_make),     # the reference answer (minutes per solve)
    }


def run_problem(name, method, op, A_csr, b, args, inv_diag=None):
    print(f"\n## {name} ({method}, n = {b.shape[0]}), load {os.getloadavg()[0]:.1f}",
          flush=True)
    configs = configurations(method, op, A_csr, b, args.target, inv_diag)
    chosen, answers, first = {}, {}, {}
    for label, (tols, make) in configs.items():
        last = None
        for tol in tols:
            run, extra = make(tol)
            x, t = _timed(run)                       # compile + first run
            res = _verify(A_csr, x, b)
            print(f"  calibrate {label}: tol {tol:.3g} -> verified {res:.2e} "
                  f"({t:.1f} s with compilation)", flush=True)
            if last is not None and res > 0.7 * last[2]:
                # a tighter setting no longer improves the verified residual: the
                # method's own floor; time the looser setting that got there
                run, tol, res, extra, t, x = last
            if res <= args.target or tol == tols[-1] or last is not None and tol == last[1]:
                chosen[label] = (run, tol, res, res <= args.target, extra)
                first[label] = t
                answers[label] = np.asarray(x)
                break
            last = (run, tol, res, extra, t, x)
    info = chosen["adaptive"][4]()
    # scipy (host, nothing to compile) is timed by its one calibrated run unless
    # --time-scipy: at 1024^2 one solve takes minutes under load
    timed = {k: v for k, v in chosen.items() if k != "scipy" or args.time_scipy}
    times = {k: [] for k in timed}
    if "scipy" not in timed:
        times["scipy"] = [first["scipy"]]
    for _ in range(args.rounds):
        for label, (run, *_rest) in timed.items():
            times[label].append(_timed(run)[1])
    med = {k: float(np.median(v)) for k, v in times.items()}
    ref = answers["scipy"]
    print(f"adaptive: {ap.Status(int(info.status)).name}, iterations per rung "
          f"{np.asarray(info.iterations_per_rung).tolist()}, escalations "
          f"{int(info.escalations)} ({ap.reason_name(int(info.reason))}), "
          f"cycles {int(info.cycles)}")
    if int(info.escalations):
        print(info.trace())
    plain = chosen["ours f64"][4]()
    print(f"ours f64: {ap.Status(int(plain.status)).name}, iterations "
          f"{int(plain.iterations)}, cycles {int(plain.cycles)}")
    print("| solver | tolerance | verified residual | time (s) | adaptive / this | "
          "|x - x_scipy| / |x_scipy| |")
    print("|---|---|---|---|---|---|")
    for label, (run, tol, res, ok, _) in chosen.items():
        diff = np.linalg.norm(answers[label] - ref) / np.linalg.norm(ref)
        flag = "" if ok else " (target not reached)"
        print(f"| {label} | {tol:.3g} | {res:.2e}{flag} | {med[label]:.3f} | "
              f"{med['adaptive'] / med[label]:.2f} | {diff:.1e} |", flush=True)
    return med


def main():
    ap_ = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap_.add_argument("--n2d", type=int, default=1024)
    ap_.add_argument("--n3d", type=int, default=128)
    ap_.add_argument("--nvar", type=int, default=384)
    ap_.add_argument("--points", type=int, default=200_000)
    ap_.add_argument("--ncd", type=int, default=512)
    ap_.add_argument("--peclet", type=float, default=200.0)
    ap_.add_argument("--rounds", type=int, default=3)
    ap_.add_argument("--target", type=float, default=1e-10)
    ap_.add_argument("--time-scipy", action="store_true",
                     help="time scipy in every round too (default: its one calibrated run)")
    ap_.add_argument("--only", default="poisson2d,poisson3d,varcoef,graph,convdiff")
    args = ap_.parse_args()
    only = set(args.only.split(","))
    rng = np.random.default_rng(0)
    print(f"bench_krylov: load {os.getloadavg()}, jax {jax.__version__}, "
          f"{jax.device_count()} device(s)")
    if "poisson2d" in only:
        op, A = poisson2d(args.n2d)
        run_problem(f"poisson2d {args.n2d}^2", "cg", op, A,
                    rng.uniform(0.5, 1.5, A.shape[0]), args)
    if "poisson3d" in only:
        op, A = poisson3d(args.n3d)
        run_problem(f"poisson3d {args.n3d}^3", "cg", op, A,
                    rng.uniform(0.5, 1.5, A.shape[0]), args)
    if "varcoef" in only:
        op, A, inv_diag = varcoef(args.nvar)
        run_problem(f"varcoef {args.nvar}^2, Jacobi", "cg", op, A,
                    rng.uniform(0.5, 1.5, A.shape[0]), args, inv_diag)
    if "graph" in only:
        Abcsr, A = graph_laplacian(args.points)
        run_problem(f"graph Laplacian ({args.points} points)", "cg", Abcsr, A,
                    rng.uniform(0.5, 1.5, A.shape[0]), args)
    if "convdiff" in only:
        op, A = convdiff(args.ncd, args.peclet)
        b = rng.uniform(0.5, 1.5, A.shape[0])
        for method in ("gmres", "bicgstab"):
            run_problem(f"convdiff {args.ncd}^2", method, op, A, b, args)
    print(f"\nload at the end {os.getloadavg()}")


if __name__ == "__main__":
    main()
