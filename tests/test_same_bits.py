"""Same inputs, same bits: a fit's answer depends on its inputs and options alone, not on
the machine's load. ``starts="auto"`` budgets its search in residual evaluations (no
clock), so a hard fit gives the same bits with and without a busy process beside it."""

import json
import subprocess
import sys

from _subprocess import run_python

_FIT = """
import json
import numpy as np, jax.numpy as jnp
import adaptprec as ap

x = np.linspace(0.0, 10.0, 200)
noise = 0.1 * np.random.default_rng(0).standard_normal(200)
y = 4.0 * np.exp(-0.5 * ((x - 6.2) / 0.7) ** 2) + 1.0 + noise
def model(x, a, mu, w, c):
    return a * jnp.exp(-0.5 * ((x - mu) / w) ** 2) + c
popt, pcov, info, mesg, ier = ap.curve_fit(model, x, y, p0=np.ones(4), starts="auto",
                                           full_output=True)
res = info["result"]
print(json.dumps({"popt": [float(v).hex() for v in popt],
                  "pcov": [float(v).hex() for v in np.ravel(pcov)],
                  "nfev": int(res.nfev), "starts_run": int(res.starts_run),
                  "search": res.search}))
"""


def _fit():
    proc = run_python(_FIT, x64=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_starts_auto_same_bits_quiet_and_busy():
    quiet = _fit()
    assert quiet["starts_run"] > 0, quiet       # a hard fit: the search ran
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        loaded = _fit()
    finally:
        busy.kill()
        busy.wait()
    assert loaded == quiet
