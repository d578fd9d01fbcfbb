"""Mixed-precision solve: float32 LU, float64 refinement, fallback — and what the info says.

Run: python examples/linalg_refinement.py
"""

import jax

jax.config.update("jax_enable_x64", True)   # float64 working precision; adaptprec never flips it

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import adaptprec as ap  # noqa: E402


def prescribed(kappa, n=64, seed=0):
    rng = np.random.default_rng(seed)
    u, _ = np.linalg.qr(rng.standard_normal((n, n)))
    v, _ = np.linalg.qr(rng.standard_normal((n, n)))
    return (u * np.logspace(0, -np.log10(kappa), n)) @ v.T


solve = jax.jit(ap.linalg.solve, static_argnames=("refine",))
b = jnp.ones(64)
print(f"{'kappa':>7} {'refine':>6} {'status':>6} {'fell_back':>9} {'iters':>5} "
      f"{'backward err':>12} {'cond est':>9}")
for kappa in (1e2, 1e6, 1e9, 1e13):
    A = jnp.asarray(prescribed(kappa))
    for refine in ("lu", "gmres"):
        x, info = solve(A, b, refine=refine)
        print(f"{kappa:>7.0e} {refine:>6} {int(info.status):>6} {str(bool(info.fell_back)):>9} "
              f"{int(info.iterations):>5} {float(info.backward_error):>12.1e} "
              f"{float(info.cond_estimate):>9.1e}")

# a batch with one bad member: only that member takes the float64 answer
A = jnp.stack([prescribed(1e2, seed=1), prescribed(1e12, seed=2)])
x, info = ap.linalg.solve(A, jnp.ones((2, 64, 3)))        # 3 right-hand sides each
print("batch fell_back:", info.fell_back.tolist(), "messages:", info.message)

# gradients are implicit: the adjoint is another refined solve on the same factors
g = jax.grad(lambda A: jnp.sum(ap.linalg.solve(A, b)[0]))(A[0])
g_ref = jax.grad(lambda A: jnp.sum(jnp.linalg.solve(A, b)))(A[0])
print("grad max rel diff vs jnp.linalg.solve:",
      float(jnp.abs(g - g_ref).max() / jnp.abs(g_ref).max()))
