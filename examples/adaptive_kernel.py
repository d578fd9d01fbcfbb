"""Adaptive kernels: run cheap, check inside jit, escalate only when a guard fires.

Three kernels on the ladder bf16 -> f32 -> f64:

1. a log-sum-exp written naively (no max shift): it overflows in bf16 and f32 for inputs
   around 100, the ``finite`` guard fires and the call escalates to f64;
2. a linear solve with a Hilbert matrix (kappa_1 ~ 3e10): ``matrix_condition`` fires on
   f32 and the solve escalates to f64, while a well-conditioned system stays on f32;
3. a benign kernel that stays on bf16.

Run:  python examples/adaptive_kernel.py
"""

import jax

jax.config.update("jax_enable_x64", True)   # the f64 rung needs it; adaptprec never sets it

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import scipy.linalg  # noqa: E402

import adaptprec as ap  # noqa: E402
from adaptprec import guards  # noqa: E402


@ap.adaptive(ladder="bf16,f32,f64", guards=[guards.finite()])
def naive_logsumexp(x):
    return jnp.log(jnp.sum(jnp.exp(x)))


# jnp.linalg.solve has no bf16 LU on CPU, so this ladder starts at f32
adaptive_solve = ap.adaptive(
    jnp.linalg.solve, ladder="f32,f64",
    guards=[guards.finite(), guards.matrix_condition(tol=1e-3)])


@ap.adaptive(ladder="bf16,f32,f64", guards=[guards.finite(), guards.headroom(0.5)])
def smooth_relu_mean(x):
    # accumulate in float32 even on the bf16 rung
    return jnp.mean(jnp.log1p(jnp.exp(x)), dtype=jnp.float32)


def main():
    x = jnp.array([100.0, 99.0, 1.0], jnp.float32)
    y, rep = jax.jit(naive_logsumexp.with_report)(x)
    print(f"naive logsumexp({x.tolist()}) = {float(y):.6f}")
    print(f"  reference (scipy)           = {scipy.special.logsumexp(np.asarray(x)):.6f}")
    print(f"  report: {rep.summary()}")

    h = jnp.asarray(scipy.linalg.hilbert(8))
    well = jnp.asarray(np.eye(8) * 4 + 0.3 * np.random.default_rng(0).standard_normal((8, 8)))
    b = jnp.ones(8)
    solve = jax.jit(adaptive_solve.with_report)
    for name, a in (("Hilbert(8)", h), ("well-conditioned", well)):
        xs, rep = solve(a, b)
        ref = np.linalg.solve(np.asarray(a), np.asarray(b))
        err = np.linalg.norm(np.asarray(xs) - ref) / np.linalg.norm(ref)
        print(f"solve {name:17s}: rung {rep.rung_name}, kappa_1 estimate "
              f"{float(rep.values[rep.rung, 1]):.2e}, relative error vs LAPACK {err:.1e}")
        print(f"  report: {rep.summary()}")

    z = jnp.linspace(-4.0, 4.0, 1024, dtype=jnp.float32)
    y, rep = jax.jit(smooth_relu_mean.with_report)(z)
    print(f"mean softplus on 1024 points: {float(y):.4f} "
          f"(f64 reference {np.mean(np.log1p(np.exp(np.asarray(z, np.float64)))):.4f})")
    print(f"  report: {rep.summary()}")

    # Under vmap, batch="call" (default) escalates the whole batch if any element fails.
    xs = jnp.array([[1.0, 2.0, 3.0], [100.0, 99.0, 1.0], [0.5, 0.1, -2.0]], jnp.float32)
    _, rep = jax.jit(jax.vmap(naive_logsumexp.with_report))(xs)
    print(f"vmap, batch='call':    {rep.summary()}")
    per_element = ap.adaptive(naive_logsumexp.__wrapped__, ladder="bf16,f32,f64",
                              batch="element", capacity=1)
    _, rep = jax.jit(jax.vmap(per_element.with_report))(xs)
    print(f"vmap, batch='element': {rep.summary()}")


if __name__ == "__main__":
    main()
