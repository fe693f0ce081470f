"""Group-level facts the sidecar measures from Kafka: consumer lag and the dead-letter backlog.

Both are facts of the consumer group or of a topic, not of the host the sidecar runs on: every
sidecar of a deployment (one per pod) measures the same values. They are exported by each of
them (so a single sidecar that stays up is enough) and dashboards and alerts aggregate them
with ``max by (group, topic, partition)`` (lag) or ``max by (topic)`` (backlog) before any
``sum``: a replica never multiplies them. See deploy/README.md.

Measured every ``interval_s`` in one background thread, which also runs the ``also`` callables
(the replay ledger tail, ``retryd.metrics.replays``) so the sidecar needs one thread for all of
its Kafka-side measurements.

A background reader must outlive every failed read, whatever it raises: a thread that dies
freezes what it reported (issue 31 fault 7: the share-lag thread died on a ``UnicodeError``
and its gauge kept its last value, so a stuck worker stopped tripping the lag alert).
``ReaderHealth`` is how the readers here and in ``retryd.share.lag`` keep going: any
``Exception`` of one read is counted, logged once per new cause (a cause that repeats read
after read is logged once, a different one again, the recovery too), and reported to an
optional callback, e.g. a gauge. The sidecar's lag needs no gauge: ``snapshot`` serves nothing
older than three periods, so a failing measurement shows as missing series, never frozen ones.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from retryd.errors import RetrydError
from retryd.kafka.clients import new_consumer, reader_config

log = logging.getLogger(__name__)

_NUMBERS = re.compile(r"\d+")
# what a reader meets when Kafka or the network misbehaves; anything else is a bug, logged
# with its traceback (once per cause, like the rest)
EXPECTED = (RetrydError, KafkaException, OSError)


def cause_of(exc: BaseException) -> str:
    """What identifies a failure for logging: its type and message with the numbers blanked,
    so a message that carries a byte count or a correlation id is still the same cause."""
    return f"{type(exc).__name__}: {_NUMBERS.sub('#', str(exc))}"


class ReaderHealth:
    """Whether a background reader's last read worked, logged without flooding the log.

    ``failed`` logs a warning when the cause differs from the previous failure's (the first
    of an outage included), ``ok`` an info line when an outage ends; ``report(up)`` (a gauge)
    is told after every read. Thread-compatible: one reader thread calls it."""

    def __init__(
        self,
        what: str,
        logger: logging.Logger,
        *,
        every_s: float = 0.0,
        report: Callable[[bool], None] | None = None,
    ) -> None:
        self.what = what
        self.log = logger
        self.every_s = every_s
        self.report = report
        self.up = False
        self.failing: str | None = None  # the last failure's message, None once a read works
        self.failures = 0  # failed reads since start
        self._cause: str | None = None
        self._outage = 0  # failed reads since the last that worked

    def ok(self) -> None:
        if self._cause is not None:
            self.log.info("%s: read again after %d failed reads", self.what, self._outage)
        self.up, self.failing, self._cause, self._outage = True, None, None, 0
        self._tell(True)

    def failed(self, exc: Exception) -> None:
        cause = cause_of(exc)
        if cause != self._cause:
            self.log.warning(
                "%s: read failed (%s: %s); retrying every %gs",
                self.what,
                type(exc).__name__,
                exc,
                self.every_s,
                exc_info=None if isinstance(exc, EXPECTED) else exc,
            )
        self.up, self.failing, self._cause = False, str(exc), cause
        self.failures += 1
        self._outage += 1
        self._tell(False)

    def down(self) -> None:
        """The reader stopped reading for good (already logged by it)."""
        self.up = False
        self._tell(False)

    def _tell(self, up: bool) -> None:
        if self.report is None:
            return
        try:
            self.report(up)
        except Exception as exc:  # a metric must never end the reader it describes
            self.log.warning("%s: cannot report its state: %s", self.what, exc)


class LagMonitor:
    """Measures the worker group's lag (and the records in ``backlog_topics``) periodically.

    The group's committed offsets come from an OffsetFetch by a consumer that carries the
    group's id but never subscribes, so nothing here ever touches the group's membership. A
    group-less consumer then fetches one small batch at each committed position and reads the
    watermarks from the fetch response (``get_watermark_offsets(cached=True)``): a ListOffsets
    'latest' request is wrong on some Kafka-compatible brokers. Lag = high watermark -
    committed (or - low watermark when the group committed nothing); backlog = high - low.
    """

    def __init__(
        self,
        common: dict[str, str],
        group_id: str,
        topics: list[str],
        interval_s: float = 5.0,
        timeout_s: float = 5.0,
        *,
        backlog_topics: list[str] | None = None,
        also: list[Callable[[], object]] | None = None,
    ) -> None:
        self.common = common
        self.group_id = group_id
        self.topics = topics
        self.backlog_topics = list(backlog_topics or [])
        self.also = list(also or [])
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self._values: dict[tuple[str, int], int] = {}
        self._backlog: dict[str, int] = {}
        self._measured_at = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._consumer: Consumer | None = None
        self._offsets: Consumer | None = None  # carries the group's id; never subscribes
        self.health = ReaderHealth("consumer lag measurement", log, every_s=interval_s)
        self._extras: dict[int, ReaderHealth] = {}  # by position in ``also``

    @property
    def last_error(self) -> str | None:
        return self.health.failing

    def start(self) -> LagMonitor:
        if (self.topics or self.backlog_topics or self.also) and self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="lag-monitor", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self.timeout_s * 3)
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None
        if self._offsets is not None:
            self._offsets.close()
            self._offsets = None

    def _fresh(self, max_age_s: float | None) -> bool:
        limit = max_age_s if max_age_s is not None else max(15.0, self.interval_s * 3)
        return time.monotonic() - self._measured_at <= limit

    def snapshot(self, max_age_s: float | None = None) -> dict[tuple[str, int], int]:
        """The last lag measurement, or {} if older than ``max_age_s`` (default 3 periods)."""
        with self._lock:
            return dict(self._values) if self._fresh(max_age_s) else {}

    def backlog(self, max_age_s: float | None = None) -> dict[str, int]:
        """Records in each backlog topic at the last measurement ({} when too old)."""
        with self._lock:
            return dict(self._backlog) if self._fresh(max_age_s) else {}

    def _loop(self) -> None:
        """Never ends on a failed read (module docstring): any ``Exception`` is counted and
        logged once per cause; the next period tries again."""
        while not self._stop.is_set():
            if self.topics or self.backlog_topics:
                self._attempt(self.measure_once, self.health)
            for i, extra in enumerate(self.also):
                self._attempt(extra, self._extra_health(i, extra))
            self._stop.wait(self.interval_s)

    def _extra_health(self, i: int, extra: Callable[[], object]) -> ReaderHealth:
        if i not in self._extras:
            name = getattr(extra, "__qualname__", None) or type(extra).__name__
            self._extras[i] = ReaderHealth(
                f"sidecar measurement {name}", log, every_s=self.interval_s
            )
        return self._extras[i]

    @staticmethod
    def _attempt(read: Callable[[], object], health: ReaderHealth) -> None:
        try:
            read()
        except Exception as exc:  # one bad read must not end the thread
            health.failed(exc)
        else:
            health.ok()

    def _get_consumer(self) -> Consumer:
        if self._consumer is None:
            self._consumer = new_consumer(
                reader_config(
                    self.common,
                    "lag-probe",
                    **{
                        "fetch.wait.max.ms": 50,
                        "queued.max.messages.kbytes": 64,
                        "max.partition.fetch.bytes": 16384,
                        "log_level": 3,
                    },
                )
            )
        return self._consumer

    def _committed(self, tps: list[TopicPartition]) -> dict[tuple[str, int], int]:
        """The group's committed offsets, through a consumer that carries the group's id but
        never subscribes (so it never joins): ``committed()`` is an OffsetFetch like the admin
        client's ``list_consumer_group_offsets``, whose response parser crashes librdkafka
        2.16 (segfault in ``rd_kafka_ListConsumerGroupOffsetsResponse_parse``) on a cluster
        where the offsets topic does not exist yet: a sidecar started on a fresh Apache Kafka
        died seconds after start."""
        out = {(tp.topic, tp.partition): -1 for tp in tps}
        if not tps:
            return out
        if self._offsets is None:
            conf = reader_config(self.common, "lag-offsets", log_level=3)
            conf["group.id"] = self.group_id  # read its offsets; never subscribe, never commit
            conf["enable.auto.commit"] = False
            self._offsets = new_consumer(conf)
        for tp in self._offsets.committed(tps, timeout=self.timeout_s):
            if tp.error is None and tp.offset >= 0:
                out[(tp.topic, tp.partition)] = tp.offset
        return out

    def _partitions(self, consumer: Consumer, topics: list[str]) -> list[TopicPartition]:
        tps: list[TopicPartition] = []
        for topic in topics:
            md = consumer.list_topics(topic, timeout=self.timeout_s).topics.get(topic)
            if md is None or md.error is not None:
                continue
            tps.extend(TopicPartition(topic, p) for p in sorted(md.partitions))
        return tps

    def measure_once(self) -> dict[tuple[str, int], int]:
        consumer = self._get_consumer()
        tps = self._partitions(consumer, self.topics)
        backlog_tps = self._partitions(consumer, [t for t in self.backlog_topics if t])
        committed = self._committed(tps)
        start = [
            TopicPartition(t.topic, t.partition, max(committed[(t.topic, t.partition)], 0))
            for t in tps
        ] + [TopicPartition(t.topic, t.partition, 0) for t in backlog_tps]
        out: dict[tuple[str, int], int] = {}
        backlog: dict[str, int] = {}
        if start:
            seen = self._fetch_once(consumer, start)
            for t in tps:
                key = (t.topic, t.partition)
                if key not in seen:
                    continue
                low, high = consumer.get_watermark_offsets(t, cached=True)
                base = committed[key] if committed[key] >= 0 else max(low, 0)
                if high >= 0:
                    out[key] = max(0, high - base)
            for t in backlog_tps:
                if (t.topic, t.partition) not in seen:
                    continue
                low, high = consumer.get_watermark_offsets(t, cached=True)
                if high >= 0:
                    backlog[t.topic] = backlog.get(t.topic, 0) + max(0, high - max(low, 0))
        with self._lock:
            self._values = out
            self._backlog = backlog
            self._measured_at = time.monotonic()
        return out

    def _fetch_once(self, consumer: Consumer, start: list[TopicPartition]) -> set[tuple[str, int]]:
        """Fetch one small batch per partition, so the client caches its watermarks."""
        consumer.assign(start)
        seen: set[tuple[str, int]] = set()
        deadline = time.monotonic() + self.timeout_s
        try:
            while len(seen) < len(start) and time.monotonic() < deadline:
                for msg in consumer.consume(1000, 0.1):
                    err = msg.error()
                    if err is None or err.code() == KafkaError._PARTITION_EOF:
                        seen.add((msg.topic() or "", msg.partition() or 0))
        finally:
            consumer.unassign()
        return seen
