"""What one worker run did: counts a caller (tests, ``retryd dev``, batch jobs) can report."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field


@dataclass
class RunSummary:
    outcomes: Counter[tuple[str, str]] = field(default_factory=Counter)  # (topic, outcome)
    dead_reasons: Counter[str] = field(default_factory=Counter)
    rebalances: Counter[str] = field(default_factory=Counter)
    first_message_at: float | None = None  # monotonic: first batch with messages
    last_message_at: float | None = None  # monotonic: end of the last batch with messages

    def batch_done(self, started: float, ended: float) -> None:
        if self.first_message_at is None:
            self.first_message_at = started
        self.last_message_at = ended

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
            "rebalances": dict(self.rebalances),
        }
