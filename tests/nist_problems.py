"""NIST StRD nonlinear-regression problems: a small parser for the ``.dat`` files and the
model functions. It lives with the tests (not in the library): the data are test data.
Examples and benchmarks import it from here (``sys.path`` gets ``tests/``).

Example:
    >>> from nist_problems import MODELS, lre
    >>> len(MODELS), round(lre(1.000001, 1.0), 3)
    (27, 6.0)
    >>> sorted(DIFFICULTY.values()).count("higher")
    8
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass

import jax.numpy as jnp
import numpy as np

__all__ = ["NistProblem", "MODELS", "DIFFICULTY", "load", "load_all", "lre", "default_data_dir"]


def _misra1a(b, x):
    return b[0] * (1 - jnp.exp(-b[1] * x))


def _chwirut(b, x):
    return jnp.exp(-b[0] * x) / (b[1] + b[2] * x)


def _lanczos(b, x):
    return b[0] * jnp.exp(-b[1] * x) + b[2] * jnp.exp(-b[3] * x) + b[4] * jnp.exp(-b[5] * x)


def _gauss(b, x):
    return (b[0] * jnp.exp(-b[1] * x) + b[2] * jnp.exp(-((x - b[3]) ** 2) / b[4] ** 2)
            + b[5] * jnp.exp(-((x - b[6]) ** 2) / b[7] ** 2))


def _danwood(b, x):
    return b[0] * x ** b[1]


def _misra1b(b, x):
    return b[0] * (1 - (1 + b[1] * x / 2) ** (-2))


def _kirby2(b, x):
    return (b[0] + b[1] * x + b[2] * x ** 2) / (1 + b[3] * x + b[4] * x ** 2)


def _hahn1(b, x):
    return ((b[0] + b[1] * x + b[2] * x ** 2 + b[3] * x ** 3)
            / (1 + b[4] * x + b[5] * x ** 2 + b[6] * x ** 3))


def _nelson(b, x):  # x has columns (x1, x2); the response is log(y)
    return b[0] - b[1] * x[:, 0] * jnp.exp(-b[2] * x[:, 1])


def _mgh17(b, x):
    return b[0] + b[1] * jnp.exp(-x * b[3]) + b[2] * jnp.exp(-x * b[4])


def _misra1c(b, x):
    return b[0] * (1 - (1 + 2 * b[1] * x) ** (-0.5))


def _misra1d(b, x):
    return b[0] * b[1] * x * ((1 + b[1] * x) ** (-1))


def _roszman1(b, x):
    return b[0] - b[1] * x - jnp.arctan(b[2] / (x - b[3])) / jnp.pi


def _enso(b, x):
    w = 2 * jnp.pi * x
    return (b[0] + b[1] * jnp.cos(w / 12) + b[2] * jnp.sin(w / 12)
            + b[4] * jnp.cos(w / b[3]) + b[5] * jnp.sin(w / b[3])
            + b[7] * jnp.cos(w / b[6]) + b[8] * jnp.sin(w / b[6]))


def _mgh09(b, x):
    return b[0] * (x ** 2 + x * b[1]) / (x ** 2 + x * b[2] + b[3])


def _thurber(b, x):
    return ((b[0] + b[1] * x + b[2] * x ** 2 + b[3] * x ** 3)
            / (1 + b[4] * x + b[5] * x ** 2 + b[6] * x ** 3))


def _boxbod(b, x):
    return b[0] * (1 - jnp.exp(-b[1] * x))


def _rat42(b, x):
    return b[0] / (1 + jnp.exp(b[1] - b[2] * x))


def _mgh10(b, x):
    return b[0] * jnp.exp(b[1] / (x + b[2]))


def _eckerle4(b, x):
    return (b[0] / b[1]) * jnp.exp(-0.5 * ((x - b[2]) / b[1]) ** 2)


def _rat43(b, x):
    return b[0] / (1 + jnp.exp(b[1] - b[2] * x)) ** (1 / b[3])


def _bennett5(b, x):
    return b[0] * (b[1] + x) ** (-1 / b[2])


MODELS = {
    "Misra1a": _misra1a, "Chwirut1": _chwirut, "Chwirut2": _chwirut,
    "Lanczos1": _lanczos, "Lanczos2": _lanczos, "Lanczos3": _lanczos,
    "Gauss1": _gauss, "Gauss2": _gauss, "Gauss3": _gauss, "DanWood": _danwood,
    "Misra1b": _misra1b, "Kirby2": _kirby2, "Hahn1": _hahn1, "Nelson": _nelson,
    "MGH17": _mgh17, "Misra1c": _misra1c, "Misra1d": _misra1d, "Roszman1": _roszman1,
    "ENSO": _enso,
    # higher level of difficulty
    "MGH09": _mgh09, "Thurber": _thurber, "BoxBOD": _boxbod, "Rat42": _rat42,
    "MGH10": _mgh10, "Eckerle4": _eckerle4, "Rat43": _rat43, "Bennett5": _bennett5,
}

# NIST's "Level of Difficulty" from each file's header
DIFFICULTY = {
    **dict.fromkeys(["Misra1a", "Chwirut1", "Chwirut2", "Lanczos3", "Gauss1", "Gauss2",
                     "DanWood", "Misra1b"], "lower"),
    **dict.fromkeys(["Kirby2", "Hahn1", "Nelson", "MGH17", "Lanczos1", "Lanczos2", "Gauss3",
                     "Misra1c", "Misra1d", "Roszman1", "ENSO"], "average"),
    **dict.fromkeys(["MGH09", "Thurber", "BoxBOD", "Rat42", "MGH10", "Eckerle4", "Rat43",
                     "Bennett5"], "higher"),
}


@dataclass(frozen=True)
class NistProblem:
    """One StRD problem: data, both starts, certified values and residual sum of squares."""

    name: str
    model: object
    x: np.ndarray
    y: np.ndarray
    starts: tuple
    certified: np.ndarray
    certified_sd: np.ndarray
    certified_rss: float

    @property
    def n(self) -> int:
        return int(self.certified.size)

    def residual(self, b, x, y):
        """Residual ``model(b, x) - y`` (for ``solve_nlsq(res, b0, args=(x, y))``)."""
        return self.model(b, x) - y


def default_data_dir() -> str:
    """``tests/data/nist_strd`` of the source tree (or ``$ADAPTPREC_NIST_DIR``)."""
    env = os.environ.get("ADAPTPREC_NIST_DIR")
    if env:
        return env
    here = os.path.dirname(os.path.abspath(__file__))
    return os.path.join(here, "data", "nist_strd")


_NUM = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"


def load(name: str, data_dir: str | None = None) -> NistProblem:
    """Parse ``<data_dir>/<name>.dat``."""
    path = os.path.join(data_dir or default_data_dir(), f"{name}.dat")
    with open(path) as fh:
        lines = fh.read().splitlines()
    starts1, starts2, cert, sd = [], [], [], []
    rss = math.nan
    data_at = None
    for i, line in enumerate(lines):
        mpar = re.match(rf"\s*b\d+\s*=\s*({_NUM})\s+({_NUM})\s+({_NUM})\s+({_NUM})", line)
        if mpar:
            a, b, c, d = (float(v) for v in mpar.groups())
            starts1.append(a), starts2.append(b), cert.append(c), sd.append(d)
        if line.strip().startswith("Residual Sum of Squares"):
            rss = float(re.findall(_NUM, line.split(":")[1])[0])
        if line.startswith("Data:") and re.match(r"Data:\s+y\b", line):
            data_at = i + 1
    if data_at is None or not cert:
        raise ValueError(f"{path} does not look like a NIST StRD nonlinear file")
    rows = np.array([[float(v) for v in ln.split()] for ln in lines[data_at:] if ln.strip()])
    y = rows[:, 0]
    x = rows[:, 1:] if rows.shape[1] > 2 else rows[:, 1]
    if name == "Nelson":
        y = np.log(y)
    return NistProblem(name, MODELS[name], x, y, (np.array(starts1), np.array(starts2)),
                       np.array(cert), np.array(sd), rss)


def load_all(data_dir: str | None = None) -> list[NistProblem]:
    """All 27 problems, in :data:`MODELS` order."""
    return [load(name, data_dir) for name in MODELS]


def lre(x, c, cap: float = 11.0) -> float:
    """Log relative error ``-log10(|x - c| / |c|)`` (minimum over components, capped).

    Example:
        >>> from nist_problems import lre
        >>> lre([1.0, 2.0], [1.0, 2.0])
        11.0
    """
    x = np.atleast_1d(np.asarray(x, np.float64))
    c = np.atleast_1d(np.asarray(c, np.float64))
    with np.errstate(divide="ignore", invalid="ignore"):
        rel = np.abs(x - c) / np.abs(c)
    if not np.all(np.isfinite(rel)):
        return 0.0
    vals = np.where(rel == 0, cap, -np.log10(np.maximum(rel, 1e-300)))
    return float(np.clip(np.min(vals), 0.0, cap))
