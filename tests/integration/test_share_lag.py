"""A share group's lag, as Kafka exposes it, on a real Apache Kafka (4.2+).

The Kafka script ``kafka-share-groups.sh --describe`` is not part of the suite's broker (its
jars are the server's only); it reads the same DescribeShareGroupOffsets response this
client decodes, so the reader is checked against what the test acknowledged itself: 4 of 10
records accepted is a lag of 6, whichever 4. The start offset is the one the share
coordinator persisted, which on Kafka 4.4 moves one acknowledgement write late (a fully
acknowledged partition still shows its old start offset until the next write): high
watermark - start offset over-reports, which is why the broker's figure is preferred. Then a
share worker drains a topic while its sidecar's ``/metrics`` shows
``retryd_consumer_lag{kind="main", share_group=...}`` go up and fall to 0.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from confluent_kafka import AcknowledgeType, ShareConsumer

from retryd.kafka.share_offsets import ShareOffsetsClient, SharePartitionOffset
from retryd.kafka.wire import WireError
from retryd.share.lag import ShareLagReader, lags_of
from retryd.worker.events import NullSink
from tests.integration.test_share_mode import configure_group, share_deployment, spawn
from tests.integration.worker_support import stop_process
from tests.support import (
    ON_TANSU,
    broker_older_than,
    create_topics,
    json_lines,
    produce,
    unique,
    wait_for,
)

pytestmark = pytest.mark.skipif(
    ON_TANSU or broker_older_than(4, 2),
    reason="share groups (KIP-932) need Apache Kafka 4.2 or newer",
)


class Recorded(NullSink):
    def __init__(self) -> None:
        self.lags: list[dict[tuple[str, int], int]] = []

    def lag(self, lags: dict[tuple[str, int], int]) -> None:
        self.lags.append(dict(lags))


def acknowledge(bootstrap: str, topic: str, group: str, n: int, accept: Callable[[int], bool]):  # type: ignore[no-untyped-def]
    """Acquire each of the topic's ``n`` records once: ACCEPT those ``accept`` picks, RELEASE
    the others (available again, not done)."""
    configure_group(
        bootstrap,
        group,
        {"share.auto.offset.reset": "earliest", "share.delivery.count.limit": "10"},
    )
    consumer = ShareConsumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "share.acknowledgement.mode": "explicit",
        }
    )
    seen: set[int] = set()
    try:
        consumer.subscribe([topic])

        def all_seen() -> bool:
            for msg in consumer.poll(0.5):
                assert msg.error() is None, msg.error()
                kind = AcknowledgeType.ACCEPT if accept(msg.offset()) else AcknowledgeType.RELEASE
                consumer.acknowledge(msg, kind)
                seen.add(msg.offset())
            consumer.commit_sync(10)
            return len(seen) == n

        wait_for(all_seen, 40, 0, f"the {n} records through share group {group}")
    finally:
        consumer.close()


def handled(log: Path) -> set[str]:
    return {c["id"] for c in json_lines(log)} if log.exists() else set()


def fresh(bootstrap: str, n: int) -> tuple[str, str]:
    topic, group = unique("share-lag"), unique("sg")
    create_topics(bootstrap, [topic], 1)
    produce(bootstrap, topic, [(str(i).encode(), b"v") for i in range(n)])
    return topic, group


def test_start_offset_and_lag_are_kafkas(bootstrap: str) -> None:
    topic, group = fresh(bootstrap, 10)
    acknowledge(bootstrap, topic, group, 10, lambda offset: offset < 4)
    client = ShareOffsetsClient({"bootstrap.servers": bootstrap}, group)
    (p,) = client.describe([topic])
    assert (p.topic, p.partition, p.lag, p.error_code) == (topic, 0, 6, 0)
    assert 0 <= p.start_offset <= 4  # persisted late (module docstring)
    sink = Recorded()
    reader = ShareLagReader({"bootstrap.servers": bootstrap}, group, [topic], sink)
    assert reader.read_once() == {(topic, 0): 6}
    assert sink.lags == [{(topic, 0): 6}]
    # without the broker's figure (DescribeShareGroupOffsets v0): high watermark - start
    v0 = SharePartitionOffset(topic, 0, p.start_offset, p.leader_epoch, -1)
    high = reader.high_watermarks([v0])
    assert high == {(topic, 0): 10}
    assert lags_of([v0], high) == {(topic, 0): 10 - p.start_offset}
    # the operator's view: retryd share-lag prints the same figures
    shown = subprocess.run(
        [sys.executable, "-m", "retryd", "share-lag", "-b", bootstrap, "--group", group, "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        env={k: v for k, v in os.environ.items() if not k.startswith("RETRYD_")},
        check=True,
    )
    assert json.loads(shown.stdout) == {
        "group": group,
        "topic": topic,
        "partition": 0,
        "start_offset": p.start_offset,
        "lag": 6,
        "error": None,
    }


def test_records_done_past_the_start_offset_count_in_the_brokers_lag(bootstrap: str) -> None:
    topic, group = fresh(bootstrap, 10)
    acknowledge(bootstrap, topic, group, 10, lambda offset: offset >= 6)
    (p,) = ShareOffsetsClient({"bootstrap.servers": bootstrap}, group).describe([topic])
    assert (p.start_offset, p.lag) == (0, 6)  # 0-5 left; high watermark - start says 10
    reader = ShareLagReader({"bootstrap.servers": bootstrap}, group, [topic], NullSink())
    assert reader.read_once() == {(topic, 0): 6}


def test_a_group_without_state_lags_by_the_whole_log_when_it_starts_at_the_earliest(
    bootstrap: str,
) -> None:
    from tests.integration.test_share_mode import configure_group

    topic, group = fresh(bootstrap, 3)
    assert ShareOffsetsClient({"bootstrap.servers": bootstrap}, group).describe() == []
    sink = Recorded()
    reader = ShareLagReader({"bootstrap.servers": bootstrap}, group, [topic], sink)
    assert reader.read_once() == {}  # the broker's default: it would start at the latest
    assert sink.lags == []
    # as retryd sets a new share group: nothing acquired yet, every record still to do
    configure_group(bootstrap, group, {"share.auto.offset.reset": "earliest"})
    assert reader.read_once() == {(topic, 0): 3}
    assert sink.lags == [{(topic, 0): 3}]


def test_the_sidecar_shows_the_share_groups_lag_fall_to_zero(
    bootstrap: str, tmp_path: Path
) -> None:
    from tests.integration.sidecar_support import SidecarProcess
    from tests.integration.test_sidecar_metrics import scrape, sidecar_env, value

    d = share_deployment(bootstrap, tmp_path, sequence="1s", max_in_flight=1)
    n = 40
    for i in range(n):  # one producer batch each: the broker acquires whole batches, and
        d.send([{"id": f"s{i}", "mode": "slow", "seconds": 0.2}])  # acks go batch by batch
    env = sidecar_env(d, d.settings.state_dir, "1s")
    env.extra.update(RETRYD_CONSUMER_MODE="share", RETRYD_ORDERING="none")
    sidecar = SidecarProcess(env, tmp_path / "sidecar.log")
    log = tmp_path / "calls.jsonl"
    labels = {"kind": "main", "topic": d.main, "partition": "0"}
    labels["share_group"] = d.settings.share_group_id
    seen: list[float] = []
    with sidecar:
        worker = spawn(d, log, RETRYD_METRICS_INTERVAL_S="0.5")
        try:

            def lag(done: Callable[[float], bool]) -> bool:
                got = value(scrape(sidecar.url), "retryd_consumer_lag", **labels)
                if got is not None and (not seen or seen[-1] != got):
                    seen.append(got)
                return got is not None and done(got)

            wait_for(lambda: lag(lambda v: v > 0), 60, 0.2, "a share-group lag above 0")
            wait_for(lambda: len(handled(log)) == n, 90, 0.2, f"the {n} records handled")
            wait_for(lambda: lag(lambda v: v == 0), 30, 0.2, "the share-group lag at 0")
        finally:
            assert stop_process(worker) == 0
    assert seen[0] > 0 and seen[-1] == 0, seen
    assert seen == sorted(seen, reverse=True), seen  # it only falls


def _certificate(tmp_path: Path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 (its own CA) and its key, in PEM files."""
    from tests.integration.test_sidecar_security import _self_signed

    tmp_path.mkdir(parents=True, exist_ok=True)
    return _self_signed(tmp_path)


def test_the_reader_speaks_tls_with_a_client_certificate(tmp_path: Path) -> None:
    """A broker of its own with an SSL listener that requires a client certificate (Kafka's
    TLS, PEM files): the reader finds the coordinator on that listener and reads the lag."""
    from retryd.kafka.apache import ApacheKafkaBroker, free_port
    from tests.support import TEST_KAFKA_OVERRIDES

    cert, key = _certificate(tmp_path)
    both = tmp_path / "broker.pem"
    both.write_text(cert.read_text() + key.read_text())
    plain, tls, controller = free_port(), free_port(), free_port()
    overrides = {
        **TEST_KAFKA_OVERRIDES,
        "listeners": (
            f"PLAINTEXT://127.0.0.1:{plain},SSL://127.0.0.1:{tls},"
            f"CONTROLLER://127.0.0.1:{controller}"
        ),
        "advertised.listeners": f"PLAINTEXT://127.0.0.1:{plain},SSL://127.0.0.1:{tls}",
        "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT,SSL:SSL",
        "ssl.keystore.type": "PEM",
        "ssl.keystore.location": str(both),
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": str(cert),
        "ssl.client.auth": "required",
    }
    broker = ApacheKafkaBroker(
        plain, tmp_path / "broker.log", controller_port=controller, overrides=overrides
    )
    with broker.start():
        topic, group = fresh(broker.bootstrap, 10)
        acknowledge(broker.bootstrap, topic, group, 10, lambda offset: offset < 4)
        common = {
            "bootstrap.servers": f"127.0.0.1:{tls}",
            "security.protocol": "SSL",
            "ssl.ca.location": str(cert),
            "ssl.certificate.location": str(cert),
            "ssl.key.location": str(key),
        }
        reader = ShareLagReader(common, group, [topic], NullSink())
        assert reader.read_once() == {(topic, 0): 6}
        # the wrong CA: the handshake fails, said so (and the reader would log it, once)
        other, _ = _certificate(tmp_path / "other")
        with pytest.raises(WireError, match=r"TLS with 127\.0\.0\.1:\d+ failed"):
            ShareOffsetsClient({**common, "ssl.ca.location": str(other)}, group).describe()
        # no client certificate: the broker refuses the handshake
        anonymous = {k: v for k, v in common.items() if not k.startswith(("ssl.cert", "ssl.key"))}
        with pytest.raises(WireError):
            ShareOffsetsClient(anonymous, group).describe()
