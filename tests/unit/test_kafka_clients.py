"""librdkafka configuration: pass-through options reach every client; the design's fixed keys win;
assign-only readers never use the worker's group."""

from __future__ import annotations

import logging

import pytest

from retryd.config import Role, load_settings
from retryd.errors import KafkaSetupError
from retryd.kafka.clients import (
    admin_config,
    common_config,
    group_consumer_config,
    new_consumer,
    producer_config,
    reader_config,
)
from retryd.worker.clients import worker_consumer_config, worker_producer_config


def _settings(**kafka: str):  # type: ignore[no-untyped-def]
    return load_settings(bootstrap_servers="b:9092", main_topics="orders", kafka=kafka)


SASL = {
    "security.protocol": "SASL_SSL",
    "sasl.mechanism": "PLAIN",
    "sasl.username": "u",
    "sasl.password": "p",
}


def test_security_options_reach_every_client() -> None:
    s = _settings(**SASL)
    common = common_config(s)
    confs = [
        worker_consumer_config(s, Role.ALL),
        worker_producer_config(s),
        reader_config(common, "scan"),
        producer_config(common, "replay"),
        admin_config(common, "topics"),
        group_consumer_config(common, "x", "grp"),
    ]
    for conf in confs:
        assert conf["security.protocol"] == "SASL_SSL"
        assert conf["sasl.password"] == "p"
        assert conf["bootstrap.servers"] == "b:9092"
        assert isinstance(conf["logger"], logging.Logger)


def test_at_least_once_options_cannot_be_overridden(caplog: pytest.LogCaptureFixture) -> None:
    s = _settings(
        **{
            "enable.auto.offset.store": "true",
            "acks": "1",
            "enable.idempotence": "false",
            "linger.ms": "50",
        }
    )
    c, p = worker_consumer_config(s, Role.MAIN), worker_producer_config(s)
    assert c["enable.auto.offset.store"] is False
    assert c["partition.assignment.strategy"] == "cooperative-sticky"
    assert p["acks"] == "all" and p["enable.idempotence"] is True
    assert p["linger.ms"] == "50"  # a tuning knob stays the user's
    assert "ignoring kafka option acks=1" in caplog.text


def test_readers_never_join_or_commit_for_the_worker_group() -> None:
    s = _settings(**{"group.id": "retryd", "enable.auto.commit": "true"})
    conf = reader_config(common_config(s), "scan")
    assert conf["group.id"].startswith("retryd-scan-") and conf["group.id"] != "retryd"
    assert conf["enable.auto.commit"] is False
    assert reader_config({}, "scan")["group.id"] != conf["group.id"]  # unique per reader


def test_worker_group_comes_from_settings_not_pass_through() -> None:
    s = load_settings(main_topics="orders", group_id="mine", kafka={"group.id": "other"})
    assert worker_consumer_config(s, Role.ALL)["group.id"] == "mine"


def test_main_topics_keep_default_prefetch_whatever_the_role() -> None:
    s = load_settings(main_topics="orders", tier_prefetch_kbytes=512)
    assert "queued.max.messages.kbytes" not in worker_consumer_config(s, Role.MAIN)
    assert "queued.max.messages.kbytes" not in worker_consumer_config(s, Role.ALL)
    assert worker_consumer_config(s, Role.TIERS)["queued.max.messages.kbytes"] == 512


def test_bad_option_is_a_clear_error_without_secrets() -> None:
    conf = reader_config({"bootstrap.servers": "b:1", "sasl.password": "hunter2"}, "scan")
    conf["no.such.option"] = "1"
    with pytest.raises(KafkaSetupError) as info:
        new_consumer(conf)
    assert "no.such.option" in str(info.value)
    assert "hunter2" not in str(info.value)


def test_heartbeat_fits_a_short_session() -> None:
    """librdkafka's 3 s heartbeat would outlast a 2 s session: at most a third of it."""
    short = worker_consumer_config(load_settings(session_timeout_ms=2000), Role.MAIN)
    assert short["heartbeat.interval.ms"] == 666
    default = worker_consumer_config(load_settings(), Role.MAIN)
    assert default["heartbeat.interval.ms"] == 3000


def test_the_consumer_group_protocol_leaves_timing_and_assignment_to_the_broker(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """librdkafka refuses session.timeout.ms, heartbeat.interval.ms and
    partition.assignment.strategy with group.protocol=consumer (the client is not created):
    they are left out, a pass-through one with a warning, and the range assignor is asked."""
    s = load_settings(
        bootstrap_servers="b:9092",
        main_topics="orders",
        group_protocol="consumer",
        kafka={"session.timeout.ms": "10000", **SASL},
    )
    with caplog.at_level(logging.WARNING):
        conf = worker_consumer_config(s, Role.ALL)
    assert conf["group.protocol"] == "consumer" and conf["group.remote.assignor"] == "range"
    for key in ("session.timeout.ms", "heartbeat.interval.ms", "partition.assignment.strategy"):
        assert key not in conf
    assert conf["sasl.username"] == "u" and conf["enable.auto.offset.store"] is False
    assert "session.timeout.ms" in caplog.text and "group_protocol=consumer" in caplog.text
    new_consumer(conf).close()  # librdkafka accepts it

    classic = worker_consumer_config(
        load_settings(bootstrap_servers="b:9092", main_topics="o"), Role.ALL
    )
    assert classic["partition.assignment.strategy"] == "cooperative-sticky"
    assert "group.protocol" not in classic
