"""Mixed-precision training steps: policy casts, loss scaling, finiteness, skipped updates.

Three pieces, usable separately:

* :func:`mixed_value_and_grad`: ``jax.value_and_grad`` for mixed precision. It casts the
  parameters and the other arguments to the :class:`~adaptprec.Policy` compute dtype (the
  parameters themselves stay in their own dtype: gradients flow back through the cast and
  come out in the parameter dtype), optionally runs the loss under
  :func:`~adaptprec.autocast` with per-scope rules, multiplies the loss by the loss scale
  (in float32) before differentiating, unscales the gradients, checks that they are finite
  and adjusts the loss scale. It returns a :class:`MixedGrads`.
* :func:`skip_nonfinite`: an optax ``GradientTransformation`` wrapper. When the gradients
  it receives are not all finite, it returns zero updates and leaves the inner optimizer's
  state untouched (Adam's moments are not poisoned); it owns the (dynamic) loss scale,
  adjusts it every step and counts the skipped steps.
* :func:`train_step`: ties both together: ``step(params, opt_state, *args) ->
  (params, opt_state, StepInfo)``, reading the current loss scale from the optimizer state.

optax is an optional dependency (``pip install adaptprec[train]``), imported only by
:func:`skip_nonfinite` and :func:`train_step`.

Example:
    >>> import jax, jax.numpy as jnp
    >>> import adaptprec as ap
    >>> def loss(w, x):
    ...     return jnp.mean((x @ w - 1.0) ** 2)
    >>> vg = ap.mixed_value_and_grad(loss, "p=f32,c=f16,o=f32")
    >>> w, x = jnp.full((3,), 0.1, jnp.float32), jnp.ones((4, 3), jnp.float32)
    >>> out = jax.jit(vg)(w, x, loss_scale=ap.DynamicLossScale(2.0 ** 10))
    >>> out.value.dtype.name, out.grads.dtype.name, bool(out.finite)
    ('float32', 'float32', True)
    >>> bool(jnp.allclose(out.grads, jax.grad(loss)(w, x), rtol=1e-2))
    True
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ._autocast.vocabulary import training_policies
from ._policy import Policy
from .loss_scale import (
    DynamicLossScale,
    NoOpLossScale,
    StaticLossScale,
    all_finite,
    select_tree,
)

__all__ = [
    "MixedGrads",
    "StepInfo",
    "SkipNonFiniteState",
    "mixed_value_and_grad",
    "skip_nonfinite",
    "train_step",
    "loss_scale_of",
]

_LOSS_SCALES = (NoOpLossScale, StaticLossScale, DynamicLossScale)


class MixedGrads(NamedTuple):
    """What :func:`mixed_value_and_grad` returns; what an optimizer update needs.

    Attributes:
        value: the unscaled loss in the policy's output dtype (``(loss, aux)`` with
            ``has_aux``).
        grads: unscaled gradients, same structure and dtypes as the parameters.
        finite: scalar bool, every gradient leaf is free of NaN/Inf.
        loss_scale: the loss scale adjusted for the next step (``adjust(finite)``).
    """

    value: Any
    grads: Any
    finite: jax.Array
    loss_scale: Any


class StepInfo(NamedTuple):
    """Per-step diagnostics of :func:`train_step`.

    Attributes:
        loss: the unscaled loss (``(loss, aux)`` with ``has_aux``).
        finite: scalar bool; ``False`` means the update was skipped.
        loss_scale: the loss scale after this step (float32 scalar).
        skipped: number of skipped steps so far (int32).
    """

    loss: Any
    finite: jax.Array
    loss_scale: jax.Array
    skipped: jax.Array


class SkipNonFiniteState(NamedTuple):
    """Optimizer state of :func:`skip_nonfinite`.

    Attributes:
        inner: the wrapped transformation's state.
        loss_scale: the loss scale (``NoOpLossScale``/``StaticLossScale``/
            ``DynamicLossScale``), adjusted every step.
        skipped: number of updates skipped because the gradients were not finite.
        steps: number of updates seen.
    """

    inner: Any
    loss_scale: Any
    skipped: jax.Array
    steps: jax.Array


def _check_loss_scale(ls: Any, where: str) -> None:
    if not isinstance(ls, _LOSS_SCALES):
        raise TypeError(f"{where}: loss_scale must be an adaptprec loss scale "
                        f"(ap.NoOpLossScale(), ap.StaticLossScale(s), "
                        f"ap.DynamicLossScale(s)); got {ls!r} of type {type(ls).__name__}")


def mixed_value_and_grad(loss_fn: Callable, policy: Policy | str = "p=f32,c=bf16,o=f32",
                         *, has_aux: bool = False, precision: Any = None,
                         scopes: dict | None = None) -> Callable:
    """``jax.value_and_grad`` with a precision policy, loss scaling and a finite check.

    Args:
        loss_fn: ``loss_fn(params, *args, **kwargs)`` returning a scalar loss (or
            ``(loss, aux)`` with ``has_aux``). Gradients are taken w.r.t. the floating
            array leaves of ``params``; other leaves (ints, Python values, an Equinox
            module's functions) get ``None``, as with ``eqx.filter_grad``.
        policy: a :class:`~adaptprec.Policy` or its string (``"p=f32,c=bf16,o=f32"``,
            ``"p=f32,c=f16,o=f32"``): floating leaves of ``params`` and of the other
            arguments are cast to ``compute`` (ints/bools untouched); the loss (and aux)
            are cast to ``output``; gradients come back in each parameter's own dtype.
            An autocast policy (``"auto_mixed_bf16"``, an
            :class:`~adaptprec.PrecisionPolicy`) here means ``precision=`` it with
            float32 parameters; giving it and ``precision=`` is an error.
        has_aux: as in ``jax.value_and_grad``.
        precision, scopes: if either is given, the loss runs under
            ``ap.autocast(loss_fn, precision, scopes=scopes)`` (``precision`` defaults to
            ``"always_f32"`` when only ``scopes`` is given): per-op and per-region
            precision on top of the policy's casts, e.g. early layers in bfloat16.

    Returns:
        ``f(params, *args, loss_scale=ap.NoOpLossScale(), **kwargs) -> MixedGrads``:
        the loss is multiplied by ``loss_scale`` (in float32) before differentiation and
        the gradients divided by it afterwards; ``finite`` says whether every gradient is
        finite and ``loss_scale`` is the scale adjusted for the next step. Works under
        ``jit`` and ``vmap``.

    Example:
        >>> import jax.numpy as jnp
        >>> import adaptprec as ap
        >>> vg = ap.mixed_value_and_grad(lambda w, x: jnp.sum((w * x) ** 2), "c=f16")
        >>> w, x = jnp.ones(2, jnp.float32), jnp.array([100.0, 1.0], jnp.float32)
        >>> out = vg(w, x, loss_scale=ap.StaticLossScale(2.0 ** 8))
        >>> bool(out.finite), out.grads.dtype.name   # 2e4 * 256 overflows float16
        (False, 'float32')
        >>> out = vg(w, x, loss_scale=ap.StaticLossScale(2.0 ** -4))
        >>> bool(out.finite), out.grads.tolist()
        (True, [20000.0, 2.0])
    """
    pol, precision = training_policies(policy, precision)
    if not callable(loss_fn):
        raise TypeError(f"mixed_value_and_grad needs a callable loss_fn, got {loss_fn!r}")
    fn = loss_fn
    if precision is not None or scopes is not None:
        from ._autocast import autocast

        fn = autocast(loss_fn, "always_f32" if precision is None else precision,
                      scopes=scopes)

    def scaled(params, ls, args, kwargs):
        out = fn(pol.cast_to_compute(params), *pol.cast_to_compute(args),
                 **pol.cast_to_compute(kwargs))
        if has_aux:
            if not (isinstance(out, tuple) and len(out) == 2):
                raise TypeError("with has_aux=True, loss_fn must return (loss, aux); got "
                                f"{type(out).__name__}")
            loss, aux = out
        else:
            loss, aux = out, None
        loss = jnp.asarray(loss)
        if loss.shape != () or not jnp.issubdtype(loss.dtype, jnp.floating):
            raise TypeError(f"loss_fn must return a floating scalar loss, got "
                            f"{loss.dtype}{list(loss.shape)}")
        loss = pol.cast_to_output(loss)
        # scale in float32 (or wider): the cotangent entering the backward pass is the scale
        wide = jnp.promote_types(loss.dtype, jnp.float32)
        scaled_loss = loss.astype(wide) * ls.loss_scale.astype(wide)
        return scaled_loss, (loss, pol.cast_to_output(aux))

    def run(params, *args, loss_scale=None, **kwargs) -> MixedGrads:
        ls = NoOpLossScale() if loss_scale is None else loss_scale
        _check_loss_scale(ls, "mixed_value_and_grad")
        leaves, treedef = jax.tree_util.tree_flatten(params)
        diff = [i for i, leaf in enumerate(leaves) if _is_float_array(leaf)]

        def of_leaves(dleaves, ls, args, kwargs):
            full = list(leaves)
            for i, d in zip(diff, dleaves):
                full[i] = d
            return scaled(jax.tree_util.tree_unflatten(treedef, full), ls, args, kwargs)

        dgrads, (loss, aux) = jax.grad(of_leaves, has_aux=True)(
            [leaves[i] for i in diff], ls, args, kwargs)
        grads = _fill(treedef, len(leaves), diff, dgrads)
        grads, finite, new_ls = ls.unscale_and_adjust(grads)
        return MixedGrads((loss, aux) if has_aux else loss, grads, finite, new_ls)

    return run


def _is_float_array(leaf: Any) -> bool:
    return (isinstance(leaf, (jax.Array, np.ndarray))
            and jnp.issubdtype(leaf.dtype, jnp.inexact))


def _fill(treedef, n: int, idx: list, vals: list):
    """A tree of ``treedef``: ``vals`` at leaf positions ``idx``, ``None`` elsewhere."""
    out: list = [None] * n
    for i, v in zip(idx, vals):
        out[i] = v
    return jax.tree_util.tree_unflatten(treedef, out)


def _trainable(params: Any) -> Any:
    """``params`` with ``None`` in place of every leaf that is not a floating array
    (what ``eqx.filter(params, eqx.is_inexact_array)`` gives)."""
    leaves, treedef = jax.tree_util.tree_flatten(params)
    idx = [i for i, leaf in enumerate(leaves) if _is_float_array(leaf)]
    return _fill(treedef, len(leaves), idx, [leaves[i] for i in idx])


def _is_array(x) -> bool:
    return isinstance(x, (jax.Array, np.ndarray, np.generic))


def _apply_updates(params: Any, updates: Any) -> Any:
    """``optax.apply_updates`` that leaves parameters with a ``None`` update alone."""
    leaves, treedef = jax.tree_util.tree_flatten(params)
    upd = treedef.flatten_up_to(updates)
    return jax.tree_util.tree_unflatten(treedef, [
        p if u is None else jnp.asarray(p + u).astype(jnp.asarray(p).dtype)
        for p, u in zip(leaves, upd)])


def _optax():
    try:
        import optax
    except ImportError as exc:  # pragma: no cover - exercised only without optax
        raise ImportError("skip_nonfinite/train_step need optax: pip install optax "
                          "(or pip install 'adaptprec[train]')") from exc
    return optax


def skip_nonfinite(inner: Any, loss_scale: Any = None) -> Any:
    """Wrap an optax transformation: skip non-finite updates, own the loss scale.

    ``update(grads, state, params)``: if every gradient is finite, the inner
    transformation's updates and state; otherwise zero updates (parameters unchanged)
    and the inner state as it was. Either way the loss scale is adjusted with the finite
    flag (a dynamic scale halves on overflow and grows after ``period`` good steps) and
    ``skipped``/``steps`` count. Pass *unscaled* gradients (``MixedGrads.grads``); read
    the scale for the next step with :func:`loss_scale_of`.

    Args:
        inner: an ``optax.GradientTransformation``.
        loss_scale: the initial loss scale (default ``NoOpLossScale()``: skipping only).

    Example:
        >>> import jax.numpy as jnp, optax
        >>> import adaptprec as ap
        >>> tx = ap.skip_nonfinite(optax.sgd(0.1), ap.DynamicLossScale(2.0 ** 15))
        >>> params = {"w": jnp.ones(2)}
        >>> state = tx.init(params)
        >>> upd, state = tx.update({"w": jnp.array([1.0, jnp.inf])}, state, params)
        >>> upd["w"].tolist(), int(state.skipped), float(ap.loss_scale_of(state).loss_scale)
        ([0.0, 0.0], 1, 16384.0)
    """
    optax = _optax()
    ls0 = NoOpLossScale() if loss_scale is None else loss_scale
    _check_loss_scale(ls0, "skip_nonfinite")
    if not hasattr(inner, "init") or not hasattr(inner, "update"):
        raise TypeError(f"skip_nonfinite wraps an optax GradientTransformation, got "
                        f"{inner!r}")

    def init(params):
        return SkipNonFiniteState(inner.init(params), ls0, jnp.zeros((), jnp.int32),
                                  jnp.zeros((), jnp.int32))

    def update(updates, state, params=None, **extra):
        finite = all_finite(updates)
        # zero the non-finite gradients before the inner update so its unused branch
        # stays finite too (no NaN in what select discards, no FP traps under debug_nans)
        safe = jax.tree_util.tree_map(
            lambda g: jnp.where(finite, g, jnp.zeros_like(g)), updates)
        if isinstance(inner, optax.GradientTransformationExtraArgs):
            new, inner_state = inner.update(safe, state.inner, params, **extra)
        else:
            new, inner_state = inner.update(safe, state.inner, params)
        zeros = jax.tree_util.tree_map(jnp.zeros_like, new)
        new = select_tree(finite, new, zeros)
        inner_state = select_tree(finite, inner_state, state.inner)
        return new, SkipNonFiniteState(inner_state, state.loss_scale.adjust(finite),
                                       state.skipped + (~finite).astype(jnp.int32),
                                       state.steps + 1)

    return optax.GradientTransformationExtraArgs(init, update)


def loss_scale_of(opt_state: Any) -> Any:
    """The loss scale held by a :func:`skip_nonfinite` state, found anywhere in
    ``opt_state`` (e.g. inside ``optax.chain``); ``NoOpLossScale()`` if there is none.

    Example:
        >>> import adaptprec as ap
        >>> ap.loss_scale_of(())
        NoOpLossScale()
    """
    found = [s for s in jax.tree_util.tree_leaves(
        opt_state, is_leaf=lambda x: isinstance(x, SkipNonFiniteState))
        if isinstance(s, SkipNonFiniteState)]
    if len(found) > 1:
        raise ValueError(f"the optimizer state holds {len(found)} skip_nonfinite states; "
                         f"wrap the optimizer once")
    return found[0].loss_scale if found else NoOpLossScale()


def _skip_state(opt_state: Any) -> SkipNonFiniteState | None:
    found = [s for s in jax.tree_util.tree_leaves(
        opt_state, is_leaf=lambda x: isinstance(x, SkipNonFiniteState))
        if isinstance(s, SkipNonFiniteState)]
    return found[0] if found else None


_ON_SKIP = ("count", "warn")


def _skip_reporter(on_skip: Any) -> Callable | None:
    """The host function a skipped step calls (``None``: count only)."""
    if callable(on_skip):
        return on_skip
    if on_skip == "count":
        return None
    if on_skip == "warn":
        def warn(info: StepInfo) -> None:
            warnings.warn(
                f"train_step skipped a step: the gradients were not finite (loss "
                f"{np.asarray(info.loss).tolist()}, loss scale after the step "
                f"{float(np.asarray(info.loss_scale))}, {int(np.asarray(info.skipped))} "
                f"skipped so far with ap.skip_nonfinite); parameters and optimizer "
                f"state are unchanged", RuntimeWarning, stacklevel=2)
        return warn
    raise ValueError(f"on_skip must be 'count', 'warn' or a function of the StepInfo; "
                     f"got {on_skip!r}")


def _report_skip(report: Callable, finite: jax.Array, info: StepInfo) -> None:
    """Call ``report(info)`` on the host for a skipped step (each skipped element of a
    vmapped step)."""
    def host(finite, info):
        finite = np.asarray(finite)
        if finite.ndim == 0:
            if not finite:
                report(info)
            return
        for i in np.flatnonzero(~finite.reshape(-1)):   # a vmapped step
            report(jax.tree_util.tree_map(lambda a: np.asarray(a).reshape(
                finite.size, *np.shape(a)[finite.ndim:])[i], info))

    jax.lax.cond(finite, lambda: None, lambda: jax.debug.callback(host, finite, info))


def train_step(loss_fn: Callable, optimizer: Any,
               policy: Policy | str = "p=f32,c=bf16,o=f32", *, has_aux: bool = False,
               precision: Any = None, scopes: dict | None = None,
               on_skip: str | Callable = "count") -> Callable:
    """One mixed-precision optimisation step: policy, loss scale, finite check, optax.

    ``optimizer`` should be wrapped with :func:`skip_nonfinite` (it holds the loss scale
    and skips non-finite updates); a bare optax transformation gets no loss scaling, and a
    non-finite step still leaves the parameters and the optimizer state as they were
    (``StepInfo.finite`` False), but ``StepInfo.skipped`` counts only with the wrapper.
    Policy, ``has_aux``, ``precision`` and ``scopes`` are as in
    :func:`mixed_value_and_grad`: ``policy`` takes a jmp policy (``"p=f32,c=f16,o=f32"``)
    or an autocast policy (``"auto_mixed_bf16"``, meaning ``precision=`` it).

    ``on_skip`` says what a skipped step does besides leaving the parameters alone:

    * ``"count"`` (the default): nothing on the host; ``StepInfo.finite`` is False and
      ``StepInfo.skipped`` counts (a dynamic loss scale skips a few steps while it finds
      its level, so skipped steps are routine in float16 training);
    * ``"warn"``: also a ``RuntimeWarning`` from the host (``jax.debug.callback``) with
      the loss, the loss scale and the count;
    * a function ``on_skip(info)``: called on the host with the step's
      :class:`StepInfo` (NumPy values) for every skipped step.

    Returns:
        ``step(params, opt_state, *args, **kwargs) -> (params, opt_state, StepInfo)``,
        pure and ``jit``-able. Parameters keep their dtype (float32 master weights).
        ``params`` may be any pytree, e.g. an Equinox module: only its floating array
        leaves are trained (initialise the optimizer with
        ``eqx.filter(model, eqx.is_inexact_array)``).

    Example:
        >>> import jax, jax.numpy as jnp, optax
        >>> import adaptprec as ap
        >>> tx = ap.skip_nonfinite(optax.sgd(0.25), ap.DynamicLossScale(2.0 ** 15))
        >>> skipped = []
        >>> step = jax.jit(ap.train_step(lambda w, x: jnp.sum((w - x) ** 2), tx,
        ...                              "p=f32,c=f16,o=f32", on_skip=skipped.append))
        >>> w, x = jnp.zeros(2, jnp.float32), jnp.array([1.0, 2.0], jnp.float32)
        >>> state = tx.init(w)
        >>> for _ in range(30):
        ...     w, state, info = step(w, state, x)
        >>> jnp.round(w, 3).tolist(), w.dtype.name
        ([1.0, 2.0], 'float32')
        >>> int(info.skipped), float(info.loss_scale)   # 4 * 2**15 overflowed float16 twice
        (2, 8192.0)
        >>> jax.effects_barrier()
        >>> [float(i.loss_scale) for i in skipped]      # on_skip saw both
        [16384.0, 8192.0]
    """
    _optax()
    report = _skip_reporter(on_skip)
    vg = mixed_value_and_grad(loss_fn, policy, has_aux=has_aux, precision=precision,
                              scopes=scopes)

    def step(params, opt_state, *args, **kwargs):
        out = vg(params, *args, loss_scale=loss_scale_of(opt_state), **kwargs)
        updates, new_state = optimizer.update(out.grads, opt_state, _trainable(params))
        new_params = _apply_updates(params, updates)
        if _skip_state(opt_state) is None:
            # a bare optimizer: StepInfo.finite=False still means "skipped" (the update
            # of a non-finite gradient is not applied)
            new_params, new_state = jax.tree.map(
                lambda a, b: jnp.where(out.finite, a, b) if _is_array(a) else a,
                (new_params, new_state), (params, opt_state))
        params, opt_state = new_params, new_state
        st = _skip_state(opt_state)
        skipped = st.skipped if st is not None else jnp.zeros((), jnp.int32)
        scale = loss_scale_of(opt_state).loss_scale
        info = StepInfo(out.value, out.finite, scale, skipped)
        if report is not None:
            _report_skip(report, out.finite, info)
        return params, opt_state, info

    return step
