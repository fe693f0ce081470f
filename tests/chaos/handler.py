"""The chaos suite's business handler (``python:tests.chaos.handler:handle``) and the rules it
shares with the HTTP business server of the header fuzz.

The message value is JSON ``{"id": ..., "kind": ..., "k": n}``; what a call does depends only
on the kind and the copy's retry number, so the outcome of every id is known in advance:

- ``ok`` succeeds;
- ``transient`` fails while ``retry_number < k``, then succeeds (fails exactly k times);
- ``poison`` fails always (dead-lettered ``exhausted`` after the retry sequence);
- ``non_retryable`` raises ``retryd.NonRetryableError`` (dead-lettered ``non_retryable``).

Every call is appended to ``$RETRYD_CHAOS_LOG`` as one JSON line (id, outcome, retry number,
topic, pid; from this handler also the copy's partition and offset and the call's wall time),
written with one ``os.write`` on an ``O_APPEND`` descriptor *before* the call returns: a SIGKILL
can cut a process between two calls but never inside a line, a success that reached the log is
a success that happened, and a call made after another one returned is logged after it.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from collections.abc import Iterable
from typing import Any

from retryd import NonRetryableError
from retryd.handlers.base import Message

LOG_ENV = "RETRYD_CHAOS_LOG"

OK, FAIL, DEAD = "ok", "fail", "dead"  # what one call did

_fd: int | None = None
_fd_lock = threading.Lock()


class TransientFailure(Exception):
    """A retryable failure the plan asked for."""


def decide(kind: str, k: int, retry_number: int) -> str:
    """What a call of a message of ``kind`` does on the copy with ``retry_number``."""
    if kind == "ok":
        return OK
    if kind == "transient":
        return FAIL if retry_number < k else OK
    if kind == "poison":
        return FAIL
    if kind == "non_retryable":
        return DEAD
    raise ValueError(f"unknown kind {kind!r}")


def is_retryd_name(name: str) -> bool:
    """retryd's own headers (spec §2): replaced hop by hop, so not part of what a user sent."""
    return name in ("retry_number", "retry_timestamp") or name.startswith("retryd_")


def header_digest(
    headers: Iterable[tuple[str, bytes | None]] | None, *, fold_case: bool = False
) -> str:
    """A digest of the *user* headers as a multiset (HTTP does not keep the order between
    different names): equal digests mean every user header arrived byte for byte.
    ``fold_case``: compare names ignoring letter case (HTTP frameworks fold the case of
    ``X-Kafka-*`` names, as retryd's HTTP handler documents)."""
    items = sorted(
        ((name.lower() if fold_case else name).encode(), value is None, value or b"")
        for name, value in headers or ()
        if not is_retryd_name(name)
    )
    h = hashlib.sha1(usedforsecurity=False)
    for name, null, value in items:
        h.update(b"%d:%s|%d|%d:%s;" % (len(name), name, null, len(value), value))
    return h.hexdigest()[:16]


def spec_of(value: bytes | None) -> dict[str, Any]:
    try:
        doc = json.loads(value or b"{}")
    except ValueError:
        return {}
    return doc if isinstance(doc, dict) else {}


def append_call(entry: dict[str, Any]) -> None:
    """Append one call to ``$RETRYD_CHAOS_LOG`` in one write (SIGKILL-safe); the descriptor
    stays open for the life of the worker process."""
    global _fd
    path = os.environ.get(LOG_ENV)
    if not path:
        return
    with _fd_lock:
        if _fd is None:
            _fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        write_line(_fd, entry)


def write_line(fd: int, entry: dict[str, Any]) -> None:
    os.write(fd, (json.dumps(entry, separators=(",", ":")) + "\n").encode())


def call_entry(
    spec: dict[str, Any], outcome: str, retry_number: int, topic: str, digest: str | None
) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "id": spec.get("id"),
        "o": outcome,
        "r": retry_number,
        "t": topic,
        "pid": os.getpid(),
    }
    if digest is not None:
        entry["h"] = digest
    return entry


def handle(message: Message) -> None:
    spec = spec_of(message.value)
    retry_number = message.retry_number
    outcome = decide(str(spec.get("kind", "ok")), int(spec.get("k", 0)), retry_number)
    digest = header_digest(message.headers) if "h" in spec else None
    entry = call_entry(spec, outcome, retry_number, message.topic, digest)
    # where this copy was read and when it was called: evidence for an order check
    entry.update(p=message.partition, off=message.offset, at=round(time.time(), 3))
    append_call(entry)
    if outcome == FAIL:
        raise TransientFailure(f"planned failure (retry {retry_number})")
    if outcome == DEAD:
        raise NonRetryableError("planned non-retryable failure")
