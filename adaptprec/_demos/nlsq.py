"""Demo: nonlinear least squares with adaptive precision (NIST StRD Misra1a + curve_fit).

Misra1a's 14 observations and certified values (NIST ITL, public domain) are written out
here, so the demo needs no data files and runs from an installed wheel.
"""

ORDER = 40
TITLE = "nlsq: solve_nlsq / curve_fit, f32 -> f64 with a verifying step on f64"


def run() -> None:
    import jax.numpy as jnp
    import numpy as np

    import adaptprec as ap
    x = np.array([77.6, 114.9, 141.1, 190.8, 239.9, 289.0, 332.8, 378.4, 434.8, 477.3,
                  536.8, 593.1, 689.1, 760.0])
    y = np.array([10.07, 14.73, 17.94, 23.93, 29.61, 35.18, 40.02, 44.82, 50.76, 55.05,
                  61.01, 66.40, 75.47, 81.78])
    certified = np.array([2.3894212918e02, 5.5015643181e-04])

    def misra1a(b, x, y):
        return b[0] * (1 - jnp.exp(-b[1] * x)) - y

    def lre(res):
        err = np.abs(np.asarray(res.x) - certified) / np.abs(certified)
        return float(np.min(-np.log10(err)))

    # the ladder asked for: by default a problem this small runs float64 alone on CPU,
    # where float32 is no faster (nlsq.common.SMALL_F64_MN); the large fit below climbs it
    res = ap.solve_nlsq(misra1a, np.array([500.0, 1e-4]), args=(x, y),
                        precision="f32,f64")
    default = ap.solve_nlsq(misra1a, np.array([500.0, 1e-4]), args=(x, y))
    print(f"NIST Misra1a (start 1), precision='f32,f64': LRE {lre(res):.1f} digits "
          f"(certified values), status {int(res.status)} ({res.message})")
    for t in res.trace():
        print(f"  rung {t['rung']}: entered at iteration {t['entered_at_iteration']}, "
              f"{t['nfev']} residual evaluations ({t['reason']})")
    print(f"  default 'adaptive' at this size: {default.rung_name} alone, LRE "
          f"{lre(default):.1f}, {int(default.nfev)} evaluations")

    rng = np.random.default_rng(0)
    x = np.linspace(0.0, 4.0, 200)
    sigma = 0.05 * np.ones_like(x)
    y = 2.5 * np.exp(-1.3 * x) + 0.5 + sigma * rng.standard_normal(x.size)
    popt, pcov = ap.curve_fit(lambda x, a, b, c: a * jnp.exp(-b * x) + c, x, y,
                              p0=[1.0, 1.0, 0.0], sigma=sigma, absolute_sigma=True)
    err = np.sqrt(np.diag(np.asarray(pcov)))
    print("curve_fit a*exp(-b x)+c: " + ", ".join(
        f"{n} = {v:.4f} +- {e:.4f}" for n, v, e in zip("abc", np.asarray(popt), err)))

    # A large fit: the residual is proven pointwise from its jaxpr, so J^T J and J^T f
    # are accumulated over cache-sized blocks of points (docs/nlsq.md).
    import time

    import jax

    from adaptprec._pointwise import point_axes

    def dexp(t, a1, k1, a2, k2, c):
        return a1 * jnp.exp(-k1 * t) + a2 * jnp.exp(-k2 * t) + c

    t = jnp.linspace(0.0, 10.0, 200_000)
    yb = dexp(t, 3.0, 1.7, 1.2, 0.23, 0.4) + 0.01 * jnp.asarray(
        rng.standard_normal(t.size))
    p0 = [2.0, 1.0, 1.0, 0.1, 0.0]
    axes = point_axes(lambda p, t, y: dexp(t, *p) - y, jnp.asarray(p0), (t, yb), t.size)
    t0 = time.perf_counter()
    popt, _ = ap.curve_fit(dexp, t, yb, p0=p0)
    cold = time.perf_counter() - t0
    t0 = time.perf_counter()
    popt, _, info, _, _ = ap.curve_fit(dexp, t, yb * 1.0, p0=p0, full_output=True)
    jax.block_until_ready(popt)
    warm = time.perf_counter() - t0
    res = info["result"]
    print(f"double exponential, {t.size:,} points: pointwise along axes {axes} -> blocked "
          f"normal equations; {cold:.2f} s with compilation, {warm * 1e3:.0f} ms warm; "
          f"rungs {[tr['rung'] + ':' + str(tr['nfev']) for tr in res.trace()]}")
    print("  popt = " + ", ".join(f"{v:.4f}" for v in np.asarray(popt)))
