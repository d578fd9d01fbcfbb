"""The path of one call through the package: a default ``curve_fit`` and a default
``solve_nlsq`` in a warm process visit few modules, in few round trips.

Counted with ``sys.setprofile``: every Python function call whose code lives in a file of
``adaptprec/`` names its module; "entered" are the distinct modules, "returns" the times
the call came back to a module it had left before (A -> B -> A counts one). A fresh
process (x64 off, as a scipy user runs it), NumPy data, 50 points, the second call of
the same model measured.
"""

import json

from _subprocess import run_python

_CODE = """
import json, os, sys
import numpy as np
import jax.numpy as jnp
import adaptprec as ap

ROOT = os.path.dirname(ap.__file__)
t = np.linspace(0.0, 4.0, 50)
y = 2.5 * np.exp(-1.3 * t) + 0.5 + 0.01 * np.sin(7 * t)

def model(t, a, k, c):
    return a * jnp.exp(-k * t) + c

def residual(p, t, y):
    return p[0] * jnp.exp(-p[1] * t) + p[2] - y

calls = {
    "curve_fit": lambda: ap.curve_fit(model, t, y, p0=[1.0, 1.0, 0.0]),
    "solve_nlsq": lambda: ap.solve_nlsq(residual, np.array([1.0, 1.0, 0.0]), args=(t, y)),
}

def trace(fn):
    path = []
    def prof(frame, event, arg):
        if event != "call":
            return
        f = frame.f_code.co_filename
        if f.startswith(ROOT):
            mod = os.path.relpath(f, ROOT)
            if not path or path[-1] != mod:
                path.append(mod)
    sys.setprofile(prof)
    try:
        fn()
    finally:
        sys.setprofile(None)
    returns, seen = 0, []
    for i, mod in enumerate(path):
        if mod in seen and (i == 0 or path[i - 1] != mod):
            returns += 1
        if mod not in seen:
            seen.append(mod)
    return {"entered": seen, "returns": returns, "path": path}

out = {}
for name, fn in calls.items():
    fn(); fn()          # warm: compiled, memoised
    out[name] = trace(fn)
print(json.dumps(out))
"""


def test_default_calls_visit_few_modules():
    proc = run_python(_CODE, x64=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    for name, rec in out.items():
        assert len(rec["entered"]) <= 12, (name, rec["entered"])
        assert rec["returns"] <= 25, (name, rec["returns"], rec["path"])
