"""Runs (retryd.worker.runs): records of fast handlers go through the engine a partition's
consecutive records at a time. Every guarantee a single record has must hold for each record
of a run: called once, key order, a failure routed alone, a revoke committing what ran and
nothing else, calls turning slow getting their concurrency back."""

from __future__ import annotations

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
from retryd.worker.engine import Worker
from tests.stub_kafka import StubBroker
from tests.support import wait_for
from tests.unit.test_engine_loop import (
    GROUP,
    MAIN,
    Calls,
    _overlaps,
    make_worker,
    recorded,
    send,
)
from tests.unit.test_engine_loop import running as _running

running = _running  # the fixture: a worker run in a thread, stopped at teardown


@pytest.fixture
def broker() -> StubBroker:
    return StubBroker()


@pytest.fixture
def runs_made(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many records each run the intake made held."""
    made: list[int] = []
    real = intake_module.new_run

    def counted(raws: list[Any], *args: Any) -> Any:
        made.append(len(raws))
        return real(raws, *args)

    monkeypatch.setattr(intake_module, "new_run", counted)
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
    send(broker, 300, keys=1)
    running(worker)
    wait_for(lambda: broker.committed_offset(GROUP, MAIN) == 300, 10, what="the warm-up")
    made = len(runs_made)
    send(broker, 50, keys=1)
    assert in_call.wait(5)
    assert len(runs_made) > made, "the second lot should run as a run"
    consumer = broker.consumers[0]
    consumer.trigger_revoke([(MAIN, 0)])
    threading.Timer(0.3, release.set).start()  # the call finishes while the revoke waits
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
) -> None:
    calls = Calls()
    slow = threading.Event()

    def maybe_slow(m: Message) -> None:
        if slow.is_set():
            time.sleep(0.02)

    worker = make_worker(
        broker, tmp_path, recorded(calls, maybe_slow), max_in_flight=8, batch_size=100
    )
    send(broker, 1000, keys=50)
    running(worker)
    wait_for(lambda: broker.committed_offset(GROUP, MAIN) == 1000, 10, what="the fast part")
    assert runs_made
    slow.set()
    send(broker, 400, keys=50)
    wait_for(lambda: broker.committed_offset(GROUP, MAIN) == 1400, 30, what="the slow part")
    _in_key_order(calls)
    late = [c for c in calls.items if c["offset"] >= 1000]
    assert len(late) == 400
    # 400 calls of 20 ms one at a time would take 8 s: the keys ran side by side again
    span = max(c["end"] for c in late) - min(c["start"] for c in late)
    assert span < 4.0, span
