"""Profile a function across precision configurations: time, memory and accuracy.

:func:`profile` compiles and runs ``fn(*args)`` once per configuration and measures what a
user needs to choose a ladder or policy from evidence:

* ``compile_s``: ``jax.jit(...).lower(...).compile()`` wall time;
* ``time_s``: median over ``repeats`` of the blocked run time of the compiled executable
  (each repeat runs enough calls to last ``min_time``, and is divided by that number);
* ``memory_bytes``: peak memory from the compiled executable's memory analysis
  (``peak_memory_in_bytes``, which on XLA:CPU counts arguments, outputs and temporaries),
  and ``arg_bytes``, the bytes of the arguments as passed at that configuration;
* ``rel_error``: normwise relative error ``||y - ref||_2 / ||ref||_2`` over all floating
  output leaves against a float64 reference; ``max_rel_error``: the largest componentwise
  relative error ``|y_i - ref_i| / |ref_i|`` (a component whose reference is 0 is compared
  against the largest ``|ref|`` instead); ``digits = -log10(rel_error)``, clipped to
  ``[0, 15.95]`` (float64's unit roundoff); integer/bool outputs add ``mismatch``, the
  fraction of entries that differ from the reference (a column of the table), and any
  mismatch makes ``digits`` 0;
* ``est_digits``: the accuracy guard's estimate of the significant digits at the rung
  reached (adaptive configurations whose guards include an ``accuracy`` guard), and
  ``guards``, every guard's value there;
* ``rung``: the precision that produced the answer.

Configurations (``configs=[...]``):

``"f32"``, ``jnp.bfloat16``...         a dtype: floating arguments are cast to it and
                                         ``jit(fn)`` runs on them.
``"bf16,f32,f64"``, a ``Ladder``        ``adaptive(fn, ladder=...)`` with its default
                                         (finite) guards.
``"auto_mixed_bf16"``, a policy         ``autocast(fn, policy)`` (any
                                         :class:`~adaptprec.PrecisionPolicy` or its string).
``"p=f32,c=bf16,o=f32"``, a jmp         ``autocast(fn, policy)``: as everywhere autocast
``Policy``                               takes a jmp policy, the compute dtype throughout
                                         (dots and sums accumulating in float32), outputs
                                         in ``o``.
``"bf16,f32,f64;rtol=1e-3"``,           ``adaptive(fn, ladder=..., rtol=...)`` (the
``"rtol=1e-3"``, ``{"ladder": ...,``    accuracy guard; a bare ``rtol=`` uses the ladder
``"rtol": 1e-3}``                        ``bf16,f32,f64``). A dict's other keys are passed
                                         to :func:`~adaptprec.adaptive` too.

The float64 reference, and every configuration that computes in float64, run inside JAX's
thread-local ``jax.enable_x64(True)`` scope, so profiling works with ``jax_enable_x64``
off (the one x64 rule of every entry point: :mod:`adaptprec._x64_rule`). Pass
``reference=`` (a pytree like ``fn``'s output) to compare against known values instead.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import math
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import numpy as np

from ._policy import _is_floating_array
from ._user_fn import returns_arrays
from ._tracing import is_eager
from ._x64_rule import traced_x64_error
from ._x64_scope import float64_scope
from .precision import Ladder, canonical_dtype, dtype_name, x64_enabled

__all__ = ["Profile", "ProfileRow", "profile"]

_MAX_DIGITS = -math.log10(2.0 ** -53)      # float64's unit roundoff: 15.95 digits
_DEFAULT_LADDER = "bf16,f32,f64"


def _is_array(x) -> bool:
    return isinstance(x, (jax.Array, np.ndarray, np.generic))


# ----------------------------------------------------------------------------- configs

@dataclasses.dataclass(frozen=True)
class _Config:
    name: str
    kind: str                  # "dtype" | "ladder" | "autocast" | "adaptive"
    value: Any                 # np.dtype | Ladder | PrecisionPolicy | dict of adaptive kwargs


def _parse_adaptive_string(spec: str) -> dict:
    kw: dict = {}
    ladder = None
    for part in (p.strip() for p in spec.split(";")):
        if not part:
            continue
        if "=" in part and part.split("=", 1)[0].strip() == "rtol":
            value = part.split("=", 1)[1].strip()
            try:
                kw["rtol"] = float(value)
            except ValueError:
                raise ValueError(f"profile config {spec!r}: rtol must be a number, got "
                                 f"{value!r}") from None
        elif "=" in part:
            raise ValueError(f"profile config {spec!r}: unknown setting {part!r}; only "
                             "'rtol=...' is accepted after the ladder, e.g. "
                             "'bf16,f32,f64;rtol=1e-3'")
        elif ladder is None:
            ladder = part
        else:
            raise ValueError(f"profile config {spec!r} names two ladders")
    kw["ladder"] = Ladder.parse(ladder or _DEFAULT_LADDER, check_x64=False)
    return kw


def _config(spec: Any) -> _Config:
    from ._autocast import PrecisionPolicy
    from ._autocast.vocabulary import precision_policy
    from ._policy import Policy, is_jmp_spec

    if isinstance(spec, PrecisionPolicy):
        return _Config(str(spec), "autocast", spec)
    if isinstance(spec, Policy):        # a jmp policy: autocast's reading of it
        return _Config(str(spec), "autocast", precision_policy(spec, "configs"))
    if isinstance(spec, Ladder):
        return _Config(str(spec), "ladder", spec)
    if isinstance(spec, Mapping):
        kw = dict(spec)
        kw["ladder"] = Ladder.parse(kw.get("ladder", _DEFAULT_LADDER), check_x64=False)
        extra = ",".join(f"{k}={v}" for k, v in kw.items() if k != "ladder")
        return _Config(f"{kw['ladder']};{extra}" if extra else str(kw["ladder"]),
                       "adaptive" if "rtol" in kw else "ladder", kw)
    if isinstance(spec, str):
        s = spec.strip()
        if "=" in s and ";" not in s and is_jmp_spec(s):   # "p=f32,c=bf16,o=f32"
            return _Config(spec, "autocast", precision_policy(s, "configs"))
        if ";" in s or s.startswith("rtol"):
            return _Config(spec, "adaptive", _parse_adaptive_string(s))
        if "," in s:
            try:
                return _Config(spec, "ladder", Ladder.parse(s, check_x64=False))
            except ValueError:
                pass    # maybe a policy string such as "auto_mixed_bf16,exp=f32"
        else:
            try:
                return _Config(spec, "dtype", canonical_dtype(s, check_x64=False))
            except ValueError:
                pass
        try:
            return _Config(spec, "autocast", PrecisionPolicy.parse(s))
        except ValueError as exc:
            raise ValueError(
                f"profile config {spec!r} is neither a dtype ('f32', 'bf16'...), a ladder "
                "('bf16,f32,f64'), an autocast policy ('auto_mixed_bf16', see "
                "adaptprec.PRESETS), a jmp policy ('p=f32,c=bf16,o=f32') nor an adaptive "
                f"setting ('bf16,f32,f64;rtol=1e-3'): {exc}") from None
    try:
        dt = canonical_dtype(spec, check_x64=False)
    except ValueError:
        raise TypeError(f"profile config {spec!r} ({type(spec).__name__}) is not a dtype, "
                        "ladder, PrecisionPolicy, dict of adaptive settings or string") from None
    return _Config(dtype_name(dt), "dtype", dt)


def _needs_x64(cfg: _Config) -> bool:
    if cfg.kind == "dtype":
        return cfg.value == np.float64
    if cfg.kind == "autocast":
        pol = cfg.value
        return np.float64 in (pol.dtype, pol.accumulate, getattr(pol, "output", None))
    ladder = cfg.value if cfg.kind == "ladder" and isinstance(cfg.value, Ladder) \
        else cfg.value["ladder"]
    return any(d == np.float64 for d in ladder)


# --------------------------------------------------------------------------- the row

@dataclasses.dataclass
class ProfileRow:
    """One configuration's measurements (see :func:`profile` for each field's meaning).

    Example:
        >>> import jax.numpy as jnp
        >>> import adaptprec as ap
        >>> row = ap.profile(jnp.sqrt, jnp.arange(1.0, 65.0), configs=["f32"],
        ...                  repeats=1)["f32"]
        >>> row.rung, row.arg_bytes, 6 < row.digits < 9
        ('f32', 256, True)
    """

    config: str
    kind: str
    rung: str
    compile_s: float
    time_s: float
    times_s: list
    memory_bytes: int | None
    arg_bytes: int
    temp_bytes: int | None
    rel_error: float
    max_rel_error: float
    digits: float
    mismatch: float | None = None
    est_digits: float | None = None
    guards: dict | None = None
    ok: bool | None = None
    report: str | None = None

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d.pop("config")
        return d


def _fmt_time(s: float) -> str:
    if s >= 1.0:
        return f"{s:.2f} s"
    if s >= 1e-3:
        return f"{s * 1e3:.2f} ms"
    return f"{s * 1e6:.1f} us"


def _fmt_bytes(b: int | None) -> str:
    if b is None:
        return "?"
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= size:
            return f"{b / size:.1f} {unit}"
    return f"{b} B"


def _fmt_num(x: float | None, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


@dataclasses.dataclass
class Profile:
    """What :func:`profile` measured: one :class:`ProfileRow` per configuration.

    ``str(profile)`` is a table; :meth:`to_dict` gives ``{config: {"time_s", "compile_s",
    "memory_bytes", "rel_error", "digits", "rung", ...}}`` keyed by the configurations as
    given; :meth:`plot` draws time against digits (a Pareto chart; needs the ``plot``
    extra).

    Example:
        >>> import jax.numpy as jnp
        >>> import adaptprec as ap
        >>> prof = ap.profile(jnp.exp, jnp.array([1.0, 100.0]), configs=["f32", "f32,f64"],
        ...                   repeats=1)
        >>> prof["f32"].digits, prof["f32,f64"].rung     # exp(100) overflows float32
        (0.0, 'f64')
        >>> prof.pareto()[-1]      # the front, fastest first, ends with the most accurate
        'f32,f64'
        >>> prof.table().splitlines()[1].split()[:5]
        ['config', 'rung', 'time', 'compile', 'memory']
    """

    function: str
    reference: str
    rows: list

    def __getitem__(self, config: str) -> ProfileRow:
        for row in self.rows:
            if row.config == config:
                return row
        raise KeyError(f"no configuration {config!r} in this profile; it has "
                       f"{[r.config for r in self.rows]}")

    def to_dict(self) -> dict:
        """``{config: {field: value}}``, keyed by the configuration strings as given."""
        return {row.config: row.to_dict() for row in self.rows}

    def pareto(self) -> list[str]:
        """Configurations no other one beats on both time and digits (fastest first)."""
        front = []
        for r in self.rows:
            dominated = any(
                o is not r and o.time_s <= r.time_s and o.digits >= r.digits
                and (o.time_s < r.time_s or o.digits > r.digits) for o in self.rows)
            if not dominated:
                front.append(r)
        return [r.config for r in sorted(front, key=lambda r: r.time_s)]

    def table(self) -> str:
        """The readable table ``str()`` returns."""
        ints = any(r.mismatch is not None for r in self.rows)
        head = ("config", "rung", "time", "compile", "memory", "args", "rel err",
                "max cw err") + (("mismatch",) if ints else ()) + ("digits", "est digits")
        lines = [head]
        for r in self.rows:
            lines.append((r.config, r.rung, _fmt_time(r.time_s), _fmt_time(r.compile_s),
                          _fmt_bytes(r.memory_bytes), _fmt_bytes(r.arg_bytes),
                          f"{r.rel_error:.2e}", f"{r.max_rel_error:.2e}")
                         + ((_fmt_num(r.mismatch, ".2%"),) if ints else ())
                         + (f"{r.digits:.1f}", _fmt_num(r.est_digits, ".1f")))
        widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
        out = [f"profile of {self.function} (reference: {self.reference})"]
        for j, line in enumerate(lines):
            out.append("  ".join(c.ljust(w) if i < 2 else c.rjust(w)
                                 for i, (c, w) in enumerate(zip(line, widths))).rstrip())
            if j == 0:
                out.append("  ".join("-" * w for w in widths))
        notes = [f"  {r.config}: {r.report}" for r in self.rows if r.report]
        if notes:
            out.append("adaptive reports:")
            out.extend(notes)
        return "\n".join(out)

    def __str__(self) -> str:
        return self.table()

    def plot(self, ax=None):
        """A Pareto chart of run time against digits, one point per configuration.

        Returns the matplotlib ``Figure`` (needs ``pip install adaptprec[plot]``).
        """
        from ._plot import plot_profile

        return plot_profile(self, ax=ax)


# ------------------------------------------------------------------------ measuring

def _float64_leaves(tree) -> tuple[list, list]:
    leaves = jax.tree_util.tree_leaves(tree)
    floats, others = [], []
    for x in leaves:
        a = np.asarray(x)
        if np.issubdtype(a.dtype, np.floating) or a.dtype.name == "bfloat16":
            floats.append(a.astype(np.float64).ravel())
        elif np.issubdtype(a.dtype, np.complexfloating):
            floats.append(a.astype(np.complex128).ravel())
        else:
            others.append(a.ravel())
    return floats, others


def _errors(out, ref) -> tuple[float, float, float | None]:
    o_f, o_i = _float64_leaves(out)
    r_f, r_i = _float64_leaves(ref)
    if len(o_f) != len(r_f) or len(o_i) != len(r_i) or any(
            a.shape != b.shape for a, b in zip(o_f + o_i, r_f + r_i)):
        raise ValueError("the output's structure or shapes differ from the reference's; "
                         "fn must return the same pytree at every precision")
    mismatch = None
    if o_i:
        a, b = np.concatenate(o_i), np.concatenate(r_i)
        mismatch = float(np.mean(a != b)) if a.size else 0.0
    if not o_f:
        return 0.0, 0.0, mismatch
    y, r = np.concatenate(o_f), np.concatenate(r_f)
    diff = np.abs(y - r)
    scale = np.linalg.norm(r)
    norm_err = float(np.linalg.norm(y - r) / scale) if scale > 0 else float(
        0.0 if not diff.any() else np.inf)
    big = np.max(np.abs(r)) if r.size else 0.0
    denom = np.where(r != 0, np.abs(r), big)
    with np.errstate(divide="ignore", invalid="ignore"):
        cw = np.where(diff == 0, 0.0, diff / denom)
    max_cw = float(np.max(cw)) if cw.size else 0.0
    if not np.all(np.isfinite(y)):
        norm_err, max_cw = np.inf, np.inf
    return norm_err, max_cw, mismatch


def _digits(rel_error: float, mismatch: float | None = None) -> float:
    # a wrong integer/bool entry (an index, a count, a decision) has no correct digits:
    # the row gets 0, so neither pareto() nor the table prefers it (a bf16 argsort that
    # is mostly wrong has no float error to score it by)
    if not np.isfinite(rel_error) or (mismatch is not None and mismatch > 0):
        return 0.0
    if rel_error <= 0:
        return _MAX_DIGITS
    return float(min(_MAX_DIGITS, max(0.0, -math.log10(rel_error))))


def _block(x):
    return jax.block_until_ready(x)


def _time(compiled, dyn, repeats: int, min_time: float) -> list[float]:
    t0 = time.perf_counter()
    _block(compiled(*dyn))                      # warm-up (first-call allocations)
    one = max(time.perf_counter() - t0, 1e-7)
    number = max(1, min(10_000, math.ceil(min_time / one)))
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(number):
            out = compiled(*dyn)
        _block(out)
        times.append((time.perf_counter() - t0) / number)
    return times


def _memory(compiled) -> tuple[int | None, int | None]:
    try:
        ma = compiled.memory_analysis()
    except Exception:       # some backends do not implement it
        return None, None
    if ma is None:
        return None, None
    temp = int(getattr(ma, "temp_size_in_bytes", 0))
    peak = getattr(ma, "peak_memory_in_bytes", None)
    if not peak:
        peak = (int(ma.argument_size_in_bytes) + int(ma.output_size_in_bytes)
                + temp - int(ma.alias_size_in_bytes))
    return int(peak), temp


class _Args:
    """``args`` split into array leaves (traced) and the rest (static)."""

    def __init__(self, args):
        leaves, self.treedef = jax.tree_util.tree_flatten(args)
        self.pos = [i for i, x in enumerate(leaves) if _is_array(x)]
        self.leaves = leaves
        self.dyn = [leaves[i] for i in self.pos]

    def rebuild(self, dyn):
        full = list(self.leaves)
        for i, x in zip(self.pos, dyn):
            full[i] = x
        return jax.tree_util.tree_unflatten(self.treedef, full)


def _checked(fn: Callable) -> Callable:
    """``fn`` whose output is checked to be arrays: an error names ``fn``, not this
    module's wrapper lambdas."""
    @functools.wraps(fn)
    def checked(*args):
        return returns_arrays(fn, fn(*args), "profiled function")

    return checked


def _program(fn: Callable, cfg: _Config, a: _Args):
    """``(g, dyn, has_report)``: a function of the array leaves and the leaves to pass."""
    from ._autocast import autocast
    from .runtime import adaptive

    dyn = [jax.numpy.asarray(x) for x in a.dyn]
    if cfg.kind == "dtype":
        dyn = [x.astype(cfg.value) if _is_floating_array(x) else x for x in dyn]
        return (lambda *d: fn(*a.rebuild(d))), dyn, False
    if cfg.kind == "autocast":
        g = autocast(fn, cfg.value)
        return (lambda *d: g(*a.rebuild(d))), dyn, False
    if cfg.kind == "ladder" and isinstance(cfg.value, Ladder):
        kw = {"ladder": cfg.value}
    else:
        kw = dict(cfg.value)
    if "rtol" in kw and "rtol" not in inspect.signature(adaptive).parameters:
        raise ValueError(f"profile config {cfg.name!r} asks for rtol=, but this version of "
                         "adaptprec.adaptive has no accuracy guard (rtol); profile a ladder "
                         "without rtol instead")
    af = adaptive(fn, **kw)
    return (lambda *d: af.with_report(*a.rebuild(d))), dyn, True


def _reference(fn: Callable, a: _Args):
    from ._x64_scope import float64_scope

    with float64_scope():
        dyn = [jax.numpy.asarray(x) for x in a.dyn]
        dyn = [x.astype(np.float64) if _is_floating_array(x) else x for x in dyn]
        out = jax.jit(lambda *d: fn(*a.rebuild(d)))(*dyn)
        return jax.tree_util.tree_map(np.asarray, out)


def _report_fields(report) -> dict:
    rung = int(np.asarray(report.rung).max())
    values = np.asarray(report.values)[rung]
    guards = {g: float(v) for g, v in zip(report.guard_names, values)}
    # the accuracy guard's value is its estimate of the significant digits; reports that
    # know guard roles say which guard that is, else it is named "accuracy(...)"
    roles = tuple(getattr(report, "guard_roles", ()) or ())
    acc = [i for i, r in enumerate(roles) if r == "accuracy"] or [
        i for i, g in enumerate(report.guard_names) if g.startswith("accuracy")]
    est = float(values[acc[0]]) if acc else None
    return {"rung": report.rung_names[rung], "guards": guards, "est_digits": est,
            "ok": bool(np.all(np.asarray(report.ok))), "report": report.summary()}


def _profile_one(fn, cfg: _Config, a: _Args, ref, repeats: int, min_time: float):
    if _needs_x64(cfg) and not x64_enabled():
        # the x64 rule (adaptprec._x64_rule): a float64 configuration is compiled, timed
        # and run inside JAX's thread-local x64 scope; under a trace it cannot be
        if not is_eager(a.dyn):
            raise traced_x64_error("profile", "configs", cfg.name,
                                   "float32 configurations (e.g. configs=['bf16', 'f32'])")
        with float64_scope():
            return _profile_one(fn, cfg, a, ref, repeats, min_time)
    g, dyn, has_report = _program(fn, cfg, a)
    t0 = time.perf_counter()
    compiled = jax.jit(g).lower(*dyn).compile()
    compile_s = time.perf_counter() - t0
    times = _time(compiled, dyn, repeats, min_time)
    out = compiled(*dyn)
    fields: dict = {}
    if has_report:
        out, report = out
        fields = _report_fields(report)
    elif cfg.kind == "dtype":
        fields["rung"] = dtype_name(cfg.value)
    else:
        fields["rung"] = f"autocast {dtype_name(cfg.value.dtype)}"
    rel, max_cw, mismatch = _errors(out, ref)
    memory, temp = _memory(compiled)
    arg_bytes = int(sum(x.size * x.dtype.itemsize for x in dyn))
    return ProfileRow(config=cfg.name, kind=cfg.kind, compile_s=compile_s,
                      time_s=statistics.median(times), times_s=times, memory_bytes=memory,
                      arg_bytes=arg_bytes, temp_bytes=temp, rel_error=rel,
                      max_rel_error=max_cw, digits=_digits(rel, mismatch), mismatch=mismatch,
                      **fields)


_DEFAULT_CONFIGS = ("bf16", "f32", "f64", "bf16,f32,f64", "auto_mixed_bf16")


def profile(fn: Callable, *args, configs: Sequence[Any] | None = None,
            repeats: int = 5, min_time: float = 2e-3, reference: Any = None,
            name: str | None = None) -> Profile:
    """Measure ``fn(*args)`` under each precision configuration; returns a :class:`Profile`.

    Args:
        fn: the function; array leaves of ``args`` are traced, other leaves are static
            (bind keyword arguments with ``functools.partial``).
        configs: dtypes (``"f32"``), ladders (``"bf16,f32,f64"``), autocast policies
            (``"auto_mixed_bf16"`` or a :class:`~adaptprec.PrecisionPolicy`), jmp
            policies (``"p=f32,c=bf16,o=f32"``, run under autocast) and adaptive
            settings with ``rtol`` (``"bf16,f32,f64;rtol=1e-3"`` or a dict of
            :func:`~adaptprec.adaptive` keyword arguments). See the module docs.
            Default: ``bf16, f32, f64, bf16,f32,f64, auto_mixed_bf16``. With
            ``jax_enable_x64`` off, the float64 ones are compiled, timed and run inside
            JAX's thread-local x64 scope (:mod:`adaptprec._x64_rule`).
        repeats: timed repeats; ``time_s`` is their median.
        min_time: each repeat runs the compiled function enough times to last this long
            (seconds), for a stable reading on fast kernels.
        reference: the exact answer to compare against (a pytree like ``fn``'s output);
            default: ``fn`` run on float64 inputs in a local ``jax.enable_x64`` scope.
        name: label for the table (default ``fn.__name__``).

    Raises:
        ValueError: an empty or duplicated config list, a config string that is none of
            the above, ``repeats < 1``, a float64 config under a trace with
            ``jax_enable_x64`` off.
        TypeError: ``fn`` is not callable, or a config of an unknown type.

    Example:
        >>> import jax.numpy as jnp
        >>> import adaptprec as ap
        >>> def f(x):
        ...     return jnp.sum(jnp.sin(x) ** 2)
        >>> prof = ap.profile(f, jnp.linspace(0.0, 1.0, 1000), configs=["bf16", "f32"],
        ...                   repeats=2)
        >>> d = prof.to_dict()
        >>> list(d), d["f32"]["rung"], d["f32"]["digits"] > d["bf16"]["digits"]
        (['bf16', 'f32'], 'f32', True)
        >>> sorted(k for k in d["f32"] if k in ("time_s", "compile_s", "memory_bytes"))
        ['compile_s', 'memory_bytes', 'time_s']
    """
    if not callable(fn):
        raise TypeError(f"profile needs a callable, got {fn!r}")
    if configs is None:
        configs = _DEFAULT_CONFIGS
    if isinstance(configs, (str, Mapping)) or not isinstance(configs, Sequence):
        configs = [configs]
    cfgs = [_config(c) for c in configs]
    if not cfgs:
        raise ValueError("configs is empty; pass e.g. configs=['f32', 'bf16,f32,f64']")
    names = [c.name for c in cfgs]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ValueError(f"duplicate profile configs {dup}")
    if int(repeats) < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats!r}")
    a = _Args(args)
    label = name or getattr(fn, "__name__", type(fn).__name__)
    fn = _checked(fn)
    if reference is None:
        ref, ref_name = _reference(fn, a), "f64"
    else:
        ref, ref_name = jax.tree_util.tree_map(np.asarray, reference), "given"
    rows = [_profile_one(fn, c, a, ref, int(repeats), float(min_time)) for c in cfgs]
    return Profile(function=label, reference=ref_name, rows=rows)
