"""What the sidecar, ``retryd replay`` and the replay targets know of error routes: every dead
reason (``routed`` included) is a valid filter, the routes' dead-letter topics can be read but
are never replay targets, and no other topic can be named as a source."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError
from typer.testing import CliRunner

from retryd.api.schemas import FilterIn, ReplayJobIn, ReplayJobOut
from retryd.cli import app
from retryd.config import Settings
from retryd.metrics.replays import LedgerTail
from retryd.policy import headers as h
from retryd.policy.oversize import DEAD_TOO_LARGE
from retryd.replay.errors import InvalidRequest, NotADeadLetterTopic, TargetReserved
from retryd.replay.records import DEAD_REASONS
from retryd.replay.sources import dead_letter_topics, source_topic
from retryd.replay.targets import TargetPolicy, reserved_topics

ROUTES = {
    "myapp.Declined": "dlt:orders.declined",
    "Poison": "dlt:orders.poison",
    "Also": "dlt:orders.declined",  # the same DLT twice: listed once
    "TimeoutError": "5s,10s",
    "ValidationError": "dead",
}


def settings(**extra: Any) -> Settings:
    return Settings(
        main_topics=["orders"],
        failed_topic="orders.failed",
        ledger_topic="orders.ledger",
        error_routes=ROUTES,
        **extra,
    )


def test_every_dead_reason_the_worker_writes_is_known() -> None:
    assert set(h.DEAD_REASONS) | {DEAD_TOO_LARGE} == set(DEAD_REASONS)
    assert h.DEAD_ROUTED in DEAD_REASONS


def test_the_api_enum_is_derived_from_the_dead_reasons() -> None:
    prop = FilterIn.model_json_schema()["properties"]["dead_reason"]
    enum = next(choice["enum"] for choice in prop["anyOf"] if "enum" in choice)
    assert enum == list(DEAD_REASONS)
    assert FilterIn(dead_reason="routed").dead_reason == "routed"
    assert FilterIn(dead_reason="too_large").dead_reason == "too_large"
    with pytest.raises(ValidationError):
        FilterIn(dead_reason="bored")


def test_dead_letter_topics_are_failed_topic_then_the_routes_dlts() -> None:
    s = settings()
    assert dead_letter_topics(s) == ("orders.failed", "orders.declined", "orders.poison")
    no_routes = Settings(main_topics=["orders"], failed_topic="orders.failed")
    assert dead_letter_topics(no_routes) == ("orders.failed",)


def test_source_topic_defaults_to_failed_topic_and_refuses_any_other_topic() -> None:
    s = settings()
    assert source_topic(s, None) == "orders.failed"
    assert source_topic(s, "orders.failed") == "orders.failed"
    assert source_topic(s, "orders.poison") == "orders.poison"
    tier = s.plan.tier_topics[0]
    for other in ("orders", "orders.ledger", tier, "__consumer_offsets", "unknown"):
        with pytest.raises(NotADeadLetterTopic) as caught:
            source_topic(s, other)
        assert isinstance(caught.value, InvalidRequest)  # answered 400
        assert "orders.failed, orders.declined, orders.poison" in str(caught.value)


def test_a_routes_dead_letter_topic_is_never_a_replay_target() -> None:
    s = settings(replay_allowlist=["orders", "orders.declined"])
    reserved = reserved_topics(s)
    assert reserved["orders.declined"] == "a dead-letter topic of an error route (dlt:)"
    assert "orders.poison" in reserved and "orders.failed" in reserved
    policy = TargetPolicy({}, s.replay_allowlist, reserved=reserved)
    try:
        assert policy.allowed == {"orders"}
        with pytest.raises(TargetReserved, match="dead-letter topic of an error route"):
            policy.require_allowed("orders.declined")
    finally:
        policy.close()


def test_job_bodies_name_their_topic() -> None:
    assert ReplayJobIn().topic is None
    assert ReplayJobIn(topic="orders.poison").topic == "orders.poison"
    with pytest.raises(ValidationError):
        ReplayJobIn(topic="not a topic")
    assert "topic" in ReplayJobOut.model_json_schema()["required"]


def test_the_ledger_tail_counts_replays_from_every_dead_letter_topic() -> None:
    tail = LedgerTail({}, "orders.ledger", "orders.failed", dlt_topics=["orders.declined"])
    assert b"orders.failed/0/1".startswith(tail.prefix)
    assert b"orders.declined/2/7".startswith(tail.prefix)
    assert not b"orders.failed.other/0/1".startswith(tail.prefix)
    assert not b"orders/0/1".startswith(tail.prefix)


CLI_ENV = {
    "RETRYD_MAIN_TOPICS": "orders",
    "RETRYD_FAILED_TOPIC": "orders.failed",
    "RETRYD_ERROR_ROUTES": "myapp.Declined=dlt:orders.declined",
    # nothing below reaches Kafka: every case exits on its arguments first
    "RETRYD_BOOTSTRAP_SERVERS": "127.0.0.1:1",
}


def test_replay_cli_accepts_routed_and_checks_the_topic() -> None:
    runner = CliRunner()
    bad = runner.invoke(app, ["replay", "--dead-reason", "bored"], env=CLI_ENV)
    assert bad.exit_code == 2
    assert "exhausted, non_retryable, malformed, routed, too_large" in bad.output
    # routed passes the reason check; the unknown topic is what stops it (before Kafka)
    other = runner.invoke(
        app, ["replay", "--dead-reason", "routed", "--topic", "orders"], env=CLI_ENV
    )
    assert other.exit_code == 2, other.output
    assert "--topic" in other.output and "not a dead-letter topic" in other.output
    assert "orders.failed, orders.declined" in other.output


def test_the_key_state_topic_is_never_a_replay_target() -> None:
    """Issue 23, item 11: a record replayed into strict order's key-state topic would be read
    as a chain entry by every worker (or skipped as malformed), never handled."""
    s = settings(replay_allowlist=["orders", "retryd_key_state"])
    reserved = reserved_topics(s)
    assert reserved[s.key_state_topic] == "the key-state topic (key_order = strict)"
    policy = TargetPolicy({}, s.replay_allowlist, reserved=reserved)
    try:
        assert policy.allowed == {"orders"}
        with pytest.raises(TargetReserved, match="key-state topic"):
            policy.require_allowed(s.key_state_topic)
    finally:
        policy.close()
