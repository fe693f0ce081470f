"""The share consumer's ``poll`` and ``commit_async`` as the share worker uses them: when the
records of a poll may have been acquired, and what an exception from the client becomes.

**When a record's lock started.** The broker starts a record's lock when it acquires the
record for a ShareFetch, and neither the broker's response nor the client (confluent-kafka
2.16, librdkafka 2.15/2.16) tells the application when that was: a ``Message`` carries its
delivery count, not its acquisition time (Java's ``acquisitionLockTimeoutMs``, KIP-1222, is the
lock's length, not its start). What librdkafka does is known: a poll that finds no record
queued asks for a fetch, and that fetch stays in flight (librdkafka's main thread sends it
again and again) until a response brings records, which then wait in the client's queue for
the *next* poll, their locks running, however long the application takes to poll again (the
circuit breaker open, a stop, a slow loop). So the worker takes the conservative bound:

- after a poll that returned records, no fetch is in flight: the next batch was acquired no
  earlier than the next poll was *called*;
- after a poll that returned nothing, a fetch may still be in flight: the next batch was
  acquired no earlier than that empty poll *returned* (a response already on its way then
  lands within milliseconds, covered by ``retryd.share.group.LOCK_MARGIN_S``).

The bound is earlier than the truth by at most one poll's wait (``poll_timeout_s``) when
records arrive while the worker waits in ``poll``; it is never later, so a call never starts
when its lock can no longer hold it.

**Exceptions.** ``poll`` and ``commit_async`` raise ``KafkaException`` (a fatal one stops the
worker: the client is unusable), ``IllegalStateException`` (a ``RuntimeError``), and, from a
binding bug, anything. None of them ends the worker by itself: each is logged (the first of a
streak with its traceback), counted (``errors``), and the next poll waits a backoff that
doubles up to ``BACKOFF_MAX_S``, on the worker's stop event (``stop()`` ends it at once, never
a blind sleep). Polls failing without a break for ``max_poll_interval_ms`` (past which the
client has left the group anyway) stop the worker cleanly: there is no record in hand between
two polls, and closing the consumer tells the broker it is gone; the process exits with the
runtime status so that it is restarted. ``commit_async`` needs no backoff: its
acknowledgements stay pending in the client and go with the next poll.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from confluent_kafka import KafkaError, KafkaException

from retryd.errors import KafkaRuntimeError, RetrydError

log = logging.getLogger(__name__)

BACKOFF_MIN_S = 0.05
BACKOFF_MAX_S = 1.0


class Fetcher:
    """``poll`` and ``commit`` for the share worker's poll thread (module docstring)."""

    def __init__(self, consumer: Any, stop: threading.Event, max_failing_s: float) -> None:
        self.consumer = consumer
        self.stop = stop
        self.max_failing_s = max_failing_s
        self.errors = 0  # exceptions from poll and commit_async, ever
        self.fault: RetrydError | None = None
        self._in_flight_since: float | None = None  # a fetch may have acquired records since
        self._failing_since: float | None = None
        self._streak = 0

    def poll(self, timeout_s: float) -> tuple[list[Any], float]:
        """A batch (empty on an error, or nothing to hand out) and the earliest moment its
        records may have been acquired (monotonic)."""
        if self._streak:
            backoff = min(BACKOFF_MAX_S, BACKOFF_MIN_S * 2 ** (self._streak - 1))
            if self.stop.wait(backoff):
                return [], time.monotonic()
        called = time.monotonic()
        try:
            batch = self.consumer.poll(timeout_s)
        except Exception as exc:
            self._failed("poll", exc)
            return [], called
        returned = time.monotonic()
        if self._streak:
            log.info("share consumer: poll works again after %d failures", self._streak)
            self._streak = 0
            self._failing_since = None
        since = self._in_flight_since if self._in_flight_since is not None else called
        records = any(m.error() is None for m in batch)  # (error events end no fetch)
        self._in_flight_since = None if records else returned
        return batch, since

    def commit(self) -> None:
        """Send the acknowledgements made (``commit_async``)."""
        try:
            self.consumer.commit_async()
        except Exception as exc:
            self.errors += 1
            if _fatal(exc):
                self.fault = KafkaRuntimeError(f"share consumer fatal error: {exc}")
                return
            log.warning(
                "share consumer: commit_async failed (%s); the acknowledgements go with the "
                "next poll",
                exc,
                exc_info=not isinstance(exc, KafkaException),
            )

    def _failed(self, what: str, exc: Exception) -> None:
        self.errors += 1
        if _fatal(exc):
            self.fault = KafkaRuntimeError(f"share consumer fatal error: {exc}")
            return
        now = time.monotonic()
        if self._failing_since is None:
            self._failing_since = now
        self._streak += 1
        if self._streak == 1:  # the client's own errors need no traceback, anything else does
            expected = isinstance(exc, KafkaException)
            log.log(
                logging.WARNING if expected else logging.ERROR,
                "share consumer: %s failed (%s: %s); polling again after a backoff",
                what,
                type(exc).__name__,
                exc,
                exc_info=not expected,
            )
        else:
            log.warning(
                "share consumer: %s failed again (%d in a row, %.1fs): %s",
                what,
                self._streak,
                now - self._failing_since,
                exc,
            )
        if now - self._failing_since >= self.max_failing_s:
            self.fault = KafkaRuntimeError(
                f"share consumer: every {what} failed for {now - self._failing_since:.1f}s "
                f"(max_poll_interval_ms), the last with {type(exc).__name__}: {exc}; "
                "stopping so that the process is restarted"
            )


def _fatal(exc: Exception) -> bool:
    err = exc.args[0] if isinstance(exc, KafkaException) and exc.args else None
    return isinstance(err, KafkaError) and err.fatal()
