"""`Report`: what an adaptive call did — which rung produced the result and why.

A report is a pytree (a frozen dataclass, ``adaptprec._pytree.Module``), so it comes out of ``jit`` and ``vmap``
like any array output (under ``vmap`` every field gains the batch axis). Static fields
name the ladder's rungs and the guards, so :meth:`Report.summary` can print a readable
line on the host.
"""

from __future__ import annotations

import collections

import jax
import jax.numpy as jnp
import numpy as np

from ._pytree import Module, field
from .guards import code_name

__all__ = ["Report"]


class Report(Module):
    """Outcome of one adaptive call.

    Attributes:
        rung: index of the ladder rung whose result was returned.
        escalations: how many times the call climbed the ladder: the rungs tried below
            the returned one (equals ``rung`` unless the plan skipped rungs).
        ok: whether every guard passed on that rung. ``False`` only when the top rung
            failed too (then ``on_failure`` decided what was returned).
        reason: the first failing guard's code at the last rung that failed (why the call
            escalated, or why it failed); 0 if rung 0 passed. See
            :func:`adaptprec.guards.code_name`.
        codes: ``(n_rungs, n_guards)`` code of each guard at each rung; 0 passed, -1 that
            rung did not run.
        values: ``(n_rungs, n_guards)`` what each guard measured (NaN: not run).
        rung_names, guard_names: static labels.
        guard_roles: static, per guard: what it verifies when it passes (``"finite"``,
            ``"accuracy"``, ``"spot_check"`` or ``"other"``); guard_rtols: the ``rtol`` of
            accuracy/spot-check guards (``None`` for others).
        plan: static, per rung: what the cost model planned for it and why, e.g.
            ``"skipped: its check (3.1 ms) would cost more than it saves (2.2 ms),
            modelled"`` or ``"first-order error bound (check ~9% of the rung's time,
            modelled)"``; empty when the manager has no plan.
        checks: static, per rung: how the accuracy guard checked it (``"mca"``: Monte
            Carlo arithmetic, ``"first_order"``: first-order error bound, ``"screen"``:
            cancellation screen only, ``"skipped"``: the rung did not run by plan).
        check_shares: static, per rung: the check's modelled share of the rung's time
            (``None``: not run or not modelled). Estimated, not measured.
        norm: static: what the accuracy guard's relative error is, ``"normwise"``
            (relative to each output's largest entry) or ``"componentwise"`` (every
            entry relative to itself), with its ``atol`` floor if any; ``""`` without
            an accuracy guard.

    A report never calls a result "ok" for finiteness alone: :meth:`summary` and
    :attr:`verified` say what was verified, e.g. ``f32; ~5.2 digits verified (rtol
    0.001)`` with an accuracy guard, ``bf16; finite only: accuracy not checked`` without.

    Example:
        >>> import jax.numpy as jnp
        >>> import adaptprec as ap
        >>> @ap.adaptive(ladder="f32,f64", guards=[ap.guards.finite()])
        ... def expm(x):
        ...     return jnp.exp(x)
        >>> y, rep = expm.with_report(jnp.array([1.0, 100.0]))  # e^100 overflows f32
        >>> rep.rung_name, int(rep.escalations), rep.reason_name
        ('f64', 1, 'nonfinite')
        >>> print(rep.summary())
        f64 after 1 escalation (f32: finite failed: nonfinite, value 1); finite only: accuracy not checked
        >>> _, rep = ap.adaptive(jnp.exp, ladder="f32,f64", rtol=1e-4).with_report(
        ...     jnp.array([1.0, 2.0]))
        >>> rep.rung_name, rep.digits > 4
        ('f32', True)
    """

    rung: jax.Array
    escalations: jax.Array
    ok: jax.Array
    reason: jax.Array
    codes: jax.Array
    values: jax.Array
    rung_names: tuple[str, ...] = field(static=True)
    guard_names: tuple[str, ...] = field(static=True)
    guard_roles: tuple[str, ...] = field(static=True, default=())
    guard_rtols: tuple[float | None, ...] = field(static=True, default=())
    plan: tuple[str, ...] = field(static=True, default=())
    checks: tuple[str, ...] = field(static=True, default=())
    check_shares: tuple[float | None, ...] = field(static=True, default=())
    norm: str = field(static=True, default="")

    def _roles(self) -> tuple[str, ...]:
        return self.guard_roles or ("other",) * len(self.guard_names)

    def _rtols(self) -> tuple[float | None, ...]:
        return self.guard_rtols or (None,) * len(self.guard_names)

    def _accuracy_index(self) -> int | None:
        roles = self._roles()
        return roles.index("accuracy") if "accuracy" in roles else None

    @property
    def digits(self):
        """Significant digits the accuracy guard estimated on the returned rung.

        A float for a single call (NaN when no accuracy guard ran), an array for a batch.
        """
        i = self._accuracy_index()
        rung = np.asarray(self.rung)
        if i is None:
            out = np.full(rung.shape, np.nan)
        else:
            vals = np.asarray(self.values)[..., i]
            out = np.take_along_axis(vals, rung[..., None], axis=-1)[..., 0]
        return float(out) if out.ndim == 0 else out

    @property
    def verified(self) -> str:
        """What the guards verified for the returned result (host side), e.g.
        ``"~5.2 digits verified (rtol 0.001)"`` or ``"finite only: accuracy not checked"``.
        """
        ok = np.asarray(self.ok)
        roles, rtols = self._roles(), self._rtols()
        i = self._accuracy_index()
        if not ok.all():
            n_bad = int((~ok).sum())
            what = ("accuracy" if i is not None else "guards")
            return (f"NOT OK: {what} not verified on the top rung"
                    + (f" for {n_bad}/{ok.size}" if ok.ndim else ""))
        if i is not None:
            d = np.asarray(self.digits)
            d = float(np.min(d)) if d.size else float("nan")
            low = "" if ok.ndim == 0 else "min "
            used = {self.checks[r] for r in np.unique(np.asarray(self.rung)).tolist()} \
                if self.checks else {"mca"}
            tol = f"rtol {rtols[i]:g}" + (f", {self.norm}" if self.norm else "")
            if used == {"speculative"}:
                return ("speculative: this rung was verified on an earlier call for these "
                        "shapes; this call checked finite only (its rounding error was not "
                        "estimated)")
            if used == {"none"}:
                return ("finite only on the top rung: accuracy not checked (the plan "
                        "found no check within budget, see plan)")
            if used == {"screen"}:
                return (f"screened only (cancellation {low}~{d:.1f} digits, finite; "
                        f"{tol}): rounding error not estimated, see plan")
            sampled = _SAMPLED.get(next(iter(used))) if len(used) == 1 else None
            if sampled is not None:
                return (f"{low}~{d:.1f} digits verified on {sampled[0]} ({tol}; "
                        f"statistical: {sampled[1]})")
            how = "" if used == {"mca"} else (
                "; first-order bound" if used == {"first_order"} else
                "; " + "/".join(sorted(used)))
            return f"{low}~{d:.1f} digits verified ({tol}{how})"
        if "spot_check" in roles:
            j = roles.index("spot_check")
            top = len(self.rung_names) - 1
            if np.all(np.asarray(self.rung) < top):
                return f"spot-checked against the next rung (rtol {rtols[j]:g})"
            return "spot check not run on the top rung: accuracy not checked"
        others = [g for g, r in zip(self.guard_names, roles) if r == "other"]
        if others:
            return f"passed {', '.join(others)}; accuracy not estimated"
        return "finite only: accuracy not checked"

    @property
    def batch_shape(self) -> tuple[int, ...]:
        """Leading batch shape (``()`` for a single call)."""
        return tuple(np.shape(self.rung))

    @property
    def rung_name(self) -> str:
        """Name of the rung used (single calls only)."""
        self._require_single("rung_name")
        return self.rung_names[int(self.rung)]

    @property
    def reason_name(self) -> str:
        """Readable :attr:`reason` (single calls only)."""
        self._require_single("reason_name")
        return code_name(int(self.reason))

    def _require_single(self, what):
        if self.batch_shape:
            raise ValueError(f"Report.{what} is for a single call; this report has batch "
                             f"shape {self.batch_shape}: index it first, e.g. "
                             f"jax.tree.map(lambda x: x[0], report), or use summary()")

    def summary(self) -> str:
        """A readable one-line summary (host side; ``print`` it).

        Single call: the rung, escalations, which guards failed on lower rungs and their
        values, and what was verified (:attr:`verified`). Batched: counts per rung, how
        many are ok, reasons, and what was verified.
        """
        rung = np.asarray(self.rung)
        ok = np.asarray(self.ok)
        if rung.ndim == 0:
            r = int(rung)
            codes = np.asarray(self.codes)
            values = np.asarray(self.values)
            n_esc = int(np.asarray(self.escalations))
            parts = []
            roles = self._roles()
            for k in range(len(self.rung_names)):
                failed = [f"{g} failed: {code_name(c)}, "
                          + (f"~{v:.1f} digits" if role == "accuracy" else f"value {v:.3g}")
                          for g, c, v, role in zip(self.guard_names, codes[k], values[k],
                                                   roles) if c > 0]
                if failed:
                    parts.append(f"{self.rung_names[k]}: " + "; ".join(failed))
            esc = f" after {n_esc} escalation{'s' if n_esc != 1 else ''}" if n_esc else ""
            why = f" ({' | '.join(parts)})" if parts else ""
            return f"{self.rung_names[r]}{esc}{why}; {self.verified}{self._plan_note()}"
        n = rung.size
        counts = collections.Counter(rung.ravel().tolist())
        per_rung = ", ".join(f"{self.rung_names[k]} {counts[k]}" for k in sorted(counts))
        reasons = collections.Counter(np.asarray(self.reason).ravel().tolist())
        reasons.pop(0, None)
        why = ("; reasons: " + ", ".join(f"{code_name(c)} x{m}" for c, m in
                                         sorted(reasons.items()))) if reasons else ""
        return (f"{n} calls: {per_rung}; ok {int(ok.sum())}/{n}{why}; {self.verified}"
                f"{self._plan_note()}")

    def _plan_note(self) -> str:
        """``" [plan: ...]"`` when the plan skipped a rung or checked without Monte Carlo
        arithmetic (nothing for the thorough plan)."""
        if not self.checks or set(self.checks) <= {"mca", ""}:
            return ""
        parts = [f"{name} {note}" for name, note in zip(self.rung_names, self.plan)
                 if note]
        return " [plan: " + "; ".join(parts) + "]"

    def __str__(self) -> str:
        return self.summary()


#: per sampled check: what was verified, and what a sample cannot see
_SAMPLED = {
    "sample": ("sampled entries", "entries between the samples are not checked"),
    "sample_conv": ("sampled output positions",
                    "positions between the samples are not checked"),
    "sample_rows": ("sampled rows", "rows between the samples are not checked"),
    "probe": ("random probes of the matrix product",
              "row errors in the 2-norm, seen through 4 random directions"),
}


def _reason(codes, rung, ok):
    """First failing code at the last rung that failed (0 if none; rungs the plan
    skipped have no codes)."""
    r_fail = jnp.where(ok, rung - 1, rung)
    idx = jnp.arange(codes.shape[0])
    failed = jnp.any(codes > 0, axis=-1) & (idx <= r_fail)
    last = jnp.max(jnp.where(failed, idx, -1))
    row = codes[jnp.clip(last, 0)]
    first = row[jnp.argmax(row > 0)]
    return jnp.where(last >= 0, first, 0).astype(jnp.int32)
