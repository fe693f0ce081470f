"""The bulk-replay token bucket, on a fake clock."""

from __future__ import annotations

import threading

import pytest

from retryd.replay.ratelimit import TokenBucket


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_starts_empty_so_n_tokens_take_n_over_rate() -> None:
    clock = Clock()
    bucket = TokenBucket(500, clock=clock)
    taken = 0
    while taken < 2000:
        wait = bucket.try_take()
        if wait:
            clock.now += wait
        else:
            taken += 1
    assert clock.now - 100.0 == pytest.approx(2000 / 500, rel=1e-6)


def test_burst_is_capped_after_idle() -> None:
    clock = Clock()
    bucket = TokenBucket(100, burst=5, clock=clock)
    clock.now += 60  # idle for a minute
    immediate = 0
    while bucket.try_take() == 0:
        immediate += 1
    assert immediate == 5


def test_take_returns_false_when_stopped() -> None:
    stop = threading.Event()
    stop.set()
    assert TokenBucket(0.001).take(stop) is False


def test_rate_must_be_positive() -> None:
    with pytest.raises(ValueError):
        TokenBucket(0)
