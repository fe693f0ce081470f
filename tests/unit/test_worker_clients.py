"""librdkafka configuration: pass-through options reach the clients; the design's fixed ones win."""

from __future__ import annotations

from retryd.config import Role, load_settings
from retryd.worker.clients import consumer_config, producer_config


def _settings(**kafka: str):  # type: ignore[no-untyped-def]
    return load_settings(bootstrap_servers="b:9092", main_topics="orders", kafka=kafka)


def test_security_options_pass_through_to_both_clients() -> None:
    s = _settings(
        **{
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": "PLAIN",
            "sasl.username": "u",
            "sasl.password": "p",
        }
    )
    for conf in (consumer_config(s, Role.ALL), producer_config(s)):
        assert conf["security.protocol"] == "SASL_SSL"
        assert conf["sasl.password"] == "p"
        assert conf["bootstrap.servers"] == "b:9092"


def test_at_least_once_options_cannot_be_overridden() -> None:
    s = _settings(
        **{
            "enable.auto.offset.store": "true",
            "acks": "1",
            "enable.idempotence": "false",
            "linger.ms": "50",
        }
    )
    c, p = consumer_config(s, Role.MAIN), producer_config(s)
    assert c["enable.auto.offset.store"] is False
    assert c["partition.assignment.strategy"] == "cooperative-sticky"
    assert p["acks"] == "all" and p["enable.idempotence"] is True
    assert p["linger.ms"] == "50"  # a tuning knob stays the user's


def test_tier_roles_get_a_small_prefetch() -> None:
    s = load_settings(main_topics="orders", tier_prefetch_kbytes=512)
    assert consumer_config(s, Role.TIERS)["queued.max.messages.kbytes"] == 512
    assert "queued.max.messages.kbytes" not in consumer_config(s, Role.MAIN)
