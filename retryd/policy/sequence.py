"""Retry sequences (``5m,5m,30m``): parsing, tier naming and the attempt → destination rule."""

from __future__ import annotations

import re
from dataclasses import dataclass

from retryd.errors import SequenceError

_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
# re.ASCII: \d must not accept digits of other scripts (Arabic-Indic five is not a delay).
_DELAY_RE = re.compile(r"^\s*(\d+)\s*(ms|s|m|h|d)\s*$", re.ASCII)
# Upper bound keeps due times and tier retention (factor x delay) far inside int64 milliseconds.
MAX_DELAY_MS = 365 * _UNIT_MS["d"]
# Tier topic names must stay valid Kafka topic names: [a-zA-Z0-9._-], at most 249 chars.
_TOPIC_RE = re.compile(r"^[A-Za-z0-9._-]{1,249}\Z", re.ASCII)


def parse_delay(text: str) -> int:
    """Return the delay in milliseconds for ``'500ms'``, ``'5m'``, ``'1h'``, …"""
    match = _DELAY_RE.match(text)
    if match is None:
        raise SequenceError(
            f"invalid delay {text!r}: expected a whole number with a unit ms|s|m|h|d, e.g. '5m'"
        )
    value = int(match.group(1))
    if value <= 0:
        raise SequenceError(f"invalid delay {text!r}: must be greater than zero")
    delay_ms = value * _UNIT_MS[match.group(2)]
    if delay_ms > MAX_DELAY_MS:
        raise SequenceError(f"invalid delay {text!r}: must be at most 365d")
    return delay_ms


def format_delay(delay_ms: int) -> str:
    """Canonical short name of a delay, used in tier topic names: the largest exact unit."""
    for unit in ("d", "h", "m", "s"):
        size = _UNIT_MS[unit]
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

    @classmethod
    def parse(
        cls,
        sequence: str,
        *,
        tier_template: str = "retry_{delay}",
        failed_topic: str,
        group: str = "",
    ) -> RetryPlan:
        parts = [p for p in sequence.split(",")]
        if not sequence.strip() or any(not p.strip() for p in parts):
            raise SequenceError(
                f"invalid retry sequence {sequence!r}: expected a comma list such as '5m,30m,1h'"
            )
        delays = tuple(parse_delay(p) for p in parts)
        if "{delay}" not in tier_template:
            raise SequenceError(f"tier template {tier_template!r} must contain '{{delay}}'")
        plan = cls(delays, tier_template, failed_topic, group)
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
