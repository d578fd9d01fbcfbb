"""curve_fit quickstart: scipy's curve_fit semantics, jit/vmap/grad, adaptive precision.

Run:  python examples/curve_fit_quickstart.py
"""

import jax

jax.config.update("jax_enable_x64", True)  # the f64 rung needs x64; adaptprec never flips it

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import adaptprec as ap  # noqa: E402


def model(x, a, k, c):
    return a * jnp.exp(-k * x) + c


rng = np.random.default_rng(0)
x = np.linspace(0.0, 4.0, 200)
sigma = 0.02 + 0.03 * rng.random(x.size)
y = model(x, 2.5, 1.3, 0.5) + sigma * rng.standard_normal(x.size)

# 1. scipy-style fit with per-point standard deviations
popt, pcov = ap.curve_fit(model, x, y, p0=[1.0, 1.0, 0.0], sigma=sigma, absolute_sigma=True)
print("popt", np.round(np.asarray(popt), 4), "+-", np.round(np.sqrt(np.diag(pcov)), 4))

# 2. the full result: which rung produced it, how many evaluations on each rung
popt, pcov, info, mesg, ier = ap.curve_fit(model, x, y, p0=[1.0, 1.0, 0.0], sigma=sigma,
                                           full_output=True)
res = info["result"]
print(mesg)
for t in res.trace():
    print("  ", t)

# 3. many fits at once: vmap over data sets (one compiled solver)
ys = jnp.stack([y, 1.1 * y, y + 0.2])
fit = jax.jit(lambda yy: ap.curve_fit(model, jnp.asarray(x), yy, p0=jnp.array([1.0, 1.0, 0.0]))[0])
print("vmapped popt\n", np.round(np.asarray(jax.vmap(fit)(ys)), 4))

# 4. sensitivity of the fitted rate k to each data point (implicit differentiation)
dk_dy = jax.grad(lambda yy: fit(yy)[1])(jnp.asarray(y))
print("most influential point for k:", int(jnp.argmax(jnp.abs(dk_dy))),
      "d k / d y =", float(jnp.max(jnp.abs(dk_dy))))
