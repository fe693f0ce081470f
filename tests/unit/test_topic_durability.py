"""min.insync.replicas of retryd's own topics: validated with the settings, planned on every
topic retryd creates, and a topic that differs is reported by ``retryd topics check``.

Why it matters: retryd's producers send with acks=all and commit an input only once its routed
copy is acknowledged, so the copy is exactly as durable as its topic's min.insync.replicas;
with the broker's default of 1 an acknowledged copy can sit on one replica only.
"""

from __future__ import annotations

import os

import pytest

from retryd.config import load_settings
from retryd.errors import ConfigError
from retryd.kafka.topics import MIN_INSYNC, _inspect, _plan


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("RETRYD_"):
            monkeypatch.delenv(name)


def test_unset_leaves_the_broker_default() -> None:
    s = load_settings(retry_sequence="1s,2s", tier_partitions=3)
    assert s.min_insync_replicas is None
    assert all(MIN_INSYNC not in spec.config for spec in _plan(s, 3))


def test_every_topic_retryd_creates_gets_it() -> None:
    s = load_settings(
        retry_sequence="1s,2s", replication_factor=3, min_insync_replicas=2, failed_topic="dlq"
    )
    specs = _plan(s, 4)
    assert [(x.kind, x.replication_factor, x.config[MIN_INSYNC]) for x in specs] == [
        ("tier", 3, "2"),
        ("tier", 3, "2"),
        ("failed", 3, "2"),
        ("ledger", 3, "2"),
    ]
    assert {x.min_insync_replicas for x in specs} == {2}
    # the other settings of each topic are untouched
    assert specs[-1].config == {"cleanup.policy": "compact", MIN_INSYNC: "2"}


def test_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RETRYD_MIN_INSYNC_REPLICAS", "2")
    monkeypatch.setenv("RETRYD_REPLICATION_FACTOR", "3")
    assert load_settings().min_insync_replicas == 2


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (
            {"replication_factor": 2, "min_insync_replicas": 3},
            "min_insync_replicas=3 exceeds replication_factor=2: every acks=all write to "
            "retryd's topics would be refused",
        ),
        ({"min_insync_replicas": 0}, "min_insync_replicas"),
    ],
)
def test_invalid_values_are_refused(overrides: dict[str, int], expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_settings(**overrides)
    assert any(expected in line for line in info.value.problems), info.value.problems


def test_broker_default_replication_is_not_judged() -> None:
    """With replication_factor -1 the broker decides: retryd cannot know it, so no check."""
    assert load_settings(replication_factor=-1, min_insync_replicas=3).min_insync_replicas == 3


def test_check_reports_a_topic_that_differs() -> None:
    s = load_settings(
        retry_sequence="1s", replication_factor=3, min_insync_replicas=2, failed_topic="dlq"
    )
    tier, failed, _ledger = _plan(s, 1)
    base = {"retention.ms": tier.config["retention.ms"], "cleanup.policy": "delete"}
    ok = _inspect(tier, 1, {**base, MIN_INSYNC: "2"})
    assert (ok.status, ok.problems, ok.min_insync_replicas) == ("exists", (), "2")
    low = _inspect(tier, 1, {**base, MIN_INSYNC: "1"})
    assert low.status == "mis-sized"
    assert low.problems == (
        f"tier topic {tier.name} has min.insync.replicas=1, planned 2: retryd never "
        "reconfigures a topic (kafka-configs --alter, or recreate it)",
    )
    failed_base = {"retention.ms": failed.config["retention.ms"], "cleanup.policy": "delete"}
    assert _inspect(failed, 1, {**failed_base, MIN_INSYNC: "3"}).status == "mis-sized"
    # a broker that does not report the setting is not judged
    assert _inspect(failed, 1, failed_base).problems == ()


def test_unplanned_is_never_judged() -> None:
    s = load_settings(retry_sequence="1s", failed_topic="dlq")
    tier = _plan(s, 1)[0]
    config = {"retention.ms": tier.config["retention.ms"], MIN_INSYNC: "1"}
    assert _inspect(tier, 1, config).problems == ()
