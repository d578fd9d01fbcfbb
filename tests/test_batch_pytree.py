"""solve_nlsq_batch with pytree parameters: dict / namedtuple / list-of-arrays starts give
the same fits as the flat (B, n) matrix, under jit too; leaves without the common batch
axis are rejected at the boundary."""

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import adaptprec as ap
from adaptprec.batch._pytree import is_array_like

B = 6
T = jnp.linspace(0.0, 2.0, 12)
_rng = np.random.default_rng(0)
TRUE = np.column_stack([2.0 + _rng.random(B), 0.5 + _rng.random(B), 0.1 * _rng.random(B)])
Y = jnp.asarray(TRUE[:, :1] * np.exp(-TRUE[:, 1:2] * np.asarray(T)) + TRUE[:, 2:])
X0 = jnp.asarray(TRUE * 0.9 + 0.05)


def flat_model(p, t):
    return p[0] * jnp.exp(-p[1] * t) + p[2]


def dict_model(p, t):
    return p["amp"] * jnp.exp(-p["rate_offset"][0] * t) + p["rate_offset"][1]


class Params(NamedTuple):
    amp: jax.Array
    rate: jax.Array
    offset: jax.Array


def nt_model(p, t):
    return p.amp * jnp.exp(-p.rate * t) + p.offset


@pytest.fixture(scope="module")
def flat_result():
    return ap.solve_nlsq_batch(flat_model, X0, (T,), in_axes=None, ydata=Y,
                               precision="f64", return_pcov=True)


@pytest.mark.slow
def test_dict_start_matches_flat(flat_result):
    x0 = {"amp": X0[:, 0], "rate_offset": X0[:, 1:]}
    res = ap.solve_nlsq_batch(dict_model, x0, (T,), in_axes=None, ydata=Y,
                              precision="f64", return_pcov=True)
    assert set(res.x) == {"amp", "rate_offset"}
    assert res.x["amp"].shape == (B,) and res.x["rate_offset"].shape == (B, 2)
    np.testing.assert_allclose(res.x["amp"], flat_result.x[:, 0], rtol=1e-12)
    np.testing.assert_allclose(res.x["rate_offset"], flat_result.x[:, 1:], rtol=1e-12)
    # pcov rows/columns follow the flattened order: amp, rate, offset
    np.testing.assert_allclose(res.pcov, flat_result.pcov, rtol=1e-9)
    assert res.batch_size == B and bool(res.success.all())


@pytest.mark.slow
def test_namedtuple_and_list_starts_under_jit(flat_result):
    x0 = Params(X0[:, 0], X0[:, 1], X0[:, 2])
    res = jax.jit(lambda x0, y: ap.solve_nlsq_batch(
        nt_model, x0, (T,), in_axes=None, ydata=y, precision="f64"))(x0, Y)
    assert isinstance(res.x, Params)
    np.testing.assert_allclose(jnp.stack(list(res.x), axis=1), flat_result.x, rtol=1e-10)
    res_l = ap.solve_nlsq_batch(lambda p, t: flat_model(jnp.stack(p), t),
                                [X0[:, 0], X0[:, 1], X0[:, 2]], (T,), in_axes=None,
                                ydata=Y, precision="f64")
    assert isinstance(res_l.x, list) and len(res_l.x) == 3
    np.testing.assert_allclose(jnp.stack(res_l.x, axis=1), flat_result.x, rtol=1e-10)


def test_pytree_boundary_errors():
    with pytest.raises(ValueError, match="same leading batch axis"):
        ap.solve_nlsq_batch(dict_model, {"amp": X0[:, 0], "rate_offset": X0[:3, 1:]},
                            (T,), in_axes=None, ydata=Y)
    with pytest.raises(ValueError, match="empty pytree"):
        ap.solve_nlsq_batch(dict_model, {}, (T,), in_axes=None, ydata=Y)
    assert is_array_like([[1.0, 2.0], [3.0, 4.0]]) and is_array_like(np.ones((2, 2)))
    assert not is_array_like([np.ones(2), np.ones(2)])
    assert not is_array_like(Params(1.0, 2.0, 3.0))
