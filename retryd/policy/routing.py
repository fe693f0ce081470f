"""Where a failed message goes and what its routed copy carries."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

from retryd.policy.classify import HandlerResult, Outcome
from retryd.policy.headers import (
    DEAD_EXHAUSTED,
    DEAD_MALFORMED,
    DEAD_NON_RETRYABLE,
    DEAD_REASON,
    ERROR_CLASS,
    ERROR_CLASS_MAX_BYTES,
    ERROR_MESSAGE,
    FIRST_FAILURE_TIMESTAMP,
    GROUP,
    ORIGINAL_OFFSET,
    ORIGINAL_PARTITION,
    ORIGINAL_TIMESTAMP,
    ORIGINAL_TOPIC,
    RETRY_NUMBER,
    RETRY_TIMESTAMP,
    Envelope,
    Headers,
    clean_headers,
    decode_lenient,
    routed_headers,
    truncate_utf8,
    user_headers,
)
from retryd.policy.sequence import RetryPlan, is_topic_name


# Not frozen: a frozen dataclass costs ~2 µs to build (object.__setattr__ per field) and
# one is built per failed record. Treat instances as values: never mutate one.
@dataclass(slots=True)
class Route:
    topic: str
    headers: Headers
    timestamp_ms: int  # CreateTime of the routed copy: the produce time
    retry_number: int
    due_ms: int | None
    dead_reason: str | None

    @property
    def is_dead(self) -> bool:
        return self.dead_reason is not None


class RoutePlanner:
    """``route_failure`` for the worker's hot path: every per-plan fact is computed once (the
    destination of each retry number, header values that never change), and a routed copy's
    headers are built in one pass instead of through intermediate envelopes."""

    __slots__ = (
        "_backoff",
        "_classes",
        "_dead",
        "_draw",
        "_group_header",
        "_next",
        "_numbers",
        "_topics",
        "group",
        "plan",
    )

    MAX_CACHED = 4096  # topic names and error classes are code and config, not data

    def __init__(
        self,
        plan: RetryPlan,
        group: str | None = None,
        draw: Callable[[], float] = random.random,
    ) -> None:
        self.plan = plan
        self._backoff = plan.backoff if plan.jitter else None
        self._draw = draw  # uniform in [0, 1): the jitter of each due time
        self.group = group or plan.group or None
        self._next = [plan.next_destination(n) for n in range(plan.max_retries + 1)]
        self._dead = plan.dead_destination
        self._numbers = [b"%d" % n for n in range(plan.max_retries + 2)]
        self._group_header = (GROUP, self.group.encode()) if self.group else None
        self._topics: dict[str, bytes] = {}
        self._classes: dict[str, bytes] = {}

    def failure(
        self,
        envelope: Envelope,
        source_headers: list[tuple[str, bytes | None]] | None,
        result: HandlerResult,
        now_ms: int,
    ) -> Route:
        """The routed copy for a RETRY or DEAD handler result.

        ``envelope.retry_number`` is how many retries the failing copy had already been
        scheduled.
        """
        return self.route(
            envelope.original_topic,
            envelope.original_partition,
            envelope.original_offset,
            envelope.original_timestamp,
            envelope.retry_number,
            envelope.first_failure_timestamp,
            source_headers,
            result,
            now_ms,
        )

    def route(
        self,
        original_topic: str,
        original_partition: int,
        original_offset: int,
        original_timestamp: int,
        retries: int,
        first_failure_ms: int | None,
        source_headers: list[tuple[str, bytes | None]] | None,
        result: HandlerResult,
        now_ms: int,
    ) -> Route:
        """``failure`` from the envelope's fields (a main-topic record has no envelope yet)."""
        if result.outcome is Outcome.DEAD:
            dest = self._dead(retries)
            reason: str | None = DEAD_NON_RETRYABLE
        elif result.outcome is Outcome.RETRY:
            dest = self._next[retries] if retries < len(self._next) else self._dead(retries)
            reason = DEAD_EXHAUSTED if dest.is_dead else None
        else:
            raise ValueError(f"no route for outcome {result.outcome}")
        if dest.delay_ms is None:
            due = None
        elif self._backoff is None:
            due = now_ms + dest.delay_ms
        else:
            due = self._backoff.due_ms(dest.delay_ms, now_ms, self._draw)
        headers = user_headers(source_headers) if source_headers else []
        append = headers.append
        n = dest.retry_number
        append((RETRY_NUMBER, self._numbers[n] if n < len(self._numbers) else b"%d" % n))
        if due is not None:
            append((RETRY_TIMESTAMP, b"%d" % due))
        topic = self._topics.get(original_topic)
        if topic is None:
            topic = original_topic.encode("utf-8", errors="replace")
            if len(self._topics) < self.MAX_CACHED:
                self._topics[original_topic] = topic
        append((ORIGINAL_TOPIC, topic))
        append((ORIGINAL_PARTITION, b"%d" % original_partition))
        append((ORIGINAL_OFFSET, b"%d" % original_offset))
        append((ORIGINAL_TIMESTAMP, b"%d" % original_timestamp))
        append((FIRST_FAILURE_TIMESTAMP, b"%d" % (first_failure_ms or now_ms)))
        error_class = result.error_class or "unknown"
        encoded = self._classes.get(error_class)
        if encoded is None:
            encoded = truncate_utf8(error_class, ERROR_CLASS_MAX_BYTES)
            if len(self._classes) < self.MAX_CACHED:
                self._classes[error_class] = encoded
        append((ERROR_CLASS, encoded))
        append((ERROR_MESSAGE, truncate_utf8(result.error_message or "")))
        if reason is not None:
            append((DEAD_REASON, reason.encode("ascii")))
        if self._group_header is not None:
            append(self._group_header)
        return Route(dest.topic, headers, now_ms, n, due, reason)


def route_failure(
    plan: RetryPlan,
    envelope: Envelope,
    source_headers: list[tuple[str, bytes | None]] | None,
    result: HandlerResult,
    now_ms: int,
) -> Route:
    """One-off ``RoutePlanner(plan).failure(...)`` (the worker keeps a planner)."""
    return RoutePlanner(plan).failure(envelope, source_headers, result, now_ms)


def route_malformed(
    plan: RetryPlan,
    topic: str,
    partition: int,
    offset: int,
    timestamp_ms: int,
    source_headers: list[tuple[str, bytes | None]] | None,
    problem: str,
    now_ms: int,
    group: str | None = None,
) -> Route:
    """A tier message whose retryd headers are unusable: dead-letter it, keep what parses.

    Never raises on any ``source_headers`` (any names, values, sizes, repeats; see
    ``clean_headers``): it is how the poll thread gets rid of a record it cannot read."""
    source_headers = clean_headers(source_headers)
    parsed = decode_lenient(source_headers)

    def _int(name: str, default: int) -> int:
        value = parsed.get(name)
        return value if isinstance(value, int) else default

    orig_topic = parsed.get("retryd_original_topic")
    env = Envelope(
        original_topic=orig_topic
        if isinstance(orig_topic, str) and is_topic_name(orig_topic)
        else topic,
        original_partition=_int("retryd_original_partition", partition),
        original_offset=_int("retryd_original_offset", offset),
        original_timestamp=_int("retryd_original_timestamp", timestamp_ms),
        retry_number=_int("retry_number", 0),
        first_failure_timestamp=_int("retryd_first_failure_timestamp", now_ms),
        error_class="malformed_headers",
        error_message=f"{topic}[{partition}]@{offset}: {problem}",
        dead_reason=DEAD_MALFORMED,
        group=group or plan.group or None,
    )
    headers = routed_headers(source_headers, env)
    return Route(plan.failed_topic, headers, now_ms, env.retry_number, None, DEAD_MALFORMED)


def target_partition(source_partition: int, target_partitions: int | None) -> int | None:
    """Same partition number as the source when the target has it; else None (keyed by the
    producer's partitioner, like the source)."""
    if target_partitions is not None and 0 <= source_partition < target_partitions:
        return source_partition
    return None
