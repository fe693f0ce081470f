"""A running share worker reads its group's record lock and delivery limit again
(``retryd.share.group.GroupConfigWatch``): a change is taken between batches, a failed read
keeps the values in force (one warning until it works again), and a lock shortened below what
a call needs is an error in the log, never an exit."""

from __future__ import annotations

import logging

import pytest

from retryd.errors import KafkaRuntimeError
from retryd.share.group import (
    LOCK_MARGIN_S,
    GroupConfigWatch,
    ShareGroupConfig,
    lock_holds,
    start_budget_s,
)
from tests.support import wait_for

START = ShareGroupConfig("orders.share", 30_000, 5, "earliest", False)


class Answers:
    """What the broker answers to each read, in turn (a config, or an error)."""

    def __init__(self, *answers: ShareGroupConfig | Exception) -> None:
        self.answers = list(answers)
        self.reads = 0

    def __call__(self, admin: object, group: str) -> ShareGroupConfig:
        assert group == "orders.share"
        self.reads += 1
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer


def watch(answers: Answers, call_s: float = 10.0) -> GroupConfigWatch:
    return GroupConfigWatch(None, START, call_s, call_s, read=answers)  # type: ignore[arg-type]


def cfg(lock_ms: int, limit: int) -> ShareGroupConfig:
    return ShareGroupConfig("orders.share", lock_ms, limit, "earliest", False)


def test_a_change_is_taken_once_and_an_unchanged_read_is_nothing() -> None:
    w = watch(Answers(START, cfg(60_000, 8), cfg(60_000, 8)))
    assert w.refresh() is None and w.take() is None
    assert w.refresh() == cfg(60_000, 8)
    assert w.take() == cfg(60_000, 8)
    assert w.take() is None  # taken
    assert w.refresh() is None and w.current == cfg(60_000, 8)


def test_a_failed_read_keeps_the_values_and_warns_once(caplog: pytest.LogCaptureFixture) -> None:
    down = KafkaRuntimeError("cannot read the configuration")
    w = watch(Answers(down, down, down, cfg(20_000, 3)))
    with caplog.at_level(logging.INFO, logger="retryd.share.group"):
        for _ in range(3):
            assert w.refresh() is None
        assert w.failing and w.current == START and w.take() is None
        assert w.refresh() == cfg(20_000, 3)
    warnings = [r for r in caplog.records if "cannot read its configuration again" in r.message]
    assert len(warnings) == 1
    assert "keeps share.record.lock.duration.ms=30000" in warnings[0].message
    assert any("is read again" in r.message for r in caplog.records)
    assert not w.failing


def test_a_lock_shortened_below_a_call_is_an_error_and_the_worker_carries_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    w = watch(Answers(cfg(15_000, 5)), call_s=14.0)
    with caplog.at_level(logging.WARNING, logger="retryd.share.group"):
        assert w.refresh() == cfg(15_000, 5)
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and "no longer holds a handler call" in errors[0].message
    assert w.take() == cfg(15_000, 5)


def test_the_start_budget_is_a_call_and_its_margin_or_half_a_lock_too_short() -> None:
    assert lock_holds(START, 10.0) and start_budget_s(START, 10.0) == 10.0 + LOCK_MARGIN_S
    assert not lock_holds(START, 28.0)
    assert start_budget_s(START, 28.0) == 15.0  # half the 30 s lock


def test_the_thread_reads_every_interval_and_stops() -> None:
    answers = Answers(*([START] * 1000))
    w = GroupConfigWatch(None, START, 1.0, 1.0, interval_s=0.01, read=answers)  # type: ignore[arg-type]
    w.start()
    try:
        wait_for(lambda: answers.reads >= 3, 10, 0.01, "three reads")
    finally:
        w.stop()


def test_a_read_that_times_out_is_a_failed_read_not_the_end_of_the_thread() -> None:
    # an admin future's result(timeout) raises the builtin TimeoutError (seen with a node of
    # the cluster down): it once ended the watch thread with a traceback
    w = watch(Answers(TimeoutError(), cfg(20_000, 3)))
    assert w.refresh() is None and w.failing and w.current == START
    assert w.refresh() == cfg(20_000, 3) and not w.failing


def test_read_group_config_turns_a_timeout_into_a_retryd_error() -> None:
    from retryd.share.group import read_group_config

    class SlowAdmin:
        def describe_configs(self, resources: list[object]) -> dict[object, object]:
            class Never:
                def result(self, timeout: float) -> object:
                    raise TimeoutError()

            return {r: Never() for r in resources}

    with pytest.raises(KafkaRuntimeError, match="cannot read the configuration of share group"):
        read_group_config(SlowAdmin(), "orders.share")  # type: ignore[arg-type]
