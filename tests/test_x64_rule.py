"""The one x64 rule (adaptprec/_x64_rule.py), entry point by entry point, with x64 off.

An eager call whose precision/ladder/policy needs float64 computes in float64 inside
JAX's thread-local x64 scope, leaves the global flag off, and returns its float64 results
as NumPy float64; a traced call that needs float64 raises the same error from every entry
point. One fresh interpreter (x64 off) runs every entry point.
"""

import pytest

from _subprocess import run_python

CODE = r"""
import jax, jax.numpy as jnp, numpy as np
import adaptprec as ap
from adaptprec._x64_rule import TRACED_X64_MESSAGE

assert not jax.config.read("jax_enable_x64")
rng = np.random.default_rng(0)
n = 6
A = jnp.asarray(rng.standard_normal((n, n)), jnp.float32) + 4 * jnp.eye(n)
b = jnp.ones(n)
A64 = np.asarray(A, np.float64)
x_ref = np.linalg.solve(A64, np.ones(n))

def is_np64(x):
    return isinstance(x, np.ndarray) and x.dtype == np.float64

# ---- eager: float64 inside the scope, float64 results as NumPy
x, info = ap.linalg.solve(A, b)
assert is_np64(x) and np.abs(x - x_ref).max() < 1e-13, x
assert int(info.status) == 5 and float(info.backward_error) < 1e-15
x, info = ap.linalg.lstsq(jnp.concatenate([A, A]), jnp.ones(2 * n))
assert is_np64(x) and np.abs(x - x_ref).max() < 1e-12
c = ap.linalg.matmul(A64, A64)
assert is_np64(c) and np.abs(c - A64 @ A64).max() < 1e-12
k = ap.linalg.cond_estimate(A64)
assert is_np64(k) and 1 / 3 <= float(k) / np.linalg.cond(A64, 1) <= 1 + 1e-9, k

big = jnp.array([100.0, 99.0, 1.0])
lse = ap.adaptive(lambda v: jnp.log(jnp.sum(jnp.exp(v))), ladder="bf16,f32,f64",
                  rtol=1e-3)
y, rep = lse.with_report(big)            # overflows in bf16 and f32: the f64 rung answers
assert rep.rung_name == "f64" and y.dtype == jnp.float32   # the input's dtype
assert abs(float(y) - 100.31326168751822) < 1e-4
y, rep = ap.MixedPrecisionManager("f32,f64").run(jnp.exp, np.array([1.0, 500.0]))
assert rep.rung_name == "f64" and is_np64(y) and np.isfinite(y).all(), y   # e^500

prof = ap.profile(jnp.sin, jnp.linspace(0.0, 1.0, 64), configs=["f32", "f64"],
                  repeats=1, min_time=1e-4).to_dict()
assert prof["f64"]["rung"] == "f64" and prof["f64"]["digits"] > 15, prof["f64"]

res = ap.solve_nlsq(lambda p: p - jnp.array([1.0, 2.0]), jnp.zeros(2))
assert is_np64(res.x)
assert not jax.config.read("jax_enable_x64"), "the library flipped the global flag"

# ---- traced: the one error, from every entry point
traced = {
    "adaptive": lambda: jax.jit(lse)(big),
    "MixedPrecisionManager.run": lambda: jax.jit(
        lambda v: ap.MixedPrecisionManager("f32,f64").run(jnp.exp, v))(big),
    "adaptive under grad": lambda: jax.grad(lambda v: lse(v))(big),
    "linalg.solve": lambda: jax.jit(ap.linalg.solve)(A, b),
    "linalg.solve under vmap": lambda: jax.vmap(ap.linalg.solve)(A[None], b[None]),
    "linalg.lstsq": lambda: jax.jit(ap.linalg.lstsq)(A, b),
    "linalg.matmul": lambda: jax.jit(
        lambda a: ap.linalg.matmul(a, a, policy="c=f32,o=f64"))(A),
    "solve_nlsq": lambda: jax.jit(
        lambda y: ap.solve_nlsq(lambda p: p - y, jnp.zeros(2)).x)(jnp.ones(2)),
}
messages = {}
for name, call in traced.items():
    try:
        call()
    except ValueError as e:
        messages[name] = str(e)
    else:
        raise SystemExit(f"{name}: no error under a trace")
for name, msg in messages.items():
    assert "needs float64, but it was called under jit/vmap/grad with jax_enable_x64 off" \
        in msg and "ask for float32 explicitly with" in msg, (name, msg)
    # the same text but for the entry, argument and the float32 alternative
    messages[name] = msg[msg.index(" needs float64"):msg.rindex(" with ")]
assert len(set(messages.values())) == 1, messages

# float32-only ladders and precisions need nothing and stay JAX arrays under jit
y = jax.jit(ap.adaptive(jnp.exp, ladder="bf16,f32"))(jnp.ones(2))
x, info = jax.jit(lambda A, b: ap.linalg.solve(A, b, factor="bf16", working="f32"))(A, b)
assert x.dtype == jnp.float32
assert not jax.config.read("jax_enable_x64")
print("OK")
"""


@pytest.mark.slow
def test_x64_rule_for_every_entry_point_with_x64_off():
    out = run_python(CODE, x64=False, timeout=900)
    assert out.returncode == 0, out.stderr[-4000:]
    assert out.stdout.strip().endswith("OK"), out.stdout[-2000:]
