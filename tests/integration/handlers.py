"""Business handlers used by the integration tests, driven by the message value.

The value is JSON: ``{"id": "...", "mode": "...", "k": n, "seconds": s}``.
Every call is recorded in ``CALLS`` and, when ``RETRYD_TEST_LOG`` names a file, appended to it
as one JSON line (one ``os.write`` on an O_APPEND descriptor, so a SIGKILL loses no line).
"""

from __future__ import annotations

import json
import os
import threading
import time

from retryd import NonRetryableError
from retryd.handlers.base import Message

CALLS: list[dict] = []
_LOCK = threading.Lock()
_INFLIGHT = 0


class PoisonError(Exception):
    """Configured as non-retryable by name in tests."""


class Unusual(BaseException):
    """A BaseException subclass that is neither KeyboardInterrupt nor SystemExit."""


def _spec(message: Message) -> dict:
    try:
        doc = json.loads(message.value or b"{}")
        return doc if isinstance(doc, dict) else {}
    except ValueError:
        return {}


def _entry(message: Message, spec: dict) -> dict:
    return {
        "id": spec.get("id"),
        "topic": message.topic,
        "partition": message.partition,
        "offset": message.offset,
        "key": (message.key or b"").decode("utf-8", "replace"),
        "retry_number": message.retry_number,
        "retry_timestamp": int(message.header("retry_timestamp") or 0),
        "called_ms": int(time.time() * 1000),
        "pid": os.getpid(),
    }


def _record(message: Message, spec: dict) -> None:
    entry = _entry(message, spec)
    with _LOCK:
        CALLS.append(entry)
    append_log_line(entry)


def append_log_line(entry: dict) -> None:
    """Append ``entry`` to ``$RETRYD_TEST_LOG`` as one JSON line in one write (SIGKILL-safe)."""
    path = os.environ.get("RETRYD_TEST_LOG")
    if path:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, (json.dumps(entry) + "\n").encode())
        finally:
            os.close(fd)


def timed(message: Message) -> None:
    """Like ``behave``, but each call is logged when it ends, with its start and end times
    (wall clock, seconds) and how many calls were in flight in this process when it started."""
    global _INFLIGHT
    spec = _spec(message)
    entry = _entry(message, spec)
    with _LOCK:
        _INFLIGHT += 1
        entry["inflight"] = _INFLIGHT
    entry["start"] = time.time()
    entry["failed"] = False
    try:
        _act(message, spec)
    except BaseException:
        entry["failed"] = True
        raise
    finally:
        entry["end"] = time.time()
        with _LOCK:
            _INFLIGHT -= 1
            CALLS.append(entry)
        append_log_line(entry)


def behave(message: Message) -> None:
    spec = _spec(message)
    _record(message, spec)
    _act(message, spec)


def _act(message: Message, spec: dict) -> None:
    mode = spec.get("mode", "ok")
    if mode == "ok":
        return
    if mode == "always":
        raise RuntimeError(f"always fails (retry {message.retry_number})")
    if mode == "fail_k":
        if message.retry_number < int(spec["k"]):
            raise ValueError(f"fails until retry {spec['k']}")
        return
    if mode == "non_retryable":
        raise NonRetryableError("poison message")
    if mode == "poison_by_name":
        raise PoisonError("configured as non-retryable")
    if mode == "base_exception":
        if message.retry_number == 0:
            raise Unusual("not an Exception")
        return
    if mode == "hang":
        if message.retry_number == 0:
            time.sleep(float(spec.get("seconds", 30)))
        return
    if mode == "slow":
        time.sleep(float(spec.get("seconds", 0.001)))
        return
    raise RuntimeError(f"unknown test mode {mode!r}")
