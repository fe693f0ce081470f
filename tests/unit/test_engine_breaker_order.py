"""The circuit breaker composed with key order and the rest of the engine, on the stub broker
(issue 23, items 1, 2, 5 and 6): a held record keeps its key's lane, a probe always gets a
verdict, retries that succeed are not an outage, and poison keys cannot keep the circuit open.
The same workloads run on Apache Kafka in tests/integration/test_circuit_outage.py."""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections import defaultdict
from pathlib import Path

import pytest

from retryd.handlers.base import Message
from retryd.policy.circuit import CircuitState
from retryd.worker import loop_pool
from retryd.worker.engine import Worker
from tests.stub_kafka import StubBroker
from tests.support import wait_for
from tests.unit.test_engine_loop import GROUP, MAIN, make_worker, send

OPEN, HALF, CLOSED = CircuitState.OPEN, CircuitState.HALF_OPEN, CircuitState.CLOSED


class CallLog:
    """Every call: (key, offset, retry number, start, end), thread-safe."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.items: list[tuple[bytes | None, str, int, int, float, float]] = []

    def add(self, m: Message, start: float) -> None:
        with self.lock:
            self.items.append(
                (m.key, m.topic, m.offset, m.retry_number, start, time.perf_counter())
            )

    def assert_key_order(self) -> None:
        """Per key on the main topic: calls never overlap and start in offset order (a record
        held by the circuit and run again comes before the next record of its key)."""
        by_key: dict[bytes | None, list[tuple[float, float, int]]] = defaultdict(list)
        with self.lock:
            for key, topic, offset, _retry, start, end in self.items:
                if topic == MAIN:
                    by_key[key].append((start, end, offset))
        for key, calls in by_key.items():
            calls.sort()
            offsets = [o for _, _, o in calls]
            assert offsets == sorted(offsets), f"key {key!r} started out of order: {offsets}"
            for a, b in itertools.pairwise(calls):
                assert b[0] >= a[1], f"key {key!r}: {b} started before {a} ended"


def _run(worker: Worker) -> threading.Thread:
    t = threading.Thread(target=worker.run, kwargs={"until_drained": True}, daemon=True)
    t.start()
    return t


@pytest.mark.parametrize("kind", ["def", "async def"])
def test_a_held_record_never_overlaps_the_next_record_of_its_key(tmp_path: Path, kind: str) -> None:
    """Item 1: the service flaps while records of few keys flow; a record held while the
    circuit is not closed keeps its key's lane, so it runs again before the key's next record
    starts, and never beside it."""
    broker = StubBroker()
    log = CallLog()
    down = threading.Event()
    down.set()

    def body(m: Message) -> None:
        if down.is_set():
            raise ConnectionError("service unavailable")

    def sync_handler(m: Message) -> None:
        start = time.perf_counter()
        try:
            time.sleep(0.001)
            body(m)
        finally:
            log.add(m, start)

    async def async_handler(m: Message) -> None:
        start = time.perf_counter()
        try:
            await asyncio.sleep(0.001)
            body(m)
        finally:
            log.add(m, start)

    worker = make_worker(
        broker,
        tmp_path,
        sync_handler if kind == "def" else async_handler,
        sequence="100ms",
        circuit_breaker=True,
        circuit_probe_s=0.05,
        circuit_probe_max_s=0.05,
        circuit_min_failures=5,
        circuit_min_keys=2,
        max_in_flight=8,
    )
    send(broker, 6000, keys=6)  # 1000 records per key: every key's lane is always busy
    thread = _run(worker)
    flaps = 0
    try:
        for _ in range(5):  # down until the circuit holds records, then up until it closes
            before = worker.circuit.snapshot().held
            down.set()
            wait_for(
                lambda b=before: worker.circuit.snapshot().held > b or not thread.is_alive(),
                10,
                what="a hold",
            )
            down.clear()
            wait_for(
                lambda: worker.circuit.breaker.state is CLOSED or not thread.is_alive(),
                10,
                what="the circuit to close",
            )
            flaps += thread.is_alive()
    finally:
        down.clear()
    thread.join(30)
    assert not thread.is_alive()
    assert flaps >= 3, "the run ended before the circuit held records a few times"
    assert worker.circuit.snapshot().held > 0
    log.assert_key_order()
    assert broker.committed_offset(GROUP, MAIN) == 6000


def test_a_probe_cut_off_with_its_abandoned_loop_is_offered_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Item 2: the probe runs on the event loop of a call that ignores its cancellation; the
    loop is abandoned and the probe cut off. It is offered again on the new loop (and a probe
    that never answers counts as failed), so the circuit never stays half-open."""
    monkeypatch.setattr(loop_pool, "ASYNC_CANCEL_GRACE_S", 0.2)
    broker = StubBroker()
    down = threading.Event()
    down.set()
    stubborn_started = threading.Event()

    async def handler(m: Message) -> None:
        if m.key == b"stubborn" and m.retry_number == 0 and not stubborn_started.is_set():
            stubborn_started.set()
            end = time.monotonic() + 1.5  # ignores cancellation: its loop is abandoned
            while time.monotonic() < end:
                try:
                    await asyncio.sleep(0.01)
                except asyncio.CancelledError:
                    continue
            return
        # slow: the circuit trips while the stubborn call runs, and the probe is still
        # running on the stubborn call's loop when that loop is given up
        await asyncio.sleep(0.28)
        if down.is_set():
            raise ConnectionError("down")

    worker = make_worker(
        broker,
        tmp_path,
        handler,
        sequence="100ms",
        circuit_breaker=True,
        circuit_probe_s=0.1,
        circuit_probe_max_s=0.1,
        circuit_min_failures=3,
        circuit_min_keys=3,
        handler_timeout_s=0.3,
        max_in_flight=4,
    )
    broker.append(MAIN, b"stubborn", b"s")
    send(broker, 40, keys=10)
    thread = _run(worker)
    wait_for(lambda: worker.circuit.breaker.state is not CLOSED, 10, what="the circuit to open")
    wait_for(lambda: worker.pool.abandoned >= 1, 10, what="the stubborn loop to be abandoned")
    down.clear()
    thread.join(30)
    assert not thread.is_alive(), f"stuck: {worker.circuit.snapshot()}"
    assert worker.circuit.breaker.state is CLOSED
    assert broker.committed_offset(GROUP, MAIN) == 41
    assert broker.records("failed_topic") == []


def test_a_probe_without_a_verdict_by_its_deadline_counts_as_failed(tmp_path: Path) -> None:
    """Item 2: a probe offered but never answered (every slot busy with hung calls) does not
    keep the circuit half-open: past its deadline it counts as failed and a new one follows."""
    broker = StubBroker()
    down = threading.Event()
    down.set()
    release = threading.Event()

    def handler(m: Message) -> None:
        if m.key == b"hang":
            release.wait(5)  # occupies the only slot past the probe's deadline
            return
        if down.is_set():
            raise ConnectionError("down")

    worker = make_worker(
        broker,
        tmp_path,
        handler,
        sequence="100ms",
        circuit_breaker=True,
        circuit_probe_s=0.05,
        circuit_probe_max_s=0.05,
        circuit_min_failures=3,
        circuit_min_keys=3,
        handler_timeout_s=20,
        max_in_flight=1,
    )
    worker.circuit.probe_timeout_s = 0.3
    send(broker, 10, keys=10)
    broker.append(MAIN, b"hang", b"h")
    thread = _run(worker)
    try:
        wait_for(
            lambda: "no answer" in (worker.circuit.breaker.last_error or ""),
            10,
            what="the lost probe to count as failed",
        )
        assert worker.circuit.breaker.state is not CLOSED
    finally:
        release.set()
        down.clear()
    thread.join(30)
    assert not thread.is_alive()
    assert worker.circuit.breaker.state is CLOSED
    assert broker.committed_offset(GROUP, MAIN) == 11


@pytest.mark.parametrize("fails", ["its first call", "every first attempt"])
def test_records_that_fail_once_and_succeed_when_retried_are_not_an_outage(
    tmp_path: Path, fails: str
) -> None:
    """Item 5: every record fails once and succeeds on its first retry, at default breaker
        settings, nothing is dead-lettered and nothing waits for a probe interval (set to an hour
    here, so that waiting for one could not pass unseen on a slow machine). A
        handler failing its first *call* of each record: the window trips, the failed record run
        again succeeds, so the circuit closes at once. One failing every *first attempt*
        (``retry_number == 0``, whatever the call): running it again in place fails too, so the
        circuit opens, but its first probe comes when the first tier's retry is due, and that
        retry (a tier record) succeeds."""
    broker = StubBroker()
    seen: set[int] = set()
    lock = threading.Lock()

    def handler(m: Message) -> None:
        if fails == "every first attempt":
            if m.retry_number == 0:
                raise ConnectionError("not there yet")
            return
        origin = m.offset if m.original_offset is None else m.original_offset
        with lock:
            first = origin not in seen
            seen.add(origin)
        if first:
            raise ConnectionError("read-after-write lag")

    # probes an hour apart: a drain that waited for one would not end before the test's own
    # timeout, so the run returning is the proof, whatever the machine's speed
    worker = make_worker(
        broker,
        tmp_path,
        handler,
        sequence="100ms",
        circuit_breaker=True,
        circuit_probe_s=3600,
        circuit_probe_max_s=3600,
    )
    send(broker, 3000, keys=200)
    summary = worker.run(until_drained=True)
    snap = worker.circuit.snapshot()
    if fails == "its first call":
        assert "open" not in snap.transitions, snap
    assert broker.records("failed_topic") == []
    assert summary.total("success") == 3000
    assert broker.committed_offset(GROUP, MAIN) == 3000


def test_poison_keys_cannot_keep_the_circuit_open(tmp_path: Path) -> None:
    """Item 6: three always-failing keys make most of the traffic and open the circuit
    (``circuit_min_keys=3`` allows it), so every record held is poison. Probes rotate keys,
    then take a record that never ran, so the healthy records behind run while the poison
    ones stay held, never moved on by the outage they caused."""
    broker = StubBroker()
    poison = {b"p0", b"p1", b"p2"}
    ok: set[int] = set()

    def handler(m: Message) -> None:
        time.sleep(0.001)
        if m.key in poison:
            raise ConnectionError("poison: always unavailable")
        ok.add(m.offset)

    worker = make_worker(
        broker,
        tmp_path,
        handler,
        sequence="50ms",
        circuit_breaker=True,
        circuit_min_keys=3,
        circuit_min_failures=6,
        # growing probe intervals, as at defaults (5 s to 60 s), scaled down: a probe that
        # picks poison again and again costs 0.5 + 1 + 2 + 4 + 8 + 10 ... seconds
        circuit_probe_s=0.5,
        circuit_probe_max_s=10,
        max_in_flight=16,
    )
    for i in range(300):  # the poison first: the circuit opens before a healthy record runs
        broker.append(MAIN, b"p%d" % (i % 3), b"v")
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        wait_for(lambda: worker.circuit.snapshot().transitions.get("open"), 10, what="it to open")
        healthy = list(range(300, 600))  # fetched while half-open, behind the gate
        for i in healthy:
            broker.append(MAIN, b"h%d" % (i % 20), b"v")
        wait_for(lambda: set(healthy) <= ok, 12, what="the healthy records to run")
    finally:
        worker.stop()
        thread.join(30)
    assert not thread.is_alive()
    assert worker.circuit.snapshot().transitions.get("closed"), "the circuit never closed"
