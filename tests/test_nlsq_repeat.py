"""The repeat of a fit: a memoised problem (same model, shapes and options) takes the
call's values, checks them as a first call does, and answers with a first call's bits.

The first-call reference passes ``x0`` as a JAX array, which the memo does not take
(``_inputs._structure_key``): the same program runs from a freshly prepared problem.
"""

import inspect

import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import adaptprec as ap
from adaptprec._x64_rule import _ArgumentReader
from adaptprec.batch.api import solve_nlsq_batch
from adaptprec.nlsq import _caches
from adaptprec.nlsq._inputs import all_finite

T = np.linspace(0.0, 3.0, 40)
Y = 2.0 * np.exp(-1.3 * T) + 0.3 + 0.02 * np.sin(11.0 * T)
X0 = np.array([1.0, 1.0, 0.0])


def expo(p, t, y):
    return p[0] * jnp.exp(-p[1] * t) + p[2] - y


def _same_bits(a, b):
    for name in ("x", "cost", "fun", "jac", "grad", "nfev", "status"):
        assert np.array_equal(np.asarray(getattr(a, name)), np.asarray(getattr(b, name))), name


@pytest.mark.parametrize("bounds, x_scale", [
    ((-np.inf, np.inf), None),
    ((0.0, 10.0), 1.0),
    ((0.0, 10.0), 2.0),               # x_scale changed
    ((-0.5, 10.0), 1.0),              # new values for the memo's key
    ((-0.0, 10.0), 1.0),              # -0.0 == 0.0, a different bound
    ((np.zeros(3), np.full(3, 10.0)), 1.0),   # arrays: never taken for the memo's
])
def test_repeat_answers_with_first_call_bits(bounds, x_scale):
    ap.solve_nlsq(expo, X0, args=(T, Y), bounds=bounds, x_scale=x_scale)
    # the repeat, with an equal new tuple of bounds (not the memo's: checked again)
    memo = ap.solve_nlsq(expo, X0 + 0.1, args=(T, Y), bounds=tuple(list(bounds)),
                         x_scale=x_scale)
    first = ap.solve_nlsq(expo, jnp.asarray(X0 + 0.1), args=(T, Y), bounds=bounds,
                          x_scale=x_scale)
    _same_bits(memo, first)


def test_repeat_reuses_a_memoised_problem():
    ap.solve_nlsq(expo, X0, args=(T, Y), bounds=(0.0, 10.0))
    hits = _caches.PROBLEMS.hits
    ap.solve_nlsq(expo, X0 + 0.2, args=(T, Y + 0.01), bounds=(0.0, 10.0))
    assert _caches.PROBLEMS.hits == hits + 1


@pytest.mark.parametrize("change, match", [
    (dict(x0=np.array([20.0, 1.0, 0.0])), "bound"),
    (dict(x0=np.array([np.nan, 1.0, 0.0])), "x0"),
    (dict(args=(T, np.where(T > 1, np.nan, Y))), "NaN or Inf"),
    (dict(bounds=(5.0, 1.0)), "strictly less"),
    (dict(bounds=(np.nan, 10.0)), "NaN"),
    (dict(f_scale=0.0), "f_scale"),
    (dict(x_scale=-1.0), "x_scale"),
])
def test_repeat_checks_values(change, match):
    call = dict(x0=X0, args=(T, Y), bounds=(0.0, 10.0), x_scale=1.0, f_scale=1.0)
    ap.solve_nlsq(expo, **call)   # memoised
    with pytest.raises(ValueError, match=match):
        ap.solve_nlsq(expo, **{**call, **change})


def test_unknown_option_raises_on_repeat():
    def model(t, a, k, c):
        return a * jnp.exp(-k * t) + c

    ap.curve_fit(model, T, Y, p0=[1.0, 1.0, 0.0])
    with pytest.raises(TypeError, match="not_an_option"):
        ap.curve_fit(model, T, Y, p0=[1.0, 1.0, 0.0], not_an_option=1)


def test_argument_reader_is_bind():
    """``float64_entry``'s reader gives ``sig.bind(...).arguments`` or bind's error."""
    def kw_only(a, b=1, *, c, d=2, **kw):
        pass

    def pos_only(a, /, b, *args, c=3):
        pass

    def named_kwargs(a, b=2, *, kwargs=None):
        pass

    cases = [((1,), {}), ((1, 2), {}), ((1, 2, 3), {}), ((), {"a": 1}), ((1,), {"a": 2}),
             ((1,), {"c": 1}), ((1,), {"c": 1, "z": 5}), ((1,), {"c": 1, "kw": 5}),
             ((1, 2, 3, 4), {"c": 1}), ((), {}), ((1,), {"kwargs": {"precision": 1}}),
             ((1,), {"b": 3, "c": 4, "d": 5, "precision": "f32"}), ((1, 2), {"x0": 3}),
             (tuple(range(11)), {}), ((len, 1, 2), {"p0": [1]}), ((1, 2), {"kwargs": None}),
             ((len, 1), {"ydata": 2, "precision": "f64", "fixed": {}})]
    for fn in (kw_only, pos_only, named_kwargs, ap.curve_fit.__wrapped__,
               ap.solve_nlsq.__wrapped__, solve_nlsq_batch.__wrapped__):
        sig = inspect.signature(fn)
        read = _ArgumentReader(sig)
        for args, kwargs in cases:
            try:
                want = dict(sig.bind(*args, **kwargs).arguments)
            except TypeError as exc:
                want = str(exc)
            try:
                got = dict(read(args, kwargs))
            except TypeError as exc:
                got = str(exc)
            assert got == want, (fn.__name__, args, kwargs)


def test_all_finite():
    big = np.ones(10_000)
    assert all_finite(big) and all_finite(np.full(10_000, 1e308))   # the sum overflows
    for bad in (np.nan, np.inf, -np.inf):
        b = big.copy()
        b[-1] = bad
        assert not all_finite(b) and not all_finite(b[-8:])
    assert all_finite(np.arange(5)) and all_finite([1.0, 2.0])
    assert not all_finite(np.array([1 + 1j, complex(np.nan, 0)]))
    assert all_finite(np.array([np.nan], ml_dtypes.bfloat16))   # not an inexact NumPy type


@pytest.mark.slow
def test_residual_kwargs_none_with_x64_off():
    """``kwargs=None`` (the residual's keyword arguments) is not searched for a precision."""
    from _subprocess import run_python

    proc = run_python("""
        import numpy as np, adaptprec as ap
        res = ap.solve_nlsq(lambda p: p - 2.0, np.zeros(2), kwargs=None)
        print(res.x.tolist())
    """, x64=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().splitlines()[-1] == "[2.0, 2.0]"
