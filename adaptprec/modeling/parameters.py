"""Fixed, tied and constrained parameters, without rewriting the model.

The fitting entry points (:func:`~adaptprec.curve_fit`, :func:`~adaptprec.fit` and its
intervals and bands, :func:`~adaptprec.solve_nlsq_batch`) take the options of lmfit's
``Parameter`` as keywords, by the names of the model's parameters:

- ``fixed={"bottom": 0.0}`` holds a parameter at a value (lmfit's ``vary=False``);
- ``expr={"w2": "w1", "b": "2*a"}`` ties a parameter to the others by an expression
  (:mod:`._expr`; lmfit's ``expr``) or by a callable receiving the parameters by name,
  ``expr={"b": lambda p: 2 * p["a"]}``;
- ``constraints=["a < b"]`` holds an inequality between a parameter and an expression of
  the others: the parameter alone on one side is replaced by that expression plus (or
  minus) a free non-negative slack, lmfit's documented recipe done for you (``<`` and
  ``<=`` both give ``a <= b``);
- ``p0`` and ``bounds`` may be dicts by name (``bounds={"k": (0, None)}``, lmfit's
  ``min``/``max``).

The fit then runs on the **free coordinates** ``q`` (the free parameters and the slacks);
the model sees the full vector ``p = expand(q)``. The covariance of ``p`` is the
covariance of ``q`` propagated through that map: ``C_p = T C_q T^T`` with ``T = dp/dq``,
so a fixed parameter has error 0 and a tied one the error of its expression (the delta
method, exact for a linear tie). Degrees of freedom, AIC and BIC count the free
coordinates.

Example:
    >>> import numpy as np
    >>> from adaptprec.modeling.parameters import parameter_spec
    >>> spec, values = parameter_spec(("a", "b", "c"), p0=[1.0, 2.0, 0.5],
    ...                               fixed={"c": 0.5}, expr={"b": "2*a"})
    >>> spec.free, values.q0.tolist()
    (('a',), [1.0])
    >>> np.asarray(spec.expand(np.array([3.0]), values.fixed)).tolist()
    [3.0, 6.0, 0.5]
"""

from __future__ import annotations

import functools
import numbers
import re
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ._expr import CONSTANTS, Expression

__all__ = ["ParameterSpec", "ParameterValues", "parameter_spec", "parameter_structure",
           "Slack", "slack_start", "has_parameter_options", "reduced_model", "propagate",
           "PARAMETER_OPTIONS"]

#: the keywords that make an entry point fit on free coordinates
PARAMETER_OPTIONS = ("fixed", "expr", "constraints")

_CONSTRAINT = re.compile(r"^(.*?)(<=|>=|<|>)(.*)$")


def has_parameter_options(p0, bounds, options: dict) -> bool:
    """Whether a call asks for parameters by name (:data:`PARAMETER_OPTIONS`, or ``p0``
    or ``bounds`` given as a dict)."""
    return any(options.get(k) for k in PARAMETER_OPTIONS) or isinstance(p0, dict) or \
        isinstance(bounds, dict)


class ParameterSpec:
    """Which parameters are free, fixed or tied (the structure, hashable: one reduced
    model and one compiled program per structure; the values are
    :class:`ParameterValues`).

    ``names``: the model's parameters; ``free``: the free coordinates (free parameters,
    then one slack per constraint); ``fixed``: the fixed parameters; ``tied``:
    ``(name, rule)`` pairs in evaluation order, ``rule`` an :class:`._expr.Expression`
    or a callable of the parameters by name; ``described``: per parameter, ``"free"``,
    ``"fixed"`` or the tie's text.
    """

    def __init__(self, names, free, fixed, tied, described):
        self.names, self.free, self.fixed = tuple(names), tuple(free), tuple(fixed)
        self.tied, self.described = tuple(tied), tuple(described)

    def _key(self):
        return (self.names, self.free, self.fixed, self.tied)

    def __eq__(self, other):
        return isinstance(other, ParameterSpec) and other._key() == self._key()

    def __hash__(self):
        return hash(self._key())

    def __repr__(self):
        return (f"ParameterSpec(free={self.free}, fixed={self.fixed}, "
                f"tied={tuple(n for n, _ in self.tied)})")

    @property
    def trivial(self) -> bool:
        """Every parameter free (nothing fixed, tied or constrained)."""
        return self.free == self.names

    def expand(self, q, fixed_values):
        """The model's full parameter vector ``p`` from the free coordinates ``q`` and the
        fixed values (jit/vmap/grad-safe)."""
        q = jnp.asarray(q)
        values = {name: q[i] for i, name in enumerate(self.free)}
        fixed_values = jnp.asarray(fixed_values, q.dtype)
        values.update({name: fixed_values[i] for i, name in enumerate(self.fixed)})
        for name, rule in self.tied:
            values[name] = jnp.asarray(rule(values), q.dtype)
        return jnp.stack([values[name] for name in self.names])

    def free_values(self, p, fixed_values) -> np.ndarray:
        """The free coordinates of a full vector ``p`` (a slack is ``p``'s distance to
        the constraint's other side), host NumPy."""
        p = np.asarray(p, np.float64)
        values = dict(zip(self.names, p))
        values.update(zip(self.fixed, np.asarray(fixed_values, np.float64)))
        out = []
        for name in self.free:
            if name in values:
                out.append(values[name])
            else:   # a slack: its tied parameter minus the rest of its rule
                target, rule = next((t, r) for t, r in self.tied
                                    if isinstance(r, Slack) and r.slack == name)
                out.append(rule.sign * (values[target] - float(
                    rule.other({**values, name: 0.0}))))
        return np.asarray(out, np.float64)


class Slack:
    """``target = other ± slack`` (a constraint solved for its single-name side)."""

    def __init__(self, slack: str, other: Expression, sign: float, text: str):
        self.slack, self.other, self.sign, self.text = slack, other, sign, text
        self.names = (*other.names, slack)

    def __call__(self, values):
        return self.other(values) + self.sign * values[self.slack]

    def __eq__(self, o):
        return isinstance(o, Slack) and (o.slack, o.other, o.sign) == (
            self.slack, self.other, self.sign)

    def __hash__(self):
        return hash((self.slack, self.other, self.sign))


class ParameterValues(NamedTuple):
    """The values of a :class:`ParameterSpec` for one call: ``fixed`` (values of
    ``spec.fixed``), ``q0`` (start of the free coordinates), ``lower``/``upper`` (their
    bounds), ``p_lower``/``p_upper`` (every parameter's bounds, for reports)."""

    fixed: np.ndarray
    q0: np.ndarray
    lower: np.ndarray
    upper: np.ndarray
    p_lower: np.ndarray
    p_upper: np.ndarray


def _by_name(value, names, what: str, default):
    """A dict by name, or a sequence in ``names`` order, as a dict over ``names``."""
    n = len(names)
    if value is None:
        return dict.fromkeys(names, default)
    if isinstance(value, dict):
        unknown = [k for k in value if k not in names]
        if unknown:
            raise ValueError(f"{what} names {unknown}, which the model does not take; its "
                             f"parameters are {list(names)}")
        return {k: value.get(k, default) for k in names}
    arr = np.atleast_1d(np.asarray(value, np.float64))
    if arr.size == 1:
        arr = np.full(n, float(arr[0]))
    if arr.shape != (n,):
        raise ValueError(f"{what} has {arr.size} values for the model's {n} parameters "
                         f"{list(names)}; give one per parameter or a dict by name")
    return dict(zip(names, arr.tolist()))


def _bounds_by_name(bounds, names):
    """``(lower, upper)`` dicts from ``(lb, ub)`` (scalars, arrays, scipy ``Bounds``) or
    a dict ``{name: (lo, hi)}`` (``None`` for no bound)."""
    if isinstance(bounds, dict):
        unknown = [k for k in bounds if k not in names]
        if unknown:
            raise ValueError(f"bounds names {unknown}, which the model does not take; its "
                             f"parameters are {list(names)}")
        lower, upper = {}, {}
        for k in names:
            lo, hi = bounds.get(k, (None, None))
            lower[k] = -np.inf if lo is None else float(lo)
            upper[k] = np.inf if hi is None else float(hi)
        return lower, upper
    if hasattr(bounds, "lb") and hasattr(bounds, "ub"):
        bounds = (bounds.lb, bounds.ub)
    lb, ub = bounds
    return (_by_name(lb, names, "the lower bound", -np.inf),
            _by_name(ub, names, "the upper bound", np.inf))


def _default_start(lo: float, hi: float) -> float:
    """scipy's ``curve_fit`` start for one parameter (midpoint of finite bounds, one
    inside a one-sided bound, 1 otherwise)."""
    if np.isfinite(lo) and np.isfinite(hi):
        return 0.5 * (lo + hi)
    if np.isfinite(lo):
        return lo + 1.0
    if np.isfinite(hi):
        return hi - 1.0
    return 1.0


def _rule(name, rule, names):
    """An :class:`Expression` or a callable of the parameters by name."""
    if isinstance(rule, str):
        e = Expression(rule)
        unknown = [v for v in e.names if v not in names and v not in CONSTANTS]
        if unknown:
            raise ValueError(f"expr for {name!r} ({rule!r}) names {unknown}; the model's "
                             f"parameters are {list(names)}")
        e.names = tuple(v for v in e.names if v in names)
        return e
    if callable(rule):
        return rule
    raise ValueError(f"expr for {name!r} must be a string such as '2*a' or a callable "
                     f"of the parameters by name, got {rule!r}")


class _Recorder(dict):
    """A dict that records the keys read (a callable tie's dependencies)."""

    def __init__(self, *a):
        super().__init__(*a)
        self.read = []

    def __getitem__(self, k):
        self.read.append(k)
        return super().__getitem__(k)


def _dependencies(name, rule, start):
    if isinstance(rule, (Expression, Slack)):
        return list(rule.names)
    rec = _Recorder(start)
    try:
        rule(rec)
    except KeyError as exc:
        raise ValueError(f"expr for {name!r} reads {exc.args[0]!r}, which is not a "
                         f"parameter; the parameters are {list(start)}") from None
    return rec.read


def _order(tied: dict, start: dict):
    """The ties in an order where each reads only computed values; a cycle raises."""
    deps = {n: [d for d in _dependencies(n, r, start) if d in tied and d != n]
            for n, r in tied.items()}
    for n, r in tied.items():
        if n in _dependencies(n, r, start):
            raise ValueError(f"expr for {n!r} reads {n!r} itself")
    done, order = set(), []
    while len(order) < len(tied):
        ready = [n for n in tied if n not in done and all(d in done for d in deps[n])]
        if not ready:
            left = [n for n in tied if n not in done]
            raise ValueError(f"the expressions of {left} depend on each other in a cycle")
        for n in ready:
            done.add(n)
            order.append((n, tied[n]))
    return order


def _constraint(text: str, names, free, lower, upper):
    """Parse ``"lhs < rhs"``; returns ``(target, Slack)`` solving it for a parameter of
    ``free`` standing alone on one side. ``lower``/``upper`` by name, numbers or per-fit
    arrays (a batch): the target's own bound must be implied in every entry."""
    m = _CONSTRAINT.match(text.strip()) if isinstance(text, str) else None
    if m is None or "<" in m.group(3) or ">" in m.group(3) or "=" in m.group(1):
        raise ValueError(f"constraint {text!r} must be one inequality, such as 'a < b' or "
                         "'a + b <= 10'")
    left, op, right = m.group(1).strip(), m.group(2), m.group(3).strip()
    small, big = (left, right) if op in ("<", "<=") else (right, left)
    for target, other, sign in ((big, small, 1.0), (small, big, -1.0)):
        if target not in free:
            continue
        e = _rule(target, other, names)
        if target in e.names:
            continue
        # target = other + sign * slack drops the target's own bound: allowed where the
        # bound is open or implied (target >= other >= lower[other] >= lower[target])
        lo, hi = np.asarray(lower[target]), np.asarray(upper[target])
        single = other in names
        implied_lo = ~np.isfinite(lo) | (sign > 0 and single and
                                          np.asarray(lower[other]) >= lo)
        implied_hi = ~np.isfinite(hi) | (sign < 0 and single and
                                          np.asarray(upper[other]) <= hi)
        if not np.all(implied_lo & implied_hi):
            continue
        slack = f"{target} - {other}" if sign > 0 else f"{other} - {target}"
        slack = slack if re.fullmatch(r"[\w\s.\-]*", other) else (
            f"{target} - ({other})" if sign > 0 else f"({other}) - {target}")
        return target, Slack(slack, e, sign, f"{small} <= {big}")
    raise ValueError(
        f"constraint {text!r}: one side must be a single free parameter that the other "
        "side does not name, with no bound of its own beyond what the constraint implies "
        f"(free parameters: {[n for n in names if n in free]}). Write it as, e.g., "
        "'a < 10 - b'.")


def slack_start(s0, start, xnp=np):
    """A slack's start: its distance ``s0 >= 0`` to the bound, or just off the bound
    (``1e-3 max(1, |start|)``, ``start`` the constrained parameter's) where ``s0 = 0``:
    a start on the bound would leave the slack's gradient projected away."""
    return xnp.where(s0 > 0, s0, 1e-3 * xnp.maximum(1.0, xnp.abs(start)))


def parameter_structure(names, lower, upper, start, *, expr=None, constraints=None,
                        fixed=(), held=()) -> ParameterSpec:
    """The :class:`ParameterSpec` of ``expr`` and ``constraints`` (validated).

    Args:
        names: the model's parameter names.
        lower, upper: bounds by name (numbers, or arrays of per-fit values in a batch).
        start: a value by name (what a callable tie is called with, to record what it
            reads).
        expr, constraints: as to :func:`parameter_spec`.
        fixed: names held at a value (not free coordinates).
        held: names that stay free coordinates but may not be tied, nor be the side a
            constraint solves for (a batch's per-fit fixed parameters: boxes of width
            zero).
    """
    if expr is not None and not isinstance(expr, dict):
        raise ValueError(f"expr must be a dict {{name: expression}}, such as "
                         f"{{'b': '2*a'}}; got {expr!r}")
    tied_in = dict(expr or {})
    constraints = [constraints] if isinstance(constraints, str) else list(constraints or ())
    unknown = [k for k in tied_in if k not in names]
    if unknown:
        raise ValueError(f"expr names {unknown}, which the model does not take; its "
                         f"parameters are {list(names)}")
    both = sorted((set(fixed) | set(held)) & set(tied_in))
    if both:
        raise ValueError(f"{both} are both fixed and tied by expr: give one")
    tied = {k: _rule(k, r, names) for k, r in tied_in.items()}
    for k in tied:
        if np.any(np.isfinite(lower[k])) or np.any(np.isfinite(upper[k])):
            raise ValueError(f"{k!r} is tied by expr and bounded: bound the parameters its "
                             "expression reads, or hold it with constraints=")
    free = [k for k in names if k not in fixed and k not in tied]
    slacks = []
    for text in constraints:
        target, rule = _constraint(text, names, [k for k in free if k not in held],
                                   lower, upper)
        free.remove(target)
        tied[target] = rule
        slacks.append(rule.slack)
    order = _order(tied, start)
    if not free and not slacks:
        raise ValueError("every parameter is fixed or tied: nothing is left to fit")
    return ParameterSpec(names, (*free, *slacks), tuple(fixed), order,
                         tuple("fixed" if k in fixed else _describe(tied[k]) if k in tied
                               else "free" for k in names))


def parameter_spec(names, *, p0=None, bounds=None, fixed=None, expr=None,
                   constraints=None) -> tuple[ParameterSpec, ParameterValues]:
    """The structure and values of a call's parameter options (module docstring).

    Args:
        names: the model's parameter names, in the order it takes them.
        p0: the start: a sequence over ``names``, a dict by name (the others start at
            curve_fit's default), or ``None``.
        bounds: ``(lb, ub)`` over ``names`` or ``{name: (lo, hi)}``.
        fixed: ``{name: value}``.
        expr: ``{name: "expression" or callable}``.
        constraints: a string or a list of ``"lhs < rhs"`` strings.
    """
    names = tuple(names)
    fixed = dict(fixed or {})
    unknown = [k for k in fixed if k not in names]
    if unknown:
        raise ValueError(f"fixed names {unknown}, which the model does not take; its "
                         f"parameters are {list(names)}")
    lower, upper = _bounds_by_name((-np.inf, np.inf) if bounds is None else bounds, names)
    start = _by_name(p0, names, "p0", None)
    for k in names:
        if start[k] is None:
            start[k] = _default_start(lower[k], upper[k])
    for k, v in fixed.items():
        if not isinstance(v, (numbers.Real, np.ndarray, np.generic, jax.Array)) or \
                not np.isfinite(float(v)):
            raise ValueError(f"fixed value of {k!r} must be a finite number, got {v!r}")
        if not lower[k] <= float(v) <= upper[k]:
            raise ValueError(f"fixed value of {k!r} ({float(v)}) is outside its bounds "
                             f"[{lower[k]}, {upper[k]}]")
        start[k] = float(v)
    spec = parameter_structure(names, lower, upper, start, expr=expr,
                               constraints=constraints, fixed=tuple(fixed))
    free = [k for k in spec.free if k in start]
    values, slack = dict(start), {}
    for k, rule in spec.tied:
        if isinstance(rule, Slack):
            other = float(np.asarray(rule.other(values)))
            s0 = rule.sign * (start[k] - other)
            if s0 < 0:
                raise ValueError(f"p0 breaks the constraint {rule.text} ({k} = {start[k]}, "
                                 f"the other side {other}): start inside it")
            slack[rule.slack] = float(slack_start(s0, start[k]))
            values[k] = other + rule.sign * slack[rule.slack]
        else:
            values[k] = float(np.asarray(rule(values)))
    q0 = [start[k] for k in free] + [slack[k] for k in spec.free[len(free):]]
    qlo = [lower[k] for k in free] + [0.0] * len(slack)
    qhi = [upper[k] for k in free] + [np.inf] * len(slack)
    p_lower = np.array([lower[k] for k in names])
    p_upper = np.array([upper[k] for k in names])
    return spec, ParameterValues(np.array([float(fixed[k]) for k in spec.fixed]),
                                 np.array(q0, np.float64), np.array(qlo), np.array(qhi),
                                 p_lower, p_upper)


def _describe(rule) -> str:
    if isinstance(rule, Expression):
        return f"= {rule.text}"
    if isinstance(rule, Slack):
        return f"constrained: {rule.text}"
    return f"= {getattr(rule, '__name__', 'callable')}(params)"


@functools.lru_cache(maxsize=128)
def _reduced(model: Callable, spec: ParameterSpec, fixed_bytes: bytes, nfixed: int):
    fixed_values = np.frombuffer(fixed_bytes, np.float64, nfixed).copy()

    def reduced(x, *q):
        p = spec.expand(jnp.stack([jnp.asarray(v) for v in q]) if q else jnp.zeros(0),
                        fixed_values)
        return model(x, *[p[i] for i in range(len(spec.names))])

    from .._user_fn import named_like

    return named_like(reduced, model, [re.sub(r"\W", "_", n) for n in spec.free])


def reduced_model(model: Callable, spec: ParameterSpec, fixed_values) -> Callable:
    """``g(x, *q) = model(x, *expand(q))``: one stable function per model, structure and
    fixed values (the fixed values are captured arrays, so the compiled program of a
    structure serves every value)."""
    fixed_values = np.ascontiguousarray(fixed_values, np.float64)
    try:
        return _reduced(model, spec, fixed_values.tobytes(), fixed_values.size)
    except TypeError:   # an unhashable model or rule
        return _reduced.__wrapped__(model, spec, fixed_values.tobytes(), fixed_values.size)


def propagate(spec: ParameterSpec, q, fixed_values, cov_q) -> tuple[Any, Any, Any]:
    """``(p, C_p, T)``: the full parameters, their covariance ``T C_q T^T`` and
    ``T = dp/dq``. A parameter that reads a free coordinate of infinite variance gets
    ``inf`` rows and columns; a fixed one zeros. Float64 NumPy for concrete inputs;
    traceable (``jit``/``vmap``/``grad`` through ``q`` and ``cov_q``)."""
    from .._tracing import is_concrete

    concrete = is_concrete((q, cov_q))
    xnp = np if concrete else jnp
    fv = np.asarray(fixed_values, np.float64)
    qj = jnp.asarray(q, jnp.float64 if concrete else jnp.result_type(q))
    p = spec.expand(qj, fv)
    T = jax.jacfwd(lambda v: spec.expand(v, fv))(qj).reshape(len(spec.names), -1)
    C = xnp.asarray(cov_q)
    if concrete:
        p, T, C = (np.asarray(a, np.float64) for a in (p, T, C))
    bad_q = ~xnp.isfinite(xnp.diag(C))
    P = T @ xnp.where(xnp.isfinite(C), C, 0.0) @ T.T
    bad_p = (xnp.abs(T) @ bad_q.astype(T.dtype)) > 0
    moves = xnp.any(T != 0, axis=1)
    inf = (bad_p[:, None] & moves[None, :]) | (moves[:, None] & bad_p[None, :])
    return p, xnp.where(inf, xnp.inf, P), T


def model_names(model, n: int | None) -> tuple:
    """The names of ``model``'s fit parameters (its signature, as
    :func:`adaptprec._user_fn.fit_parameters`), else ``p0, p1, ...`` for ``n`` of them."""
    from .._user_fn import fit_parameters

    names = fit_parameters(model)
    if names:
        return names
    if n is None:
        raise ValueError("fixed=, expr= and constraints= name the model's parameters, but "
                         "its signature does not name them (*params): give p0 so that "
                         "they can be called p0, p1, ...")
    return tuple(f"p{i}" for i in range(n))


def curve_fit_free(curve_fit: Callable, f, xdata, ydata, p0, sigma, absolute_sigma,
                   check_finite, bounds, method, jac, full_output, nan_policy, kwargs,
                   **options):
    """:func:`adaptprec.curve_fit` with parameter options: the fit of the reduced model on
    the free coordinates, ``popt``/``pcov`` over every parameter (``pcov`` propagated,
    zero rows for fixed parameters). ``infodict["result"]`` is the free coordinates'
    solve; ``infodict["free"]`` names them."""
    if callable(jac):
        raise ValueError("jac= (a callable) cannot be combined with fixed=, expr= or "
                         "constraints=: the Jacobian of the free coordinates comes from "
                         "autodiff (leave jac=None)")
    n = None if p0 is None or isinstance(p0, dict) else int(np.size(p0))
    spec, values = parameter_spec(model_names(f, n), p0=p0, bounds=bounds, **options)
    g = reduced_model(f, spec, values.fixed)
    out = curve_fit(g, xdata, ydata, values.q0, sigma, absolute_sigma, check_finite,
                    (values.lower, values.upper), method, jac, full_output=full_output,
                    nan_policy=nan_policy, **kwargs)
    q, cov_q = out[0], out[1]
    p, P, _ = propagate(spec, q, values.fixed, cov_q)
    if not full_output:
        return p, P
    info = dict(out[2], free=spec.free)
    return (p, P, info, *out[3:])
