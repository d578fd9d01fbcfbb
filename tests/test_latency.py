"""The in-memory program (adaptprec/nlsq/_programs.py): eager and traced solves agree,
shape buckets compile nothing for a new length in the bucket, inline residuals reuse
compiled code, float64 without setup, migration errors. Timings are in
benchmarks/bench_latency.py, not here."""

import contextlib
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.optimize as so

import adaptprec as ap
from _subprocess import run_python
from nist_problems import MODELS, load

HANDFUL = ["Misra1a", "Kirby2", "MGH17", "Lanczos3"]  # Kirby2 (m=151): padded to 192


@contextlib.contextmanager
def count_compiles():
    """Counts XLA backend compilations (every jit program and eager operation)."""
    from jax._src import monitoring
    from jax._src.dispatch import BACKEND_COMPILE_EVENT

    seen = []

    def listener(event, duration, **kw):
        if event == BACKEND_COMPILE_EVENT:
            seen.append(duration)

    monitoring.register_event_duration_secs_listener(listener)
    try:
        yield seen
    finally:
        monitoring.unregister_event_duration_listener(listener)


def _nist(name, start, traced):
    p = load(name)

    def solve(x0, t, y):
        return ap.solve_nlsq(p.residual, x0, args=(t, y))

    args = (jnp.asarray(p.starts[start]), jnp.asarray(p.x), jnp.asarray(p.y))
    return jax.jit(solve)(*args) if traced else solve(*args)


def _agree(name):
    # eager: the padded program keyed on the residual's computation (LLVM -O0); under a
    # user's jit: inlined at XLA's default options. The same arithmetic up to rounding.
    for start in (0, 1):
        a, b = _nist(name, start, False), _nist(name, start, True)
        assert int(a.status) > 0 and int(b.status) > 0, (name, start)
        np.testing.assert_allclose(np.asarray(b.x), np.asarray(a.x), rtol=1e-7, atol=0)
        # (an absolute floor: a cost at rounding level, Lanczos1's 7e-26, differs relatively)
        np.testing.assert_allclose(float(b.cost), float(a.cost), rtol=1e-9, atol=1e-20)
        assert np.asarray(b.fun).shape == np.asarray(a.fun).shape == (load(name).y.size,)


@pytest.mark.parametrize("name", [n if n == "Kirby2" else pytest.param(n, marks=pytest.mark.slow)
                                  for n in HANDFUL])
@pytest.mark.slow
def test_eager_and_traced_agree_on_nist(name):
    _agree(name)


@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n in MODELS if n not in HANDFUL])
def test_eager_and_traced_agree_on_nist_full(name):
    _agree(name)


def _expo(t, a, k, c):
    return a * jnp.exp(-k * t) + c


def _data(m, seed=0):
    rng = np.random.default_rng(seed)
    t = np.linspace(0.0, 4.0, m)
    return t, 2.5 * np.exp(-1.3 * t) + 0.5 + 0.01 * rng.standard_normal(m)


def test_new_length_in_bucket_compiles_nothing():
    t, y = _data(130)
    ap.curve_fit(_expo, t, y, p0=[1.0, 1.0, 0.0])          # bucket 192: compiles
    for m in (131, 150, 191):
        t, y = _data(m, seed=m)
        with count_compiles() as seen:
            popt, pcov = ap.curve_fit(_expo, t, y, p0=[1.0, 1.0, 0.0])
        assert len(seen) == 0, (m, len(seen))
        ref, _ = so.curve_fit(lambda t, a, k, c: a * np.exp(-k * t) + c, t, y,
                              p0=[1.0, 1.0, 0.0], ftol=1e-15, xtol=1e-15, gtol=1e-15)
        np.testing.assert_allclose(popt, ref, rtol=1e-9)


@pytest.mark.slow
def test_fresh_lambda_reuses_compiled_code_with_its_own_constants():
    t = np.linspace(0.0, 4.0, 40)
    ys = [2.0 * np.exp(-0.7 * t), 3.0 * np.exp(-1.9 * t)]
    ap.curve_fit(lambda t, a, k: a * jnp.exp(-k * t) - 0.0 * ys[0], t, ys[0], p0=[1.0, 1.0])
    compiles = []
    for y, want in zip(ys, ([2.0, 0.7], [3.0, 1.9])):
        # a new closure each time, capturing a different array (hoisted, not baked in)
        with count_compiles() as seen:
            res = ap.solve_nlsq(lambda p, t: p[0] * jnp.exp(-p[1] * t) - y,
                                np.ones(2), args=(t,))
        np.testing.assert_allclose(np.asarray(res.x), want, rtol=1e-10)
        compiles.append(len(seen))
    assert compiles[1] == 0, compiles  # the first compiled this residual's programs
    with count_compiles() as seen:
        res = ap.solve_nlsq(lambda p, t: p[0] * jnp.exp(-p[1] * t) - ys[0],
                            np.ones(2), args=(t,))
    assert len(seen) == 0
    np.testing.assert_allclose(np.asarray(res.x), [2.0, 0.7], rtol=1e-10)


def test_memo_of_fresh_models_stays_bounded(monkeypatch):
    # each memo holds its keys' models (and their captured data) alive: bounded
    from adaptprec.nlsq import _caches

    for memo in (_caches.SIZES, _caches.POINT_AXES, _caches.TRACES, _caches.RESIDUALS):
        monkeypatch.setattr(memo, "size", 8)
    t = np.linspace(0.0, 4.0, 40)
    for k in range(12):
        y = (1.0 + k) * np.exp(-t)
        ap.curve_fit(lambda t, a, b: a * jnp.exp(-b * t) + 0.0 * y, t, y, p0=[1.0, 1.0])
    assert all(len(m) <= 8 for m in (_caches.SIZES, _caches.POINT_AXES, _caches.TRACES,
                                      _caches.RESIDUALS))


@pytest.mark.slow
def test_padded_rows_contribute_nothing():
    t, y = _data(100, seed=3)  # bucket 128
    sig = 0.01 + 0.02 * np.random.default_rng(4).random(100)
    popt, pcov, info, _, ier = ap.curve_fit(_expo, t, y, p0=[1.0, 1.0, 0.0], sigma=sig,
                                            full_output=True)
    ref, rcov = so.curve_fit(lambda t, a, k, c: a * np.exp(-k * t) + c, t, y,
                             p0=[1.0, 1.0, 0.0], sigma=sig, ftol=1e-15, xtol=1e-15,
                             gtol=1e-15)
    np.testing.assert_allclose(popt, ref, rtol=1e-9)
    np.testing.assert_allclose(pcov, rcov, rtol=1e-6)      # dof = m - n, not the bucket
    assert isinstance(popt, np.ndarray) and isinstance(pcov, np.ndarray)
    res = info["result"]
    assert np.asarray(res.fun).shape == (100,) and np.asarray(res.jac).shape == (100, 3)
    np.testing.assert_allclose(2.0 * float(res.cost),
                               np.sum(((_expo(t, *popt) - y) / sig) ** 2), rtol=1e-10)


@pytest.mark.slow
def test_traced_solve_pads_the_same_under_jit():
    t, y = _data(100, seed=5)
    args = (jnp.asarray(t), jnp.asarray(y))

    def resid(p, t, y):
        return _expo(t, *p) - y

    eager = ap.solve_nlsq(resid, jnp.ones(3), args=args)
    traced = jax.jit(lambda a: ap.solve_nlsq(resid, jnp.ones(3), args=a))(args)
    # (under a user's jit XLA's default options apply: equal up to the tolerances)
    np.testing.assert_allclose(np.asarray(traced.x), np.asarray(eager.x), rtol=1e-8)
    assert traced.fun.shape == (100,) and traced.jac.shape == (100, 3)
    # and grad through the traced solve
    g = jax.grad(lambda y: ap.solve_nlsq(resid, jnp.ones(3), args=(args[0], y)).x[1])(args[1])
    assert g.shape == (100,) and bool(jnp.all(jnp.isfinite(g)))


def test_migration_errors_name_the_construct_and_the_fix():
    t = np.linspace(0.0, 1.0, 20)
    with pytest.raises(TypeError, match="jax.numpy"):
        ap.curve_fit(lambda t, a, k: a * np.exp(-k * t), t, np.exp(-t), p0=[1.0, 1.0])
    with pytest.raises(TypeError, match="jnp.where"):
        ap.curve_fit(lambda t, a, k: a * t if k > 0 else t, t, t, p0=[1.0, 1.0])
    # Python's math module on a parameter (newcomer audit: only "control flow" was named)
    with pytest.raises(TypeError, match="math.exp"):
        ap.curve_fit(lambda t, a, k: a * math.exp(-k) + 0 * t, t, t, p0=[1.0, 1.0])

    class Mine(Exception):
        pass

    def bad(t, a, k):
        raise Mine("my own error")

    with pytest.raises(Mine, match="my own error"):
        ap.curve_fit(bad, t, t, p0=[1.0, 1.0])
    with pytest.raises(Mine):
        ap.solve_nlsq(lambda p: bad(t, *p), np.ones(2))
    # a jac written with NumPy gets the same explanation (newcomer audit)
    with pytest.raises(TypeError, match="jac calls a NumPy function"):
        ap.curve_fit(lambda t, a, k: a * jnp.exp(-k * t), t, np.exp(-t), p0=[1.0, 1.0],
                     jac=lambda t, a, k: np.stack([np.exp(-k * t), -a * t * np.exp(-k * t)],
                                                  axis=1))

    # a scipy-style loss built in NumPy (newcomer audit 4: JAX's raw tracer error), and
    # a loss of the wrong shape (it was used as if it were rho's rows)
    def numpy_rho(z):
        out = np.empty((3, z.size))
        out[0] = np.log1p(z)
        return out

    def residual(p):
        return p[0] * jnp.exp(-p[1] * t) - np.exp(-t)

    with pytest.raises(TypeError, match="loss callable rho.z. uses NumPy"):
        ap.solve_nlsq(residual, np.ones(2), loss=numpy_rho)
    with pytest.raises(TypeError, match="loss callable rho.z. uses NumPy"):
        ap.solve_nlsq_batch(lambda p, t: p[0] * jnp.exp(-p[1] * t), np.ones((2, 2)), (t,),
                            in_axes=None, ydata=np.exp(-t)[None].repeat(2, 0),
                            loss=numpy_rho)
    with pytest.raises(ValueError, match=r"`loss` callable has wrong shape.*\(20, 3\)"):
        ap.solve_nlsq(residual, np.ones(2), loss=lambda z: jnp.stack([z, z, z], axis=1))


def test_model_output_must_match_ydata():
    # newcomer audit: a (m, 1) column broadcast against ydata (m,) into m * m residuals
    # and gave a wrong popt with a finite pcov; a wrong length was JAX's TypeError
    t = np.linspace(0.0, 4.0, 50)
    y = 3.0 * t + 1.0
    with pytest.raises(ValueError, match=r"returned shape \(50, 1\).*not a column"):
        ap.curve_fit(lambda t, a, b: (a * t + b)[:, None], t, y)
    with pytest.raises(ValueError, match=r"returned shape \(49,\) but ydata has shape"):
        ap.curve_fit(lambda t, a, b: (a * t + b)[1:], t, y)


@pytest.mark.slow
def test_batch_size_bucket_compiles_nothing():
    t = np.linspace(0.0, 1.0, 12)
    model = lambda p, t: p[0] * jnp.exp(-p[1] * t)  # noqa: E731

    def run(B):
        k = np.linspace(0.5, 2.0, B)
        y = 3.0 * np.exp(-k[:, None] * t)
        return k, ap.solve_nlsq_batch(model, np.ones((B, 2)), (t,), in_axes=None, ydata=y,
                                      return_pcov=True)

    k, res = run(20)                                     # bucket 24
    assert res.x.shape == (20, 2) and res.status.shape == (20,) and res.pcov.shape[0] == 20
    np.testing.assert_allclose(np.asarray(res.x[:, 1]), k, rtol=1e-8)
    assert bool(np.all(np.asarray(res.success)))
    with count_compiles() as seen:
        k, res = run(23)
    assert len(seen) == 0
    assert res.x.shape == (23, 2)
    np.testing.assert_allclose(np.asarray(res.x[:, 1]), k, rtol=1e-8)


X64_OFF = r"""
import jax, jax.numpy as jnp, numpy as np
import adaptprec as ap
t = np.linspace(0, 4, 120)
popt, pcov = ap.curve_fit(lambda t, a, k: a * jnp.exp(-k * t), t, np.exp(-t), p0=[1.0, 1.0])
print(type(popt).__module__, popt.dtype, type(pcov).__module__, pcov.dtype)
assert abs(popt[1] - 1.0) < 1e-12 and not jax.config.read("jax_enable_x64")
# the eager NumPy result's scalars are scipy's types (they were 0-d arrays: json failed)
import json
res = ap.solve_nlsq(lambda p: p[0] * jnp.exp(-p[1] * t) - np.exp(-t), [1.0, 2.0])
assert all(type(getattr(res, f)) is int for f in ("nfev", "nit", "status")), res
assert type(res.cost) is np.float64 and type(res.success) is bool, res
json.dumps({"nfev": res.nfev, "status": res.status, "cost": res.cost})
# an explicit ladder asks for float64 too (it raised: "f32,f64" was not parsed with x64 off)
res = ap.solve_nlsq(lambda p: p[0] * jnp.exp(-p[1] * t) - np.exp(-t), [1.0, 2.0],
                    precision="f32,f64")
assert res.escalations == 1 and res.rung_name == "f64" and res.x.dtype == np.float64, res
p2, _ = ap.curve_fit(lambda t, a, k: a * jnp.exp(-k * t), t, np.exp(-t), p0=[1.0, 1.0],
                     precision="f32,f64")
assert type(p2) is np.ndarray and p2.dtype == np.float64 and abs(p2[1] - 1.0) < 1e-12
# a residual closing over NumPy data, solved in float32 (no scope) and then by default (the
# float64 scope), and the user's own JAX code on the same arrays afterwards: JAX caches
# its conversion of a NumPy array per array object, not per x64 setting, so each mode got
# the other's constant ("requires compatible types"; "RuntimeProgramInputMismatch")
xs = np.linspace(0.0, 4.0, 50); ys = 2.5 * np.exp(-1.3 * xs) + 0.5
g = lambda p: p[0] * jnp.exp(-p[1] * xs) + p[2] - ys
for prec in ("f32", "adaptive", "f32", "f32,f64"):
    r = ap.solve_nlsq(g, np.array([1.0, 1.0, 0.0]), precision=prec)
    assert r.status > 0 and abs(r.x[1] - 1.3) < 1e-4, (prec, r)
try:   # the order message, not the x64 one (the ladder was parsed with the x64 check)
    ap.solve_nlsq(g, np.array([1.0, 1.0, 0.0]), precision="f64,f32")
    raise SystemExit("precision='f64,f32': no error")
except ValueError as e:
    assert "strictly increasing" in str(e), e
p3 = jnp.asarray([2.5, 1.3, 0.5])
assert g(p3).dtype == jax.jit(g)(p3).dtype == jax.jacfwd(g)(p3).dtype == jnp.float32
msgs = []
calls = [
    lambda y: ap.curve_fit(lambda t, a, k: a * jnp.exp(-k * t), t, y, p0=[1.0, 1.0])[0],
    lambda y: ap.solve_nlsq(lambda p, y: p[0] * jnp.exp(-p[1] * t) - y, jnp.ones(2),
                            args=(y,)).x,
    lambda y: ap.solve_nlsq_batch(lambda p, t: p[0] * jnp.exp(-p[1] * t), jnp.ones((1, 2)),
                                  (t,), in_axes=None, ydata=y[None]).x,
]
for call in calls:
    try:
        jax.jit(call)(jnp.asarray(np.exp(-t)))
        raise SystemExit("no error")
    except ValueError as e:
        msgs.append(str(e).split(":", 1)[1])
assert len(set(msgs)) == 1 and "jax_enable_x64" in msgs[0], msgs
popt, _ = ap.curve_fit(lambda t, a, k: a * jnp.exp(-k * t), t, np.exp(-t), p0=[1.0, 1.0],
                       precision="f32")
print(popt.dtype)
try:   # "adaptive" never silently means float32 alone
    ap.nlsq.resolve_ladder("adaptive")
    raise SystemExit("resolve_ladder('adaptive') with x64 off: no error")
except ValueError as e:
    assert "precision='f32'" in str(e), e
with jax.enable_x64(True):
    assert len(ap.nlsq.resolve_ladder("adaptive").rungs) == 2
"""


@pytest.mark.slow
def test_float64_without_setup_in_a_fresh_process():
    proc = run_python(X64_OFF, x64=False, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["numpy", "float64", "numpy", "float64", "float32"]
