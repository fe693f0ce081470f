"""The sidecar's metric merge: one series per name and labels, measured lag wins."""

from __future__ import annotations

import time
from pathlib import Path

from prometheus_client.metrics_core import Metric
from prometheus_client.samples import Sample

from retryd.metrics import registry as m
from retryd.metrics.exposition import LagMonitor, SidecarCollector, _merge


def _fam(name: str, kind: str, *samples: tuple[dict[str, str], float]) -> Metric:
    fam = Metric(name, "doc", kind)
    fam.samples = [
        Sample(name + ("_total" if kind == "counter" else ""), lb, v) for lb, v in samples
    ]
    return fam


def test_merge_sums_counters_and_takes_max_of_gauges() -> None:
    merged = {
        f.name: f
        for f in _merge(
            [
                _fam("c", "counter", ({"a": "1"}, 2.0), ({"a": "2"}, 1.0)),
                _fam("c", "counter", ({"a": "1"}, 3.0)),
                _fam("g", "gauge", ({"a": "1"}, 2.0)),
                _fam("g", "gauge", ({"a": "1"}, 5.0)),
            ]
        )
    }
    assert {tuple(s.labels.items()): s.value for s in merged["c"].samples} == {
        (("a", "1"),): 5.0,
        (("a", "2"),): 1.0,
    }
    assert [s.value for s in merged["g"].samples] == [5.0]


def test_measured_lag_replaces_worker_reported_series(tmp_path: Path) -> None:
    m.CONSUMER_LAG.labels(topic="lagtest", partition="0").set(7)
    m.CONSUMER_LAG.labels(topic="lagtest", partition="1").set(9)
    lag = LagMonitor({}, "g", ["lagtest"])
    lag._values = {("lagtest", 0): 3}
    lag._measured_at = time.monotonic()
    families = list(SidecarCollector(tmp_path / "absent", lag).collect())
    lags = [f for f in families if f.name == "retryd_consumer_lag"]
    assert len(lags) == 1
    values = {
        s.labels["partition"]: s.value for s in lags[0].samples if s.labels["topic"] == "lagtest"
    }
    assert values == {"0": 3, "1": 9}  # measured where measured, worker value elsewhere
    lag._measured_at = time.monotonic() - 3600  # a stale measurement is not served
    families = list(SidecarCollector(tmp_path / "absent", lag).collect())
    values = {
        s.labels["partition"]: s.value
        for f in families
        if f.name == "retryd_consumer_lag"
        for s in f.samples
        if s.labels["topic"] == "lagtest"
    }
    assert values == {"0": 7, "1": 9}


def test_group_kind_backlog_workers_and_ledger_replays(tmp_path: Path) -> None:
    """Every series gets ``group``; lag gets ``kind`` from the settings, not the topic's name;
    the sidecar's own ``replayed`` increments give way to the ledger's counts by source."""
    m.CONSUMER_LAG.labels(topic="custom.tier.5s", partition="0").set(4)
    m.REPLAYED.labels(status="replayed").inc()  # counted from the ledger instead
    skipped_before = m.REPLAYED.labels(status="skipped")._value.get()
    m.REPLAYED.labels(status="skipped").inc(2)
    lag = LagMonitor({}, "g", ["orders", "custom.tier.5s"])
    lag._values = {("orders", 0): 3}
    lag._backlog = {"dead": 11}
    lag._measured_at = time.monotonic()

    class Ledger:
        def counts(self) -> dict[str, int]:
            return {"sidecar": 1, "cli": 5, "spark": 2, "other": 0}

    collector = SidecarCollector(
        tmp_path / "absent",
        lag,
        group="grp",
        main_topics=["orders"],
        workers_alive=lambda: 3,
        ledger=Ledger(),  # type: ignore[arg-type]
    )
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in collector.collect()
        for s in f.samples
    }
    assert all(dict(labels).get("group") == "grp" for _, labels in samples)

    def get(name: str, **labels: str) -> float | None:
        return samples.get((name, tuple(sorted({**labels, "group": "grp"}.items()))))

    assert get("retryd_consumer_lag", kind="main", topic="orders", partition="0") == 3
    assert get("retryd_consumer_lag", kind="tier", topic="custom.tier.5s", partition="0") == 4
    assert get("retryd_failed_backlog", topic="dead") == 11
    assert get("retryd_workers_alive") == 3
    assert get("retryd_replayed_total", status="replayed", source="cli") == 5
    assert get("retryd_replayed_total", status="replayed", source="sidecar") == 1
    assert get("retryd_replayed_total", status="skipped", source="sidecar") == skipped_before + 2


def test_ledger_entry_sources_are_a_bounded_set() -> None:
    from retryd.metrics.replays import entry_source, source_of

    assert source_of("sidecar:ops-token@host-1") == "sidecar"
    assert source_of("sidecar") == "sidecar"
    assert source_of("cli") == "cli"
    assert source_of("spark@executor-3") == "spark"
    assert source_of("somebody else") == "other"
    assert entry_source(None) is None  # a tombstone replays nothing
    assert entry_source(b"not json") == "other"
    assert entry_source(b'{"v": 1, "replay_id": "r", "by": "spark@x"}') == "spark"
