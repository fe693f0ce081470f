"""Consumer lag from librdkafka's statistics, for the partitions this process owns.

Built before the consumer (its statistics callback is part of the consumer's configuration),
it reads the same ownership map the partition book later fills.
"""

from __future__ import annotations

from collections.abc import Mapping

from retryd.worker.events import Sink
from retryd.worker.partition import PartitionState, partition_lags


class LagReporter:
    def __init__(self, events: Sink, owned: Mapping[tuple[str, int], PartitionState]) -> None:
        self.events = events
        self.owned = owned

    def on_stats(self, raw: str) -> None:
        lags = {tp: lag for tp, lag in partition_lags(raw).items() if tp in self.owned}
        if lags:
            self.events.lag(lags)
