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
