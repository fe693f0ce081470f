"""Retry sequences (``5m,5m,30m``, or a policy: ``retryd.policy.backoff``): tier naming and the
attempt → destination rule."""

from __future__ import annotations

import re
from dataclasses import dataclass

from retryd.errors import SequenceError
from retryd.policy.backoff import MAX_DELAY_MS, UNIT_MS, Backoff, parse_backoff, parse_delay

__all__ = [
    "MAX_DELAY_MS",
    "Destination",
    "RetryPlan",
    "format_delay",
    "is_topic_name",
    "parse_delay",
    "validate_topic_name",
]

# Tier topic names must stay valid Kafka topic names: [a-zA-Z0-9._-], at most 249 chars.
_TOPIC_RE = re.compile(r"^[A-Za-z0-9._-]{1,249}\Z", re.ASCII)


def format_delay(delay_ms: int) -> str:
    """Canonical short name of a delay, used in tier topic names: the largest exact unit."""
    for unit in ("d", "h", "m", "s"):
        size = UNIT_MS[unit]
        if delay_ms % size == 0:
            return f"{delay_ms // size}{unit}"
    return f"{delay_ms}ms"


def is_topic_name(name: str) -> bool:
    """A valid Kafka topic name: 1-249 characters from [A-Za-z0-9._-], not '.' or '..'."""
    return _TOPIC_RE.match(name) is not None and name not in {".", ".."}


def validate_topic_name(name: str) -> None:
    if not is_topic_name(name):
        raise SequenceError(
            f"invalid topic name {name!r}: use 1-249 characters from [A-Za-z0-9._-]"
        )


@dataclass(frozen=True, slots=True)
class Destination:
    """Where a failed copy goes next: a tier (with its delay) or the dead-letter topic."""

    topic: str
    delay_ms: int | None  # None for failed_topic
    retry_number: int  # value of the retry_number header on the routed copy

    @property
    def is_dead(self) -> bool:
        return self.delay_ms is None


@dataclass(frozen=True, slots=True)
class RetryPlan:
    """A parsed retry sequence bound to topic names."""

    delays_ms: tuple[int, ...]
    tier_template: str
    failed_topic: str
    group: str = ""
    jitter: float = 0.0  # fraction of each delay a due time may move (backoff policy)
    quick: int = 0  # in-place retries on the main topic before the first tier
    quick_delay_ms: int = 0

    @classmethod
    def parse(
        cls,
        sequence: str,
        *,
        tier_template: str = "retry_{delay}",
        failed_topic: str,
        group: str = "",
    ) -> RetryPlan:
        backoff = parse_backoff(sequence)
        if "{delay}" not in tier_template:
            raise SequenceError(f"tier template {tier_template!r} must contain '{{delay}}'")
        plan = cls(
            backoff.delays_ms,
            tier_template,
            failed_topic,
            group,
            backoff.jitter,
            backoff.quick,
            backoff.quick_delay_ms,
        )
        for topic in [*plan.tier_topics, failed_topic]:
            validate_topic_name(topic)
        if failed_topic in plan.tier_topics:
            raise SequenceError(f"failed_topic {failed_topic!r} collides with a tier topic name")
        return plan

    @property
    def max_retries(self) -> int:
        return len(self.delays_ms)

    def tier_topic(self, delay_ms: int) -> str:
        try:
            return self.tier_template.format(delay=format_delay(delay_ms), group=self.group)
        except (KeyError, IndexError, ValueError) as exc:
            raise SequenceError(
                f"tier template {self.tier_template!r} may only use {{delay}} and {{group}}"
            ) from exc

    @property
    def tier_topics(self) -> list[str]:
        """Distinct tier topics in sequence order: one per distinct delay."""
        seen: dict[str, None] = {}
        for delay in self.delays_ms:
            seen.setdefault(self.tier_topic(delay), None)
        return list(seen)

    @property
    def tier_delays(self) -> dict[str, int]:
        return {self.tier_topic(d): d for d in self.delays_ms}

    @property
    def backoff(self) -> Backoff:
        return Backoff(self.delays_ms, self.jitter, self.quick, self.quick_delay_ms)

    @property
    def tier_floors(self) -> dict[str, int]:
        """Per tier topic, the earliest a copy can be due after it was routed (its delay minus
        the largest jitter): how soon a record not yet fetched can come due."""
        return {topic: d - int(d * self.jitter) for topic, d in self.tier_delays.items()}

    @property
    def tier_bounds(self) -> dict[str, int]:
        """Per tier topic, the latest a copy can be due after it was routed (its delay plus
        the largest jitter): how far a tier consumer lets a record wait past its own time."""
        backoff = self.backoff
        return {topic: backoff.bound_ms(d) for topic, d in self.tier_delays.items()}

    def next_destination(self, retries_so_far: int) -> Destination:
        """After ``retries_so_far`` scheduled retries failed again, where does the copy go?

        Attempt n (1-based) uses delay n; past the end of the sequence the copy is exhausted.
        """
        if retries_so_far < 0:
            raise ValueError("retries_so_far must be >= 0")
        n = retries_so_far + 1
        if n > len(self.delays_ms):
            return Destination(self.failed_topic, None, retries_so_far)
        delay = self.delays_ms[n - 1]
        return Destination(self.tier_topic(delay), delay, n)

    def dead_destination(self, retries_so_far: int) -> Destination:
        return Destination(self.failed_topic, None, retries_so_far)
