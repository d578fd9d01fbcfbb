"""Bad input at the boundary (issue 13 item 8, issue 20): one table row per bad input and
public entry point; each must raise a clear error that names the argument (and, where
there is one, the fix). Errors are raised before anything is compiled, so the table is
cheap to run.
"""

import jax.numpy as jnp
import numpy as np
import pytest

import adaptprec as ap

T = np.linspace(0.0, 1.0, 8)
YB = np.stack([2.0 * np.exp(-T)] * 4)


def model(p, t):
    return p[0] * jnp.exp(-p[1] * t)


def cf_model(x, a, b):
    return a * jnp.exp(-b * x)


def residual(p, t, y):
    return p[0] * jnp.exp(-p[1] * t) - y


# (id, call, exception type, regex the message must match)
CASES = [
    # ---- solve_nlsq
    ("solve_nlsq: string x0", lambda: ap.solve_nlsq(residual, "ab", (T, T)),
     ValueError, "x0 must be numbers"),
    ("solve_nlsq: complex x0", lambda: ap.solve_nlsq(residual, [1j, 1.0], (T, T)),
     ValueError, "x0` must be real"),
    ("solve_nlsq: NaN x0", lambda: ap.solve_nlsq(residual, [np.nan, 1.0], (T, T)),
     ValueError, "x0 contains NaN.*finite starting point"),
    # newcomer audit: scipy passes any args; a str failed inside JAX
    ("solve_nlsq: str in args", lambda: ap.solve_nlsq(
        lambda p, t, y, mode: residual(p, t, y), [1.0, 1.0], (T, T, "fast")),
     TypeError, r"args\[2\] is a str.*functools.partial"),
    ("solve_nlsq: jac wrong shape", lambda: ap.solve_nlsq(
        residual, [1.0, 1.0], (T, T), jac=lambda p, t, y: jnp.ones((2, 8))),
     ValueError, r"`jac` has wrong shape: expected \(8, 2\)"),
    ("solve_nlsq: jac nonsense", lambda: ap.solve_nlsq(residual, [1.0, 1.0], (T, T),
                                                       jac="nonsense"),
     ValueError, "`jac` must be"),
    ("solve_nlsq: jac array", lambda: ap.solve_nlsq(residual, [1.0, 1.0], (T, T),
                                                    jac=np.ones((8, 2))),
     ValueError, "not an array"),
    ("solve_nlsq: bounds size 1", lambda: ap.solve_nlsq(residual, [1.0, 1.0], (T, T),
                                                        bounds=([0.0], [3.0, 4.0])),
     ValueError, "Inconsistent shapes between bounds"),
    ("solve_nlsq: all tolerances off", lambda: ap.solve_nlsq(
        residual, [1.0, 1.0], (T, T), method="trf", ftol=None, xtol=None, gtol=None),
     ValueError, "At least one of the tolerances"),
    ("solve_nlsq: max_nfev 0", lambda: ap.solve_nlsq(residual, [1.0, 1.0], (T, T),
                                                     max_nfev=0),
     ValueError, "max_nfev"),
    ("solve_nlsq: huber with lm", lambda: ap.solve_nlsq(residual, [1.0, 1.0], (T, T),
                                                        method="lm", loss="huber"),
     ValueError, "only 'linear' loss"),
    ("solve_nlsq: unknown method", lambda: ap.solve_nlsq(residual, [1.0, 1.0], (T, T),
                                                         method="bfgs"),
     ValueError, "method='bfgs'"),
    ("solve_nlsq: workers", lambda: ap.solve_nlsq(residual, [1.0, 1.0], (T, T),
                                                  workers=2),
     ValueError, "solve_nlsq_batch"),
    ("solve_nlsq: residual 2-D", lambda: ap.solve_nlsq(lambda p: jnp.outer(p, p),
                                                       [1.0, 1.0]),
     ValueError, "at most a 1-D array"),
    ("solve_nlsq: residual not callable", lambda: ap.solve_nlsq(3, [1.0]),
     TypeError, "callable"),
    # ---- curve_fit
    ("curve_fit: p0 too short", lambda: ap.curve_fit(cf_model, T, T, p0=[1.0]),
     ValueError, r"p0 has 1 value but cf_model\(x, a, b\) takes 2 fit parameters"),
    ("curve_fit: p0 too long", lambda: ap.curve_fit(cf_model, T, T, p0=[1.0] * 3),
     ValueError, r"one value per parameter \(a, b\)"),
    ("curve_fit: string p0", lambda: ap.curve_fit(cf_model, T, T, p0="ab"),
     ValueError, "x0 must be numbers"),
    ("curve_fit: jac nonsense", lambda: ap.curve_fit(cf_model, T, T, jac="nonsense"),
     ValueError, "`jac` must be"),
    ("curve_fit: jac array", lambda: ap.curve_fit(cf_model, T, T, jac=np.ones((8, 2))),
     ValueError, "not an array"),
    ("curve_fit: jac wrong shape", lambda: ap.curve_fit(
        cf_model, T, T, jac=lambda x, a, b: jnp.ones((2, 8))),
     ValueError, r"`jac` has wrong shape: expected \(8, 2\)"),
    ("curve_fit: string ydata", lambda: ap.curve_fit(cf_model, T, "abc"),
     ValueError, "ydata must be numbers"),
    # (issue 31) the data are read once, in curve_fit; an Inf the model maps to a finite
    # residual (exp(-b inf) = 0) must still be refused, also for jax.Array data
    ("curve_fit: Inf xdata", lambda: ap.curve_fit(cf_model, np.r_[T[:-1], np.inf], T),
     ValueError, "xdata contains NaN or Inf"),
    ("curve_fit: NaN jax ydata", lambda: ap.curve_fit(
        cf_model, jnp.asarray(T), jnp.asarray(np.r_[T[:-1], np.nan])),
     ValueError, "ydata contains NaN or Inf"),
    # ... and what curve_fit derives from them is still checked by solve_nlsq (1 / sigma
    # of a subnormal sigma overflows)
    ("curve_fit: sigma whose inverse overflows", lambda: ap.curve_fit(
        cf_model, T, T, sigma=np.full(8, 5e-324)), ValueError, "NaN or Inf"),
    ("curve_fit: sigma shape", lambda: ap.curve_fit(cf_model, T, T, sigma=np.ones(3)),
     ValueError, "`sigma` has incorrect shape"),
    ("curve_fit: empty ydata", lambda: ap.curve_fit(cf_model, T[:0], T[:0]),
     ValueError, "must not be empty"),
    ("curve_fit: args", lambda: ap.curve_fit(cf_model, T, T, args=(1,)),
     ValueError, "'args' is not a supported keyword"),
    ("curve_fit: nan_policy", lambda: ap.curve_fit(cf_model, T, T, nan_policy="hi"),
     ValueError, "nan_policy must be one of"),
    ("curve_fit: lm with bounds", lambda: ap.curve_fit(cf_model, T, T, method="lm",
                                                       bounds=(0, 5)),
     ValueError, "bounds"),
    ("curve_fit: col_deriv", lambda: ap.curve_fit(cf_model, T, T, col_deriv=1),
     ValueError, "col_deriv"),
    # ---- solve_nlsq_batch
    ("batch: ydata length", lambda: ap.solve_nlsq_batch(
        model, np.ones((4, 2)), (T,), in_axes=(None,), ydata=np.ones((4, 5))),
     ValueError, "ydata has 5 points per fit"),
    ("batch: ydata rows", lambda: ap.solve_nlsq_batch(
        model, np.ones((4, 2)), (T,), in_axes=(None,), ydata=np.ones((3, 8))),
     ValueError, "ydata must have shape"),
    ("batch: string x0", lambda: ap.solve_nlsq_batch(model, "ab", (T,), in_axes=(None,),
                                                     ydata=YB),
     ValueError, "x0 must be numbers"),
    ("batch: complex x0", lambda: ap.solve_nlsq_batch(model, np.ones((4, 2)) * 1j, (T,),
                                                      in_axes=(None,), ydata=YB),
     ValueError, "x0 must be real"),
    ("batch: 1-D x0", lambda: ap.solve_nlsq_batch(model, np.ones(2), (T,),
                                                  in_axes=(None,), ydata=YB),
     ValueError, r"x0 must have shape \(B, n\)"),
    ("batch: fun not callable", lambda: ap.solve_nlsq_batch(3, np.ones((4, 2)), (T,)),
     TypeError, "callable"),
    ("batch: bad loss", lambda: ap.solve_nlsq_batch(model, np.ones((4, 2)), (T,),
                                                    in_axes=(None,), ydata=YB, loss="l3"),
     ValueError, "loss='l3'"),
    # ---- linalg
    ("linalg.solve: not square", lambda: ap.linalg.solve(np.ones((3, 2)), np.ones(3)),
     ValueError, "square"),
    ("linalg.solve: b mismatch", lambda: ap.linalg.solve(np.eye(3), np.ones(4)),
     ValueError, "does not match A"),
    # a half-precision top rung: LAPACK has no half precision (it was a raw KeyError)
    ("solve_nlsq: bf16 alone", lambda: ap.solve_nlsq(residual, [1.0, 1.0], (T, T),
                                                     precision="bf16"),
     ValueError, "must be float32 or float64"),
    ("curve_fit: ladder ending on f16", lambda: ap.curve_fit(
        cf_model, T, YB[0], p0=[1.0, 1.0], precision="bf16,f16"),
     ValueError, "must be float32 or float64"),
    ("batch: ladder ending on f16", lambda: ap.solve_nlsq_batch(
        model, np.ones((4, 2)), (T,), in_axes=None, ydata=YB, precision="bf16,f16"),
     ValueError, "must end on float32 or float64"),
    ("batch: bf16 alone", lambda: ap.solve_nlsq_batch(
        model, np.ones((4, 2)), (T,), in_axes=None, ydata=YB, precision="bf16"),
     ValueError, "must end on float32 or float64"),
    ("linalg.solve: string A", lambda: ap.linalg.solve("abc", np.ones(3)),
     ValueError, "floating dtype is required"),
    ("linalg.solve: complex A", lambda: ap.linalg.solve(np.eye(3) * 1j, np.ones(3)),
     ValueError, "floating dtype is required"),
    ("linalg.solve: NaN A", lambda: ap.linalg.solve(np.eye(3) * np.nan, np.ones(3)),
     ValueError, "NaN or Inf"),
    ("linalg.solve: bad factor", lambda: ap.linalg.solve(np.eye(3), np.ones(3),
                                                         factor="f7"),
     ValueError, "alias 'f7'"),
    ("linalg.lstsq: wide", lambda: ap.linalg.lstsq(np.ones((2, 3)), np.ones(2)),
     ValueError, "tall"),
    ("linalg.lstsq: b mismatch", lambda: ap.linalg.lstsq(np.ones((4, 3)), np.ones(3)),
     ValueError, "does not match A"),
    # ---- runtime
    ("adaptive: not callable", lambda: ap.adaptive(3), TypeError, "callable"),
    ("adaptive: bad ladder", lambda: ap.adaptive(lambda x: x, ladder=("bf16", "f99")),
     ValueError, "alias 'f99'"),
    ("MixedPrecisionManager: bad ladder", lambda: ap.MixedPrecisionManager(
        ladder="f32,nope"), ValueError, "alias 'nope'"),
    ("MixedPrecisionManager: guards", lambda: ap.MixedPrecisionManager(
        ladder="f32,f64", guards=3), TypeError, "guards must be"),
    ("MixedPrecisionManager.run: not callable", lambda: ap.MixedPrecisionManager(
        ladder="f32,f64").run(3, 1.0), TypeError, "fn must be callable"),
    # ---- policy
    ("Policy.parse: unknown alias", lambda: ap.Policy.parse("p=f32,c=f99,o=f32"),
     ValueError, "alias 'f99'"),
    ("Policy.parse: unknown key", lambda: ap.Policy.parse("q=f32"),
     ValueError, "unknown key 'q'"),
    ("Policy.parse: not a string", lambda: ap.Policy.parse(3),
     ValueError, "a policy is a string"),
]


@pytest.mark.parametrize("call, exc, match", [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_bad_input(call, exc, match):
    with pytest.raises(exc, match=match):
        call()


def test_every_entry_point_is_covered():
    entries = {c[0].split(":")[0].split(".")[0] for c in CASES}
    for name in ("solve_nlsq", "curve_fit", "batch", "linalg", "adaptive",
                 "MixedPrecisionManager", "Policy"):
        assert name in entries, name


@pytest.mark.parametrize("option", [dict(max_nfev=50), dict(tr_solver="lsmr"),
                                    dict(callback=lambda intermediate_result: None),
                                    dict(diff_step=1e-6)], ids=lambda d: next(iter(d)))
def test_multistart_refuses_options_it_cannot_carry(option):
    # starts= runs on the batched engine: an option it does not carry is an error, never
    # silently dropped
    from adaptprec.nlsq._arguments import OptionNotOffered

    with pytest.raises(OptionNotOffered, match=next(iter(option))):
        ap.solve_nlsq(lambda x: x - 1.0, np.zeros(2), starts=3, **option)


@pytest.mark.slow
def test_args_lists_of_numbers_are_arrays():
    # newcomer audit: scipy code passes args=(list(x), list(y)); to JAX a list is a pytree
    # of scalars and the residual got a Python list (tracer - list failed)
    res = ap.solve_nlsq(residual, np.array([1.0, 1.0]), args=(list(T), list(2.0 * np.exp(-T))))
    np.testing.assert_allclose(np.asarray(res.x), [2.0, 1.0], rtol=1e-8)
    # a list of arrays stays a list (a pytree the residual indexes)
    res = ap.solve_nlsq(lambda p, ty: residual(p, ty[0], ty[1]), np.array([1.0, 1.0]),
                        args=([T, 2.0 * np.exp(-T)],))
    np.testing.assert_allclose(np.asarray(res.x), [2.0, 1.0], rtol=1e-8)
    # and in a batch: Y.tolist() is the (B, m) data, not a pytree of B * m scalars
    b = ap.solve_nlsq_batch(residual, np.ones((4, 2)), (T, YB.tolist()), in_axes=(None, 0))
    np.testing.assert_allclose(np.asarray(b.x), [[2.0, 1.0]] * 4, rtol=1e-6)


def test_all_finite_matches_isfinite():
    # (issue 31) the one-pass test at the boundary: a finite sum, else entry by entry
    from adaptprec.nlsq._inputs import all_finite

    for a in (np.ones(5), np.array([1.0, np.inf]), np.array([-np.inf, 1.0]),
              np.array([np.nan]), np.array([1e308, 1e308, -1e308]),
              np.array([1e308, np.inf]), np.array([np.inf, -np.inf]),
              np.full(4, 6e4, np.float16), np.array([np.float16(np.inf)]),
              np.array([1 + 1j, np.nan * 1j]), np.array([1 + 1j]), np.zeros(0),
              np.arange(5), np.float64(np.nan), jnp.asarray([1.0, np.nan])):
        assert all_finite(a) == bool(np.all(np.isfinite(np.asarray(a)))), a


def test_checked_finite_skips_only_the_arrays_named():
    from adaptprec.nlsq._inputs import check_finite_tree

    bad, other = np.array([1.0, np.nan]), np.array([np.inf])
    check_finite_tree((bad,), "data", skip=(bad,))     # declared checked: not read again
    with pytest.raises(ValueError, match="data contains NaN or Inf"):
        check_finite_tree((bad, other), "data", skip=(bad,))  # any other array still is
    with pytest.raises(ValueError, match="data contains NaN or Inf"):
        check_finite_tree((bad,), "data")              # not declared: checked
