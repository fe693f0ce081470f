"""The spec's metric set.

Worker processes and the sidecar aggregate through prometheus-client's multiprocess mode:
``PROMETHEUS_MULTIPROC_DIR`` must be set by the CLI before this module is first imported.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import Counter, Gauge, Histogram

from retryd import __version__

_LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
_LATENESS_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600)

MESSAGES = Counter("retryd_messages", "Messages by topic and outcome", ["topic", "outcome"])
DEAD_LETTERS = Counter("retryd_dead_letters", "Messages dead-lettered, by reason", ["reason"])
HANDLER_DURATION = Histogram(
    "retryd_handler_duration_seconds", "Handler call duration", ["topic"], buckets=_LATENCY_BUCKETS
)
DUE_LATENESS = Histogram(
    "retryd_due_lateness_seconds",
    "Processing start minus retry_timestamp for tier messages",
    ["topic"],
    buckets=_LATENESS_BUCKETS,
)
PAUSED_PARTITIONS = Gauge(
    "retryd_paused_partitions",
    "Partitions paused waiting for a due time",
    ["topic"],
    multiprocess_mode="livesum",
)
CONSUMER_LAG = Gauge(
    "retryd_consumer_lag",
    "High watermark minus consumer position",
    ["topic", "partition"],
    multiprocess_mode="livemax",
)
REBALANCES = Counter("retryd_rebalances", "Rebalance events by kind", ["kind"])
REPLAYED = Counter("retryd_replayed", "Replayed failed records by status", ["status"])
BUILD_INFO = Gauge("retryd_build_info", "retryd version", ["version"], multiprocess_mode="livemax")


def mark_build_info() -> None:
    BUILD_INFO.labels(version=__version__).set(1)


class HotPath:
    """Label children cached by label values: ``labels()`` costs microseconds per call, too much
    to pay several times per message."""

    def __init__(self) -> None:
        self._messages: dict[tuple[str, str], Any] = {}
        self._duration: dict[str, Any] = {}
        self._lateness: dict[str, Any] = {}

    def message(self, topic: str, outcome: str) -> None:
        child = self._messages.get((topic, outcome))
        if child is None:
            child = self._messages[(topic, outcome)] = MESSAGES.labels(topic=topic, outcome=outcome)
        child.inc()

    def handler_seconds(self, topic: str, seconds: float) -> None:
        child = self._duration.get(topic)
        if child is None:
            child = self._duration[topic] = HANDLER_DURATION.labels(topic=topic)
        child.observe(seconds)

    def lateness_seconds(self, topic: str, seconds: float) -> None:
        child = self._lateness.get(topic)
        if child is None:
            child = self._lateness[topic] = DUE_LATENESS.labels(topic=topic)
        child.observe(seconds)
