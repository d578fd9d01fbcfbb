"""Realistic curve fits (issue 32): models scientists fit, with seeded noisy data.

Each :class:`Problem` holds a model written once against an array namespace (``xp`` is
``numpy`` for scipy's run and ``jax.numpy`` for adaptprec's, so neither pays the other's
dispatch), the data (made here from true parameters plus seeded Gaussian noise), a
textbook starting guess (what a practitioner would type: the data's max for an amplitude,
the median x for a midpoint, ...) and optional bounds. Starting from scipy's default
``p0`` (ones) is the other start the benchmark and the tests use.

The data are built from the true parameters, so each problem has a known good minimum;
:func:`reference_cost` polishes it with scipy in float64 at tight tolerances, and a fit
*solves* the problem when its cost is within ``SOLVED_RTOL`` of that (a different local
minimum or a runaway is not solved, however it is reported).

Used by ``benchmarks/bench_real.py`` (the whole set, against scipy in the same run) and
``tests/test_real_fits.py`` (a few problems in the default run, the set in the slow one).

Example:
    >>> from real_models import PROBLEMS
    >>> p = PROBLEMS["michaelis_menten"]
    >>> p.xdata.shape, p.ydata.shape, len(p.p_true)
    ((10,), (10,), 2)
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

import numpy as np

__all__ = ["Problem", "PROBLEMS", "reference_cost", "cost_of", "is_solved", "SOLVED_RTOL"]

#: a fit solves the problem when cost <= reference * (1 + SOLVED_RTOL) (+ a floor for
#: exact fits); cost is 0.5 * sum(r**2), r = (f - y) / sigma
SOLVED_RTOL = 1e-6


@dataclasses.dataclass(frozen=True)
class Problem:
    """One realistic fit: ``make(xp)`` returns ``f(x, *p)`` in that array namespace."""

    name: str
    make: Callable
    xdata: np.ndarray
    ydata: np.ndarray
    p_true: tuple
    p0: tuple                      # the textbook start
    bounds: tuple = (-np.inf, np.inf)
    sigma: np.ndarray | None = None
    kind: str = ""                 # the family, for the report

    @property
    def n(self) -> int:
        return len(self.p_true)

    @property
    def m(self) -> int:
        return int(np.size(self.ydata))

    def model(self, xp=np):
        return self.make(xp)


def _data(rng, f, x, p, noise, relative=False):
    y = np.asarray(f(x, *p), dtype=np.float64)
    scale = np.abs(y) if relative else 1.0
    return y + noise * scale * rng.standard_normal(y.shape)


PROBLEMS: dict[str, Problem] = {}


def _add(name, make, x, p_true, p0, noise, *, seed, bounds=(-np.inf, np.inf),
         relative=False, sigma=False, kind=""):
    rng = np.random.default_rng(seed)
    f = make(np)
    y = _data(rng, f, x, p_true, noise, relative)
    s = None
    if sigma:
        s = noise * (np.abs(np.asarray(f(x, *p_true))) if relative else np.ones_like(y))
    PROBLEMS[name] = Problem(name, make, np.asarray(x, dtype=np.float64), y,
                             tuple(float(v) for v in p_true),
                             tuple(float(v) for v in p0), bounds, s, kind)


# --- dose-response, kinetics, binding -------------------------------------------------

def _4pl(xp):
    def f(x, bottom, hill, ec50, top):
        return top + (bottom - top) / (1.0 + (x / ec50) ** hill)
    return f


def _5pl(xp):
    def f(x, bottom, hill, ec50, top, asym):
        return top + (bottom - top) / (1.0 + (x / ec50) ** hill) ** asym
    return f


_conc = np.logspace(-3, 2, 12)
_add("4pl", _4pl, _conc, (0.05, 1.2, 0.8, 1.0), (0.0, 1.0, float(np.median(_conc)), 1.0),
     0.02, seed=1, bounds=([-1, 0.1, 1e-4, 0], [1, 10, 1e3, 3]), kind="dose-response")
_conc16 = np.logspace(-3, 2, 16)
_add("5pl", _5pl, _conc16, (0.02, 1.5, 0.5, 1.1, 0.7),
     (0.0, 1.0, float(np.median(_conc16)), 1.0, 1.0), 0.01, seed=2,
     bounds=([-1, 0.1, 1e-4, 0, 0.1], [1, 10, 1e3, 3, 10]), kind="dose-response")


def _mm(xp):
    def f(s, vmax, km):
        return vmax * s / (km + s)
    return f


_s = np.array([0.02, 0.04, 0.06, 0.08, 0.12, 0.2, 0.4, 0.8, 1.2, 2.0])
_add("michaelis_menten", _mm, _s, (2.5, 0.4), (2.5, float(np.median(_s))), 0.03, seed=3,
     kind="enzyme kinetics")


def _hill(xp):
    def f(x, bmax, kd, n):
        return bmax * x ** n / (kd ** n + x ** n)
    return f


_lig = np.logspace(-2, 2, 14)
_add("hill_binding", _hill, _lig, (120.0, 1.7, 1.4), (100.0, 1.0, 1.0), 2.0, seed=4,
     kind="binding")


def _assoc(xp):
    def f(t, ymax, k):
        return ymax * (1.0 - xp.exp(-k * t))
    return f


_t20 = np.linspace(0, 20, 25)
_add("association", _assoc, _t20, (850.0, 0.32), (800.0, 0.1), 10.0, seed=5,
     kind="binding kinetics")


# --- exponential decays ---------------------------------------------------------------

def _exp1(xp):
    def f(t, a, tau, c):
        return a * xp.exp(-t / tau) + c
    return f


def _exp2(xp):
    def f(t, a1, k1, a2, k2, c):
        return a1 * xp.exp(-k1 * t) + a2 * xp.exp(-k2 * t) + c
    return f


def _exp3(xp):
    def f(t, a1, k1, a2, k2, a3, k3, c):
        return a1 * xp.exp(-k1 * t) + a2 * xp.exp(-k2 * t) + a3 * xp.exp(-k3 * t) + c
    return f


_t10 = np.linspace(0, 10, 60)
_add("exp_decay", _exp1, _t10, (5.0, 2.2, 0.4), (5.0, 1.0, 0.0), 0.05, seed=6,
     kind="decay")
_t30 = np.linspace(0, 30, 150)
_add("biexponential", _exp2, _t30, (3.0, 1.5, 2.0, 0.12, 0.1), (3.0, 1.0, 2.0, 0.1, 0.0),
     0.02, seed=7, kind="decay")
_t60 = np.geomspace(0.01, 60, 300)
_add("triexponential", _exp3, _t60, (2.0, 6.0, 1.5, 0.8, 1.0, 0.07, 0.05),
     (2.0, 5.0, 1.0, 1.0, 1.0, 0.1, 0.0), 0.005, seed=8, kind="decay")


# --- peaks and spectra ----------------------------------------------------------------

def _gauss_bg(xp):
    def f(x, a, mu, s, b0, b1):
        return a * xp.exp(-0.5 * ((x - mu) / s) ** 2) + b0 + b1 * x
    return f


_x100 = np.linspace(0, 10, 200)
_add("gaussian_background", _gauss_bg, _x100, (4.0, 6.2, 0.7, 1.0, 0.15),
     (4.0, 5.0, 1.0, 1.0, 0.0), 0.1, seed=9, kind="spectroscopy")


def _lorentz(xp):
    def f(x, a, x0, gamma, c):
        return a * gamma ** 2 / ((x - x0) ** 2 + gamma ** 2) + c
    return f


_add("lorentzian", _lorentz, np.linspace(-5, 5, 120), (10.0, 0.7, 0.4, 0.5),
     (10.0, 0.0, 1.0, 0.0), 0.1, seed=10, kind="spectroscopy")


def _raman3(xp):
    def f(x, a1, m1, s1, a2, m2, s2, a3, m3, s3, b0, b1):
        g = lambda a, m, s: a * xp.exp(-0.5 * ((x - m) / s) ** 2)  # noqa: E731
        return g(a1, m1, s1) + g(a2, m2, s2) + g(a3, m3, s3) + b0 + b1 * x
    return f


_wn = np.linspace(200, 1800, 2000)
_add("raman_3peaks", _raman3, _wn,
     (120.0, 520.0, 12.0, 80.0, 1001.0, 8.0, 60.0, 1580.0, 20.0, 20.0, 0.005),
     (100.0, 500.0, 10.0, 100.0, 1000.0, 10.0, 100.0, 1600.0, 10.0, 10.0, 0.0), 2.0,
     seed=11, kind="spectroscopy")


def _voigtish(xp):
    # pseudo-Voigt: a weighted sum of a Gaussian and a Lorentzian of one width
    def f(x, a, x0, w, eta, c):
        g = xp.exp(-4 * np.log(2) * ((x - x0) / w) ** 2)
        lor = 1.0 / (1.0 + 4 * ((x - x0) / w) ** 2)
        return a * (eta * lor + (1 - eta) * g) + c
    return f


_add("pseudo_voigt", _voigtish, np.linspace(20, 40, 400), (500.0, 28.4, 0.6, 0.3, 30.0),
     (500.0, 28.0, 1.0, 0.5, 0.0), 5.0, seed=12, bounds=([0, 20, 0.01, 0, -100],
                                                         [1e4, 40, 10, 1, 1e3]),
     kind="diffraction")


# --- oscillations ---------------------------------------------------------------------

def _damped_sine(xp):
    def f(t, a, tau, omega, phi, c):
        return a * xp.exp(-t / tau) * xp.sin(omega * t + phi) + c
    return f


_t1e5 = np.linspace(0, 20, 100_000)
_add("damped_sine_1e5", _damped_sine, _t1e5, (2.0, 6.0, 3.1, 0.4, 0.1),
     (2.0, 5.0, 3.0, 0.0, 0.0), 0.3, seed=13, kind="oscillation")


def _fourier3(xp):
    def f(t, a0, a1, b1, a2, b2, a3, b3, w):
        return (a0 + a1 * xp.cos(w * t) + b1 * xp.sin(w * t) + a2 * xp.cos(2 * w * t)
                + b2 * xp.sin(2 * w * t) + a3 * xp.cos(3 * w * t) + b3 * xp.sin(3 * w * t))
    return f


_add("fourier3", _fourier3, np.linspace(0, 10, 300),
     (1.0, 2.0, -1.0, 0.5, 0.8, -0.3, 0.2, 1.25), (1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.2),
     0.05, seed=14, kind="oscillation")


# --- growth, isotherms, physics -------------------------------------------------------

def _logistic(xp):
    def f(t, k, r, t0):
        return k / (1.0 + xp.exp(-r * (t - t0)))
    return f


_t48 = np.linspace(0, 48, 30)
_add("logistic_growth", _logistic, _t48, (1.8, 0.35, 20.0), (1.8, 0.1, 24.0), 0.03,
     seed=15, kind="growth")


def _gompertz(xp):
    def f(t, a, b, c):
        return a * xp.exp(-b * xp.exp(-c * t))
    return f


_add("gompertz", _gompertz, _t48, (2.1, 6.0, 0.15), (2.0, 1.0, 0.1), 0.03, seed=16,
     kind="growth")


def _langmuir(xp):
    def f(p, qmax, k):
        return qmax * k * p / (1.0 + k * p)
    return f


def _freundlich(xp):
    def f(p, k, n):
        return k * p ** (1.0 / n)
    return f


_press = np.linspace(0.1, 10, 15)
_add("langmuir", _langmuir, _press, (4.2, 0.65), (4.0, 1.0), 0.03, seed=17,
     kind="isotherm")
_add("freundlich", _freundlich, _press, (1.7, 2.4), (1.0, 1.0), 0.02, relative=True,
     seed=18, kind="isotherm")


_R = 8.314


def _arrhenius(xp):
    def f(temp, a, ea):
        return a * xp.exp(-ea / (_R * temp))
    return f


_temps = np.linspace(300.0, 400.0, 8)
_add("arrhenius", _arrhenius, _temps, (3.6e11, 7.5e4), (1e10, 6e4), 0.02, relative=True,
     sigma=True, seed=19, kind="kinetics")


_H, _C, _KB = 6.62607015e-34, 2.99792458e8, 1.380649e-23


def _planck(xp):
    # spectral radiance at wavelength lam (micrometres), a scale factor and T (kelvin)
    def f(lam_um, scale, temp):
        lam = lam_um * 1e-6
        return scale * 1e-13 * (2 * _H * _C ** 2 / lam ** 5) / xp.expm1(
            _H * _C / (lam * _KB * temp))
    return f


_add("planck", _planck, np.linspace(0.3, 3.0, 60), (1.0, 5800.0), (1.0, 5000.0), 0.01,
     relative=True, seed=20, kind="physics")


def _bateman(xp):
    # daughter activity of a parent-daughter decay chain
    def f(t, n0, la, lb):
        return n0 * la / (lb - la) * (xp.exp(-la * t) - xp.exp(-lb * t))
    return f


_add("bateman", _bateman, np.linspace(0.1, 30, 40), (100.0, 0.3, 0.08), (100.0, 0.5, 0.1),
     0.5, seed=21, kind="physics")


def _powerlaw(xp):
    def f(x, a, b, c):
        return a * x ** b + c
    return f


_add("power_law", _powerlaw, np.linspace(1, 50, 40), (0.8, 1.6, 5.0), (1.0, 1.0, 0.0),
     0.5, seed=22, kind="scaling")


# --- 2-D and geometric ----------------------------------------------------------------

def _psf(xp):
    def f(xy, a, x0, y0, s, b):
        return a * xp.exp(-((xy[0] - x0) ** 2 + (xy[1] - y0) ** 2) / (2 * s ** 2)) + b
    return f


_g = np.arange(32.0)
_xy = np.stack([c.ravel() for c in np.meshgrid(_g, _g)])
_add("psf_2d", _psf, _xy, (900.0, 15.3, 16.8, 2.1, 50.0), (900.0, 16.0, 16.0, 3.0, 40.0),
     5.0, seed=23, kind="imaging")


def _circle(xp):
    # geometric circle fit: the distance of each point to the circle is the residual
    def f(xy, a, b, r):
        return xp.sqrt((xy[0] - a) ** 2 + (xy[1] - b) ** 2) - r
    return f


def _circle_data():
    rng = np.random.default_rng(24)
    th = np.sort(rng.uniform(0.2, 2.6, 40))           # an arc, not the full circle
    r_pts = 7.0 + 0.05 * rng.standard_normal(40)
    return np.stack([3.0 + r_pts * np.cos(th), -2.0 + r_pts * np.sin(th)])


PROBLEMS["circle"] = Problem("circle", _circle, _circle_data(), np.zeros(40),
                             (3.0, -2.0, 7.0), (0.0, 0.0, 5.0), kind="geometry")


# --- the reference minimum ------------------------------------------------------------

def cost_of(problem: Problem, p) -> float:
    """0.5 * sum(((f(x, *p) - y) / sigma)**2) in float64 NumPy."""
    with np.errstate(all="ignore"):
        r = np.asarray(problem.model(np)(problem.xdata, *np.asarray(p, dtype=np.float64)),
                       dtype=np.float64) - problem.ydata
    if problem.sigma is not None:
        r = r / problem.sigma
    c = 0.5 * float(np.sum(r * r))
    return c if np.isfinite(c) else np.inf


@functools.lru_cache(maxsize=None)
def reference_cost(name: str) -> float:
    """The cost of the minimum next to the true parameters (scipy, float64, tight)."""
    from scipy.optimize import least_squares

    p = PROBLEMS[name]
    f = p.model(np)

    def resid(q):
        r = f(p.xdata, *q) - p.ydata
        return r / p.sigma if p.sigma is not None else r

    x_scale = np.maximum(np.abs(np.asarray(p.p_true)), 1e-12)
    best = cost_of(p, p.p_true)
    for method in ("trf", "lm") if np.all(np.isinf(p.bounds)) else ("trf",):
        kw = {} if method == "lm" else {"bounds": p.bounds}
        res = least_squares(resid, np.asarray(p.p_true), method=method, x_scale=x_scale,
                            xtol=1e-15, ftol=1e-15, gtol=1e-15, max_nfev=20000, **kw)
        best = min(best, 0.5 * float(np.sum(res.fun ** 2)))
    return best


def is_solved(problem: Problem, p) -> bool:
    """Whether ``p`` reaches the reference minimum's cost (to SOLVED_RTOL)."""
    if p is None or not np.all(np.isfinite(np.asarray(p, dtype=np.float64))):
        return False
    ref = reference_cost(problem.name)
    return cost_of(problem, p) <= ref * (1 + SOLVED_RTOL) + 1e-300
