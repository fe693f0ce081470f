"""What the sidecar's ``/metrics`` serves.

- Every worker process writes its metrics to ``<state_dir>/metrics`` (prometheus-client
  multiprocess mode); ``MultiProcessCollector`` sums them, so totals span all processes on the
  host and survive worker restarts.
- The sidecar's own metrics (HTTP requests, replays) are added: from the same directory when
  the sidecar itself runs in multiprocess mode (``retryd sidecar`` does), else from this
  process's registry. Families with the same name are merged, never listed twice.
- ``retryd_consumer_lag`` is *measured* here (``LagMonitor``): the group's committed offset
  versus the partition's high watermark, for the main topics and the tiers. This is the
  authoritative series: it exists even when no worker runs (the case that matters most), and
  it is what the group has really committed. Worker processes also report lag from their
  librdkafka statistics (position based, only for partitions they own); those samples are
  dropped for every partition the sidecar measured and kept only for the rest (for example
  while the broker cannot be reached), so each ``{topic, partition}`` appears once.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Iterable
from pathlib import Path

from confluent_kafka import (
    Consumer,
    ConsumerGroupTopicPartitions,
    KafkaError,
    KafkaException,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient
from prometheus_client import REGISTRY, CollectorRegistry, values
from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

from retryd.kafka.clients import admin_config, new_admin, new_consumer, reader_config
from retryd.metrics.http import LOCAL, sanitize
from retryd.metrics.http import observe_request as observe_request

log = logging.getLogger(__name__)

LAG = "retryd_consumer_lag"


def local_is_multiprocess(path: Path) -> bool:
    """True when this process writes its own metrics into ``path`` (so do not add them twice)."""
    env = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if not env or values.ValueClass.__name__ != "MmapedValue":
        return False
    try:
        return Path(env).resolve() == path.resolve()
    except OSError:
        return False


class LagMonitor:
    """Measures the worker group's lag every ``interval_s`` in a background thread.

    The group's committed offsets come from an admin OffsetFetch
    (``list_consumer_group_offsets``), so nothing here ever touches the group's membership. A
    group-less consumer then fetches one small batch at each committed position and reads the
    high watermark from the fetch response (``get_watermark_offsets(cached=True)``): a
    ListOffsets 'latest' request is wrong on some Kafka-compatible brokers. Lag = high
    watermark - committed (or - low watermark when the group committed nothing).
    """

    def __init__(
        self,
        common: dict[str, str],
        group_id: str,
        topics: list[str],
        interval_s: float = 5.0,
        timeout_s: float = 5.0,
    ) -> None:
        self.common = common
        self.group_id = group_id
        self.topics = topics
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self._values: dict[tuple[str, int], int] = {}
        self._measured_at = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._consumer: Consumer | None = None
        self._admin: AdminClient | None = None
        self.last_error: str | None = None

    def start(self) -> LagMonitor:
        if self.topics and self._thread is None:
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

    def snapshot(self, max_age_s: float | None = None) -> dict[tuple[str, int], int]:
        """The last measurement, or {} if it is older than ``max_age_s`` (default 3 periods)."""
        limit = max_age_s if max_age_s is not None else max(15.0, self.interval_s * 3)
        with self._lock:
            if time.monotonic() - self._measured_at > limit:
                return {}
            return dict(self._values)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.measure_once()
                self.last_error = None
            except (KafkaException, RuntimeError, TimeoutError) as exc:
                self.last_error = str(exc)
                log.warning("consumer lag measurement failed: %s", exc)
            self._stop.wait(self.interval_s)

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
        if self._admin is None:
            self._admin = new_admin(admin_config(self.common, "lag-monitor", log_level=3))
        request = [ConsumerGroupTopicPartitions(self.group_id, tps)]
        futures = self._admin.list_consumer_group_offsets(request, request_timeout=self.timeout_s)
        result = futures[self.group_id].result(self.timeout_s)
        out = {(tp.topic, tp.partition): -1 for tp in tps}
        for tp in result.topic_partitions or []:
            if tp.error is None:
                out[(tp.topic, tp.partition)] = tp.offset
        return out

    def measure_once(self) -> dict[tuple[str, int], int]:
        consumer = self._get_consumer()
        tps: list[TopicPartition] = []
        for topic in self.topics:
            md = consumer.list_topics(topic, timeout=self.timeout_s).topics.get(topic)
            if md is None or md.error is not None:
                continue
            tps.extend(TopicPartition(topic, p) for p in sorted(md.partitions))
        if not tps:
            with self._lock:
                self._values, self._measured_at = {}, time.monotonic()
            return {}
        committed = self._committed(tps)
        start = [
            TopicPartition(t.topic, t.partition, max(committed[(t.topic, t.partition)], 0))
            for t in tps
        ]
        consumer.assign(start)
        seen: set[tuple[str, int]] = set()
        deadline = time.monotonic() + self.timeout_s
        try:
            while len(seen) < len(start) and time.monotonic() < deadline:
                for msg in consumer.consume(1000, 0.1):
                    err = msg.error()
                    if err is None or err.code() == KafkaError._PARTITION_EOF:
                        seen.add((msg.topic() or "", msg.partition() or 0))
            out: dict[tuple[str, int], int] = {}
            for t in tps:
                key = (t.topic, t.partition)
                if key not in seen:
                    continue
                low, high = consumer.get_watermark_offsets(t, cached=True)
                base = committed[key] if committed[key] >= 0 else max(low, 0)
                if high >= 0:
                    out[key] = max(0, high - base)
        finally:
            consumer.unassign()
        with self._lock:
            self._values = out
            self._measured_at = time.monotonic()
        return out


def _merge(families: Iterable[Metric]) -> list[Metric]:
    merged: dict[str, Metric] = {}
    for fam in families:
        have = merged.get(fam.name)
        if have is None:
            copy = Metric(fam.name, fam.documentation, fam.type, fam.unit)
            copy.samples = list(fam.samples)
            merged[fam.name] = copy
            continue
        index = {(s.name, tuple(sorted(s.labels.items()))): i for i, s in enumerate(have.samples)}
        for s in fam.samples:
            key = (s.name, tuple(sorted(s.labels.items())))
            if key in index and fam.type in ("counter", "histogram", "summary"):
                old = have.samples[index[key]]
                have.samples[index[key]] = old._replace(value=old.value + s.value)
            elif key in index:
                old = have.samples[index[key]]
                have.samples[index[key]] = old._replace(value=max(old.value, s.value))
            else:
                have.samples.append(s)
    return list(merged.values())


class SidecarCollector(Collector):
    """Workers' multiprocess files + the sidecar's own metrics + measured lag, merged."""

    def __init__(
        self,
        metrics_path: Path,
        lag: LagMonitor | None = None,
        routes: frozenset[str] | None = None,
    ) -> None:
        """``routes``: the app's route templates, the only ``route`` label values served
        (series with other values, e.g. left in the metric files by an older sidecar, are
        dropped); None serves what is there."""
        self.path = metrics_path
        self.lag = lag
        self.routes = routes

    def collect(self) -> Iterable[Metric]:
        families: list[Metric] = []
        if self.path.is_dir():
            families.extend(MultiProcessCollector(None, path=str(self.path)).collect())
        if not local_is_multiprocess(self.path):
            families.extend(LOCAL.collect())
            families.extend(f for f in REGISTRY.collect() if f.name.startswith("retryd_"))
        merged = _merge(families)
        if self.routes is not None:
            merged = sanitize(merged, self.routes)
        measured = self.lag.snapshot() if self.lag is not None else {}
        out: list[Metric] = []
        lag_family: Metric | None = None
        for fam in merged:
            if fam.name == LAG:
                lag_family = fam
            else:
                out.append(fam)
        gauge = GaugeMetricFamily(
            LAG,
            "Committed offset behind the high watermark, per partition (measured by the sidecar)",
            labels=["topic", "partition"],
        )
        for (topic, part), value in sorted(measured.items()):
            gauge.add_metric([topic, str(part)], value)
        if lag_family is not None:
            for s in lag_family.samples:
                part_label = s.labels.get("partition", "")
                part_id = int(part_label) if part_label.isdigit() else -1
                if (s.labels.get("topic", ""), part_id) not in measured:
                    gauge.samples.append(s._replace(name=LAG))
        out.append(gauge)
        return out


def exposition(collector: SidecarCollector) -> bytes:
    from prometheus_client import generate_latest

    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return generate_latest(registry)
