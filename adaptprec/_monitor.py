"""`monitor()`: opt-in collection of adaptive-call reports from inside ``jit``.

Inside ``with adaptprec.monitor() as log:``, every adaptive call *traced* in the block
sends its :class:`~adaptprec.Report` to the host through ``jax.debug.callback`` and
``log`` collects them. Outside the block nothing is inserted into the program (no
callback in the jaxpr, no cost). The on/off state is a JAX user context, so it is part of
``jit``'s cache key: a function compiled without monitoring is re-traced inside the block
(and compiled versions are reused across blocks).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import jax

from .report import Report

__all__ = ["monitor", "MonitorLog"]

_ENABLED = jax.make_user_context(default_value=False)
_ACTIVE: list[MonitorLog] = []     # global: callbacks may run on other threads
_LOCK = threading.Lock()


class MonitorLog:
    """Reports collected by :func:`monitor`: a list of ``(name, Report)`` entries.

    Reports hold NumPy values. Batched calls log one batched report.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> import adaptprec as ap
        >>> f = ap.adaptive(jnp.exp, ladder="f32,f64")
        >>> with ap.monitor() as log:
        ...     _ = jax.jit(f)(jnp.array([1.0, 200.0]))
        >>> [(name, rep.rung_name) for name, rep in log]
        [('exp', 'f64')]
    """

    def __init__(self):
        self.entries: list[tuple[str, Report]] = []

    def __iter__(self):
        return iter(list(self.entries))

    def __len__(self) -> int:
        return len(self.entries)

    def __getitem__(self, i):
        return self.entries[i]

    @property
    def reports(self) -> list[Report]:
        """The reports alone."""
        return [r for _, r in self.entries]

    def summary(self) -> str:
        """One line per logged call."""
        return "\n".join(f"{name}: {rep.summary()}" for name, rep in self.entries)

    def clear(self) -> None:
        """Forget the collected entries."""
        self.entries.clear()


def enabled() -> bool:
    """Whether a :func:`monitor` block is active in this thread (read at trace time).

    Example:
        >>> import adaptprec as ap
        >>> from adaptprec._monitor import enabled
        >>> with ap.monitor():
        ...     inside = enabled()
        >>> inside, enabled()
        (True, False)
    """
    return bool(_ENABLED.value)


def _record(name: str, report: Report) -> None:
    with _LOCK:
        for log in _ACTIVE:
            log.entries.append((name, report))


def emit(name: str, report: Report) -> None:
    """Send ``report`` to the active monitors (a no-op, adding nothing, when off).

    Called by the runtime for every adaptive call; custom drivers may call it too.

    Example:
        >>> import jax.numpy as jnp
        >>> import adaptprec as ap
        >>> from adaptprec._monitor import emit
        >>> _, rep = ap.adaptive(jnp.sin, ladder="bf16,f32").with_report(jnp.ones(2))
        >>> with ap.monitor() as log:
        ...     emit("mine", rep)
        >>> log[0][0], log[0][1].rung_name
        ('mine', 'bf16')
    """
    if enabled():
        jax.debug.callback(lambda r: _record(name, r), report)


@contextlib.contextmanager
def monitor() -> Iterator[MonitorLog]:
    """Collect the reports of adaptive calls made (and traced) inside the block.

    Yields a :class:`MonitorLog`. On exit it waits for pending callbacks
    (``jax.effects_barrier``), so the log is complete. Monitoring costs nothing when off:
    the callback is only inserted into programs traced inside the block.

    Example:
        >>> import jax.numpy as jnp
        >>> import adaptprec as ap
        >>> f = ap.adaptive(jnp.sin, ladder="bf16,f32")
        >>> with ap.monitor() as log:
        ...     _ = f(jnp.ones(3))
        >>> print(log.summary())
        sin: bf16; finite only: accuracy not checked
    """
    log = MonitorLog()
    with _LOCK:
        _ACTIVE.append(log)
    try:
        with _ENABLED(True):
            yield log
    finally:
        jax.effects_barrier()
        with _LOCK:
            _ACTIVE.remove(log)
