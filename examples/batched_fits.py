"""Many small fits at once: 2-D Gaussian spots, per-fit precision, bad fits, chunks.

Gpufit's standard problem: 20,000 spots of 5x5 pixels, each fitted with a 5-parameter
Gaussian (amplitude, x0, y0, width, offset) under Poisson noise. The example

1. fits them all with ``solve_nlsq_batch`` (float32 for the bulk, float64 per fit only
   where a guard fires) and checks a few fits against scipy;
2. adds fits that need float64 (photon counts of 1e20: float32 overflows) and a fit with a
   NaN pixel, and shows that only those fits change (rung / status);
3. chunks the batch with a progress display, fits with Poisson weights and asks for
   per-fit covariances, and compares the reported standard errors with the scatter of
   the estimates around the truth;
4. fits dim spots inside a physical box (``bounds=``: amplitude and offset >= 0, centre
   on the grid, width in [0.3, 3] px).

Run:  python examples/batched_fits.py        (about 20-40 s, mostly compilation)
"""

import time

import jax

jax.config.update("jax_enable_x64", True)   # the f64 rung needs it; adaptprec never sets it

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from scipy.optimize import least_squares  # noqa: E402

import adaptprec as ap  # noqa: E402
from adaptprec.batch import TextProgress  # noqa: E402
from _spots import gauss2d, spots  # noqa: E402  (the problem, shared with multiprocess_batch.py)


def main():
    xy, data, truth, x0 = spots(20_000)
    kw = dict(args=(xy,), in_axes=None, ydata=data)   # xy shared, data per fit

    # 1. all fits; the first call compiles, the second is the steady-state speed
    res = ap.solve_nlsq_batch(gauss2d, x0, **kw)
    t0 = time.perf_counter()
    res = ap.solve_nlsq_batch(gauss2d, x0, **kw)
    jax.block_until_ready(res.x)
    dt = time.perf_counter() - t0
    print(f"{len(x0):,} fits in {dt:.3f} s ({len(x0) / dt:,.0f} fits/s), ladder "
          f"{' -> '.join(res.ladder)}; status counts {res.status_counts()}; "
          f"escalated to f64: {res.num_escalated}")
    for k in (0, 1234, 19_999):
        ref = least_squares(lambda p: np.asarray(gauss2d(p, xy)) - data[k], x0[k], method="lm")
        print(f"  fit {k:5d}: max |x - scipy| = {np.max(np.abs(np.asarray(res.x[k]) - ref.x)):.2e}"
              f"  (x = {np.round(np.asarray(res.x[k]), 3)})")

    # 2. fits that need float64 and a fit with a bad pixel
    hard = data.copy()
    x0h = x0.copy()
    hard[[10, 20, 30]] *= 1e20          # float32 cost overflows (1e40 > 3.4e38)
    x0h[[10, 20, 30], 0] *= 1e20        # ... and so do amplitude and offset
    x0h[[10, 20, 30], 4] *= 1e20
    hard[7, 12] = np.nan
    res2 = ap.solve_nlsq_batch(gauss2d, x0h, args=(xy,), in_axes=None, ydata=hard)
    esc = np.flatnonzero(res2.escalated)   # a guard fired (every fit ends on the top rung)
    print(f"escalated fits: {esc.tolist()}; fit 7: status {int(res2.status[7])} "
          f"({res2.message(7)})")
    others = np.setdiff1d(np.arange(len(x0)), [7, 10, 20, 30])
    same = np.array_equal(np.asarray(res2.x)[others], np.asarray(res.x)[others])
    print(f"all other fits identical to the clean run: {same}")
    scaled_back = np.asarray(res2.x[20]) / np.array([1e20, 1, 1, 1, 1e20])
    print(f"fit 20 (1e20 x the photons) solved in float64 (rung {int(res2.rung[20])}); scaled "
          f"back it matches the unscaled fit to {np.max(np.abs(scaled_back / np.asarray(res.x[20]) - 1)):.1e}")

    # 3. chunks with a progress line (stderr); weighted fits (Poisson: sigma ~ sqrt(counts))
    #    with absolute sigma, so pcov is the covariance of the estimates
    sigma = np.sqrt(np.maximum(data, 1.0))
    res3 = ap.solve_nlsq_batch(gauss2d, x0, **kw, sigma=sigma, absolute_sigma=True,
                               chunk_size=5_000, return_pcov=True,
                               progress=TextProgress(label="batched_fits"))
    se = np.sqrt(np.diagonal(np.asarray(res3.pcov), axis1=1, axis2=2))
    z = (np.asarray(res3.x) - truth) / se
    print("pulls (x - truth) / standard error, std per parameter (about 1 if pcov is right): "
          + ", ".join(f"{v:.2f}" for v in z.std(axis=0)))

    # 4. dim spots (amplitude 4 photons over a background of 10) with a physical box:
    #    unconstrained, some fits wander to negative amplitudes or huge widths
    xy_d, data_d, truth_d, x0_d = spots(2_000, seed=1)
    data_d = np.random.default_rng(2).poisson(
        (data_d - truth_d[:, 4:5]) * 4.0 / 500.0 + 10.0).astype(float)
    x0_d[:, 0] = 4.0
    box = ([0.0, 0.0, 0.0, 0.3, 0.0], [np.inf, 4.0, 4.0, 3.0, np.inf])
    free_d = ap.solve_nlsq_batch(gauss2d, x0_d, args=(xy_d,), in_axes=None, ydata=data_d)
    boxed = ap.solve_nlsq_batch(gauss2d, x0_d, args=(xy_d,), in_axes=None, ydata=data_d,
                                bounds=box)
    xf, xb = np.asarray(free_d.x), np.asarray(boxed.x)
    outside = ~((xf >= box[0]) & (xf <= box[1])).all(axis=1)
    held = ((xb <= box[0]) | (xb >= box[1])).any(axis=1)
    print(f"dim spots: {outside.sum()} of {len(xf)} unconstrained fits leave the box; with "
          f"bounds= {held.sum()} fits end on a bound, status counts {boxed.status_counts()}")


if __name__ == "__main__":
    main()
