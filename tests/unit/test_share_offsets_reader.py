"""The share worker's lag reader keeps going, quietly, when it cannot read: one warning per
outage, and a configuration it cannot serve (SASL) ends it with the Kafka script named."""

from __future__ import annotations

import socket

import pytest

from retryd.share.lag import ShareLagReader
from retryd.worker.events import NullSink
from tests.support import wait_for


def test_an_unreachable_broker_is_logged_once_per_outage(caplog: pytest.LogCaptureFixture) -> None:
    lsock = socket.create_server(("127.0.0.1", 0))
    port = lsock.getsockname()[1]
    lsock.close()  # nobody listens there now
    reader = ShareLagReader(
        {"bootstrap.servers": f"127.0.0.1:{port}"}, "g", ["t"], NullSink(), interval_s=0.02
    )
    with caplog.at_level("WARNING", logger="retryd.share.lag"):
        reader.start()
        try:
            wait_for(lambda: reader.failures >= 5, 10, what="five failed reads")
        finally:
            reader.stop()
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1, warnings
    assert f"cannot connect to 127.0.0.1:{port}" in warnings[0]


def test_sasl_ends_the_reader_naming_the_script(caplog: pytest.LogCaptureFixture) -> None:
    reader = ShareLagReader(
        {"bootstrap.servers": "127.0.0.1:9", "security.protocol": "SASL_SSL"},
        "g.share",
        ["t"],
        NullSink(),
        interval_s=0.02,
    )
    with caplog.at_level("WARNING", logger="retryd.share.lag"):
        reader.start()
        assert reader._thread is not None
        reader._thread.join(5)
        assert not reader._thread.is_alive()
        reader.stop()
    (message,) = [r.getMessage() for r in caplog.records]
    assert "security.protocol=sasl_ssl is not supported" in message
    assert "kafka-share-groups.sh --describe --group g.share" in message


def test_the_sidecar_labels_the_main_topics_lag_with_the_share_group(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from prometheus_client.metrics_core import Metric

    from retryd.metrics.exposition import SidecarCollector

    reported = Metric("retryd_consumer_lag", "", "gauge")
    reported.add_sample("retryd_consumer_lag", {"topic": "orders", "partition": "0"}, 6)
    reported.add_sample("retryd_consumer_lag", {"topic": "g.retry_5m", "partition": "1"}, 2)
    served = {
        share: [
            (s.labels, s.value)
            for s in SidecarCollector(
                tmp_path, group="g", main_topics=["orders"], share_group=share
            )
            ._lag(reported)
            .samples
        ]
        for share in ("g.share", None)
    }
    assert served["g.share"] == [
        ({"kind": "main", "topic": "orders", "partition": "0", "share_group": "g.share"}, 6),
        ({"kind": "tier", "topic": "g.retry_5m", "partition": "1"}, 2),
    ]
    assert served[None][0] == ({"kind": "main", "topic": "orders", "partition": "0"}, 6)
