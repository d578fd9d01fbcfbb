"""Mixed-precision policies: which dtype parameters, computation and outputs use.

A :class:`Policy` is jmp's three-dtype policy (param, compute, output), parsed with jmp's
grammar and usable as a static value under ``jit``. :func:`cast_floating` casts only the
floating leaves of a pytree (float64 included) and leaves ints, bools, complex numbers and
non-array leaves alone. :func:`policy` is a thread-local, nestable context that sets the
:func:`current_policy` (default: float32 everywhere).

Grammar (jmp's, plus whitespace tolerance):

* a single dtype alias, e.g. ``"bf16"``: param = compute = output;
* comma-separated ``key=dtype`` pairs, keys ``p``/``params``, ``c``/``compute``,
  ``o``/``output``. Defaults: params float32, compute follows params, output follows
  compute. ``"c=bf16"`` is ``p=f32,c=bf16,o=bf16``.

Example:
    >>> import jax.numpy as jnp
    >>> import adaptprec as ap
    >>> pol = ap.Policy.parse("p=f32,c=bf16,o=f32")
    >>> str(pol)
    'p=f32,c=bf16,o=f32'
    >>> tree = {"w": jnp.ones(2), "step": jnp.array(3, jnp.int32)}
    >>> out = pol.cast_to_compute(tree)
    >>> out["w"].dtype.name, out["step"].dtype.name
    ('bfloat16', 'int32')
    >>> with ap.policy("c=bf16"):
    ...     ap.cast_floating(tree, "compute")["w"].dtype.name
    'bfloat16'
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import threading
from collections.abc import Iterator
from typing import Any, TypeVar, Union

import jax
import numpy as np

from .precision import DTypeLike, canonical_dtype, dtype_name

__all__ = [
    "Policy",
    "SemanticDType",
    "DTypeish",
    "cast_floating",
    "policy",
    "current_policy",
    "is_jmp_spec",
]

T = TypeVar("T")

_KEYS = {
    "p": "param",
    "params": "param",
    "param": "param",
    "c": "compute",
    "compute": "compute",
    "o": "output",
    "output": "output",
}


#: What an error says when a string that is not a jmp policy reaches one: where the
#: other vocabulary (autocast's op-level policies) goes.
_OTHER_KIND = ("autocast presets and policy strings ('auto_mixed_bf16', 'always_f32', "
               "'auto_mixed, exp=f32') are op-level policies, not jmp policies: pass them "
               "as precision= of ap.train_step / ap.mixed_value_and_grad, or as the "
               "policy of ap.autocast(fn, policy)")


def is_jmp_spec(spec: Any) -> bool:
    """Whether ``spec`` is written in jmp's policy grammar: a :class:`Policy`, a floating
    dtype alias, or ``key=dtype`` pairs whose keys are all jmp's (p, c, o and their long
    forms). The values are not checked.

    Example:
        >>> from adaptprec._policy import is_jmp_spec
        >>> is_jmp_spec("p=f32,c=bf16,o=f32"), is_jmp_spec("bf16"), is_jmp_spec("auto_mixed")
        (True, True, False)
    """
    if isinstance(spec, Policy):
        return True
    if not isinstance(spec, str) or not spec.strip():
        return False
    if "=" not in spec:
        try:
            canonical_dtype(spec, check_x64=False)
        except ValueError:
            return False
        return True
    keys = [part.split("=", 1)[0].strip().lower() for part in spec.split(",")]
    return all(k in _KEYS for k in keys)


@jax.tree_util.register_static
@dataclasses.dataclass(frozen=True)
class Policy:
    """Dtypes for parameters, computation and outputs (jmp-compatible).

    Frozen and hashable; registered as a *static* pytree node, so passing a policy
    through ``jit`` makes it part of the compiled signature rather than a traced value.
    ``param_dtype``/``compute_dtype``/``output_dtype`` are jmp-style aliases.

    Example:
        >>> import adaptprec as ap
        >>> ap.Policy.parse("c=bf16")
        Policy(param=float32, compute=bfloat16, output=bfloat16)
        >>> ap.Policy("f32", "f16", "f32").compute.name
        'float16'
        >>> ap.Policy(param_dtype="f32", compute_dtype="bf16", output_dtype="f32")  # jmp's
        Policy(param=float32, compute=bfloat16, output=float32)
    """

    param: np.dtype
    compute: np.dtype
    output: np.dtype

    def __init__(self, param: DTypeLike = "f32", compute: DTypeLike | None = None,
                 output: DTypeLike | None = None, *, param_dtype: DTypeLike | None = None,
                 compute_dtype: DTypeLike | None = None,
                 output_dtype: DTypeLike | None = None):
        # jmp's keyword names (jmp.Policy(param_dtype=..., ...)); given, they win, so
        # dataclasses.replace(policy, compute_dtype=...) works as it does on jmp's policy
        param = param if param_dtype is None else param_dtype
        compute = compute if compute_dtype is None else compute_dtype
        output = output if output_dtype is None else output_dtype
        param_d = canonical_dtype(param)
        compute_d = param_d if compute is None else canonical_dtype(compute)
        output_d = compute_d if output is None else canonical_dtype(output)
        object.__setattr__(self, "param", param_d)
        object.__setattr__(self, "compute", compute_d)
        object.__setattr__(self, "output", output_d)

    @classmethod
    def parse(cls, spec: str | Policy) -> Policy:
        """Parse jmp's policy grammar (see module docstring); ``ValueError`` on bad input."""
        if isinstance(spec, Policy):
            return spec
        if not isinstance(spec, str):
            raise ValueError(
                f"a policy is a string such as 'p=f32,c=bf16,o=f32' or 'bf16', or a Policy; "
                f"got {spec!r}"
            )
        if not spec.strip():
            raise ValueError(
                "empty policy string; expected a dtype alias such as 'f32' or key=dtype "
                "pairs such as 'p=f32,c=bf16,o=f32' (keys: p/params, c/compute, o/output)"
            )
        if "=" not in spec:
            try:
                d = canonical_dtype(spec)
            except ValueError as exc:
                if is_jmp_spec(spec):   # an alias that cannot be used here (f64, x64 off)
                    raise
                raise ValueError(f"{spec!r} is not a jmp policy (a dtype alias such as "
                                 f"'bf16', or 'p=f32,c=bf16,o=f32'); {_OTHER_KIND}. As a "
                                 f"dtype: {exc}") from None
            return cls(d, d, d)
        found: dict[str, np.dtype] = {}
        for part in spec.split(","):
            if part.count("=") != 1:
                raise ValueError(
                    f"cannot parse {part.strip()!r} in policy {spec!r}: expected key=dtype "
                    "with keys p/params, c/compute, o/output, e.g. 'p=f32,c=bf16,o=f32'; "
                    f"{_OTHER_KIND}"
                )
            key, value = (s.strip() for s in part.split("="))
            field = _KEYS.get(key.lower())
            if field is None:
                raise ValueError(
                    f"unknown key {key!r} in policy {spec!r}; accepted keys are p, params, "
                    f"c, compute, o, output; {_OTHER_KIND}"
                )
            if field in found:
                raise ValueError(
                    f"key {key!r} sets the {field} dtype a second time in policy {spec!r}; "
                    "give each of params, compute and output at most once"
                )
            found[field] = canonical_dtype(value)
        return cls(found.get("param", "f32"), found.get("compute"), found.get("output"))

    def __str__(self) -> str:
        return (f"p={dtype_name(self.param)},c={dtype_name(self.compute)},"
                f"o={dtype_name(self.output)}")

    def __repr__(self) -> str:
        return (f"Policy(param={self.param.name}, compute={self.compute.name}, "
                f"output={self.output.name})")

    # jmp spellings
    @property
    def param_dtype(self) -> np.dtype:
        return self.param

    @property
    def compute_dtype(self) -> np.dtype:
        return self.compute

    @property
    def output_dtype(self) -> np.dtype:
        return self.output

    def cast_to_param(self, tree: T) -> T:
        """Cast floating leaves of ``tree`` to the param dtype."""
        return _cast_floating_to(tree, self.param)

    def cast_to_compute(self, tree: T) -> T:
        """Cast floating leaves of ``tree`` to the compute dtype."""
        return _cast_floating_to(tree, self.compute)

    def cast_to_output(self, tree: T) -> T:
        """Cast floating leaves of ``tree`` to the output dtype."""
        return _cast_floating_to(tree, self.output)

    def with_output_dtype(self, output: DTypeLike) -> Policy:
        """A copy with another output dtype."""
        return Policy(self.param, self.compute, output)

    def replace(self, **changes: DTypeLike) -> Policy:
        """A copy with some of ``param``, ``compute``, ``output`` changed."""
        kw = {"param": self.param, "compute": self.compute, "output": self.output}
        unknown = set(changes) - set(kw)
        if unknown:
            raise ValueError(f"unknown policy fields {sorted(unknown)}; use param, compute, "
                             "output")
        kw.update(changes)
        return Policy(**kw)


class SemanticDType(enum.Enum):
    """A dtype named by its role in the current policy: param, compute or output.

    Example:
        >>> import adaptprec as ap
        >>> ap.SemanticDType.COMPUTE.to_dtype(ap.Policy.parse("c=bf16")).name
        'bfloat16'
    """

    PARAM = "param"
    COMPUTE = "compute"
    OUTPUT = "output"

    def to_dtype(self, pol: Policy | str | None = None) -> np.dtype:
        pol = current_policy() if pol is None else Policy.parse(pol)
        return getattr(pol, self.value)


DTypeish = Union[DTypeLike, SemanticDType]
"""A dtype alias/dtype, a :class:`SemanticDType`, or one of the strings
``"param"``/``"compute"``/``"output"`` (resolved against a policy)."""

_SEMANTIC_NAMES = {"param": SemanticDType.PARAM, "params": SemanticDType.PARAM,
                   "compute": SemanticDType.COMPUTE, "output": SemanticDType.OUTPUT}


def _resolve(dtypeish: DTypeish, pol: Policy | str | None) -> np.dtype:
    if isinstance(dtypeish, SemanticDType):
        return dtypeish.to_dtype(pol)
    if isinstance(dtypeish, str) and dtypeish.strip().lower() in _SEMANTIC_NAMES:
        return _SEMANTIC_NAMES[dtypeish.strip().lower()].to_dtype(pol)
    try:
        return canonical_dtype(dtypeish)
    except ValueError as exc:
        if not isinstance(dtypeish, str) or is_jmp_spec(dtypeish):
            raise
        raise ValueError(f"{exc}; {_OTHER_KIND}") from None


def _is_floating_array(x: Any) -> bool:
    dtype = getattr(x, "dtype", None)
    if dtype is None or not hasattr(x, "astype") or not hasattr(x, "shape"):
        return False
    try:
        return np.issubdtype(np.dtype(dtype), np.floating) or np.dtype(dtype).name in (
            "bfloat16", "float8_e4m3fn", "float8_e5m2")
    except TypeError:
        return False


def _cast_floating_to(tree: T, dtype: np.dtype) -> T:
    def cast(x):
        if _is_floating_array(x) and x.dtype != dtype:
            return x.astype(dtype)
        return x

    return jax.tree_util.tree_map(cast, tree)


def cast_floating(tree: T, dtypeish: DTypeish, policy: Policy | str | None = None) -> T:
    """Cast the floating array leaves of ``tree`` to ``dtypeish``.

    ``dtypeish`` is a dtype or alias, a :class:`SemanticDType`, or ``"param"``,
    ``"compute"``, ``"output"`` resolved against ``policy`` (default: the current one).
    Integer, boolean and complex arrays, Python scalars and other leaves are returned
    unchanged. Works under ``jit`` and ``grad`` (casts are differentiable).

    Example:
        >>> import jax.numpy as jnp
        >>> import adaptprec as ap
        >>> tree = (jnp.zeros(2, jnp.float32), jnp.arange(2, dtype=jnp.int32), 1.5)
        >>> [getattr(x, "dtype", type(x).__name__) for x in ap.cast_floating(tree, "bf16")]
        [dtype(bfloat16), dtype('int32'), 'float']
    """
    return _cast_floating_to(tree, _resolve(dtypeish, policy))


class _PolicyStack(threading.local):
    def __init__(self):
        self.stack: list[Policy] = []


_STACK = _PolicyStack()
_DEFAULT = None


def current_policy() -> Policy:
    """The innermost active :func:`policy` in this thread; float32 everywhere if none.

    Example:
        >>> import adaptprec as ap
        >>> str(ap.current_policy())
        'p=f32,c=f32,o=f32'
    """
    global _DEFAULT
    if _STACK.stack:
        return _STACK.stack[-1]
    if _DEFAULT is None:
        _DEFAULT = Policy("f32", "f32", "f32")
    return _DEFAULT


@contextlib.contextmanager
def policy(spec: str | Policy) -> Iterator[Policy]:
    """Set the current policy for this thread inside a ``with`` block; nestable.

    The policy is read when a function is traced, so it is static under ``jit``: a
    function jitted under one policy keeps the dtypes it was traced with.

    Example:
        >>> import adaptprec as ap
        >>> with ap.policy("p=f32,c=bf16,o=f32") as pol:
        ...     with ap.policy("f16"):
        ...         inner = str(ap.current_policy())
        ...     outer = str(ap.current_policy())
        >>> inner, outer
        ('p=f16,c=f16,o=f16', 'p=f32,c=bf16,o=f32')
    """
    pol = Policy.parse(spec)
    _STACK.stack.append(pol)
    try:
        yield pol
    finally:
        _STACK.stack.pop()
