"""A :class:`~adaptprec.FitResult` as JSON and back (``FitResult.to_json`` /
``FitResult.from_json``).

Every field is kept: arrays as ``{"array": nested lists, "dtype": ...}`` with ``inf``,
``-inf`` and ``nan`` as the strings ``"inf"``, ``"-inf"``, ``"nan"`` (strict JSON has no
such numbers) and complex arrays as their real and imaginary parts; the solver's result
by its fields; the parameters by their structure (names, fixed values, expressions and
constraints as text). A model is code, not data: pass it to :func:`from_json` for
``predict``, ``band`` and ``profile_intervals`` (and ``expr=`` for ties that were
callables); the table, statistics, Wald intervals and the report need neither.

Example:
    >>> import numpy as np, jax.numpy as jnp
    >>> import adaptprec as ap
    >>> x = np.linspace(0.0, 1.0, 8)
    >>> model = lambda x, a, b: a * x + b
    >>> res = ap.fit(model, x, 2 * x + 1 + np.array([1, -1] * 4) * 1e-3)
    >>> back = ap.FitResult.from_json(res.to_json(), model=model)
    >>> bool(np.array_equal(back.pcov, res.pcov)), str(back) == str(res)
    (True, True)
"""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np

__all__ = ["to_json", "from_json", "FORMAT"]

#: the format's name and version, written into every document
FORMAT = "adaptprec.FitResult/1"


def _number(v):
    v = float(v)
    if math.isfinite(v):
        return v
    return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")


def _unnumber(v):
    return float(v) if isinstance(v, str) else v


def _encode(v):
    if v is None or isinstance(v, (bool, str)):
        return v
    if isinstance(v, (int, np.integer)) and not isinstance(v, bool):
        return int(v)
    if isinstance(v, (float, np.floating)):
        return _number(v)
    a = np.asarray(v)
    if a.dtype.kind == "c":
        return {"array": _lists(a.real), "imag": _lists(a.imag), "dtype": str(a.dtype)}
    if a.dtype.kind == "b":
        return {"array": a.tolist(), "dtype": "bool"}
    if a.dtype.kind in "iu":
        return {"array": a.tolist(), "dtype": str(a.dtype)}
    return {"array": _lists(a), "dtype": str(a.dtype)}


def _lists(a):
    a = np.asarray(a, np.float64)
    if a.ndim == 0:
        return _number(a)
    return [_lists(b) for b in a] if a.ndim > 1 else [_number(b) for b in a]


def _decode(v):
    if isinstance(v, dict) and "array" in v:
        dt = np.dtype(v["dtype"])
        if dt.kind == "c":
            return np.asarray(_floats(v["array"])) + 1j * np.asarray(_floats(v["imag"]))
        if dt.kind in "biu":
            return np.asarray(v["array"], dt)
        return np.asarray(_floats(v["array"]), dt)
    return _unnumber(v) if isinstance(v, str) and v in ("nan", "inf", "-inf") else v


def _floats(x):
    return [_floats(b) for b in x] if isinstance(x, list) else _unnumber(x)


def _spec(spec, fixed_values):
    if spec is None:
        return None
    tied = [[name, getattr(rule, "text", None)] for name, rule in spec.tied]
    return {"names": list(spec.names), "free": list(spec.free),
            "fixed": dict(zip(spec.fixed, np.asarray(fixed_values, float).tolist())),
            "tied": tied, "described": list(spec.described)}


def to_json(res, **dumps_kwargs) -> str:
    """The result as a JSON document (module docstring)."""
    from ..nlsq.result import NLSQResult

    out = {"format": FORMAT}
    for f in dataclasses.fields(type(res)):
        v = getattr(res, f.name)
        if f.name in ("model",):
            out["model_name"] = getattr(v, "__name__", None) if v is not None else None
        elif f.name == "parameters":
            out[f.name] = _spec(v, res.fixed_values)
        elif f.name == "likelihood":
            out[f.name] = v if isinstance(v, str) else "callable:" + getattr(
                v, "__name__", "nll")
        elif f.name == "runs":
            out[f.name] = {k.name: _encode(getattr(v, k.name))
                           for k in dataclasses.fields(v)}
        elif f.name == "solver":
            fields = {k.name: _encode(getattr(v, k.name)) for k in dataclasses.fields(
                NLSQResult) if k.name != "ladder"}
            fields["ladder"] = [str(np.dtype(d)) for d in v.ladder]
            out[f.name] = fields
        elif isinstance(v, tuple):
            out[f.name] = list(v)
        else:
            out[f.name] = _encode(v)
    return json.dumps(out, **dumps_kwargs)


def _rebuilt_spec(d, expr):
    """The :class:`ParameterSpec` of a stored structure (ties from their text, or from
    ``expr`` for those that were callables)."""
    from ..modeling.parameters import parameter_spec

    if d is None:
        return None, np.zeros(0)
    ties, constraints = {}, []
    for name, text in d["tied"]:
        described = d["described"][d["names"].index(name)]
        if described.startswith("constrained: "):
            constraints.append(described[len("constrained: "):])
        elif text is not None:
            ties[name] = text
        elif expr is not None and name in expr:
            ties[name] = expr[name]
        else:
            ties[name] = _missing_rule(name)
    spec, values = parameter_spec(d["names"], fixed=d["fixed"], expr=ties or None,
                                  constraints=constraints or None)
    return spec, values.fixed


def _missing_rule(name):
    def missing(values):
        raise ValueError(f"the tie of {name!r} was a callable, which JSON does not keep: "
                         "pass it to FitResult.from_json(expr={...})")
    return missing


def from_json(cls, text: str, model=None, expr=None):
    """A ``cls`` (:class:`~adaptprec.FitResult`) from :func:`to_json`'s document;
    ``model`` (and ``expr`` for callable ties) make ``predict``, ``band`` and
    ``profile_intervals`` available again."""
    from ..nlsq.result import NLSQResult
    from .residual_tests import RunsTest

    d = json.loads(text)
    if d.get("format") != FORMAT:
        raise ValueError(f"not a FitResult document (format {d.get('format')!r}, "
                         f"expected {FORMAT!r})")
    kw = {}
    for f in dataclasses.fields(cls):
        if f.name == "model":
            kw["model"] = model
        elif f.name == "parameters":
            spec, _ = _rebuilt_spec(d["parameters"], expr)
            kw["parameters"] = spec
        elif f.name == "runs":
            kw["runs"] = RunsTest(**{k: _decode(v) for k, v in d["runs"].items()})
        elif f.name == "solver":
            s = {k: _decode(v) for k, v in d["solver"].items() if k != "ladder"}
            kw["solver"] = NLSQResult(**s, ladder=tuple(np.dtype(t) for t in
                                                        d["solver"]["ladder"]))
        elif f.name == "likelihood":
            kw["likelihood"] = d["likelihood"]
        elif f.name in ("names", "diagnostics"):
            kw[f.name] = tuple(d[f.name])
        else:
            kw[f.name] = _decode(d[f.name])
    return cls(**kw)
