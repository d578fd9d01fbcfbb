"""Demo: 2-D Gaussian spots on 5x5 pixels (Gpufit's standard case), thousands at once."""

from __future__ import annotations

import numpy as np

ORDER = 50
TITLE = "batched fits: solve_nlsq_batch on Gpufit's 2-D Gaussian (5x5 pixels)"

SIZE = 5
TRUTH = (500.0, 2.0, 2.0, 1.0, 10.0)  # amplitude, x0, y0, width, offset


def gauss2d(p, xy):
    """Gpufit's GAUSS_2D model on pixel coordinates ``xy`` (2, 25) for parameters ``p``."""
    import jax.numpy as jnp

    a, x0, y0, s, b = p[0], p[1], p[2], p[3], p[4]
    arg = ((xy[0] - x0) ** 2 + (xy[1] - y0) ** 2) / (2.0 * s * s)
    return a * jnp.exp(-arg) + b


def grid(size: int = SIZE) -> np.ndarray:
    """Pixel centres ``(2, size*size)``: row 0 is x, row 1 is y."""
    gx, gy = np.meshgrid(np.arange(size, dtype=np.float64), np.arange(size, dtype=np.float64))
    return np.stack([gx.ravel(), gy.ravel()])


def make_problem(num_fits: int, seed: int = 0, size: int = SIZE):
    """Poisson-noisy spots; true centres jittered +-0.5 px; starts within +-10% of truth.

    Returns ``(xy (2, m), data (B, m), truth (B, 5), x0 (B, 5))`` as float64 numpy arrays.
    """
    rng = np.random.default_rng(seed)
    truth = np.tile(np.asarray(TRUTH), (num_fits, 1))
    truth[:, 1:3] += rng.uniform(-0.5, 0.5, (num_fits, 2))
    xy = grid(size)
    arg = ((xy[0][None] - truth[:, 1:2]) ** 2 + (xy[1][None] - truth[:, 2:3]) ** 2)
    clean = truth[:, :1] * np.exp(-arg / (2 * truth[:, 3:4] ** 2)) + truth[:, 4:5]
    data = rng.poisson(clean).astype(np.float64)
    x0 = truth * (1.0 + rng.uniform(-0.1, 0.1, truth.shape))
    return xy, data, truth, x0


def run() -> None:
    import time

    import jax

    import adaptprec as ap

    xy, data, truth, x0 = make_problem(2000)
    # compaction off keeps the demo's compile time short (one LM loop per rung)
    kw = dict(args=(xy,), in_axes=None, ydata=data, compaction=None)
    res = ap.solve_nlsq_batch(gauss2d, x0, **kw)
    jax.block_until_ready(res.x)
    t0 = time.perf_counter()
    res = ap.solve_nlsq_batch(gauss2d, x0, **kw)
    jax.block_until_ready(res.x)
    dt = time.perf_counter() - t0
    err = np.median(np.abs(np.asarray(res.x) - truth), axis=0)
    print(f"{len(x0)} fits of a 5-parameter Gaussian on 5x5 pixels: {len(x0) / dt:,.0f} fits/s "
          f"(after compilation), ladder {'>'.join(res.ladder)}")
    print(f"status counts {res.status_counts()}, escalated to f64: {res.num_escalated}, "
          f"median iterations {np.median(np.asarray(res.nit)):.0f}")
    print("median |x - truth| (amp, x0, y0, width, offset): "
          + ", ".join(f"{e:.3g}" for e in err))
    bad = data.copy()
    bad[7, 3] = np.nan
    res2 = ap.solve_nlsq_batch(gauss2d, x0, **dict(kw, ydata=bad))
    same = np.array_equal(np.delete(np.asarray(res2.x), 7, 0), np.delete(np.asarray(res.x), 7, 0))
    print(f"one NaN pixel in fit 7 -> its status {int(res2.status[7])} "
          f"({res2.message(7)[:40]}...); the other fits unchanged: {same}")
