"""The repeat of a fit: a memoised problem (same model, shapes and options) takes the
call's values, checks them as a first call does, and answers with a first call's bits.

The first-call reference passes ``x0`` as a JAX array, which the memo does not take
(``_inputs._structure_key``): the same program runs from a freshly prepared problem.
"""

import inspect

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import adaptprec as ap
from adaptprec.batch.api import solve_nlsq_batch
from adaptprec.nlsq import _caches
from adaptprec.nlsq._inputs import all_finite

T = np.linspace(0.0, 3.0, 40)
Y = 2.0 * np.exp(-1.3 * T) + 0.3 + 0.02 * np.sin(11.0 * T)
X0 = np.array([1.0, 1.0, 0.0])


def expo(p, t, y):
    return p[0] * jnp.exp(-p[1] * t) + p[2] - y


def decay(t, a, k, c):
    return a * jnp.exp(-k * t) + c


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


def _options(**given):
    """``solve_nlsq``'s options as it hands them to :func:`_inputs.prepare`."""
    from adaptprec.nlsq.curve_fit import _SOLVE_DEFAULTS

    return {**_SOLVE_DEFAULTS, "method": None, "bounds": (-np.inf, np.inf), "jac": None,
            **given}


@pytest.fixture
def prepared(monkeypatch):
    """``prepare(residual, x0, args, **options) -> (problem, prepared from scratch)``,
    the memo of problems emptied first."""
    from adaptprec.nlsq import _inputs

    _caches.PROBLEMS.clear()
    calls = []
    real = _inputs._prepare
    monkeypatch.setattr(_inputs, "_prepare", lambda *a, **k: calls.append(1) or real(*a, **k))

    def prepare(residual, x0, args, **options):
        calls.clear()
        return _inputs.prepare(residual, x0, args, **_options(**options)), bool(calls)
    prepare.calls = calls
    return prepare


def test_new_length_in_a_padded_bucket_takes_its_problem(prepared):
    """40 points pad to 48: 37 points take the bucket's problem (its runner, no analysis)
    and check their values; 48 points are not padded and are prepared from scratch."""
    p40, fresh = prepared(expo, X0, (T, Y))
    assert fresh and p40.pad[1] == 48
    p37, fresh = prepared(expo, X0, (T[:37], Y[:37]))
    assert not fresh and p37.m == 37 and p37.memo_key == p40.memo_key
    assert p37.pad == p40.pad and p37.args[0].shape == (37,)
    assert prepared(expo, X0, (T[:37], Y[:37]))[0].m == 37    # now by its own key
    with pytest.raises(ValueError, match="NaN or Inf"):
        prepared(expo, X0, (T[:36], np.where(T[:36] > 1, np.nan, Y[:36])))
    t48 = np.linspace(0.0, 3.0, 48)
    p48, fresh = prepared(expo, X0, (t48, 2.0 * np.exp(-1.3 * t48)))
    assert fresh and p48.pad is None and p48.m == 48


def test_new_length_answers_with_first_call_bits():
    ap.solve_nlsq(expo, X0, args=(T, Y))
    memo = ap.solve_nlsq(expo, X0 + 0.1, args=(T[:37], Y[:37]))   # the bucket's problem
    first = ap.solve_nlsq(expo, jnp.asarray(X0 + 0.1), args=(T[:37], Y[:37]))
    _same_bits(memo, first)
    assert memo.fun.shape == (37,) and memo.jac.shape == (37, 3)


def test_new_length_deciding_otherwise_is_prepared_again(prepared):
    """A length that decides differently from its bucket's problem: float64 alone below
    ``m n = 32768`` (n = 3: 10,922 residuals), not above; lm's ``m >= n``."""
    t = np.linspace(0.0, 3.0, 11_000)
    y = 2.0 * np.exp(-1.3 * t)
    alone, fresh = prepared(expo, X0, (t[:10_000], y[:10_000]), linear_solver="qr")
    assert fresh and alone.pad[1] == 12_288 and alone.opts.adaptive_stop
    ladder, fresh = prepared(expo, X0, (t, y), linear_solver="qr")
    assert fresh and not ladder.opts.adaptive_stop and ladder.memo_key != alone.memo_key

    def wide(p, t, y):   # 20 parameters, three of them used
        return expo(p[:3], t, y) + 0.0 * jnp.sum(p)

    x0 = np.r_[X0, np.zeros(17)]
    assert prepared(wide, x0, (T[:22], Y[:22]), method="lm")[0].pad[1] == 24
    with pytest.raises(ValueError, match="at least as many residuals"):
        prepared(wide, x0, (T[:19], Y[:19]), method="lm")
    assert not prepared.calls   # raised by the bucket's problem


def test_curve_fit_new_length_takes_its_problem():
    """curve_fit's memoised problem serves any number of points, with scipy's checks."""
    from adaptprec.nlsq._model import prepare_curve_fit

    def four(x, a, b, c, d):
        return a + b * x + c * x ** 2 + d * x ** 3

    def prepare(m, **kw):
        return prepare_curve_fit(four, T[:m], Y[:m], None, kw.get("sigma"), None,
                                 (-np.inf, np.inf), None, None)

    prepare(40)
    hits = _caches.PROBLEMS.hits
    cf = prepare(37)
    assert _caches.PROBLEMS.hits == hits + 1 and cf.m == 37 and cf.args[1].shape == (37,)
    with pytest.raises(TypeError, match="must not exceed the number of data points=3"):
        prepare(3)   # lm: four parameters, three points
    cf = prepare(5, sigma=np.full(5, 0.5))
    assert cf.m == 5 and cf.args[2].tolist() == [2.0] * 5
    assert prepare(6, sigma=np.full(6, 0.5)).args[2].shape == (6,)


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
    ap.curve_fit(decay, T, Y, p0=[1.0, 1.0, 0.0])
    with pytest.raises(TypeError, match="not_an_option"):
        ap.curve_fit(decay, T, Y, p0=[1.0, 1.0, 0.0], not_an_option=1)


def _bad_calls():
    """Calls that do not bind, per entry point."""
    return [(ap.curve_fit, (), {}), (ap.curve_fit, (decay, T), {}),
            (ap.curve_fit, (decay, T, Y), {"xdata": T}),
            (ap.curve_fit, (decay, T, Y, X0, None, False, None, (0, 1), "trf", None, 1), {}),
            (ap.solve_nlsq, (), {"x0": X0}), (ap.solve_nlsq, (expo, X0, (T, Y), "lm"), {}),
            (ap.solve_nlsq, (expo, X0), {"not_an_option": 1, "precision": "f64"}),
            (ap.solve_nlsq, (expo,), {"residual": expo, "x0": X0}),
            (solve_nlsq_batch, (expo,), {"precision": "f32"}),
            (solve_nlsq_batch, (expo, X0), {"ydata": Y, "bogus": None})]


def test_entry_point_bad_call_raises_pythons_type_error():
    """With x64 off the x64 rule reads ``precision`` and the traced arguments by name and
    leaves a call that does not bind to Python: the undecorated function's ``TypeError``."""
    with jax.enable_x64(False):
        for entry, args, kwargs in _bad_calls():
            with pytest.raises(TypeError) as want:
                entry.__wrapped__(*args, **kwargs)
            with pytest.raises(TypeError) as got:
                entry(*args, **kwargs)
            assert str(got.value) == str(want.value), (entry.__name__, args, kwargs)


def test_residual_kwargs_none_in_an_x64_off_scope():
    """``solve_nlsq(..., kwargs=None)`` (the residual's keyword arguments, not searched
    for a precision) with x64 off: float64 in the x64 scope, the bits of x64 on."""
    on = ap.solve_nlsq(expo, X0, args=(T, Y), kwargs=None)
    with jax.enable_x64(False):
        off = ap.solve_nlsq(expo, X0, args=(T, Y), kwargs=None)
    assert isinstance(off.x, np.ndarray) and off.x.dtype == np.float64
    _same_bits(off, on)


def test_entry_point_traced_bad_call_raises_type_error():
    """A call that does not bind raises Python's ``TypeError`` also when an argument is
    traced (before the x64 rule's error for a traced float64 call)."""
    with jax.enable_x64(False):
        def bad(y):
            return ap.curve_fit(decay, T, y, X0, xdata=T)

        with pytest.raises(TypeError, match="multiple values"):
            jax.jit(bad)(np.asarray(Y, np.float32))
        with pytest.raises(ValueError, match="jax_enable_x64"):
            jax.jit(lambda y: ap.curve_fit(decay, T, y, X0)[0])(np.asarray(Y, np.float32))


def test_memo_key_options_are_solve_nlsq_options():
    """The problem memo's key takes every option but the per-call values, by the names
    ``solve_nlsq`` and ``curve_fit`` pass (:func:`_inputs._prepare`'s keywords)."""
    from adaptprec.nlsq import _inputs
    from adaptprec.nlsq.curve_fit import _SOLVE_DEFAULTS

    solve = {k for k, p in inspect.signature(ap.solve_nlsq.__wrapped__).parameters.items()
             if p.kind is p.KEYWORD_ONLY}
    dispatch = {"throw", "starts", "chunk_size"}   # route's, not the in-memory solve's
    assert _inputs._OPTION_NAMES == solve - dispatch
    assert _inputs._OPTION_NAMES == set(_SOLVE_DEFAULTS) | {"method", "bounds", "jac"}
    assert set(_inputs._VALUE_OPTIONS) < _inputs._OPTION_NAMES


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
