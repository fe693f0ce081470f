"""What the sidecar's ``/metrics`` serves.

- Every worker process writes its metrics to ``<state_dir>/metrics`` (prometheus-client
  multiprocess mode); ``MultiProcessCollector`` sums them, so totals span all processes that
  share the state dir and survive worker restarts.
- The sidecar's own metrics (HTTP requests, replays) are added: from the same directory when
  the sidecar itself runs in multiprocess mode (``retryd sidecar`` does), else from this
  process's registry. Families with the same name are merged, never listed twice.
- ``retryd_consumer_lag`` is *measured* here (``retryd.metrics.lag``): the group's committed
  offset versus the partition's high watermark, for the main topics and the tiers, with a
  ``kind`` label (``main`` or ``tier``) so alerts and dashboards tell them apart whatever
  ``tier_template`` names the tiers. It exists even when no worker runs (the case that matters
  most). Worker processes also report lag from their librdkafka statistics (position based,
  only for partitions they own); those samples are dropped for every partition the sidecar
  measured and kept only for the rest, so each ``{topic, partition}`` appears once. In share
  mode the main topics are read by a share group: the workers report its lag (Kafka's
  share-group offsets, ``retryd.share.lag``), served with ``kind="main"`` and a
  ``share_group`` label naming the group.
- ``retryd_failed_backlog{topic}``: records in ``failed_topic`` and in each dead-letter topic
  of the error routes (measured with the lag).
- ``retryd_workers_alive``: worker processes with a fresh heartbeat that are not stopping.
- ``retryd_replayed_total{status="replayed", source}``: replays counted from the replay
  ledger (``retryd.metrics.replays``), whoever made them.
- ``retryd_circuit_state`` comes from the workers' files like any gauge (``livemax``: the
  worst circuit among the live worker processes of this state dir, i.e. of the pod).
- Every series carries ``group`` (the consumer group): dashboards filter by it, and the
  group-level facts above (which every sidecar of a deployment measures alike) are aggregated
  ``max by (group, ...)`` so replicas never multiply them.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable
from pathlib import Path

from prometheus_client import REGISTRY, CollectorRegistry, values
from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample

from retryd.metrics.http import LOCAL, sanitize
from retryd.metrics.http import observe_request as observe_request
from retryd.metrics.lag import LagMonitor as LagMonitor
from retryd.metrics.replays import LedgerTail

log = logging.getLogger(__name__)

LAG = "retryd_consumer_lag"
BACKLOG = "retryd_failed_backlog"
WORKERS_ALIVE = "retryd_workers_alive"
REPLAYED = "retryd_replayed"
MAIN, TIER = "main", "tier"


def local_is_multiprocess(path: Path) -> bool:
    """True when this process writes its own metrics into ``path`` (so do not add them twice)."""
    env = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if not env or values.ValueClass.__name__ != "MmapedValue":
        return False
    try:
        return Path(env).resolve() == path.resolve()
    except OSError:
        return False


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
    """Workers' multiprocess files + the sidecar's own metrics + what it measures, merged."""

    def __init__(
        self,
        metrics_path: Path,
        lag: LagMonitor | None = None,
        routes: frozenset[str] | None = None,
        *,
        group: str | None = None,
        main_topics: Iterable[str] = (),
        workers_alive: Callable[[], int] | None = None,
        ledger: LedgerTail | None = None,
        share_group: str | None = None,
    ) -> None:
        """``routes``: the app's route templates, the only ``route`` label values served
        (series with other values, e.g. left in the metric files by an older sidecar, are
        dropped); None serves what is there. ``group`` is added to every series;
        ``share_group`` (share mode) to the main topics' lag."""
        self.path = metrics_path
        self.lag = lag
        self.routes = routes
        self.group = group
        self.main_topics = frozenset(main_topics)
        self.workers_alive = workers_alive
        self.ledger = ledger
        self.share_group = share_group

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
        out: list[Metric] = []
        lag_family: Metric | None = None
        replayed: Metric | None = None
        for fam in merged:
            if fam.name == LAG:
                lag_family = fam
            elif fam.name == REPLAYED:
                replayed = fam
            else:
                out.append(fam)
        out.append(self._lag(lag_family))
        out.append(self._replayed(replayed))
        if self.lag is not None:
            backlog = GaugeMetricFamily(
                BACKLOG,
                "Records in failed_topic and the error routes' dead-letter topics (measured by "
                "the sidecar)",
                labels=["topic"],
            )
            for topic, n in sorted(self.lag.backlog().items()):
                backlog.add_metric([topic], n)
            out.append(backlog)
        if self.workers_alive is not None:
            out.append(
                GaugeMetricFamily(
                    WORKERS_ALIVE,
                    "Worker processes with a fresh heartbeat that are not stopping",
                    value=self.workers_alive(),
                )
            )
        if self.group is not None:
            for fam in out:
                fam.samples = [
                    s._replace(labels={**s.labels, "group": self.group}) for s in fam.samples
                ]
        return out

    def _kind(self, topic: str) -> str:
        return MAIN if topic in self.main_topics else TIER

    def _lag(self, reported: Metric | None) -> Metric:
        measured = self.lag.snapshot() if self.lag is not None else {}
        gauge = GaugeMetricFamily(
            LAG,
            "Committed offset behind the high watermark, per partition (measured by the sidecar)",
            labels=["kind", "topic", "partition"],
        )
        for (topic, part), value in sorted(measured.items()):
            gauge.add_metric([self._kind(topic), topic, str(part)], value)
        for s in reported.samples if reported is not None else []:
            topic = s.labels.get("topic", "")
            part_label = s.labels.get("partition", "")
            part_id = int(part_label) if part_label.isdigit() else -1
            if (topic, part_id) not in measured:
                labels = {"kind": self._kind(topic), "topic": topic, "partition": part_label}
                if self.share_group is not None and labels["kind"] == MAIN:
                    labels["share_group"] = self.share_group
                gauge.samples.append(s._replace(name=LAG, labels=labels))
        return gauge

    def _replayed(self, fam: Metric | None) -> Metric:
        """The sidecar's own ``skipped``/``failed`` counts, plus ``replayed`` from the ledger
        (its own ``replayed`` increments would count its replays twice)."""
        out = Metric(REPLAYED, "Replayed failed records by status and source", "counter")
        if fam is not None:
            out.samples = [
                s._replace(labels={**s.labels, "source": "sidecar"})
                for s in fam.samples
                if s.labels.get("status") != "replayed"
            ]
        if self.ledger is not None:
            for source, n in self.ledger.counts().items():
                labels = {"status": "replayed", "source": source}
                out.samples.append(Sample(REPLAYED + "_total", labels, float(n)))
        return out


def exposition(collector: SidecarCollector) -> bytes:
    from prometheus_client import generate_latest

    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return generate_latest(registry)
