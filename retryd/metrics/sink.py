"""The Prometheus sink of the worker's event stream (see ``retryd.worker.events``).

Updates arrive once per poll iteration with counts already aggregated, so a batch of 500
records costs a handful of metric updates instead of a few per record. Histograms take the
iteration's bucket counts directly (``Histogram`` exposes only ``observe``, one value at a
time; adding counts to its bucket values is what ``observe`` does, n times over).
"""

from __future__ import annotations

import logging
from typing import Any

from retryd.metrics import registry as m
from retryd.policy.circuit import STATE_VALUE, CircuitSnapshot, CircuitState
from retryd.policy.headers import DEAD_REASONS
from retryd.policy.key_order import DEAD_BLOCKED
from retryd.worker.events import SKIP_OTHER_GROUP, BatchStats, Buckets, NullSink

log = logging.getLogger(__name__)


def _add(histogram_child: Any, buckets: Buckets) -> None:
    """Add a batch of observations to a histogram child."""
    values = getattr(histogram_child, "_buckets", None)
    total = getattr(histogram_child, "_sum", None)
    if values is None or total is None or len(values) != len(buckets.counts):
        # Internals differ from what this was written against: fall back to observe().
        bounds = [*buckets.bounds, float("inf")]
        for bound, n in zip(bounds, buckets.counts, strict=True):
            for _ in range(n):
                histogram_child.observe(bound)
        return
    for value, n in zip(values, buckets.counts, strict=True):
        if n:
            value.inc(n)
    total.inc(buckets.total)


class PrometheusSink(NullSink):
    def __init__(self, tier_topics: list[str]) -> None:
        self.tier_topics = tier_topics
        self._messages: dict[tuple[str, str], Any] = {}
        self._duration: dict[str, Any] = {}
        self._lateness: dict[str, Any] = {}
        self._dead: dict[str, Any] = {}
        self._skipped: dict[str, Any] = {}
        self._key_order: dict[str, Any] = {}
        self._abandoned_seen = 0
        m.HANDLER_INFLIGHT.set(0)
        # Every series a dashboard panel reads exists from the start at 0, so a quiet system's
        # panels show 0 ("nothing of that kind happened") rather than "No data" (which reads
        # as a broken exporter): each dead-letter and skip reason, each tier's lateness.
        for reason in (*DEAD_REASONS, DEAD_BLOCKED):
            self._dead[reason] = m.DEAD_LETTERS.labels(reason=reason)
        self._skipped[SKIP_OTHER_GROUP] = m.SKIPPED.labels(reason=SKIP_OTHER_GROUP)
        for topic in tier_topics:
            self._lateness[topic] = m.DUE_LATENESS.labels(topic=topic)
        m.ABANDONED.inc(0)
        # The circuit's series exist from the start (closed, nothing counted), so a panel or an
        # alert sees 0 rather than no data, and increase() counts the first transition.
        m.CIRCUIT_STATE.set(STATE_VALUE[CircuitState.CLOSED])
        # Strict key order's series too: nothing blocked, nothing parked (without strict order
        # they stay 0)
        self.key_order(0, 0, 0.0)
        for event in ("parked", "released", "duplicate", "waited", "orphan_removed"):
            self._key_order[event] = m.KEY_ORDER.labels(event=event)
        self._transitions = {
            s.value: m.CIRCUIT_TRANSITIONS.labels(to=s.value) for s in CircuitState
        }
        self._circuit_seen: dict[str, int] = {}
        self._held_seen = 0
        self._probes_seen = 0

    def batch(self, stats: BatchStats, started: float, ended: float) -> None:
        for (topic, outcome), n in stats.outcomes.items():
            child = self._messages.get((topic, outcome))
            if child is None:
                child = self._messages[(topic, outcome)] = m.MESSAGES.labels(
                    topic=topic, outcome=outcome
                )
            child.inc(n)
        for reason, n in stats.dead.items():
            child = self._dead.get(reason)
            if child is None:
                child = self._dead[reason] = m.DEAD_LETTERS.labels(reason=reason)
            child.inc(n)
        for reason, n in stats.skipped.items():
            child = self._skipped.get(reason)
            if child is None:
                child = self._skipped[reason] = m.SKIPPED.labels(reason=reason)
            child.inc(n)
        for event, n in stats.key_order.items():
            child = self._key_order.get(event)
            if child is None:
                child = self._key_order[event] = m.KEY_ORDER.labels(event=event)
            child.inc(n)
        if stats.quick_retries:
            m.QUICK_RETRIES.inc(stats.quick_retries)
        if stats.quick_rescued:
            m.QUICK_RESCUED.inc(stats.quick_rescued)
        for topic, buckets in stats.durations.items():
            child = self._duration.get(topic)
            if child is None:
                child = self._duration[topic] = m.HANDLER_DURATION.labels(topic=topic)
            _add(child, buckets)
        for topic, buckets in stats.lateness.items():
            child = self._lateness.get(topic)
            if child is None:
                child = self._lateness[topic] = m.DUE_LATENESS.labels(topic=topic)
            _add(child, buckets)

    def rebalance(self, kind: str, count: int) -> None:
        m.REBALANCES.labels(kind=kind).inc()

    def paused(self, by_topic: dict[str, int]) -> None:
        for topic in {*self.tier_topics, *by_topic}:
            m.PAUSED_PARTITIONS.labels(topic=topic).set(by_topic.get(topic, 0))

    def inflight(self, calls: int) -> None:
        m.HANDLER_INFLIGHT.set(calls)

    def key_order(self, blocked_keys: int, entries: int, oldest_s: float) -> None:
        m.KEY_ORDER_BLOCKED_KEYS.set(blocked_keys)
        m.KEY_ORDER_ENTRIES.set(entries)
        m.KEY_ORDER_OLDEST.set(oldest_s)

    def abandoned(self, total: int) -> None:
        if total > self._abandoned_seen:
            m.ABANDONED.inc(total - self._abandoned_seen)
            self._abandoned_seen = total

    def lag(self, lags: dict[tuple[str, int], int]) -> None:
        for (topic, partition), lag in lags.items():
            m.CONSUMER_LAG.labels(topic=topic, partition=str(partition)).set(lag)

    def forget(self, partitions: list[tuple[str, int]]) -> None:
        for topic, partition in partitions:
            m.CONSUMER_LAG.labels(topic=topic, partition=str(partition)).set(0)

    def circuit(self, snapshot: CircuitSnapshot) -> None:
        """The snapshot's totals are monotonic since the process started: add what is new."""
        m.CIRCUIT_STATE.set(STATE_VALUE[snapshot.state])
        for state, total in snapshot.transitions.items():
            delta = total - self._circuit_seen.get(state, 0)
            child = self._transitions.get(state)
            if delta > 0 and child is not None:
                child.inc(delta)
                self._circuit_seen[state] = total
        if snapshot.held > self._held_seen:
            m.CIRCUIT_HELD.inc(snapshot.held - self._held_seen)
            self._held_seen = snapshot.held
        if snapshot.probes > self._probes_seen:
            m.CIRCUIT_PROBES.inc(snapshot.probes - self._probes_seen)
            self._probes_seen = snapshot.probes
