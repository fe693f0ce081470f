"""Retry sequences (``5m,5m,30m``, or a policy: ``retryd.policy.backoff``): tier naming and the
attempt → destination rule.

A plan is ``retry_sequence`` plus its error routes (``retryd.policy.error_routes``): the tiers
of every route's sequence belong to the plan, one tier topic per distinct delay whichever
sequences use it, so the workers consume, bound and release them like the default sequence's.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from retryd.errors import SequenceError
from retryd.policy.backoff import MAX_DELAY_MS, UNIT_MS, Backoff, parse_backoff, parse_delay
from retryd.policy.error_routes import (
    ErrorRoute,
    ErrorRouteError,
    Target,
    parse_error_routes,
)

__all__ = [
    "MAX_DELAY_MS",
    "MAX_TIER_TOPICS",
    "Destination",
    "RetryPlan",
    "format_delay",
    "is_topic_name",
    "parse_delay",
    "validate_topic_name",
]

# Tier topic names must stay valid Kafka topic names: [a-zA-Z0-9._-], at most 249 chars.
_TOPIC_RE = re.compile(r"^[A-Za-z0-9._-]{1,249}\Z", re.ASCII)
# Every tier topic is consumed by every tier worker of the group: the default sequence and all
# routes together stay within the bound of one sequence.
MAX_TIER_TOPICS = 64


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
    """A parsed retry sequence and its error routes, bound to topic names."""

    delays_ms: tuple[int, ...]
    tier_template: str
    failed_topic: str
    group: str = ""
    # The largest jitter of any sequence of the plan (the default's and every route's): how far
    # a due time in a tier may move, so whether tiers release in offset order.
    jitter: float = 0.0
    quick: int = 0  # in-place retries on the main topic before the first tier
    quick_delay_ms: int = 0
    routes: tuple[ErrorRoute, ...] = ()
    default_jitter: float | None = None  # retry_sequence's own jitter; None: ``jitter``
    first_delay_ms: int = 0  # main-topic records wait this long before their first attempt

    @classmethod
    def parse(
        cls,
        sequence: str,
        *,
        tier_template: str = "retry_{delay}",
        failed_topic: str,
        group: str = "",
        routes: Mapping[str, str] | None = None,
    ) -> RetryPlan:
        backoff = parse_backoff(sequence)
        if "{delay}" not in tier_template:
            raise SequenceError(f"tier template {tier_template!r} must contain '{{delay}}'")
        parsed = parse_error_routes(routes) if routes else ()
        plan = cls(
            backoff.delays_ms,
            tier_template,
            failed_topic,
            group,
            max([backoff.jitter, *(r.jitter for r in parsed)]),
            backoff.quick,
            backoff.quick_delay_ms,
            parsed,
            backoff.jitter,
            backoff.first_delay_ms,
        )
        for topic in [*plan.tier_topics, failed_topic]:
            validate_topic_name(topic)
        if failed_topic in plan.tier_topics:
            raise SequenceError(f"failed_topic {failed_topic!r} collides with a tier topic name")
        if parsed:
            plan._check_routes()
        return plan

    def _check_routes(self) -> None:
        """Cross-checks of the routes against the plan's topics; raises ErrorRouteError."""
        problems = []
        tiers = set(self.tier_topics)
        for route in self.routes:
            topic = route.topic
            if route.target is not Target.DLT or topic is None:
                continue
            where = f"error_routes: route {route.name!r} = {route.text!r}"
            if not is_topic_name(topic):
                problems.append(
                    f"{where}: invalid dead-letter topic {topic!r}: use 1-249 characters from "
                    "[A-Za-z0-9._-]"
                )
            elif topic == self.failed_topic:
                problems.append(f"{where}: that is failed_topic: write 'dead'")
            elif topic in tiers:
                problems.append(f"{where}: {topic!r} is a tier topic of this plan")
        if len(tiers) > MAX_TIER_TOPICS:
            problems.append(
                f"error_routes: retry_sequence and the routes need {len(tiers)} tier topics "
                f"(one per distinct delay), at most {MAX_TIER_TOPICS}: let routes share delays"
            )
        if problems:
            raise ErrorRouteError(problems)

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
    def sequences(self) -> list[Backoff]:
        """retry_sequence's backoff, then every sequence route's."""
        return [self.backoff, *(r.backoff for r in self.routes if r.backoff is not None)]

    @property
    def tier_topics(self) -> list[str]:
        """Distinct tier topics: retry_sequence's in order, then those only routes use."""
        return list(self.tier_delays)

    @property
    def tier_delays(self) -> dict[str, int]:
        return {self.tier_topic(d): d for b in self.sequences for d in b.delays_ms}

    @property
    def dlt_topics(self) -> list[str]:
        """The named dead-letter topics of the routes (``dlt:<topic>``), distinct, in order."""
        return list(dict.fromkeys(r.topic for r in self.routes if r.topic is not None))

    @property
    def backoff(self) -> Backoff:
        """retry_sequence's own delays, jitter and quick retries."""
        jitter = self.jitter if self.default_jitter is None else self.default_jitter
        return Backoff(self.delays_ms, jitter, self.quick, self.quick_delay_ms, self.first_delay_ms)

    def _tier_jitter(self) -> dict[str, tuple[int, float]]:
        """Per tier topic, its delay and the largest jitter of the sequences that use it."""
        out: dict[str, tuple[int, float]] = {}
        for b in self.sequences:
            for d in b.delays_ms:
                topic = self.tier_topic(d)
                seen = out.get(topic)
                out[topic] = (d, b.jitter if seen is None else max(seen[1], b.jitter))
        return out

    @property
    def tier_floors(self) -> dict[str, int]:
        """Per tier topic, the earliest a copy can be due after it was routed (its delay minus
        the largest jitter): how soon a record not yet fetched can come due."""
        return {topic: d - int(d * j) for topic, (d, j) in self._tier_jitter().items()}

    @property
    def tier_bounds(self) -> dict[str, int]:
        """Per tier topic, the latest a copy can be due after it was routed (its delay plus
        the largest jitter): how far a tier consumer lets a record wait past its own time."""
        return {
            topic: Backoff((d,), j).bound_ms(d) for topic, (d, j) in self._tier_jitter().items()
        }

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
