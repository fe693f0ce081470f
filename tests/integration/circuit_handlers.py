"""Handlers whose records fail once and succeed when retried (read-after-write lag, a
dependency catching up): what the circuit breaker must not take for an outage
(tests/integration/test_circuit_retries_succeed.py).

The record's value names it. Every call is appended to ``$RETRYD_TEST_LOG`` as one line,
``<S|F> <value> <wall clock s>`` (S: succeeded, F: failed), in one ``os.write`` on an O_APPEND
descriptor, so the test can count successes while the worker runs.
"""

from __future__ import annotations

import os
import threading
import time

from retryd.handlers.base import Message

_LOCK = threading.Lock()
_SEEN: set[bytes] = set()  # records called at least once in this process
_FD: int | None = None


class NotYet(Exception):
    """Retryable: what the record needs is not there yet (it is on the next try)."""


def _log(ok: bool, message: Message) -> None:
    global _FD
    if _FD is None:
        with _LOCK:
            if _FD is None:
                _FD = os.open(
                    os.environ["RETRYD_TEST_LOG"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644
                )
    value = (message.value or b"").decode()
    os.write(_FD, f"{'S' if ok else 'F'} {value} {time.time():.6f}\n".encode())


def fail_first_attempt(message: Message) -> None:
    """Fails every record on its main topic (retry 0, also when run again in place) and
    succeeds on its first retry, from the first tier."""
    ok = message.retry_number > 0
    _log(ok, message)
    if not ok:
        raise NotYet("first attempt fails")


def fail_first_call(message: Message) -> None:
    """Fails each record's first call in this process, whatever it is, and succeeds on the
    next call: from the tier, or a run again in place of a record the circuit held."""
    value = message.value or b""
    with _LOCK:
        ok = value in _SEEN
        _SEEN.add(value)
    _log(ok, message)
    if not ok:
        raise NotYet("first call fails")
