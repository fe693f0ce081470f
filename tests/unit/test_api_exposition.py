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
