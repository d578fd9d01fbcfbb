"""Kernel suite for the accuracy guards: known low-precision failures and benign kernels.

Shared by tests/test_accuracy.py and benchmarks/calibrate_accuracy.py. Each entry is
``name -> (fn, make_inputs(rng) -> tuple of arrays)``; inputs are float32 unless the kernel
needs float64 data. The float64 reference is ``fn`` on the inputs cast to float64.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import scipy.linalg


def cancellation(x):
    return (x + 1.0) - 1.0


def naive_sum(x):
    return jnp.sum(x) - 1e4


def count(x):
    return jnp.sum(x > 1.0)


def argmax(x):
    return jnp.argmax(x)


def naive_variance(x):
    return jnp.mean(x * x) - jnp.mean(x) ** 2


def quadratic(a, b, c):
    """The larger root of a x^2 + b x + c by the textbook formula (cancels for b^2 >> 4ac)."""
    return (-b + jnp.sqrt(b * b - 4.0 * a * c)) / (2.0 * a)


def overflow(x):
    return jnp.exp(x) * 1e-30          # e^100 overflows bf16/f32; the result (~1e13) not


def solve(a, b):
    """LAPACK has no half-precision solve: low rungs factor in float32 (inputs rounded)."""
    w = jnp.promote_types(a.dtype, jnp.float32)
    return jnp.linalg.solve(a.astype(w), b.astype(w)).astype(a.dtype)


def gauss(x):
    return jnp.exp(-x * x) * jnp.cos(x)


def mlp(x, w1, b1, w2):
    return jnp.tanh(x @ w1 + b1) @ w2


def layernorm(x):
    m = jnp.mean(x, axis=-1, keepdims=True)
    v = jnp.mean((x - m) ** 2, axis=-1, keepdims=True)
    return (x - m) / jnp.sqrt(v + 1e-5)


def softplus(x):
    return jnp.log1p(jnp.exp(-jnp.abs(x))) + jnp.maximum(x, 0.0)


# kernels users write with loops, chained products and quadrature (benchmarks/bench_value.py
# runs them at full size; the calibration and the tests at small sizes)

def lorenz_rk4(s0, steps=60):
    """RK4 of the Lorenz system (dt 0.01) for a batch of trajectories ``s0`` (B, 3)."""
    sigma, rho, beta, dt = 10.0, 28.0, 8.0 / 3.0, 0.01

    def f(s):
        x, y, z = s[:, 0], s[:, 1], s[:, 2]
        return jnp.stack([sigma * (y - x), x * (rho - z) - y, x * y - beta * z], axis=1)

    def step(_, s):
        k1 = f(s)
        k2 = f(s + dt / 2 * k1)
        k3 = f(s + dt / 2 * k2)
        k4 = f(s + dt * k3)
        return s + dt / 6 * (k1 + 2 * k2 + 2 * k3 + k4)

    return jax.lax.fori_loop(0, steps, step, s0)


def jacobi_sweeps(u0, f, sweeps=40):
    """Jacobi sweeps for -Laplace(u) = f on a grid (the edge of ``u0`` is held fixed)."""
    def sweep(_, u):
        inner = 0.25 * (u[:-2, 1:-1] + u[2:, 1:-1] + u[1:-1, :-2] + u[1:-1, 2:]
                        + f[1:-1, 1:-1])
        return u.at[1:-1, 1:-1].set(inner)

    return jax.lax.fori_loop(0, sweeps, sweep, u0)


def matpow8(a):
    """A^8 by repeated squaring."""
    a2 = a @ a
    a4 = a2 @ a2
    return a4 @ a4


def trapezoid(p, steps=20_000):
    """The trapezoid rule for the integral of cos(p x) over [0, 1] (= sin(p) / p), one
    value per entry of ``p``, accumulated in a ``fori_loop``."""
    h = 1.0 / steps

    def body(i, acc):
        x = i * h
        return acc + 0.5 * h * (jnp.cos(p * x) + jnp.cos(p * (x + h)))

    return jax.lax.fori_loop(0, steps, body, jnp.zeros_like(p))


def kepler(m, e, iterations=30):
    """Kepler's equation E = M + e sin E by fixed-point iteration, per entry."""
    return jax.lax.fori_loop(0, iterations, lambda _, E: m + e * jnp.sin(E), m)


def ln_gelu_mlp(x, w1, w2):
    """A layer norm, then a GELU MLP."""
    return jax.nn.gelu(layernorm(x) @ w1) @ w2


def mlp4(x, w1, w2, w3, w4):
    """Four dense layers (tanh between)."""
    h = jnp.tanh(x @ w1)
    h = jnp.tanh(h @ w2)
    h = jnp.tanh(h @ w3)
    return h @ w4


def sin_mean(x):
    """``sum(sin x) / n``: cancels on data symmetric about 0."""
    return jnp.sum(jnp.sin(x)) / x.shape[0]


def _f32(*xs):
    return tuple(jnp.asarray(x, jnp.float32) for x in xs)


FAILING = {
    "cancellation": (cancellation, lambda rng: _f32(1e-3 * (1 + 0.1 * rng.random()))),
    "naive_sum": (naive_sum, lambda rng: _f32(np.full(10_000, 1.0001))),
    "count": (count, lambda rng: _f32(1.0 + 1e-3 * (1 + rng.random(100)))),
    "argmax": (argmax, lambda rng: _f32(np.array([1.0, 1.001, 1.002]))),
    "naive_variance": (naive_variance,
                       lambda rng: _f32(1000.0 + np.sin(np.arange(1000.0) + rng.random()))),
    "quadratic": (quadratic, lambda rng: _f32(1.0, 1e4 * (1 + rng.random()), 1.0)),
    "overflow": (overflow, lambda rng: _f32(100.0 + rng.random(4))),
    "ill_conditioned_solve": (solve, lambda rng: (jnp.asarray(scipy.linalg.hilbert(8)),
                                                  jnp.asarray(rng.random(8)))),
}

BENIGN = {
    "gauss": (gauss, lambda rng: _f32(rng.uniform(-2, 2, 256))),
    "mlp": (mlp, lambda rng: _f32(rng.normal(size=(16, 32)), rng.normal(size=(32, 64)) / 6,
                                  rng.normal(size=64) * 0.1, rng.normal(size=(64, 8)) / 8)),
    "layernorm": (layernorm, lambda rng: _f32(rng.normal(size=(8, 64)))),
    "softplus": (softplus, lambda rng: _f32(rng.normal(size=256) * 3)),
}


def reference(fn, inputs):
    """``fn`` on the inputs in float64 (needs x64), as a NumPy value."""
    return np.asarray(jax.jit(fn)(*[jnp.asarray(x, jnp.float64) for x in inputs]))


def rel_error(y, ref) -> float:
    """Normwise relative error (discrete outputs: 0 when equal, inf otherwise)."""
    y, ref = np.asarray(y), np.asarray(ref)
    if not np.issubdtype(ref.dtype, np.floating):
        return 0.0 if np.array_equal(y, ref) else np.inf
    d = np.max(np.abs(y.astype(np.float64) - ref))
    n = np.max(np.abs(ref))
    return 0.0 if d == 0 else float(d / n) if n else np.inf
