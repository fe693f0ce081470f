"""What the worker reports, and who listens.

The loop does not call Prometheus and the run summary side by side: it accumulates the facts of
one poll iteration in ``BatchStats`` (plain counters and histogram bucket counts, a few hundred
nanoseconds per record) and publishes them once per iteration to every ``Sink``. Prometheus
(``metrics.sink.PrometheusSink``) and ``RunSummary`` are two sinks of the same stream; tests
add their own. In multiprocess mode a metric update writes a memory-mapped file, so one update
per batch instead of several per record is most of the worker's bookkeeping cost.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import Counter
from collections.abc import Sequence
from typing import Protocol

from retryd.metrics.buckets import LATENCY_BUCKETS, LATENESS_BUCKETS
from retryd.policy.circuit import CircuitSnapshot


class Buckets:
    """A histogram's observations since the last flush: per-bucket counts and the sum."""

    __slots__ = ("bounds", "counts", "total")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # last one: +Inf
        self.total = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.total += value

    @property
    def count(self) -> int:
        return sum(self.counts)

    def copy(self) -> Buckets:
        b = Buckets(self.bounds)
        b.counts = list(self.counts)  # one C call: consistent under the GIL
        b.total = self.total
        return b

    def add_delta(self, now: Buckets, before: Buckets | None) -> None:
        """Add ``now - before`` (monotonic snapshots of one histogram) to this one."""
        counts = self.counts
        if before is None:
            for i, n in enumerate(now.counts):
                counts[i] += n
            self.total += now.total
            return
        for i, (a, b) in enumerate(zip(now.counts, before.counts, strict=True)):
            if a != b:
                counts[i] += a - b
        self.total += now.total - before.total


class _TopicHistograms:
    """Handler-duration and due-lateness histograms per topic, made on first use."""

    __slots__ = ("durations", "lateness")

    def __init__(self) -> None:
        self.durations: dict[str, Buckets] = {}
        self.lateness: dict[str, Buckets] = {}

    def duration(self, topic: str) -> Buckets:
        b = self.durations.get(topic)
        if b is None:
            b = self.durations[topic] = Buckets(LATENCY_BUCKETS)
        return b

    def late(self, topic: str) -> Buckets:
        b = self.lateness.get(topic)
        if b is None:
            b = self.lateness[topic] = Buckets(LATENESS_BUCKETS)
        return b


# Why a record was skipped (``BatchStats.skipped``): a tier record of another consumer group.
SKIP_OTHER_GROUP = "other_group"


class BatchStats(_TopicHistograms):
    """Everything one poll iteration observed."""

    __slots__ = (
        "answered",
        "dead",
        "key_order",
        "outcomes",
        "quick_rescued",
        "quick_retries",
        "records",
        "retried_ok",
        "skipped",
    )

    def __init__(self) -> None:
        super().__init__()
        self.answered = 0  # calls settled on their slot (success, drop): the circuit's "ok"
        self.retried_ok = 0  # of those, records that had failed before (retry evidence)
        self.outcomes: Counter[tuple[str, str]] = Counter()  # (topic, outcome)
        self.dead: Counter[str] = Counter()  # dead-letter reason
        self.skipped: Counter[str] = Counter()  # skip reason
        self.key_order: Counter[str] = Counter()  # strict key order: parked, released, ...
        self.records = 0  # records consumed (for first/last timing)
        self.quick_retries = 0  # handler calls made again in place (quick=<n>@<delay>)
        self.quick_rescued = 0  # records a quick retry turned into a success

    def __bool__(self) -> bool:
        """Anything to publish. The engine publishes an iteration only when this is true, so
        everything a sink counts must be here, histograms included: a failed call's duration
        reaches the iteration that collects its slot's counters, while its outcome (retried,
        dead) is counted only when its copy is acknowledged, often an iteration later. An
        iteration with that duration and nothing else (no record consumed, no outcome: the
        tail of a run) was dropped, and ``retryd_handler_duration_seconds_count`` ended one
        short of the calls made while every outcome was counted (a 1-in-20 CI failure)."""
        return bool(
            self.records
            or self.outcomes
            or self.skipped
            or self.dead
            or self.quick_retries
            or self.quick_rescued
            or self.key_order
            or any(b.count for b in self.durations.values())
            or any(b.count for b in self.lateness.values())
        )


class SlotStats(_TopicHistograms):
    """Monotonic counters of one handler slot (written only by that slot's thread). The poll
    thread reads them as deltas between snapshots, so neither side ever resets or locks."""

    __slots__ = ("calls", "dropped", "retried_ok", "success")

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0
        self.success: dict[str, int] = {}
        self.dropped: dict[str, int] = {}
        self.retried_ok = 0  # successes of records that had failed before

    def snapshot(self) -> SlotStats:
        s = SlotStats()
        s.calls = self.calls
        s.retried_ok = self.retried_ok
        s.success = dict(self.success)
        s.dropped = dict(self.dropped)
        s.durations = {t: b.copy() for t, b in list(self.durations.items())}
        s.lateness = {t: b.copy() for t, b in list(self.lateness.items())}
        return s

    def merge_delta(self, before: SlotStats | None, into: BatchStats) -> None:
        """Add this snapshot minus ``before`` (an earlier snapshot of the same slot)."""
        into.retried_ok += self.retried_ok - (before.retried_ok if before else 0)
        for outcome, now, then in (
            ("success", self.success, before.success if before else {}),
            ("dropped", self.dropped, before.dropped if before else {}),
        ):
            for topic, n in now.items():
                delta = n - then.get(topic, 0)
                if delta:
                    into.outcomes[(topic, outcome)] += delta
                    into.answered += delta
        for topic, b in self.durations.items():
            into.duration(topic).add_delta(b, before.durations.get(topic) if before else None)
        for topic, b in self.lateness.items():
            into.late(topic).add_delta(b, before.lateness.get(topic) if before else None)


class Sink(Protocol):
    """A listener of worker events. Every method is optional in spirit: implement all, no-op
    the ones you do not need (``NullSink``)."""

    def batch(self, stats: BatchStats, started: float, ended: float) -> None: ...

    def rebalance(self, kind: str, count: int) -> None: ...

    def paused(self, by_topic: dict[str, int]) -> None: ...

    def inflight(self, calls: int) -> None: ...

    def abandoned(self, total: int) -> None: ...

    def lag(self, lags: dict[tuple[str, int], int]) -> None: ...

    def forget(self, partitions: list[tuple[str, int]]) -> None: ...

    def circuit(self, snapshot: CircuitSnapshot) -> None: ...

    def key_order(self, blocked_keys: int, entries: int, oldest_s: float) -> None: ...


class NullSink:
    def batch(self, stats: BatchStats, started: float, ended: float) -> None:
        pass

    def rebalance(self, kind: str, count: int) -> None:
        pass

    def paused(self, by_topic: dict[str, int]) -> None:
        pass

    def inflight(self, calls: int) -> None:
        pass

    def abandoned(self, total: int) -> None:
        pass

    def lag(self, lags: dict[tuple[str, int], int]) -> None:
        pass

    def forget(self, partitions: list[tuple[str, int]]) -> None:
        pass

    def circuit(self, snapshot: CircuitSnapshot) -> None:
        pass

    def key_order(self, blocked_keys: int, entries: int, oldest_s: float) -> None:
        pass


class Events(NullSink):
    """Fan-out to every sink."""

    def __init__(self, sinks: Sequence[Sink]) -> None:
        self.sinks = list(sinks)

    def batch(self, stats: BatchStats, started: float, ended: float) -> None:
        for s in self.sinks:
            s.batch(stats, started, ended)

    def rebalance(self, kind: str, count: int) -> None:
        for s in self.sinks:
            s.rebalance(kind, count)

    def paused(self, by_topic: dict[str, int]) -> None:
        for s in self.sinks:
            s.paused(by_topic)

    def inflight(self, calls: int) -> None:
        for s in self.sinks:
            s.inflight(calls)

    def abandoned(self, total: int) -> None:
        for s in self.sinks:
            s.abandoned(total)

    def lag(self, lags: dict[tuple[str, int], int]) -> None:
        for s in self.sinks:
            s.lag(lags)

    def forget(self, partitions: list[tuple[str, int]]) -> None:
        for s in self.sinks:
            s.forget(partitions)

    def circuit(self, snapshot: CircuitSnapshot) -> None:
        for s in self.sinks:
            s.circuit(snapshot)

    def key_order(self, blocked_keys: int, entries: int, oldest_s: float) -> None:
        for s in self.sinks:
            gauge = getattr(s, "key_order", None)  # sinks written before strict order lack it
            if gauge is not None:
                gauge(blocked_keys, entries, oldest_s)
