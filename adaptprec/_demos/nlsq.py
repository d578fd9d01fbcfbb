"""Demo: nonlinear least squares with adaptive precision (NIST StRD Misra1a + curve_fit)."""

ORDER = 40
TITLE = "nlsq: solve_nlsq / curve_fit, f32 -> f64 with a verifying step on f64"


def run() -> None:
    import jax.numpy as jnp
    import numpy as np

    import adaptprec as ap
    from adaptprec.nlsq._nist import load, lre

    p = load("Misra1a")
    res = ap.solve_nlsq(p.residual, jnp.asarray(p.starts[0]),
                        args=(jnp.asarray(p.x), jnp.asarray(p.y)))
    print(f"NIST {p.name} (start 1): LRE {lre(res.x, p.certified):.1f} digits, "
          f"status {int(res.status)} ({res.message})")
    for t in res.trace():
        print(f"  rung {t['rung']}: entered at iteration {t['entered_at_iteration']}, "
              f"{t['nfev']} residual evaluations ({t['reason']})")

    rng = np.random.default_rng(0)
    x = np.linspace(0.0, 4.0, 200)
    sigma = 0.05 * np.ones_like(x)
    y = 2.5 * np.exp(-1.3 * x) + 0.5 + sigma * rng.standard_normal(x.size)
    popt, pcov = ap.curve_fit(lambda x, a, b, c: a * jnp.exp(-b * x) + c, x, y,
                              p0=[1.0, 1.0, 0.0], sigma=sigma, absolute_sigma=True)
    err = np.sqrt(np.diag(np.asarray(pcov)))
    print("curve_fit a*exp(-b x)+c: " + ", ".join(
        f"{n} = {v:.4f} +- {e:.4f}" for n, v, e in zip("abc", np.asarray(popt), err)))
