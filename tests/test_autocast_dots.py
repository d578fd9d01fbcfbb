"""Every dot the autocast interpreter emits runs on the backend.

A property test draws random ``dot_general`` dimension numbers (batch, contracting and
free axes in random positions, a random permutation of the result) and runs the dot
under an autocast policy with bfloat16 or float16 operands: forward under ``jit``,
``autocast(grad(f))`` and ``grad(autocast(f))``, ``vmap`` and ``jvp``. Each must run
(XLA:CPU once rejected ``bf16 x bf16 -> f32`` dots that algebraic simplification had
turned into a layout only its Eigen DotThunk takes) and agree with a float64 reference
within the operand dtype's rounding: ``|y - ref| <= TOL * u * (|a| |b|)``, the bound of
rounding both operands (products are exact in float32, float32 accumulation); the
``always_*`` presets also accumulate in the low dtype, so their bound grows with the
contraction length.
"""

import functools
import string

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from jax import lax

import adaptprec as ap

F32, F64 = jnp.float32, jnp.float64
_LOW = {"bf16": jnp.bfloat16, "f16": jnp.float16}
# policy -> (low dtype, accumulates in float32)
_POLICIES = {"auto_mixed_bf16": ("bf16", True), "auto_mixed": ("f16", True),
             "always_bf16": ("bf16", False), "always_f16": ("f16", False)}
_MODES = ("forward", "autocast_of_grad", "grad_of_autocast", "vmap", "jvp")


@st.composite
def dot_problems(draw):
    """(lhs shape, rhs shape, dimension numbers, result permutation)."""
    nb, nc = draw(st.integers(0, 2)), draw(st.integers(0, 2))
    nl, nr = draw(st.integers(0, 2)), draw(st.integers(0, 2))
    size = st.integers(1, 6)
    batch = [draw(size) for _ in range(nb)]
    contract = [draw(size) for _ in range(nc)]
    lfree = [draw(size) for _ in range(nl)]
    rfree = [draw(size) for _ in range(nr)]
    lroles = [("b", i) for i in range(nb)] + [("c", i) for i in range(nc)] + \
        [("f", i) for i in range(nl)]
    rroles = [("b", i) for i in range(nb)] + [("c", i) for i in range(nc)] + \
        [("f", i) for i in range(nr)]
    lroles = draw(st.permutations(lroles))
    rroles = draw(st.permutations(rroles))
    sizes = {"b": batch, "c": contract}
    lshape = tuple((sizes.get(k) or lfree)[i] for k, i in lroles)
    rshape = tuple((sizes.get(k) or rfree)[i] for k, i in rroles)

    def axes(roles, kind):
        return tuple(roles.index((kind, i)) for i in range(len(sizes[kind])))

    dn = ((axes(lroles, "c"), axes(rroles, "c")), (axes(lroles, "b"), axes(rroles, "b")))
    perm = tuple(draw(st.permutations(range(nb + nl + nr))))
    return lshape, rshape, dn, perm


def _einsum_spec(lshape, rshape, dn):
    """The einsum string of ``dot_general(., ., dn)`` (for the float64 reference)."""
    (lc, rc), (lb, rb) = dn
    letters = iter(string.ascii_letters)
    lsub, rsub = [None] * len(lshape), [None] * len(rshape)
    for i, j in zip(lb + lc, rb + rc):
        lsub[i] = rsub[j] = next(letters)
    for sub in (lsub, rsub):
        for i, s in enumerate(sub):
            if s is None:
                sub[i] = next(letters)
    out = [lsub[i] for i in lb] + [s for i, s in enumerate(lsub) if i not in lb + lc] + \
        [s for i, s in enumerate(rsub) if i not in rb + rc]
    return f"{''.join(lsub)},{''.join(rsub)}->{''.join(out)}"


def _data(lshape, rshape, perm, seed):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal(lshape).astype(np.float32)
    b = rng.standard_normal(rshape).astype(np.float32)
    return a, b, rng


def _program(mode, policy, dn, perm):
    """A jitted function of (a, b, c) and the float64 function it approximates."""

    def dot(a, b):
        return jnp.transpose(lax.dot_general(a, b, dn), perm)

    def loss(a, b, c):
        return jnp.sum(c * dot(a, b))

    grad = jax.grad(loss, argnums=(0, 1))
    cast = functools.partial(ap.autocast, policy=policy)
    if mode == "forward":
        return jax.jit(lambda a, b, c: cast(dot)(a, b) * 2.0), lambda a, b, c: dot(a, b) * 2.0
    if mode == "autocast_of_grad":
        return jax.jit(cast(grad)), grad
    if mode == "grad_of_autocast":
        return jax.jit(jax.grad(cast(loss), argnums=(0, 1))), grad
    if mode == "vmap":  # a batched along a new last axis, b shared
        def batched(f):
            return jax.vmap(f, in_axes=(-1, None, None))
        return (jax.jit(batched(lambda a, b, c: cast(dot)(a, b))),
                batched(lambda a, b, c: dot(a, b)))
    if mode == "jvp":
        def tangent(f):
            return lambda a, b, c: jax.jvp(lambda a, b: f(a, b), (a, b), (b.sum() * a, b))
        return jax.jit(tangent(cast(dot))), tangent(dot)
    raise AssertionError(mode)


def _check(mode, policy, lshape, rshape, dn, perm, seed=0):
    low, accumulates = _POLICIES[policy]
    u = float(jnp.finfo(_LOW[low]).eps) / 2
    a, b, rng = _data(lshape, rshape, perm, seed)
    if mode == "vmap":
        a = np.stack([a, -0.5 * a, 2.0 * a], axis=-1)
    out_shape = np.einsum(_einsum_spec(lshape, rshape, dn), a[..., 0] if mode == "vmap"
                          else a, b).transpose(perm).shape
    c = rng.standard_normal(out_shape).astype(np.float32)
    run, exact = _program(mode, policy, dn, perm)
    got = jax.tree_util.tree_leaves(run(jnp.asarray(a), jnp.asarray(b), jnp.asarray(c)))
    with jax.enable_x64(True):
        args64 = [jnp.asarray(x, F64) for x in (a, b, c)]
        ref = jax.tree_util.tree_leaves(exact(*args64))
        scale = jax.tree_util.tree_leaves(exact(*[jnp.abs(x) for x in args64]))
    k = int(np.prod([lshape[i] for i in dn[0][0]])) if dn[0][0] else 1
    # operands (and, for the gradients, the cotangent) rounded once each; a low-precision
    # accumulator adds one rounding per term of the longest sum
    tol = 6.0 * u if accumulates else (6.0 + 2.0 * k * int(np.prod(out_shape))) * u
    for g, r, s in zip(got, ref, scale):
        g, r, s = (np.asarray(x, np.float64) for x in (g, r, s))
        assert g.shape == r.shape
        err = np.abs(g - r)
        bound = tol * np.abs(s) + 1e-30
        assert np.all(err <= bound), (mode, policy, float(np.max(err / bound)))


_ISSUE_EINSUM = ((2, 5, 4), (4, 3), (((2,), (0,)), ((), ())), (0, 1, 2))


@pytest.mark.parametrize("mode", _MODES)
@pytest.mark.parametrize("policy", ["auto_mixed_bf16", "auto_mixed"])
def test_gradient_of_einsum_runs(mode, policy):
    # the issue's reproduction: the gradient of one einsum("btf,fd->btd") under
    # jit(autocast(grad(loss), AUTO_MIXED_BF16)) failed inside XLA:CPU's DotThunk
    _check(mode, policy, *_ISSUE_EINSUM)


@settings(max_examples=12, deadline=None, derandomize=True)
@given(problem=dot_problems(), mode=st.sampled_from(_MODES),
       policy=st.sampled_from(sorted(_POLICIES)))
@example(problem=((10, 4), (4, 3), (((1,), (0,)), ((), ())), (1, 0)),
         mode="forward", policy="auto_mixed_bf16")
@example(problem=((2, 5, 3), (2, 5, 4), (((0, 1), (0, 1)), ((), ())), (1, 0)),
         mode="forward", policy="auto_mixed_bf16")
@pytest.mark.slow
def test_random_dot_general_runs_and_agrees(problem, mode, policy):
    _check(mode, policy, *problem)


@pytest.mark.slow
@settings(max_examples=300, deadline=None, derandomize=True)
@given(problem=dot_problems(), mode=st.sampled_from(_MODES),
       policy=st.sampled_from(sorted(_POLICIES)))
def test_random_dot_general_many(problem, mode, policy):
    _check(mode, policy, *problem)


def test_issue_reproduction_with_x64_off():
    from _subprocess import run_python
    res = run_python("""
        import jax, jax.numpy as jnp
        import adaptprec as ap
        def loss(w, x):
            return jnp.sum(jnp.einsum("btf,fd->btd", x, w) ** 2)
        w, x = jnp.ones((4, 3)), jnp.ones((2, 5, 4))
        g = jax.jit(ap.autocast(jax.grad(loss), ap.AUTO_MIXED_BF16))(w, x)
        ex = ap.explain(jax.grad(loss), ap.AUTO_MIXED_BF16)(w, x)
        print(g.dtype, bool(jnp.allclose(g, jax.grad(loss)(w, x))), ex.guarded_dots)
    """, x64=False, timeout=300)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["float32", "True", "2"]
