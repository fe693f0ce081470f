"""SIGTERM/SIGINT from the first line of a retryd process, before its heavy imports.

A worker, sidecar or supervisor takes seconds to start on a busy machine: the interpreter,
then typer, pydantic, confluent_kafka, fastapi. Python's default dispositions apply until
someone installs a handler, so a SIGTERM in that window (a rolling update, a supervisor
stopping the child it has just restarted) ended the process with -15, which reads as a crash,
and a SIGINT with a ``KeyboardInterrupt`` traceback (status 1). Issue 32: a stop signal at any
point of a process's life ends it with its documented status.

- ``hold()`` is the first thing ``python -m retryd`` (``retryd.__main__``) and a supervised
  child (``retryd.hosting.process.child_main``) do: a stdlib-only handler records the signal,
  then the signals are unblocked. The long-running commands adopt what it recorded
  (``StopSignals``, the supervisor, the sidecar): a signal that came while they were starting
  stops them before they consume or serve anything, with status 0. Every other command gives
  the signals back (``release()``, from the CLI's root callback): a signal that came meanwhile
  then takes its usual effect, as it did before.
- ``blocked()`` closes the window that remains, the interpreter's own start, for the processes
  retryd starts itself: the supervisor spawns a child with SIGTERM/SIGINT blocked, the child
  inherits the mask through fork and exec, and a signal sent to it meanwhile stays pending
  until its ``hold()`` has a handler in place (CPython's resource tracker does the same,
  bpo-33613). A process started by something else (a container runtime, a shell) can only be
  covered from ``hold()`` on: the few milliseconds of interpreter start-up before it belong to
  its parent.

Stdlib only, and importing this module has no effect: it must stay cheap and must not touch the
dispositions of a process that merely imports retryd (the test suite, a library user).
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)

_received: list[int] = []  # signals recorded while held, in arrival order
_previous: dict[int, Any] = {}  # dispositions before hold(), given back by release()


def _record(signum: int, frame: FrameType | None) -> None:
    _received.append(signum)


def hold() -> None:
    """Record SIGTERM/SIGINT from now on instead of dying of them, then unblock them (a signal
    that arrived while the parent's mask blocked them is delivered here, and recorded)."""
    for sig in STOP_SIGNALS:
        previous = signal.signal(sig, _record)
        if previous is not _record:
            _previous[sig] = previous
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)


def received() -> int | None:
    """The first stop signal recorded since ``hold()``, or None."""
    return _received[0] if _received else None


def adopt(handler: Callable[[int, FrameType | None], Any]) -> int | None:
    """Hand SIGTERM/SIGINT to ``handler`` for good and return the signal recorded before it (or
    None). The handler is installed first, so no signal falls between the two."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, handler)
    _previous.clear()
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
    return received()


def release() -> None:
    """For a command that has no clean stop of its own: the dispositions from before
    ``hold()`` again; a signal recorded meanwhile now takes their effect (-15, or a
    ``KeyboardInterrupt``). Nothing to do when ``hold()`` never ran (an in-process caller)."""
    if not _previous:
        return
    for sig, previous in _previous.items():
        signal.signal(sig, previous)
    _previous.clear()
    if _received:
        signal.raise_signal(_received[0])


@contextlib.contextmanager
def blocked() -> Iterator[None]:
    """SIGTERM/SIGINT blocked in this thread for the block: a process spawned inside inherits
    the mask and receives them once its ``hold()`` can handle them. One sent to this process
    meanwhile is delivered when the block ends."""
    before = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)
