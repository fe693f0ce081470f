"""key_order settings and the key-state topic's provisioning."""

from __future__ import annotations

import os

import pytest

from retryd.config import load_settings
from retryd.errors import ConfigError
from retryd.kafka.topics import KEY_STATE_DELETE_RETENTION_MS, _inspect, _plan
from retryd.policy.key_order import KeyOrder, OnDeadLetter


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("RETRYD_"):
            monkeypatch.delenv(name)


def test_defaults_keep_no_key_state() -> None:
    s = load_settings(main_topics="a,b", retry_sequence="1s")
    assert s.key_order is KeyOrder.NONE
    assert s.strict_topics == frozenset()
    assert [x.kind for x in _plan(s, 2)] == ["tier", "failed", "ledger"]


def test_strict_for_every_main_topic_or_some(monkeypatch: pytest.MonkeyPatch) -> None:
    s = load_settings(main_topics="a,b", key_order="strict")
    assert s.strict_topics == {"a", "b"}
    monkeypatch.setenv("RETRYD_KEY_ORDER", "strict")
    monkeypatch.setenv("RETRYD_KEY_ORDER_TOPICS", "b")
    monkeypatch.setenv("RETRYD_KEY_ORDER_ON_DEAD_LETTER", "dead_letter")
    s = load_settings(main_topics="a,b")
    assert s.strict_topics == {"b"}
    assert s.key_order_on_dead_letter is OnDeadLetter.DEAD_LETTER


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ({"key_order": "strict", "ordering": "partition"}, "key_order=strict needs ordering=key"),
        ({"key_order": "strict", "exactly_once": True}, "not work with exactly_once"),
        ({"key_order_topics": "zzz"}, "key_order_topics zzz are not main topics"),
        ({"key_state_topic": "failed_topic"}, "already used for another purpose"),
        ({"key_state_topic": "retry_1s"}, "is a tier or dead-letter topic"),
        ({"key_order": "sometimes"}, "key_order"),
        ({"key_order_max_blocked_s": -1}, "key_order_max_blocked_s"),
    ],
)
def test_invalid_combinations_are_refused(overrides: dict[str, object], expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_settings(main_topics="a", retry_sequence="1s", **overrides)
    assert any(expected in line for line in info.value.problems), info.value.problems


def test_strict_plans_a_compacted_key_state_topic() -> None:
    s = load_settings(
        main_topics="a",
        retry_sequence="1s",
        key_order="strict",
        replication_factor=3,
        min_insync_replicas=2,
    )
    state = _plan(s, 4)[-1]
    assert (state.name, state.kind, state.partitions, state.replication_factor) == (
        "retryd_key_state",
        "key_state",
        4,
        3,
    )
    assert state.config == {
        "cleanup.policy": "compact",
        "delete.retention.ms": str(KEY_STATE_DELETE_RETENTION_MS),
        "min.insync.replicas": "2",
    }
    sized = load_settings(main_topics="a", key_order="strict", key_state_partitions=12)
    assert _plan(sized, 4)[-1].partitions == 12


def test_check_refuses_a_key_state_topic_that_is_not_compacted() -> None:
    s = load_settings(main_topics="a", retry_sequence="1s", key_order="strict")
    state = _plan(s, 2)[-1]
    assert _inspect(state, 2, {"cleanup.policy": "compact"}).problems == ()
    for policy in ("delete", "compact,delete"):
        found = _inspect(state, 2, {"cleanup.policy": policy})
        assert found.status == "mis-sized"
        assert "expected compact" in found.problems[0]
    assert _inspect(state, 1, {"cleanup.policy": "compact"}).status == "mis-sized"


def test_prometheus_sink_counts_key_order_events_and_sets_the_gauges() -> None:
    from prometheus_client import REGISTRY

    from retryd.metrics.sink import PrometheusSink
    from retryd.worker.events import BatchStats

    def value(name: str, **labels: str) -> float:
        return REGISTRY.get_sample_value(name, labels) or 0.0

    sink = PrometheusSink([])
    before = value("retryd_key_order_total", event="parked")
    stats = BatchStats()
    stats.key_order["parked"] += 4
    stats.key_order["released"] += 1
    assert stats
    sink.batch(stats, 0.0, 1.0)
    assert value("retryd_key_order_total", event="parked") - before == 4
    sink.key_order(3, 7, 12.5)
    assert value("retryd_key_order_blocked_keys") == 3
    assert value("retryd_key_order_chain_entries") == 7
    assert value("retryd_key_order_oldest_blocked_seconds") == 12.5
