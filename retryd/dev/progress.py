"""Live numbers for ``retryd dev``, read from the workers' multiprocess metric files."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from prometheus_client import CollectorRegistry
from prometheus_client.multiprocess import MultiProcessCollector


@dataclass
class Snapshot:
    outcomes: Counter[tuple[str, str]] = field(default_factory=Counter)  # (topic, outcome)
    dead: Counter[str] = field(default_factory=Counter)
    paused: Counter[str] = field(default_factory=Counter)

    def processed(self, topic: str) -> int:
        return sum(n for (t, _), n in self.outcomes.items() if t == topic)

    def total(self, outcome: str) -> int:
        return sum(n for (_, o), n in self.outcomes.items() if o == outcome)


def snapshot(metrics_dir: Path) -> Snapshot:
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(metrics_dir))
    snap = Snapshot()
    for metric in registry.collect():
        for sample in metric.samples:
            if sample.name == "retryd_messages_total":
                snap.outcomes[(sample.labels["topic"], sample.labels["outcome"])] += int(
                    sample.value
                )
            elif sample.name == "retryd_dead_letters_total":
                snap.dead[sample.labels["reason"]] += int(sample.value)
            elif sample.name == "retryd_paused_partitions":
                snap.paused[sample.labels["topic"]] += int(sample.value)
    return snap
