"""What the worker knows about one assigned partition."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from retryd.worker.offsets import OffsetTracker


@dataclass
class PartitionState:
    tracker: OffsetTracker = field(default_factory=OffsetTracker)
    paused: bool = False
    position: int | None = None  # next offset to consume
    eof_at: int | None = None  # high watermark reported by the last end-of-partition event
    known_end: int = 0  # one past the highest offset we know exists (from our own deliveries)

    def drained(self) -> bool:
        """At the end of the partition as far as we know, with nothing in progress."""
        if self.paused or self.tracker.pending or self.eof_at is None:
            return False
        position = self.eof_at if self.position is None else self.position
        return position >= max(self.eof_at, self.known_end)


def partition_lags(raw_stats: str) -> dict[tuple[str, int], int]:
    """Consumer lag per partition from librdkafka's statistics JSON (unknown lags left out)."""
    try:
        stats = json.loads(raw_stats)
    except ValueError:
        return {}
    out: dict[tuple[str, int], int] = {}
    for topic, tdata in stats.get("topics", {}).items():
        for pid, pdata in tdata.get("partitions", {}).items():
            lag = pdata.get("consumer_lag", -1)
            if pid != "-1" and isinstance(lag, int) and lag >= 0:
                out[(topic, int(pid))] = lag
    return out
