"""Runs (retryd.worker.runs): records of fast handlers go through the engine a partition's
consecutive records at a time. Every guarantee a single record has must hold for each record
of a run: called once, key order, a failure routed alone, a revoke committing what ran and
nothing else, calls turning slow getting their concurrency back.

Whether calls are fast is never left to the machine here: each test pins the scheduler's pace
(``fast_calls``), so runs are made from the first batch on a loaded machine as on a quiet one;
only slowness is measured, where a test makes calls slow on purpose (a sleep is never
shorter than asked)."""

from __future__ import annotations

import math
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from retryd.handlers.base import Message
from retryd.worker import run_intake as intake_module
from retryd.worker import runs as runs_module
from retryd.worker import settle as settle_module
from retryd.worker import thread_pool as thread_pool_module
from retryd.worker.engine import Worker
from retryd.worker.run_policy import RunPace
from retryd.worker.thread_pool import ThreadPool
from tests.stub_kafka import StubBroker
from tests.support import wait_for
from tests.unit.test_engine_loop import (
    GROUP,
    MAIN,
    Calls,
    _max_concurrency,
    _overlaps,
    make_worker,
    recorded,
    send,
)
from tests.unit.test_engine_loop import running as _running

running = _running  # the fixture: a worker run in a thread, stopped at teardown


def fast_calls(worker: Worker, slow_call_s: float = math.inf) -> None:
    """Calls count as fast from the first batch on, whatever the machine does: the pace is
    pinned (a switch the test holds), never measured. A run stops as "slow" only for calls
    past ``slow_call_s`` (never, by default), so no test here depends on calls returning in
    microseconds (issue 32 item 1: on a busy machine no run was made at all)."""
    assert isinstance(worker.pool, ThreadPool), "only the thread pool runs runs"
    worker.scheduler.pace = RunPace(fast=True, slow_call_s=slow_call_s)


@pytest.fixture
def broker() -> StubBroker:
    return StubBroker()


@pytest.fixture
def runs_made(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many records each run that started held (the scheduler may unfold a run the
    intake offered: only those its slot started count)."""
    made: list[int] = []
    real = thread_pool_module.call_run

    def counted(run: Any, *args: Any) -> Any:
        if not run.done:
            made.append(len(run.raws))
        return real(run, *args)

    monkeypatch.setattr(thread_pool_module, "call_run", counted)
    return made


def _in_key_order(calls: Calls) -> None:
    """Per partition and key, main-topic calls start in offset order and never overlap."""
    by_key: dict[tuple[int, Any], list[dict[str, Any]]] = defaultdict(list)
    for c in calls.items:
        if c["topic"] == MAIN:
            by_key[(c["partition"], c["key"])].append(c)
    for items in by_key.values():
        items.sort(key=lambda c: c["start"])
        assert [c["offset"] for c in items] == sorted(c["offset"] for c in items)
        assert not _overlaps([(c["start"], c["end"]) for c in items])


def test_fast_calls_run_as_runs_each_record_once_in_key_order(
    broker: StubBroker, tmp_path: Path, runs_made: list[int]
) -> None:
    calls = Calls()
    worker = make_worker(broker, tmp_path, recorded(calls), partitions=3, batch_size=200)
    fast_calls(worker)
    send(broker, 6000, keys=40, partitions=3)
    summary = worker.run(until_drained=True)
    assert runs_made and sum(runs_made) > 3000, "fast calls should have run as runs"
    offsets = [c["offset"] for c in calls.items]
    assert sorted(offsets) == sorted([*range(2000)] * 3)  # every record once
    _in_key_order(calls)
    assert summary.total("success") == 6000
    for p in range(3):
        assert broker.committed_offset(GROUP, MAIN, p) == 2000


@pytest.mark.parametrize("ordering", ["key", "partition", "none"])
def test_a_failure_inside_a_run_routes_that_record_alone(
    broker: StubBroker,
    tmp_path: Path,
    runs_made: list[int],
    ordering: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(runs_module, "RUNS_BACKOFF", 0)  # runs again right after a failure
    splits: list[int] = []
    real_split = settle_module.split_failed

    def split(run: Any, *args: Any) -> Any:
        splits.append(run.done)
        return real_split(run, *args)

    monkeypatch.setattr(settle_module, "split_failed", split)
    calls = Calls()

    def fail_some(m: Message) -> None:
        if m.retry_number == 0 and m.offset % 97 == 13:  # inside runs of 100 records
            raise ValueError("this one")

    worker = make_worker(
        broker, tmp_path, recorded(calls, fail_some), partitions=2, ordering=ordering
    )
    fast_calls(worker)
    send(broker, 4000, keys=7, partitions=2)
    summary = worker.run(until_drained=True)
    assert runs_made
    assert splits and any(splits), splits  # failures inside runs, part-way
    failing = sorted((p, o) for p in range(2) for o in range(2000) if o % 97 == 13)
    tier = broker.records("retry_1s")
    assert len(tier) == len(failing)
    main = sorted((c["partition"], c["offset"]) for c in calls.items if c["topic"] == MAIN)
    assert main == sorted((p, o) for p in range(2) for o in range(2000))  # each once
    assert summary.total("retried") == len(failing)
    if ordering == "key":
        _in_key_order(calls)
    if ordering == "partition":
        for p in range(2):
            items = sorted(
                (c for c in calls.items if c["topic"] == MAIN and c["partition"] == p),
                key=lambda c: c["start"],
            )
            assert [c["offset"] for c in items] == list(range(2000))
    for p in range(2):
        assert broker.committed_offset(GROUP, MAIN, p) == 2000


def test_a_revoke_stops_a_run_and_commits_what_ran(
    broker: StubBroker,
    tmp_path: Path,
    running: Callable[[Worker], threading.Thread],
    runs_made: list[int],
) -> None:
    in_call = threading.Event()
    release = threading.Event()
    calls = Calls()

    def block_at_305(m: Message) -> None:
        if m.offset == 305:
            in_call.set()
            release.wait(10)

    worker = make_worker(broker, tmp_path, recorded(calls, block_at_305), batch_size=100)
    fast_calls(worker)
    send(broker, 300, keys=1)
    running(worker)
    wait_for(lambda: broker.committed_offset(GROUP, MAIN) == 300, 10, what="the warm-up")
    made = len(runs_made)
    send(broker, 50, keys=1)
    assert in_call.wait(5)
    assert len(runs_made) > made, "the second lot should run as a run"
    consumer = broker.consumers[0]
    st = worker.book.parts[(MAIN, 0)]
    consumer.trigger_revoke([(MAIN, 0)])
    wait_for(lambda: st.closing, 10, what="the revoke to close the partition")
    release.set()  # the call finishes while the revoke waits for it
    wait_for(lambda: (MAIN, 0) not in consumer.assigned, 10, what="the revoke to complete")
    # the record running was settled and committed with every one before it; nothing of the
    # run after it started
    assert broker.committed_offset(GROUP, MAIN) == 306
    assert calls.offsets() == list(range(306))


def test_calls_turning_slow_get_key_concurrency_back(
    broker: StubBroker,
    tmp_path: Path,
    running: Callable[[Worker], threading.Thread],
    runs_made: list[int],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    stopped: list[int] = []
    real_resume = intake_module.resume_singles

    def resume(run: Any, *args: Any) -> None:
        stopped.append(run.done)
        real_resume(run, *args)

    monkeypatch.setattr(intake_module, "resume_singles", resume)
    calls = Calls()
    slow = threading.Event()

    def maybe_slow(m: Message) -> None:
        if slow.is_set():
            time.sleep(0.02)

    worker = make_worker(
        broker, tmp_path, recorded(calls, maybe_slow), max_in_flight=8, batch_size=100
    )
    # calls count as fast until they measure slow: a 20 ms sleep always does, past 5 ms
    fast_calls(worker, slow_call_s=0.005)
    send(broker, 1000, keys=50)
    running(worker)
    wait_for(lambda: broker.committed_offset(GROUP, MAIN) == 1000, 10, what="the fast part")
    assert runs_made
    slow.set()
    with broker.lock:  # consumed as full batches: the first of them one run of 100 records
        send(broker, 400, keys=50)
    wait_for(lambda: broker.committed_offset(GROUP, MAIN) == 1400, 30, what="the slow part")
    assert stopped and stopped[0] == runs_module.SLOW_STREAK, stopped  # stopped as it slowed
    _in_key_order(calls)
    late = [c for c in calls.items if c["offset"] >= 1000]
    assert sorted(c["offset"] for c in late) == list(range(1000, 1400))
    # the rest ran as single records again: different keys side by side
    assert _max_concurrency(late) > 1


def _started_in_key_order(calls: Calls, partition: int) -> None:
    """No main-topic call of a key of ``partition`` starts before every earlier offset of its
    key ended: the first offender named."""
    ended: dict[Any, list[dict[str, Any]]] = defaultdict(list)
    for c in calls.items:
        if c["topic"] == MAIN and c["partition"] == partition:
            ended[c["key"]].append(c)
    for items in ended.values():
        for c in items:
            for e in items:
                if e["offset"] < c["offset"]:
                    assert e["end"] <= c["start"], (
                        f"offset {c['offset']} started before offset {e['offset']} of its key "
                        f"({c['key']!r}) finished"
                    )


def test_a_run_never_starts_beside_earlier_singles_of_its_keys_in_one_batch(
    tmp_path: Path,
    running: Callable[[Worker], threading.Thread],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 31 fault 8: one consumed batch carries partition 0 as P0-low, P1, P0-high
    (librdkafka's queue interleaves fetch responses so). P0-low starts below the point a
    failed run put runs off to, P0-high past it: P0-low goes as single records, P0-high is
    offered as a run. Its keys are P0-low's keys, whose singles were not even submitted when
    the intake looked: the scheduler, which sees them, must not let the run start beside
    them."""
    monkeypatch.setattr(runs_module, "RUNS_BACKOFF", 50)  # P0-low 100-149, P0-high 150-199
    broker = StubBroker(interleave=50)
    calls = Calls()

    def fail_13(m: Message) -> None:
        if m.topic == MAIN and m.partition == 0 and m.offset == 13 and m.retry_number == 0:
            raise ValueError("a failure inside a run: runs of partition 0 wait 50 records")

    worker = make_worker(broker, tmp_path, recorded(calls, fail_13), partitions=2, batch_size=1000)
    fast_calls(worker)
    send(broker, 200, keys=10, partitions=2)  # offsets 0-99 of each partition, one batch
    running(worker)
    wait_for(
        lambda: all(broker.committed_offset(GROUP, MAIN, p) == 100 for p in range(2)),
        10,
        what="the first lot",
    )
    assert worker.book.parts[(MAIN, 0)].runs_from == 150  # the run with offset 13 split
    with broker.lock:  # one batch: P0 100-149, P1 100-149, P0 150-199, P1 150-199
        send(broker, 200, keys=10, partitions=2)
    wait_for(
        lambda: all(broker.committed_offset(GROUP, MAIN, p) == 200 for p in range(2)),
        10,
        what="the second lot",
    )
    _started_in_key_order(calls, 0)
    _in_key_order(calls)
    main = sorted((c["partition"], c["offset"]) for c in calls.items if c["topic"] == MAIN)
    assert main == sorted((p, o) for p in range(2) for o in range(200))  # each once
