"""Demo: mixed-precision solve — refined from float32, and a Hilbert system falling back."""

ORDER = 30
TITLE = "linalg: float32 LU + float64 refinement, with fallback (dsgesv for JAX)"


def run() -> None:
    import numpy as np

    import jax.numpy as jnp

    import adaptprec as ap

    rng = np.random.default_rng(0)
    n = 10                       # one size for every system: each solver compiles once
    A = rng.standard_normal((n, n)) + n ** 0.5 * np.eye(n)
    b = rng.standard_normal(n)
    x, info = ap.linalg.solve(A, b)
    x64 = np.linalg.solve(A, b)
    print(f"well-conditioned n={n}: status {int(info.status)}, fell_back "
          f"{bool(info.fell_back)}, {int(info.iterations)} refinement steps on float32 LU "
          f"factors")
    print(f"  backward error {float(info.backward_error):.1e} (numpy float64 "
          f"{np.abs(b - A @ x64).max() / (np.abs(A).sum(1).max() * np.abs(x64).max() + np.abs(b).max()):.1e}), "
          f"cond estimate {float(info.cond_estimate):.1e} (exact kappa_inf "
          f"{np.linalg.cond(A, np.inf):.1e})")

    H = 1.0 / (np.arange(n)[:, None] + np.arange(n) + 1.0)   # Hilbert matrix
    bh = H @ np.ones(n)
    print(f"Hilbert n={n} (kappa_1 {np.linalg.cond(H, 1):.1e}), b = H @ ones: LU-IR falls "
          "back to a float64 LU, GMRES-IR still converges from the float32 factors")
    print(f"  {'refine':>6} {'status':>6} {'fell_back':>9} {'iters':>5} {'backward err':>12} "
          f"{'max |x - 1|':>11}")
    for refine in ("lu", "gmres"):
        xh, ih = ap.linalg.solve(jnp.asarray(H), jnp.asarray(bh), refine=refine)
        print(f"  {refine:>6} {int(ih.status):>6} {str(bool(ih.fell_back)):>9} "
              f"{int(ih.iterations):>5} {float(ih.backward_error):>12.1e} "
              f"{np.abs(np.asarray(xh) - 1).max():>11.1e}")
        if refine == "lu":
            lu_message = ih.message
    print(f"  LU-IR says: {lu_message}")
