"""What one worker run did: counts a caller (tests, ``retryd dev``, batch jobs) can report."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field


@dataclass
class RunSummary:
    outcomes: Counter[tuple[str, str]] = field(default_factory=Counter)  # (topic, outcome)
    dead_reasons: Counter[str] = field(default_factory=Counter)
    rebalances: Counter[str] = field(default_factory=Counter)

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
