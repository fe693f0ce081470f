"""Backoff policies in ``retry_sequence``: exp/fixed, jitter, and their tiers and due times."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from retryd.errors import SequenceError
from retryd.handlers.base import Message
from retryd.policy import headers as h
from retryd.policy.backoff import MAX_RETRIES, Backoff, parse_backoff
from retryd.policy.classify import HandlerResult, Outcome
from retryd.policy.routing import RoutePlanner
from retryd.policy.sequence import RetryPlan
from retryd.worker.intake import effective_due_ms
from tests.stub_kafka import StubBroker
from tests.support import wait_for
from tests.unit.test_engine_loop import make_worker

S = 1000


@pytest.mark.parametrize(
    ("text", "delays_s"),
    [
        ("5m,5m,30m", [300, 300, 1800]),
        ("exp(1s, x2, max=1h, n=8)", [1, 2, 4, 8, 16, 32, 64, 128]),
        ("exp(1s, x2, max=10s, n=6)", [1, 2, 4, 8, 10, 10]),
        ("exp(1s, n=4)", [1, 2, 4, 8]),  # x2 unless told
        ("exp(10s, x1.5, n=3)", [10, 15, 22.5]),
        ("fixed(30s, n=5)", [30] * 5),
        (" fixed( 30s , n = 2 ) ", [30, 30]),
        ("5m,30m, jitter=20%", [300, 1800]),
    ],
)
def test_policies_give_their_delays(text: str, delays_s: list[float]) -> None:
    assert parse_backoff(text).delays_ms == tuple(round(d * S) for d in delays_s)


def test_quick_retries_in_a_policy_and_after_a_list() -> None:
    backoff = parse_backoff("exp(1s, n=3, quick=2@100ms, jitter=10%)")
    assert (backoff.quick, backoff.quick_delay_ms, backoff.jitter) == (2, 100, 0.1)
    plan = RetryPlan.parse("5m, quick=1@2s", failed_topic="dead")
    assert (plan.quick, plan.quick_delay_ms, plan.max_retries) == (1, 2000, 1)
    assert plan.tier_topics == ["retry_5m"]  # quick retries need no topic


def test_jitter_in_a_policy_and_after_a_list() -> None:
    assert parse_backoff("exp(1s, x2, n=3, jitter=20%)").jitter == pytest.approx(0.2)
    assert parse_backoff("5m, jitter=12.5%").jitter == pytest.approx(0.125)
    assert parse_backoff("5m,30m").jitter == 0.0


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("exp(1s, x2)", "needs n="),
        ("fixed(30s)", "needs n="),
        ("exp(1s, n=0)", "1 to 64"),
        (f"exp(1s, n={MAX_RETRIES + 1})", "1 to 64"),
        ("exp(1s, n=x)", "1 to 64"),
        ("exp(1s, x1, n=3)", "above 1"),
        ("exp(1s, x0.5, n=3)", "above 1"),
        ("exp(1s, y2, n=3)", "expected x<number>"),
        ("exp(1m, max=10s, n=3)", "below the first delay"),
        ("fixed(30s, n=3, max=1h)", "unknown option 'max'"),
        ("exp(1s, n=3, speed=2)", "unknown option 'speed'"),
        ("exp(1s, n=3, n=4)", "given twice"),
        ("exp(1s, n=3, jitter=60%)", "at most 50%"),
        ("exp(1s, n=3, jitter=20)", "expected a percentage"),
        ("exp(1s, n=3", "unbalanced"),
        ("exp(1s, n=3))", "unbalanced"),
        ("5m,exp(1s, n=3)", "a policy is the whole sequence"),
        ("exp(1s, n=3),5m", "a policy is the whole sequence"),
        ("jitter=10%,5m", "options come after delays"),
        ("5m,jitter=10%,30m", "a delay after an option"),
        ("5m,jitter=", "expected name=value"),
        ("exp(, n=3)", "the first argument is a delay"),
        ("exp(\u0665s, n=3)", "invalid delay"),  # Arabic-Indic five is not a digit here
        ("5m," * MAX_RETRIES + "5m", "at most 64 retries"),
        ("5m, quick=2", "expected <retries>@<delay>"),
        ("5m, quick=0@100ms", "1 to 10 retries"),
        ("5m, quick=11@100ms", "1 to 10 retries"),
        ("5m, quick=2@2m", "at most 60s apart"),
        ("5m, quick=2@100", "invalid delay"),
        ("5m, quick=1@1s, quick=2@1s", "given twice"),
    ],
)
def test_bad_policies_are_refused_naming_the_problem(text: str, problem: str) -> None:
    with pytest.raises(SequenceError) as info:
        parse_backoff(text)
    assert problem in str(info.value)
    assert repr(text) in str(info.value) or "invalid delay" in str(info.value)


@given(st.text(max_size=60))
def test_any_text_parses_or_is_refused_with_a_sequence_error(text: str) -> None:
    try:
        backoff = parse_backoff(text)
    except SequenceError:
        return
    assert 1 <= len(backoff.delays_ms) <= MAX_RETRIES
    assert all(d > 0 for d in backoff.delays_ms)
    assert 0.0 <= backoff.jitter <= 0.5


@given(st.integers(1, 86_400_000), st.floats(0, 0.5), st.floats(0, 1, exclude_max=True))
def test_a_jittered_due_time_stays_within_its_bound(delay: int, jitter: float, u: float) -> None:
    backoff = Backoff((delay,), jitter)
    due = backoff.due_ms(delay, 1_000, lambda: u)
    assert 1_000 + delay - delay * jitter - 1 <= due <= 1_000 + backoff.bound_ms(delay)


def test_jitter_spreads_due_times_of_copies_routed_together() -> None:
    backoff = Backoff((10_000,), 0.2)
    draws = iter(i / 100 for i in range(100))
    dues = {backoff.due_ms(10_000, 0, lambda: next(draws)) for _ in range(100)}
    assert min(dues) == 8_000 and max(dues) >= 11_900 and len(dues) == 100


def test_a_policy_gets_one_tier_per_distinct_delay_and_bounds_with_jitter() -> None:
    plan = RetryPlan.parse("exp(1s, x2, max=4s, n=5, jitter=10%)", failed_topic="dead")
    assert plan.max_retries == 5
    assert plan.tier_topics == ["retry_1s", "retry_2s", "retry_4s"]
    assert plan.tier_bounds == {"retry_1s": 1_100, "retry_2s": 2_200, "retry_4s": 4_400}
    assert [plan.next_destination(n).topic for n in range(6)] == [
        "retry_1s",
        "retry_2s",
        "retry_4s",
        "retry_4s",
        "retry_4s",
        "dead",
    ]


def test_routed_copies_carry_jittered_due_times() -> None:
    plan = RetryPlan.parse("fixed(10s, n=2, jitter=20%)", failed_topic="dead")
    for u, expected in ((0.0, 8_000), (0.5, 10_000), (0.999_999, 12_000)):
        planner = RoutePlanner(plan, draw=lambda u=u: u)
        route = planner.route(
            "orders", 0, 7, 1, 0, None, None, HandlerResult(Outcome.RETRY, "E", "x"), 100_000
        )
        assert route.due_ms == 100_000 + expected
        assert (b"%d" % route.due_ms) in [v for _, v in route.headers]


def test_a_tier_consumer_honours_positive_jitter_but_not_more() -> None:
    plan = RetryPlan.parse("fixed(10s, n=1, jitter=20%)", failed_topic="dead")
    bound = plan.tier_bounds["retry_10s"]
    written = 5_000_000
    # +15 %: honoured (the tier delay alone would have cut it to 10 s)
    assert effective_due_ms(written + 11_500, written, bound, written + 10) == written + 11_500
    # an absurd header: cut to the delay plus the largest jitter
    assert effective_due_ms(written + 10**9, written, bound, written + 10) == written + 12_000


def _tier_copy(broker: Any, key: bytes, due_ms: int, now_ms: int) -> None:
    broker.append(
        "retry_1s",
        key,
        key,
        [
            (h.RETRY_NUMBER, b"1"),
            (h.RETRY_TIMESTAMP, b"%d" % due_ms),
            (h.ORIGINAL_TOPIC, b"orders"),
            (h.ORIGINAL_PARTITION, b"0"),
            (h.ORIGINAL_OFFSET, b"0"),
        ],
        partition=0,
        timestamp=now_ms,
    )


def test_a_jittered_tier_releases_due_records_past_a_later_one_but_keeps_key_order(
    tmp_path: Path,
) -> None:
    """With jitter a tier's due times are not in offset order: a copy due later must not hold
    back the due ones behind it (head-of-line lateness), except those of its own key."""
    broker = StubBroker()
    started: dict[bytes, float] = {}

    def handler(m: Message) -> None:
        started.setdefault(m.value or b"", time.monotonic())

    worker = make_worker(broker, tmp_path, handler, sequence="fixed(1s, n=1, jitter=50%)")
    now = int(time.time() * 1000)
    _tier_copy(broker, b"a", now + 1_400, now)  # offset 0: due in 1.4 s
    _tier_copy(broker, b"b", now, now)  # offset 1: another key, due now
    _tier_copy(broker, b"a", now, now)  # offset 2: key a again, due now, behind offset 0
    began = time.monotonic()
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        wait_for(lambda: len(started) == 2 or b"a" in started, 10, what="the due record")
        first = min(started.items(), key=lambda kv: kv[1])
        assert first[0] == b"b" and first[1] - began < 1.0, started
        wait_for(lambda: b"a" in started, 10, what="key a once due")
        assert started[b"a"] - began >= 1.2, "key a's later record ran before its earlier one"
    finally:
        worker.stop()
        thread.join(10)
    assert broker.committed_offset("g", "retry_1s") == 3


def test_a_delay_before_the_first_attempt_in_a_policy_and_after_a_list() -> None:
    assert parse_backoff("fixed(1m, n=3, delay=10s)").first_delay_ms == 10_000
    assert parse_backoff("5m,30m, delay=500ms, jitter=10%").first_delay_ms == 500
    assert parse_backoff("5m").first_delay_ms == 0
    plan = RetryPlan.parse("exp(1s, n=2, delay=2s)", failed_topic="failed")
    assert plan.first_delay_ms == 2000 and plan.backoff.first_delay_ms == 2000
    assert plan.tier_topics == ["retry_1s", "retry_2s"]  # the first delay is not a tier


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("5m, delay=2h", "at most 1h before the first attempt"),
        ("5m, delay=soon", "invalid delay"),
        ("5m, delay=1s, delay=2s", "given twice"),
    ],
)
def test_invalid_first_delays_are_refused(text: str, message: str) -> None:
    with pytest.raises(SequenceError, match=message):
        parse_backoff(text)


def test_a_route_cannot_delay_a_first_attempt() -> None:
    with pytest.raises(SequenceError, match="delay= is not allowed in a route"):
        RetryPlan.parse(
            "1m", failed_topic="failed", routes={"TimeoutError": "fixed(1s, n=2, delay=5s)"}
        )


def test_main_topic_records_wait_their_first_delay_in_memory(tmp_path: Path) -> None:
    broker = StubBroker()
    calls: dict[int, float] = {}
    lock = threading.Lock()

    def handler(m: Message) -> None:
        with lock:
            calls[m.offset] = time.time() * 1000

    # a small tier_buffer: the main partition's tail pauses and resumes like a tier's
    worker = make_worker(broker, tmp_path, handler, sequence="1s, delay=300ms", tier_buffer=5)
    old = int(time.time() * 1000) - 10_000
    broker.append("orders", b"old", b"v", timestamp=old)  # its delay is over already
    written = {0: old}
    for i in range(1, 30):
        written[i] = broker.append("orders", b"k%d" % (i % 3), b"v").timestamp
    started = time.time() * 1000
    worker.run(until_drained=True)

    assert sorted(calls) == list(range(30))
    assert calls[0] - started < 250  # its delay was over: it ran at once
    for offset in range(1, 30):
        assert calls[offset] >= written[offset] + 300, offset  # never early
    assert broker.committed_offset("g", "orders") == 30
