"""Routing decisions: tier choice, exhaustion, non-retryable, malformed, partition choice."""

from __future__ import annotations

from retryd.policy import headers as h
from retryd.policy.classify import HandlerResult, Outcome
from retryd.policy.routing import route_failure, route_malformed, target_partition
from retryd.policy.sequence import RetryPlan

PLAN = RetryPlan.parse("5m,5m,30m", failed_topic="failed")
SRC = h.envelope_for_source("orders", 2, 41, 1_000)


def _hdr(route, name):  # type: ignore[no-untyped-def]
    return h.header_value(route.headers, name)


def test_first_failure_goes_to_first_tier_with_due_time() -> None:
    r = route_failure(PLAN, SRC, [("u", b"1")], HandlerResult(Outcome.RETRY, "E", "boom"), 10_000)
    assert r.topic == "retry_5m" and r.retry_number == 1 and r.due_ms == 10_000 + 300_000
    assert _hdr(r, h.RETRY_TIMESTAMP) == b"310000"
    assert _hdr(r, h.FIRST_FAILURE_TIMESTAMP) == b"10000"
    assert _hdr(r, h.ORIGINAL_PARTITION) == b"2" and _hdr(r, "u") == b"1"
    assert not r.is_dead


def test_later_failures_walk_the_sequence_then_exhaust() -> None:
    env = SRC
    topics = []
    for now in (1, 2, 3, 4):
        r = route_failure(PLAN, env, [], HandlerResult(Outcome.RETRY, "E", "x"), now)
        topics.append((r.topic, r.retry_number, r.dead_reason))
        env = h.decode_tier_envelope(r.headers) if not r.is_dead else env
    assert topics == [
        ("retry_5m", 1, None),
        ("retry_5m", 2, None),
        ("retry_30m", 3, None),
        ("failed", 3, "exhausted"),
    ]
    assert env.first_failure_timestamp == 1  # kept from the first failure


def test_non_retryable_skips_tiers() -> None:
    r = route_failure(PLAN, SRC, [], HandlerResult(Outcome.DEAD, "Poison", "bad"), 5)
    assert (r.topic, r.retry_number, r.dead_reason) == ("failed", 0, "non_retryable")
    assert _hdr(r, h.RETRY_TIMESTAMP) is None


def test_malformed_keeps_what_parses_and_names_the_record() -> None:
    hdrs = [(h.RETRY_NUMBER, b"zz"), (h.ORIGINAL_TOPIC, b"orders"), (h.ORIGINAL_OFFSET, b"9")]
    r = route_malformed(PLAN, "retry_5m", 1, 77, 3, hdrs, "bad retry_number", 100)
    assert r.topic == "failed" and r.dead_reason == "malformed"
    assert _hdr(r, h.ORIGINAL_TOPIC) == b"orders" and _hdr(r, h.ORIGINAL_OFFSET) == b"9"
    assert _hdr(r, h.ORIGINAL_PARTITION) == b"1"
    assert b"retry_5m[1]@77" in (_hdr(r, h.ERROR_MESSAGE) or b"")
    assert [k for k, _ in r.headers].count(h.RETRY_NUMBER) == 1


def test_target_partition_same_number_when_it_exists_else_keyed() -> None:
    assert target_partition(3, 8) == 3
    assert target_partition(3, 2) is None
    assert target_partition(0, None) is None


def test_the_planning_clock_rounds_up_so_a_due_time_is_never_early() -> None:
    import time

    from retryd.policy.routing import planning_now_ms

    for _ in range(1000):
        before_ns = time.time_ns()
        now_ms = planning_now_ms()
        # a due time now_ms + delay is at or after the failure (before_ns) plus the delay
        assert now_ms * 1_000_000 >= before_ns
        assert now_ms * 1_000_000 - time.time_ns() < 1_000_000
