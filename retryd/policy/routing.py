"""Where a failed message goes and what its routed copy carries.

Error routes (``retryd.policy.error_routes``) decide per failure, in this order:

1. A non-retryable failure is never retried: a matching ``dlt:``/``dead`` route takes it,
   otherwise it goes to ``failed_topic`` (``non_retryable``).
2. A retryable failure takes the route its class matches (most specific first, see
   error_routes); a ``dlt:`` route dead-letters it there (``routed``), ``dead`` to
   ``failed_topic`` (``non_retryable``), a sequence route schedules its next delay.
3. A retryable failure that matches no route stays on the route its record is on (the
   ``retryd_route`` header of a tier record), or on ``retry_sequence`` if it is on none.

``retry_number`` counts every retry of the record whatever the route: a record whose failure
switches it to another sequence continues at its position there (its next retry uses that
sequence's delay n + 1; a sequence shorter than that is exhausted), so a record whose errors
alternate between classes is still retried at most as often as the longest sequence allows.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass

from retryd.policy.backoff import Backoff
from retryd.policy.classify import HandlerResult, Outcome
from retryd.policy.error_routes import ErrorRoute, Match, Target
from retryd.policy.headers import (
    DEAD_EXHAUSTED,
    DEAD_MALFORMED,
    DEAD_NON_RETRYABLE,
    DEAD_REASON,
    DEAD_ROUTED,
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
    ROUTE,
    Envelope,
    Headers,
    clean_headers,
    decode_lenient,
    routed_headers,
    truncate_utf8,
    user_headers,
)
from retryd.policy.sequence import Destination, RetryPlan, is_topic_name


def planning_now_ms() -> int:
    """Now in whole milliseconds, rounded up: the ``now`` a failure is planned from. A due
    time is ``now + delay`` in the millisecond header ``retry_timestamp``; rounded down, it
    could fall up to a millisecond before the failure plus its delay, and a tier hands a
    record back at its due time: never early means rounding up."""
    return -(-time.time_ns() // 1_000_000)


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


class _Lane:
    """One error route as the planner applies it: everything per route computed once."""

    __slots__ = ("backoff", "dead", "header", "next", "reason", "route")

    def __init__(self, route: ErrorRoute, plan: RetryPlan) -> None:
        self.route = route
        self.header = (ROUTE, route.name.encode("ascii"))
        backoff = route.backoff
        self.backoff: Backoff | None = backoff if backoff is not None and backoff.jitter else None
        delays = route.delays_ms
        self.next = [Destination(plan.tier_topic(d), d, n) for n, d in enumerate(delays, start=1)]
        if route.target is Target.DLT:
            assert route.topic is not None
            self.dead: str | None = route.topic
            self.reason: str | None = DEAD_ROUTED
        elif route.target is Target.DEAD:
            self.dead, self.reason = plan.failed_topic, DEAD_NON_RETRYABLE
        else:
            self.dead, self.reason = None, None


_NO_ROUTE: _Lane | None = None


class RoutePlanner:
    """``route_failure`` for the worker's hot path: every per-plan fact is computed once (the
    destination of each retry number, header values that never change), and a routed copy's
    headers are built in one pass instead of through intermediate envelopes."""

    __slots__ = (
        "_backoff",
        "_by_class",
        "_by_name",
        "_by_status",
        "_classes",
        "_dead",
        "_draw",
        "_group_header",
        "_lanes",
        "_next",
        "_numbers",
        "_topics",
        "_types",
        "group",
        "plan",
    )

    MAX_CACHED = 4096  # topic names and error classes are code and config, not data
    MAX_TYPES = 1024  # exception types seen by the route matcher (code, not data)

    def __init__(
        self,
        plan: RetryPlan,
        group: str | None = None,
        draw: Callable[[], float] = random.random,
    ) -> None:
        self.plan = plan
        own = plan.backoff
        self._backoff = own if own.jitter else None
        self._draw = draw  # uniform in [0, 1): the jitter of each due time
        self.group = group or plan.group or None
        self._next = [plan.next_destination(n) for n in range(plan.max_retries + 1)]
        self._dead = plan.dead_destination
        longest = max([plan.max_retries, *(len(r.delays_ms) for r in plan.routes)])
        self._numbers = [b"%d" % n for n in range(longest + 2)]
        self._group_header = (GROUP, self.group.encode()) if self.group else None
        self._topics: dict[str, bytes] = {}
        self._classes: dict[str, bytes] = {}
        # error routes: by matcher kind; a tier record names its route (retryd_route)
        self._lanes = bool(plan.routes)
        self._by_name = {r.name: _Lane(r, plan) for r in plan.routes}
        self._by_class = {n: x for n, x in self._by_name.items() if x.route.match is Match.CLASS}
        self._by_status = {
            n: x for n, x in self._by_name.items() if x.route.match is not Match.CLASS
        }
        self._types: dict[type, _Lane | None] = {}

    def _match(self, result: HandlerResult) -> _Lane | None:
        """The route of this failure's class, most specific first (module docstring of
        ``retryd.policy.error_routes``); None when none matches."""
        cls = result.error_type
        if cls is not None:
            try:
                return self._types[cls]
            except KeyError:
                pass
            found = None
            by_class = self._by_class
            for base in cls.__mro__:
                found = by_class.get(f"{base.__module__}.{base.__qualname__}") or by_class.get(
                    base.__qualname__
                )
                if found is not None:
                    break
            if len(self._types) < self.MAX_TYPES:
                self._types[cls] = found
            return found
        name = result.error_name
        if name is not None:
            found = self._by_class.get(name)
            if found is not None:
                return found
        error_class = result.error_class
        if error_class is None:
            return None
        found = self._by_class.get(error_class)
        if found is None and len(error_class) == 8 and error_class.startswith("http_"):
            by_status = self._by_status
            found = by_status.get(error_class) or by_status.get(error_class[:6] + "xx")
        return found

    def terminal(self, result: HandlerResult) -> bool:
        """A retryable failure that an error route sends straight to a dead-letter topic
        (``dlt:``/``dead``): no retry of any kind helps it, quick retries in place included."""
        if not self._lanes or result.outcome is not Outcome.RETRY:
            return False
        lane = self._match(result)
        return lane is not None and lane.dead is not None

    def failure(
        self,
        envelope: Envelope,
        source_headers: list[tuple[str, bytes | None]] | None,
        result: HandlerResult,
        now_ms: int,
    ) -> Route:
        """The routed copy for a RETRY or DEAD handler result.

        ``envelope.retry_number`` is how many retries the failing copy had already been
        scheduled; ``envelope.route`` the error route it is on.
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
            envelope.route,
        )

    def _decide(
        self, result: HandlerResult, retries: int, on_route: str | None
    ) -> tuple[Destination, str | None, _Lane | None]:
        """``(destination, dead reason, the lane that decided or that the record stays on)``
        when error routes are configured (the module docstring's rules)."""
        lane = self._match(result)
        current = self._by_name.get(on_route) if on_route is not None else None
        if current is not None and current.dead is not None:
            current = None  # a terminal route is never a record's continuing route
        if result.outcome is Outcome.DEAD:
            if lane is not None and lane.dead is not None:
                return Destination(lane.dead, None, retries), lane.reason, lane
            return self._dead(retries), DEAD_NON_RETRYABLE, current
        if result.outcome is not Outcome.RETRY:
            raise ValueError(f"no route for outcome {result.outcome}")
        lane = lane or current
        if lane is None:
            dest = self._next[retries] if retries < len(self._next) else self._dead(retries)
            return dest, DEAD_EXHAUSTED if dest.is_dead else None, None
        if lane.dead is not None:
            return Destination(lane.dead, None, retries), lane.reason, lane
        steps = lane.next
        if retries < len(steps):
            return steps[retries], None, lane
        return self._dead(retries), DEAD_EXHAUSTED, lane

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
        on_route: str | None = None,
    ) -> Route:
        """``failure`` from the envelope's fields (a main-topic record has no envelope yet, and
        is on no route)."""
        lane = _NO_ROUTE
        backoff = self._backoff
        if self._lanes:
            dest, reason, lane = self._decide(result, retries, on_route)
            if lane is not None:
                backoff = lane.backoff
        elif result.outcome is Outcome.DEAD:
            dest = self._dead(retries)
            reason = DEAD_NON_RETRYABLE
        elif result.outcome is Outcome.RETRY:
            dest = self._next[retries] if retries < len(self._next) else self._dead(retries)
            reason = DEAD_EXHAUSTED if dest.is_dead else None
        else:
            raise ValueError(f"no route for outcome {result.outcome}")
        if dest.delay_ms is None:
            due = None
        elif backoff is None:
            due = now_ms + dest.delay_ms
        else:
            due = backoff.due_ms(dest.delay_ms, now_ms, self._draw)
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
        if lane is not None:
            append(lane.header)
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
