"""Batch handlers driven by the whole worker on the stub broker: per-record outcomes inside
one call, key lanes, timeouts of a whole call, the circuit's probe alone, in-flight bounds."""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import retryd
from retryd.config import load_settings
from retryd.errors import NonRetryableError
from retryd.handlers.base import Message
from retryd.handlers.python_batch import PythonBatchHandler
from retryd.policy import headers as h
from retryd.policy.circuit import CircuitState
from retryd.worker import loop_pool
from retryd.worker.assembly import build_worker
from retryd.worker.batch_loop_pool import BatchLoopPool
from retryd.worker.batch_pool import BatchThreadPool
from retryd.worker.engine import Worker
from tests.stub_kafka import StubBroker
from tests.support import wait_for

MAIN = "orders"
GROUP = "g"
KINDS = ["def", "async def"]


class Batches:
    """Every batch call: its records' coordinates and keys, start and end (thread-safe)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.calls: list[tuple[list[tuple[str, int, int, bytes | None, int]], float, float]] = []

    def add(self, records: list[Message], start: float) -> None:
        with self.lock:
            self.calls.append(
                (
                    [(m.topic, m.partition, m.offset, m.key, m.original_offset) for m in records],
                    start,
                    time.perf_counter(),
                )
            )

    def sizes(self) -> list[int]:
        return [len(c[0]) for c in self.calls]


def batch_handler(
    kind: str, batches: Batches, answer: Callable[[Message], Any], delay: float = 0.0
) -> Any:
    """A ``handle_batch`` (def or async def) recording its calls, answering per record."""
    if kind == "def":

        def handle_batch(records: list[Message]) -> list[Any]:
            start = time.perf_counter()
            try:
                if delay:
                    time.sleep(delay)
                return [answer(m) for m in records]
            finally:
                batches.add(records, start)

        return handle_batch

    async def ahandle_batch(records: list[Message]) -> list[Any]:
        start = time.perf_counter()
        try:
            await asyncio.sleep(delay)
            return [answer(m) for m in records]
        finally:
            batches.add(records, start)

    return ahandle_batch


def make_worker(
    broker: StubBroker,
    tmp_path: Path,
    func: Any,
    *,
    batch: int = 50,
    partitions: int = 1,
    sequence: str = "1s",
    **overrides: Any,
) -> Worker:
    settings = load_settings(
        bootstrap_servers="stub:9092",
        main_topics=MAIN,
        retry_sequence=sequence,
        group_id=GROUP,
        state_dir=tmp_path / "state",
        handler="python:tests.handlers_for_tests:ok",
        handler_batch=batch,
        handler_timeout_s=overrides.pop("handler_timeout_s", 2.0),
        max_poll_interval_ms=30_000,
        session_timeout_ms=6_000,
        poll_timeout_s=0.05,
        circuit_breaker=overrides.pop("circuit_breaker", False),
        **overrides,
    )
    broker.create(MAIN, partitions)
    for tier in settings.plan.tier_topics:
        broker.create(tier, partitions)
    broker.create(settings.failed_topic, 1)
    handler = PythonBatchHandler(
        func,
        timeout_s=settings.handler_timeout_s,
        max_batch=settings.handler_batch,
        non_retryable=settings.non_retryable,
    )
    return build_worker(
        settings,
        handler,
        drain_grace_s=0.1,
        consumer_factory=broker.consumer,
        producer_factory=broker.producer,
    )


def send(broker: StubBroker, n: int, *, keys: int | None = None, partitions: int = 1) -> None:
    for i in range(n):
        key = str(i % keys).encode() if keys else str(i).encode()
        broker.append(MAIN, key, b"v%d" % i, partition=i % partitions)


def _origin(rec: Any) -> tuple[int, int]:
    return (
        int(h.header_value(rec.headers, h.ORIGINAL_PARTITION) or b"-1"),
        int(h.header_value(rec.headers, h.ORIGINAL_OFFSET) or b"-1"),
    )


@pytest.mark.parametrize("kind", KINDS)
def test_mixed_outcomes_in_one_call_each_go_their_own_way(
    kind: str, broker: StubBroker, tmp_path: Path
) -> None:
    """offset % 4: 0 success, 1 an exception (retryable, then succeeds in its tier), 2
    retryd.Dead, 3 retryd.Retry (retried until exhausted). Each record ends in one place."""
    batches = Batches()

    def answer(m: Message) -> Any:
        kind_of = m.original_offset % 4
        if kind_of == 1:
            return None if m.retry_number else ConnectionError("flaky")
        if kind_of == 2:
            return retryd.Dead("bad_iban")
        if kind_of == 3:
            return retryd.Retry("rate_limited")
        return None

    worker = make_worker(
        broker, tmp_path, batch_handler(kind, batches, answer), partitions=2, sequence="10ms"
    )
    assert isinstance(worker.pool, BatchLoopPool if kind == "async def" else BatchThreadPool)
    send(broker, 400, partitions=2)
    summary = worker.run(until_drained=True)

    handled: dict[tuple[int, int], int] = defaultdict(int)
    for call, _, _ in batches.calls:
        for topic, partition, offset, _, origin in call:
            o = offset if topic == MAIN else origin
            p = partition
            if o % 4 == 0 or (o % 4 == 1 and topic != MAIN):
                handled[(p, o)] += 1
    dead = {_origin(r): r for r in broker.records("failed_topic")}
    tier = [_origin(r) for r in broker.records("retry_10ms")]
    every = {(p, o) for p in range(2) for o in range(200)}
    assert set(handled) | set(dead) == every
    assert not set(handled) & set(dead)  # exactly one terminal place
    assert all(n == 1 for n in handled.values())
    assert sorted(tier) == sorted(x for x in every if x[1] % 4 in (1, 3))
    for origin, rec in dead.items():
        reason = h.header_value(rec.headers, h.DEAD_REASON)
        error = h.header_value(rec.headers, h.ERROR_CLASS)
        if origin[1] % 4 == 2:
            assert (reason, error) == (b"non_retryable", b"bad_iban")
        else:
            assert (reason, error) == (b"exhausted", b"rate_limited")
    assert max(batches.sizes()) > 1  # records did share calls
    assert summary.total("success") == 200
    for p in range(2):
        assert broker.committed_offset(GROUP, MAIN, p) == 200
        assert broker.committed_offset(GROUP, "retry_10ms", p) == len(
            [1 for r in broker.records("retry_10ms") if r.partition == p]
        )


@pytest.mark.parametrize("kind", KINDS)
def test_key_lanes_hold_one_record_per_key_per_call_in_offset_order(
    kind: str, broker: StubBroker, tmp_path: Path
) -> None:
    batches = Batches()
    worker = make_worker(
        broker,
        tmp_path,
        batch_handler(kind, batches, lambda m: None, delay=0.001),
        batch=20,
        max_in_flight=40,
    )
    send(broker, 300, keys=7)
    worker.run(until_drained=True)
    seen: dict[bytes | None, list[tuple[int, float, float]]] = defaultdict(list)
    for call, start, end in batches.calls:
        keys = [k for *_, k, _ in call]
        assert len(keys) == len(set(keys)), f"two records of one key in one call: {keys}"
        for _, _, offset, key, _ in call:
            seen[key].append((offset, start, end))
    assert sum(len(v) for v in seen.values()) == 300
    for key, items in seen.items():
        items.sort(key=lambda x: x[1])
        assert [o for o, _, _ in items] == sorted(o for o, _, _ in items), key
        for a, b in itertools.pairwise(items):
            assert b[1] >= a[2], f"calls of key {key!r} overlap"
    assert max(batches.sizes()) > 1
    assert broker.committed_offset(GROUP, MAIN) == 300


@pytest.mark.parametrize("kind", KINDS)
def test_records_in_flight_never_exceed_max_in_flight(
    kind: str, broker: StubBroker, tmp_path: Path
) -> None:
    batches = Batches()
    worker = make_worker(
        broker,
        tmp_path,
        batch_handler(kind, batches, lambda m: None, delay=0.005),
        batch=8,
        max_in_flight=16,
        ordering="none",
    )
    send(broker, 400)
    worker.run(until_drained=True)
    events = sorted(
        [(s, len(c)) for c, s, _ in batches.calls] + [(e, -len(c)) for c, _, e in batches.calls]
    )
    now = best = 0
    for _, delta in events:
        now += delta
        best = max(best, now)
    assert 8 < best <= 16  # two calls of 8 at a time, never more
    assert max(batches.sizes()) == 8
    assert broker.committed_offset(GROUP, MAIN) == 400


@pytest.mark.parametrize("kind", KINDS)
def test_a_call_past_its_timeout_times_out_every_record_of_it(
    kind: str, broker: StubBroker, tmp_path: Path
) -> None:
    batches = Batches()
    hung = threading.Event()

    def answer(m: Message) -> Any:
        return None

    inner = batch_handler(kind, batches, answer)

    if kind == "def":

        def func(records: list[Message]) -> Any:
            if any(m.offset == 5 and m.retry_number == 0 for m in records):
                hung.set()
                time.sleep(1.0)  # past the 0.3 s timeout: the thread is abandoned
            return inner(records)

    else:

        async def func(records: list[Message]) -> Any:
            if any(m.offset == 5 and m.retry_number == 0 for m in records):
                hung.set()
                await asyncio.sleep(1.0)  # cancelled at the timeout
            return await inner(records)

    worker = make_worker(
        broker, tmp_path, func, batch=4, handler_timeout_s=0.3, sequence="10ms", max_in_flight=8
    )
    send(broker, 40)
    summary = worker.run(until_drained=True)
    assert hung.is_set()
    tier = broker.records("retry_10ms")
    assert tier, "the timed-out call's records were routed"
    assert 5 in {_origin(r)[1] for r in tier}
    assert {h.header_value(r.headers, h.ERROR_CLASS) for r in tier} == {b"timeout"}
    assert len(tier) <= 4  # the records of that one call, no others
    assert summary.total("success") == 40  # every record handled in the end
    assert broker.records("failed_topic") == []
    assert broker.committed_offset(GROUP, MAIN) == 40
    if kind == "def":
        assert worker.pool.abandoned == 1


def test_an_async_call_ignoring_its_cancellation_abandons_the_loop_and_loses_nothing(
    broker: StubBroker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(loop_pool, "ASYNC_CANCEL_GRACE_S", 0.1)
    stuck = threading.Event()
    ok: set[int] = set()
    lock = threading.Lock()

    async def func(records: list[Message]) -> Any:
        if any(m.offset == 3 and m.retry_number == 0 for m in records) and not stuck.is_set():
            stuck.set()
            end = time.monotonic() + 0.8
            while time.monotonic() < end:
                try:
                    await asyncio.sleep(0.01)
                except asyncio.CancelledError:
                    continue  # ignores its cancellation
        await asyncio.sleep(0.002)
        with lock:
            ok.update(m.original_offset for m in records)
        return None

    worker = make_worker(
        broker, tmp_path, func, batch=4, handler_timeout_s=0.2, sequence="10ms", max_in_flight=12
    )
    send(broker, 60, keys=5)  # lanes: calls that ended on the abandoned loop release theirs
    thread = threading.Thread(target=worker.run, kwargs={"until_drained": True}, daemon=True)
    thread.start()
    thread.join(60)
    if thread.is_alive():
        worker.stop()
        thread.join(30)
        pytest.fail("the worker did not drain after its loop was abandoned")
    assert stuck.is_set()
    assert worker.pool.abandoned >= 1
    assert ok == set(range(60))
    assert broker.records("failed_topic") == []
    assert broker.committed_offset(GROUP, MAIN) == 60


@pytest.mark.parametrize("kind", KINDS)
def test_an_outage_holds_records_and_the_probe_goes_alone(
    kind: str, broker: StubBroker, tmp_path: Path
) -> None:
    batches = Batches()
    down = threading.Event()
    down.set()
    state: dict[str, Any] = {}

    def answer(m: Message) -> Any:
        return ConnectionError("service unavailable") if down.is_set() else None

    worker = make_worker(
        broker,
        tmp_path,
        batch_handler(kind, batches, answer),
        batch=10,
        max_in_flight=20,
        sequence="1s,1s",
        circuit_breaker=True,
        circuit_probe_s=0.1,
    )
    state["worker"] = worker
    send(broker, 300, keys=50)
    thread = threading.Thread(target=worker.run, kwargs={"until_drained": True}, daemon=True)
    thread.start()
    breaker = worker.circuit.breaker
    wait_for(lambda: breaker.state is not CircuitState.CLOSED, 10, what="the circuit to open")
    wait_for(lambda: breaker.probes >= 2, 10, what="two failed probes")
    with batches.lock:
        since = len(batches.calls)
    wait_for(lambda: breaker.probes >= 3, 10, what="a third probe")
    with batches.lock:
        probes = [len(c) for c, _, _ in batches.calls[since:]]
    assert probes and all(n == 1 for n in probes), probes  # only the probe, alone
    down.clear()
    thread.join(30)
    assert not thread.is_alive()
    assert breaker.state is CircuitState.CLOSED
    assert broker.records("failed_topic") == []
    assert broker.committed_offset(GROUP, MAIN) == 300


def test_non_retryable_exception_instances_are_dead_lettered(
    broker: StubBroker, tmp_path: Path
) -> None:
    batches = Batches()

    def answer(m: Message) -> Any:
        return NonRetryableError("poison") if m.offset % 2 else None

    worker = make_worker(broker, tmp_path, batch_handler("def", batches, answer))
    send(broker, 30)
    summary = worker.run(until_drained=True)
    dead = broker.records("failed_topic")
    assert sorted(_origin(r)[1] for r in dead) == list(range(1, 30, 2))
    assert summary.total("success") == 15
    assert broker.records("retry_1s") == []
    assert broker.committed_offset(GROUP, MAIN) == 30


@pytest.fixture
def broker() -> StubBroker:
    return StubBroker()
