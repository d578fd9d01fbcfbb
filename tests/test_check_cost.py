"""What the cheap checks cost, structurally, and that the cheaper form keeps the bound.

The first-order bound of a sum of ``sin``/``cos`` reads the input once for the summands'
own errors (one reduction, ``u ||x||_2 + 4u sqrt(n)``) and writes no error array; the
bound it computes is the one of ``adaptprec._first_order_sums``, checked here against the
same formula evaluated in NumPy, and above the quadrature sum of the per-entry bounds.
"""

from __future__ import annotations

import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from adaptprec._first_order import SUM_FAILURE, first_order

N = 1 << 16
U32 = 2.0 ** -24


def _sin_sum(x):
    return jnp.sum(jnp.sin(x))


def _cos_rows(x):
    return jnp.sum(jnp.cos(x), axis=1)


def _walk(fn, x64):
    """``(rung outputs, their bounds)`` of the float32 walk of ``fn`` on float64 data."""
    r = first_order(fn, (x64.astype(jnp.float32),), {}, ((x64,), {}), jnp.float32)
    return r.outs[0], r.errs[0]


def _f32(f, x):
    return jax.jit(f)(jnp.asarray(x).astype(jnp.float32))


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(7)
    return jnp.asarray(rng.normal(size=N) * 3.0), jnp.asarray(rng.uniform(0, 2, (64, 256)))


@pytest.fixture(scope="module")
def walked(data):
    x, m = data
    return jax.jit(lambda x: _walk(_sin_sum, x))(x), jax.jit(lambda m: _walk(_cos_rows, m))(m)


def test_sum_of_sines_bound_is_the_stated_one(walked, data):
    (y, e), _ = walked
    x, _ = data
    s32 = np.asarray(_f32(jnp.sin, x))       # the rung's summands (XLA's sine)
    lam = math.sqrt(2.0 * math.log(2.0 / SUM_FAILURE))
    # Minkowski: ||u|x| + 4u||_2 <= u ||x||_2 + 4u sqrt(n), one reduction of x
    quad = U32 * np.linalg.norm(np.asarray(x)) + 4 * U32 * math.sqrt(N)
    acc = abs(float(y) - float(np.sum(s32.astype(np.float64))))
    assert float(e) == pytest.approx(acc + lam * quad, rel=1e-5)
    per_entry = np.sqrt(np.sum((U32 * np.abs(np.asarray(x)) + 4 * U32) ** 2))
    assert float(e) >= acc + lam * per_entry        # never below the per-entry form
    true = abs(float(y) - float(np.sum(np.sin(np.asarray(x)))))
    assert true <= float(e)


def test_row_sums_of_cosines_bound_per_row(walked, data):
    _, (y, e) = walked
    _, m = data
    s32 = np.asarray(_f32(jnp.cos, m))
    lam = math.sqrt(2.0 * math.log(2.0 * 64 / SUM_FAILURE))
    quad = U32 * np.linalg.norm(np.asarray(m), axis=1) + 4 * U32 * math.sqrt(256)
    acc = np.abs(np.asarray(y, np.float64) - np.sum(s32.astype(np.float64), axis=1))
    np.testing.assert_allclose(np.asarray(e), acc + lam * quad, rtol=1e-5)
    true = np.abs(np.asarray(y, np.float64) - np.sum(np.cos(np.asarray(m)), axis=1))
    assert np.all(true <= np.asarray(e))


def test_exact_input_has_a_constant_own_error():
    # float32 data on the float32 rung: no input rounding, each sine's own 4u, summed
    # worst case (n 4u) since nothing is rounded before it, and no pass over an array
    x = jnp.linspace(0.0, 2.0, 1024, dtype=jnp.float32)
    r = first_order(_sin_sum, (x,), {}, ((x,), {}), jnp.float32)
    y = float(r.outs[0])
    acc = abs(y - float(np.sum(np.asarray(_f32(jnp.sin, x), np.float64))))
    assert float(r.errs[0]) == pytest.approx(acc + 1024 * 4 * U32, rel=1e-6)


def _big_arrays(hlo: str, n: int) -> list[str]:
    """The entry computation's instructions that produce an ``f32[n]`` array."""
    entry = hlo[hlo.index("\nENTRY"):]
    return [ln for ln in entry.splitlines() if re.search(rf"= f32\[{n}\]", ln)]


def test_sum_of_sines_check_writes_no_error_array():
    # the rung's summands are the one array of the input's size the program writes; the
    # check reads them and the input (before: the error array was written, then read)
    x = jnp.zeros(1 << 20, jnp.float64)

    hlo = jax.jit(lambda x: _walk(_sin_sum, x)).lower(x).compile().as_text()
    assert len(_big_arrays(hlo, 1 << 20)) <= 1, _big_arrays(hlo, 1 << 20)


def test_bound_under_vmap_and_grad(data):
    x, _ = data
    xs = jnp.stack([x[:1024], x[1024:2048]])
    ys, es = jax.vmap(lambda x: _walk(_sin_sum, x))(xs)
    for i in range(2):
        y1, e1 = _walk(_sin_sum, xs[i])
        assert float(ys[i]) == float(y1) and float(es[i]) == pytest.approx(float(e1), rel=1e-6)
    # the walk is a check: its values and bound are constants to a derivative (the
    # runtime differentiates the rung it returns), and tracing it under grad works
    g = jax.grad(lambda x: jnp.sum(jnp.stack(_walk(_sin_sum, x)).astype(jnp.float64)))(
        x[:1024])
    assert not np.any(np.asarray(g))


@pytest.mark.slow
def test_x64_off_cancelling_sum_is_not_reported_unverified():
    # float32 is the top rung: a sum's first-order bound there is a priori (sqrt(n) u
    # sum|x|), far above a cancelling sum's error; the plan must keep the cancellation
    # screen (a right answer reported "NOT OK" otherwise)
    from _subprocess import run_python
    r = run_python("""
        import numpy as np, jax, jax.numpy as jnp, adaptprec as ap
        x = jnp.asarray(np.random.default_rng(0).normal(size=1 << 16), jnp.float32)
        f = ap.adaptive(lambda x: jnp.mean(jnp.sin(x)), rtol=1e-3, ladder="bf16,f32")
        y, rep = jax.jit(f.with_report)(x)
        print(rep.checks[-1], bool(rep.ok))
    """, x64=False)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split()[-2:] == ["screen", "True"], r.stdout
