"""Where a failed message goes and what its routed copy carries."""

from __future__ import annotations

from dataclasses import dataclass

from retryd.policy.classify import HandlerResult, Outcome
from retryd.policy.headers import (
    DEAD_EXHAUSTED,
    DEAD_MALFORMED,
    DEAD_NON_RETRYABLE,
    Envelope,
    Headers,
    decode_lenient,
    routed_headers,
)
from retryd.policy.sequence import RetryPlan, is_topic_name


@dataclass(frozen=True, slots=True)
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
    """``route_failure`` with every per-plan fact computed once: the destination of each
    retry number (tier name formatting is not free) and the routing group."""

    __slots__ = ("_dead", "_next", "group", "plan")

    def __init__(self, plan: RetryPlan, group: str | None = None) -> None:
        self.plan = plan
        self.group = group or plan.group or None
        self._next = [plan.next_destination(n) for n in range(plan.max_retries + 1)]
        self._dead = plan.dead_destination

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
        retries = envelope.retry_number
        if result.outcome is Outcome.DEAD:
            dest = self._dead(retries)
            reason: str | None = DEAD_NON_RETRYABLE
        elif result.outcome is Outcome.RETRY:
            dest = self._next[retries] if retries < len(self._next) else self._dead(retries)
            reason = DEAD_EXHAUSTED if dest.is_dead else None
        else:
            raise ValueError(f"no route for outcome {result.outcome}")
        due = None if dest.delay_ms is None else now_ms + dest.delay_ms
        env = envelope.failed_again(
            retry_number=dest.retry_number,
            due_ms=due,
            now_ms=now_ms,
            error_class=result.error_class or "unknown",
            error_message=result.error_message or "",
            dead_reason=reason,
            group=self.group,
        )
        return Route(
            dest.topic, routed_headers(source_headers, env), now_ms, dest.retry_number, due, reason
        )


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
    """A tier message whose retryd headers are unusable: dead-letter it, keep what parses."""
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
