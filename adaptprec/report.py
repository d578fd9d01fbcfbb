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
        escalations: how many times the call climbed the ladder (equals ``rung``).
        ok: whether every guard passed on that rung. ``False`` only when the top rung
            failed too (then ``on_failure`` decided what was returned).
        reason: the first failing guard's code at the last rung that failed (why the call
            escalated, or why it failed); 0 if rung 0 passed. See
            :func:`adaptprec.guards.code_name`.
        codes: ``(n_rungs, n_guards)`` code of each guard at each rung; 0 passed, -1 that
            rung did not run.
        values: ``(n_rungs, n_guards)`` what each guard measured (NaN: not run).
        rung_names, guard_names: static labels.

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
        f64 after 1 escalation (f32: finite failed: nonfinite, value 1); ok
    """

    rung: jax.Array
    escalations: jax.Array
    ok: jax.Array
    reason: jax.Array
    codes: jax.Array
    values: jax.Array
    rung_names: tuple[str, ...] = field(static=True)
    guard_names: tuple[str, ...] = field(static=True)

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
        values, and ``ok``. Batched: counts per rung, how many are ok, and reasons.
        """
        rung = np.asarray(self.rung)
        ok = np.asarray(self.ok)
        if rung.ndim == 0:
            r = int(rung)
            codes = np.asarray(self.codes)
            values = np.asarray(self.values)
            n_esc = int(np.asarray(self.escalations))
            parts = []
            for k in range(len(self.rung_names)):
                failed = [f"{g} failed: {code_name(c)}, value {v:.3g}"
                          for g, c, v in zip(self.guard_names, codes[k], values[k]) if c > 0]
                if failed:
                    parts.append(f"{self.rung_names[k]}: " + "; ".join(failed))
            esc = f" after {n_esc} escalation{'s' if n_esc != 1 else ''}" if n_esc else ""
            why = f" ({' | '.join(parts)})" if parts else ""
            return f"{self.rung_names[r]}{esc}{why}; {'ok' if bool(ok) else 'NOT OK'}"
        n = rung.size
        counts = collections.Counter(rung.ravel().tolist())
        per_rung = ", ".join(f"{self.rung_names[k]} {counts[k]}" for k in sorted(counts))
        reasons = collections.Counter(np.asarray(self.reason).ravel().tolist())
        reasons.pop(0, None)
        why = ("; reasons: " + ", ".join(f"{code_name(c)} x{m}" for c, m in
                                         sorted(reasons.items()))) if reasons else ""
        return f"{n} calls: {per_rung}; ok {int(ok.sum())}/{n}{why}"

    def __str__(self) -> str:
        return self.summary()


def _reason(codes, rung, ok):
    """First failing code at the last rung that failed (0 if none)."""
    r_fail = jnp.where(ok, rung - 1, rung)
    row = codes[jnp.clip(r_fail, 0)]
    failing = row > 0
    first = row[jnp.argmax(failing)]
    return jnp.where((r_fail >= 0) & jnp.any(failing), first, 0).astype(jnp.int32)
