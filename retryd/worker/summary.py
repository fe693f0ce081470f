"""What one worker run did: counts a caller (tests, ``retryd dev``, batch jobs) can report.

A ``Sink`` of the worker's event stream, like the Prometheus metrics.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from retryd.worker.events import BatchStats, NullSink


@dataclass
class RunSummary(NullSink):
    outcomes: Counter[tuple[str, str]] = field(default_factory=Counter)  # (topic, outcome)
    dead_reasons: Counter[str] = field(default_factory=Counter)
    skipped: Counter[str] = field(default_factory=Counter)
    rebalances: Counter[str] = field(default_factory=Counter)
    abandoned_calls: int = 0
    quick_retries: int = 0  # handler calls made again in place
    quick_rescued: int = 0  # records a quick retry turned into a success
    key_order_events: Counter[str] = field(default_factory=Counter)  # parked, released, ...
    blocked_keys: int = 0  # strict order: keys with a chain, at the last look
    first_message_at: float | None = None  # monotonic: first batch with records
    last_message_at: float | None = None  # monotonic: end of the last batch with records

    # -- Sink
    def batch(self, stats: BatchStats, started: float, ended: float) -> None:
        if stats.records or stats.outcomes:
            if self.first_message_at is None:
                self.first_message_at = started
            self.last_message_at = ended
        self.outcomes.update(stats.outcomes)
        self.dead_reasons.update(stats.dead)
        self.skipped.update(stats.skipped)
        self.quick_retries += stats.quick_retries
        self.quick_rescued += stats.quick_rescued
        self.key_order_events.update(stats.key_order)

    def rebalance(self, kind: str, count: int) -> None:
        self.rebalances[kind] += 1

    def abandoned(self, total: int) -> None:
        self.abandoned_calls = total

    def key_order(self, blocked_keys: int, entries: int, oldest_s: float) -> None:
        self.blocked_keys = blocked_keys

    # -- reading
    @property
    def busy_seconds(self) -> float:
        """From the first consumed message to the last one handled (excludes group join)."""
        if self.first_message_at is None or self.last_message_at is None:
            return 0.0
        return self.last_message_at - self.first_message_at

    def count(self, topic: str, outcome: str) -> None:
        self.outcomes[(topic, outcome)] += 1

    def total(self, outcome: str) -> int:
        return sum(n for (_, o), n in self.outcomes.items() if o == outcome)

    def by_topic(self) -> dict[str, dict[str, int]]:
        out: dict[str, dict[str, int]] = {}
        for (topic, outcome), n in sorted(self.outcomes.items()):
            out.setdefault(topic, {})[outcome] = n
        return out

    def as_dict(self) -> dict[str, object]:
        return {
            "by_topic": self.by_topic(),
            "dead_reasons": dict(self.dead_reasons),
            "skipped": dict(self.skipped),
            "rebalances": dict(self.rebalances),
            "abandoned_calls": self.abandoned_calls,
            "quick_retries": self.quick_retries,
            "quick_rescued": self.quick_rescued,
        }
