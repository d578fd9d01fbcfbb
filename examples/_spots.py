"""The 2-D Gaussian spots problem shared by the batched-fit examples (Gpufit's standard
problem: 5x5-pixel spots, a 5-parameter Gaussian, Poisson noise)."""

import jax.numpy as jnp
import numpy as np


def gauss2d(p, xy):
    """Gpufit's GAUSS_2D: amplitude * exp(-r^2 / (2 width^2)) + offset."""
    a, x0, y0, w, b = p
    return a * jnp.exp(-((xy[0] - x0) ** 2 + (xy[1] - y0) ** 2) / (2 * w * w)) + b


def spots(num, seed=0):
    """``(xy (2, 25), data (num, 25), truth (num, 5), starts (num, 5))``: ``num`` spots
    with Poisson noise, and starts within 10% of the truth."""
    rng = np.random.default_rng(seed)
    gx, gy = np.meshgrid(np.arange(5.0), np.arange(5.0))
    xy = np.stack([gx.ravel(), gy.ravel()])
    truth = np.tile([500.0, 2.0, 2.0, 1.0, 10.0], (num, 1))
    truth[:, 1:3] += rng.uniform(-0.5, 0.5, (num, 2))
    r2 = (xy[0] - truth[:, 1:2]) ** 2 + (xy[1] - truth[:, 2:3]) ** 2
    lam = truth[:, :1] * np.exp(-r2 / (2 * truth[:, 3:4] ** 2)) + truth[:, 4:5]
    data = rng.poisson(lam).astype(float)
    starts = truth * (1 + rng.uniform(-0.1, 0.1, truth.shape))
    return xy, data, truth, starts
