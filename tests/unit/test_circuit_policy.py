"""The breaker's policy: when an outage opens the circuit, how probes grow, what closes it."""

from __future__ import annotations

import pytest

from retryd.policy.circuit import (
    STATE_VALUE,
    Breaker,
    BreakerPolicy,
    CircuitAction,
    CircuitState,
    Window,
)

OPEN, HALF, CLOSED = CircuitState.OPEN, CircuitState.HALF_OPEN, CircuitState.CLOSED


def _fail(b: Breaker, now: int, keys: range | list[int], error: str = "http_503") -> None:
    for k in keys:
        b.observe(now, 0, [(k, f"{error} at t[0]@{k}")])


def _outage(b: Breaker, now: int, keys: range | list[int]) -> None:
    """First attempts fail across keys, and the confirming retry of a failed record fails."""
    _fail(b, now, keys)
    assert b.state is HALF and b.confirming
    b.probe_failed(now, "http_503 at t[0]@0")


def test_defaults_are_the_documented_ones() -> None:
    p = BreakerPolicy()
    assert (p.window_calls, p.window_s, p.failure_ratio, p.min_failures, p.min_keys) == (
        100,
        60.0,
        0.5,
        20,
        5,
    )
    assert (p.probe_initial_s, p.probe_max_s) == (5.0, 60.0)
    assert STATE_VALUE == {CLOSED: 0, HALF: 1, OPEN: 2}


def test_an_outage_across_keys_confirms_at_the_twentieth_failure_then_opens() -> None:
    b = Breaker(BreakerPolicy(), 0)
    _fail(b, 1000, range(19))
    assert b.state is CLOSED
    _fail(b, 1000, [19])
    # no retry evidence yet: one failed record runs again before anything is held for long
    assert b.state is HALF and b.confirming
    assert "confirming: 20 of the last 20 calls failed, from 20 keys" in b.reason
    assert b.last_error == "http_503 at t[0]@19"
    b.probe_failed(1001, "http_503 at t[0]@3")
    assert b.state is OPEN and not b.confirming
    assert "20 of the last 20 calls failed" in b.reason and "the probe failed" in b.reason
    assert b.snapshot().transitions == {"half_open": 1, "open": 1}


def test_a_confirming_retry_that_succeeds_closes_and_spares_the_next_trip() -> None:
    """Records that fail once and succeed when retried are not an outage."""
    b = Breaker(BreakerPolicy(), 0)
    _fail(b, 0, range(20))
    assert b.state is HALF
    b.retried(10, 1, 0)  # the failed record, run again, succeeded
    b.probe_answered(10)
    assert b.state is CLOSED
    _fail(b, 20, range(20, 60))  # first attempts keep failing
    assert b.state is CLOSED and b.spared >= 1


def test_retries_that_succeed_keep_the_window_from_opening_it() -> None:
    b = Breaker(BreakerPolicy(), 0)
    b.retried(0, 30, 10)  # tier records: mostly answered
    _fail(b, 1000, range(100))
    assert b.state is CLOSED and b.spared > 0


def test_retries_that_fail_or_stale_evidence_confirm() -> None:
    b = Breaker(BreakerPolicy(), 0)
    b.retried(0, 1, 5)  # retries mostly fail too
    _fail(b, 1000, range(20))
    assert b.state is HALF
    b = Breaker(BreakerPolicy(evidence_s=10), 0)
    b.retried(0, 10, 0)  # they succeeded, but 20 s ago
    _fail(b, 20_000, range(20))
    assert b.state is HALF


def test_a_probe_without_an_answer_counts_as_failed() -> None:
    b = Breaker(BreakerPolicy(), 0, draw=lambda: 0.5)
    _outage(b, 0, range(20))
    assert b.probe_due(5000)
    b.probe_lost(5000, "t[0]@7", 3.0)
    assert b.state is OPEN and b.next_probe_ms == 15_000  # the interval grew
    assert b.last_error is not None and "no answer from the probe t[0]@7 within 3s" in b.last_error


def test_one_poison_key_never_opens_it() -> None:
    b = Breaker(BreakerPolicy(), 0)
    for t in range(500):
        b.observe(t, 0, [(b"poison", "ValueError at t[0]@1")])
    assert b.state is CLOSED
    assert len(b.window.keys) == 1 and b.window.failures == 100  # the window is bounded


def test_four_keys_failing_are_not_an_outage_five_are() -> None:
    b = Breaker(BreakerPolicy(), 0)
    _fail(b, 0, [k % 4 for k in range(60)])
    assert b.state is CLOSED
    _fail(b, 0, [4])
    assert b.state is HALF


def test_failures_under_the_ratio_do_not_open_it() -> None:
    b = Breaker(BreakerPolicy(), 0)
    for i in range(300):  # 40 % failures, from many keys
        b.observe(i, 3, [(i * 2, "e"), (i * 2 + 1, "e")])
    assert b.state is CLOSED
    assert b.window.calls == 100


def test_old_failures_leave_the_window() -> None:
    b = Breaker(BreakerPolicy(window_s=10), 0)
    _fail(b, 0, range(19))
    _fail(b, 10_001, [100])  # the 19 are more than 10 s old
    assert b.state is CLOSED and b.window.failures == 1


def test_a_partial_answers_entry_is_trimmed_to_the_window() -> None:
    w = Window(10, 60_000)
    w.add(0, 8, [])
    w.add(1, 0, ["a", "b", "c", "d"])
    assert (w.calls, w.failures) == (10, 4)
    w.add(2, 0, ["e"] * 6)
    assert (w.calls, w.failures) == (10, 10)
    assert dict(w.keys) == {"a": 1, "b": 1, "c": 1, "d": 1, "e": 6}


def test_probes_grow_exponentially_with_jitter_up_to_the_cap() -> None:
    draws = iter([0.5] * 10)  # 0.5: no jitter
    b = Breaker(BreakerPolicy(probe_initial_s=5, probe_max_s=30), 0, draw=lambda: next(draws))
    _outage(b, 0, range(20))
    waits = []
    now = 0
    for _ in range(4):
        assert b.next_probe_ms is not None
        waits.append(b.next_probe_ms - now)
        now = b.next_probe_ms
        assert not b.probe_due(now - 1)
        assert b.probe_due(now) and b.state is HALF
        b.probe_failed(now, "http_503 at t[0]@1")
        assert b.state is OPEN
    assert waits == [5000, 10_000, 20_000, 30_000]
    assert b.probes == 5  # the confirming one and four


def test_jitter_spreads_a_probe_within_twenty_percent() -> None:
    for draw, expected in ((0.0, 4000), (1.0, 6000)):
        b = Breaker(BreakerPolicy(), 0, draw=lambda d=draw: d)
        _outage(b, 0, range(20))
        assert b.next_probe_ms == expected


def test_an_answer_while_half_open_closes_and_resets() -> None:
    b = Breaker(BreakerPolicy(), 0, draw=lambda: 0.5)
    _outage(b, 0, range(20))
    assert b.probe_due(5000)
    b.probe_failed(5000, "x")
    assert b.probe_due(15_000)
    b.probe_answered(15_100)
    assert b.state is CLOSED and b.window.calls == 0
    assert b.reason == "a call was answered"
    _outage(b, 20_000, range(20))  # a new outage starts from the first interval again
    assert b.next_probe_ms == 25_000


def test_the_last_error_is_bounded() -> None:
    b = Breaker(BreakerPolicy(), 0)
    b.observe(0, 0, [(1, "x" * 5000)])
    assert b.last_error is not None and len(b.last_error) == 200


def test_operator_orders() -> None:
    b = Breaker(BreakerPolicy(), 0, draw=lambda: 0.5)
    b.force(CircuitAction.OPEN, 10, "ops")
    assert b.state is OPEN and b.reason == "opened by ops" and b.next_probe_ms == 5010
    b.force(CircuitAction.PROBE, 20, "ops")
    assert b.probe_due(20) and b.state is HALF
    b.force(CircuitAction.CLOSE, 30, "ops")
    assert b.state is CLOSED and b.reason == "closed by ops"
    assert b.snapshot().transitions == {"open": 1, "half_open": 1, "closed": 1}


def test_disabled_never_opens() -> None:
    b = Breaker(BreakerPolicy(enabled=False), 0)
    _fail(b, 0, range(200))
    assert b.state is CLOSED


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"min_failures": 200}, "could never open"),
        ({"failure_ratio": 0}, "(0, 1]"),
        ({"probe_initial_s": 10, "probe_max_s": 5}, "must be above 0 and not exceed"),
        ({"min_keys": 0}, "at least 1"),
    ],
)
def test_inconsistent_policies_are_refused(kwargs: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace("]", r"\]")):
        BreakerPolicy(**kwargs)  # type: ignore[arg-type]


def test_settings_validate_the_combination() -> None:
    from retryd.config.settings import load_settings
    from retryd.errors import ConfigError

    with pytest.raises(ConfigError, match="could never open"):
        load_settings(None, main_topics=["orders"], circuit_min_failures=500)


def test_a_burst_of_failures_settled_after_its_answers_is_cut_in_proportion() -> None:
    # one poll iteration: 200 answers, then 96 failures (32 %); the next one: 32 answers. The
    # older observation is cut in proportion, not answers first, so the ratio stays ~32 %.
    w = Window(100, 60_000)
    w.add(0, 200, [])
    w.add(0, 0, range(96))
    assert (w.calls, w.failures) == (296, 96)  # the current observation is never cut
    w.add(1, 32, [])
    assert w.calls == 100
    assert 0.2 < w.failures / w.calls < 0.3
