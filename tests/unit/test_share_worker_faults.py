"""The share worker's loop against a fake share consumer (``tests.unit.fake_share``): the faults
of issue 31 (a call that never answers, a stale answer, the first delay) and the client's
surprises (a poll or a commit that raises, records acquired while the worker was not polling).

Every wait is a condition with a deadline; the handlers hold their calls on events the test
sets, so what a test asserts is what the worker did, not how fast the machine is."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from confluent_kafka import IllegalStateException, KafkaError, KafkaException

from retryd.errors import HungHandlersError, KafkaRuntimeError
from retryd.handlers.base import Message
from retryd.handlers.python_handler import PythonHandler
from retryd.policy.circuit import Breaker, BreakerPolicy, CircuitAction
from retryd.policy.headers import ERROR_CLASS
from tests.support import wait_for
from tests.unit.fake_share import FakeShareConsumer, Running, share_worker

TIER = "retry_5m"


def copies(broker, topic: str = TIER) -> list[tuple[bytes | None, bytes | None]]:  # type: ignore[no-untyped-def]
    """(key, error class) of each routed copy in ``topic``."""
    return [(r.key, dict(r.headers).get(ERROR_CLASS)) for r in broker.records(topic)]


# ---------------------------------------------------------------- fault 4: a frozen async call
def test_an_async_call_that_swallows_its_cancellation_times_out_and_the_worker_goes_on(
    tmp_path: Path,
) -> None:
    """Its timeout is reported once (a tier copy), its loop is replaced for later calls, the
    abandoned call counts as hung while its loop's thread lives, and stop() completes."""
    called: list[bytes | None] = []

    async def handle(m: Message) -> None:
        called.append(m.key)
        if m.key == b"stuck":
            while True:
                try:
                    await asyncio.sleep(3600)
                except asyncio.CancelledError:
                    continue  # business code that swallows its cancellation

    consumer = FakeShareConsumer(lock_s=10.0)
    worker, broker = share_worker(PythonHandler(handle, timeout_s=0.3), consumer, tmp_path)
    consumer.add(b"stuck")
    consumer.add(b"a")
    running = Running(worker)
    try:
        wait_for(lambda: sorted(consumer.accepted()) == [0, 1], 10, what="both acknowledged")
        assert copies(broker) == [(b"stuck", b"timeout")]  # reported once, as a timeout
        consumer.add(b"b")  # a later call runs on a new loop
        wait_for(lambda: 2 in consumer.accepted(), 10, what="a record after the abandonment")
        assert called.count(b"b") == 1 and called.count(b"stuck") == 1
        assert worker.calls.abandoned == 1
        wait_for(lambda: worker.calls.hung == 0, 10, what="the abandoned loop's thread to end")
    finally:
        assert running.stop(10), "stop() did not complete"
    assert running.failure is None
    assert copies(broker) == [(b"stuck", b"timeout")]


def test_a_call_cut_off_by_a_frozen_loop_runs_again_once_that_loop_is_gone(
    tmp_path: Path,
) -> None:
    """Blocking code inside ``async def`` freezes the whole loop: the overdue call is a timeout;
    a call that was merely sharing the loop is not failed but runs again (once the old loop's
    thread has ended, so never twice at once)."""
    frozen = threading.Event()
    thaw = threading.Event()
    calls: list[tuple[bytes | None, float]] = []

    async def handle(m: Message) -> None:
        calls.append((m.key, time.monotonic()))
        if m.key == b"x":
            await asyncio.sleep(0.8)  # ok starts when x ends
        elif m.key == b"block":
            await asyncio.sleep(0.9)
            frozen.set()
            thaw.wait(30)  # blocking code on the loop thread: every task of the loop stops
        else:
            await asyncio.sleep(0.5)

    consumer = FakeShareConsumer(lock_s=20.0)
    worker, broker = share_worker(PythonHandler(handle, timeout_s=1.0), consumer, tmp_path)
    for key in (b"x", b"block", b"ok"):
        consumer.add(key)
    running = Running(worker)
    try:
        wait_for(frozen.is_set, 10, what="the loop frozen")
        wait_for(lambda: worker.calls.abandoned, 10, what="the frozen loop abandoned")
        thawed_at = time.monotonic()
        thaw.set()  # its thread ends: the cut-off call may run again
        wait_for(lambda: sorted(consumer.accepted()) == [0, 1, 2], 10, what="all acknowledged")
    finally:
        thaw.set()
        assert running.stop(10), "stop() did not complete"
    assert running.failure is None
    assert copies(broker) == [(b"block", b"timeout")]  # ok was not failed
    ok = [at for key, at in calls if key == b"ok"]
    assert len(ok) == 2 and ok[1] >= thawed_at  # again, once the frozen loop was gone
    assert worker.calls.abandoned == 1


def test_async_calls_hung_past_max_abandoned_handlers_stop_the_worker_cleanly(
    tmp_path: Path,
) -> None:
    thaw = threading.Event()

    async def handle(m: Message) -> None:
        thaw.wait(30)  # freezes its loop until the test ends

    consumer = FakeShareConsumer(lock_s=20.0)
    worker, broker = share_worker(
        PythonHandler(handle, timeout_s=0.3),
        consumer,
        tmp_path,
        max_abandoned=1,
        max_in_flight=1,  # each call freezes a loop of its own: two hung calls
    )
    consumer.add(b"a")
    consumer.add(b"b")
    running = Running(worker)
    try:
        running.thread.join(10)
        assert not running.thread.is_alive(), "the worker kept running with hung calls"
        assert isinstance(running.failure, HungHandlersError)
        assert consumer.closed
        assert copies(broker) == [(b"a", b"timeout"), (b"b", b"timeout")]
        assert consumer.accepted() == [0, 1]  # each timeout went to its tier, then it stopped
        assert worker.calls.hung == 2
    finally:
        thaw.set()
        running.stop(10)


# ---------------------------------------------------------------- fault 5: stale answers
def test_a_timed_out_calls_late_answer_does_not_settle_the_rerun(tmp_path: Path) -> None:
    """The window trips on a timeout and the same record runs again in place; the first call's
    late failure must not be taken as the rerun's answer."""
    first_may_end = threading.Event()
    second_may_end = threading.Event()
    second_started = threading.Event()
    attempts = 0

    def handle(m: Message) -> None:
        nonlocal attempts
        attempts += 1
        if attempts == 1:
            first_may_end.wait(30)
            raise ValueError("call 1, answering late")
        second_started.set()
        second_may_end.wait(30)

    consumer = FakeShareConsumer(lock_s=20.0)
    breaker = Breaker(
        BreakerPolicy(window_calls=1, min_failures=1, min_keys=1, probe_jitter=0.0), 0
    )
    worker, broker = share_worker(
        PythonHandler(handle, timeout_s=0.3), consumer, tmp_path, breaker=breaker
    )
    consumer.add(b"k")
    running = Running(worker)
    try:
        wait_for(second_started.is_set, 10, what="the confirming rerun")
        first_may_end.set()  # call 1 answers while the rerun runs
        wait_for(lambda: consumer.acks or worker.calls.hung == 0, 10, what="call 1's late answer")
        second_may_end.set()
        wait_for(lambda: consumer.acks, 10, what="the record acknowledged")
    finally:
        first_may_end.set()
        second_may_end.set()
        assert running.stop(10)
    assert consumer.accepted() == [0]
    assert copies(broker) == []  # the rerun succeeded: no tier copy with call 1's error
    assert breaker.closed  # the probe's answer closed it


def test_a_rerun_that_hangs_is_still_reported_as_a_timeout(tmp_path: Path) -> None:
    """After call 1's late answer the rerun is still watched for its own timeout."""
    release = threading.Event()
    attempts = 0

    def handle(m: Message) -> None:
        nonlocal attempts
        attempts += 1
        n = attempts
        if n == 1:
            wait_for(lambda: attempts >= 2, 30, 0.01, "the rerun")
            raise ValueError("call 1, answering late")
        release.wait(30)

    consumer = FakeShareConsumer(lock_s=20.0)
    breaker = Breaker(
        BreakerPolicy(window_calls=1, min_failures=1, min_keys=1, probe_jitter=0.0), 0
    )
    worker, broker = share_worker(
        PythonHandler(handle, timeout_s=0.3), consumer, tmp_path, breaker=breaker
    )
    consumer.add(b"k")
    running = Running(worker)
    try:
        wait_for(lambda: consumer.acks, 10, what="the record acknowledged")
    finally:
        release.set()
        assert running.stop(10)
    assert copies(broker) == [(b"k", b"timeout")]  # the rerun's own timeout, not ValueError
    assert not breaker.closed  # the confirming call failed: open


# ---------------------------------------------------------------- fault 6: delay=
def test_a_record_is_not_called_before_its_timestamp_plus_the_first_delay(
    tmp_path: Path,
) -> None:
    called: dict[bytes, float] = {}

    def handle(m: Message) -> None:
        called[m.key or b""] = time.time()

    consumer = FakeShareConsumer(lock_s=10.0)
    worker, _ = share_worker(
        PythonHandler(handle, timeout_s=0.5), consumer, tmp_path, sequence="5m, delay=2s"
    )
    now_ms = int(time.time() * 1000)
    consumer.add(b"fresh", timestamp=now_ms)
    consumer.add(b"old", timestamp=now_ms - 5_000)  # due already: runs at once
    running = Running(worker)
    try:
        wait_for(lambda: len(consumer.accepted()) == 2, 10, what="both acknowledged")
    finally:
        assert running.stop(10)
    assert called[b"fresh"] * 1000 >= now_ms + 2_000, "called before timestamp + delay"
    assert called[b"old"] < called[b"fresh"] - 1.0  # the loop went on meanwhile
    assert consumer.released() == [] and consumer.refused == []


def test_a_record_its_lock_cannot_hold_until_due_goes_to_its_tier_uncalled(
    tmp_path: Path,
) -> None:
    """A lock shortened while running (start-up refuses such a delay): the record is not
    called early, and not released over and over to its delivery limit."""
    called: list[bytes | None] = []
    consumer = FakeShareConsumer(lock_s=3.0)
    worker, broker = share_worker(
        PythonHandler(lambda m: called.append(m.key), timeout_s=0.5),
        consumer,
        tmp_path,
        sequence="5m, delay=2s",
    )
    consumer.add(b"fresh")
    running = Running(worker)
    try:
        wait_for(lambda: consumer.acks, 10, what="the record acknowledged")
    finally:
        assert running.stop(10)
    assert called == [] and consumer.released() == []
    assert copies(broker) == [(b"fresh", b"not_due")]
    (copy,) = broker.records(TIER)
    due = int(dict(copy.headers)["retry_timestamp"] or 0)
    assert due >= consumer.log[0].timestamp + 2_000  # never early


# ---------------------------------------------------------------- suspected: the client
def test_a_poll_or_commit_that_raises_is_logged_counted_and_the_worker_goes_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    consumer = FakeShareConsumer(lock_s=10.0)
    consumer.poll_errors = [
        IllegalStateException("unexpected state"),
        ValueError("a bug in the binding"),
        KafkaException(KafkaError(KafkaError._TRANSPORT)),
    ]
    consumer.commit_errors = [KafkaException(KafkaError(KafkaError._TRANSPORT))]
    worker, _ = share_worker(PythonHandler(lambda m: None, timeout_s=0.5), consumer, tmp_path)
    consumer.add(b"a")
    running = Running(worker)
    try:
        wait_for(lambda: consumer.accepted() == [0], 10, what="the record after the errors")
        consumer.add(b"b")
        wait_for(lambda: consumer.accepted() == [0, 1], 10, what="the next record")
    finally:
        assert running.stop(10)
    assert running.failure is None
    assert worker.client_errors == 4
    assert "Traceback" in caplog.text and "a bug in the binding" in caplog.text


def test_polls_failing_longer_than_the_poll_interval_stop_the_worker_cleanly(
    tmp_path: Path,
) -> None:
    consumer = FakeShareConsumer(lock_s=10.0)
    consumer.poll_errors = [RuntimeError("broken")] * 10_000
    worker, _ = share_worker(
        PythonHandler(lambda m: None, timeout_s=0.3),
        consumer,
        tmp_path,
        max_poll_interval_ms=1_000,
        session_timeout_ms=1_000,
    )
    running = Running(worker)
    running.thread.join(20)
    assert not running.thread.is_alive()
    assert isinstance(running.failure, KafkaRuntimeError)
    assert "broken" in str(running.failure) and consumer.closed
    assert len(consumer.poll_errors) > 10_000 - 60  # backed off, not a tight loop


def test_stop_interrupts_the_backoff_after_a_failing_poll(tmp_path: Path) -> None:
    consumer = FakeShareConsumer(lock_s=10.0)
    consumer.poll_errors = [RuntimeError("broken")] * 10_000
    worker, _ = share_worker(PythonHandler(lambda m: None, timeout_s=0.3), consumer, tmp_path)
    running = Running(worker)
    wait_for(lambda: consumer.attempts >= 8, 30, what="a few failed polls")
    assert running.stop(2.0)  # the backoff is a wait on the stop event, not a sleep


# ---------------------------------------------------------------- suspected: lock timing
def test_records_acquired_while_the_worker_was_not_polling_are_timed_from_then(
    tmp_path: Path,
) -> None:
    """librdkafka keeps a fetch going after an empty poll: records it acquires wait in the
    client for the next poll, their locks running. Here the circuit opens right after an
    empty poll and stays open 2.8 s of a 3 s lock: the probe poll returns records whose lock
    cannot hold a call any more; none may start, and none may be acknowledged too late."""
    starts: dict[bytes, float] = {}
    breaker = Breaker(BreakerPolicy(probe_initial_s=2.8, probe_jitter=0.0), 0)

    def handle(m: Message) -> None:
        starts[m.key or b""] = time.monotonic()
        time.sleep(0.4)  # the handler's own work (not a synchronisation)

    def once(c: FakeShareConsumer) -> None:
        if c.polls == 1:
            c.add(b"a")
            c.add(b"b")
            c.acquire_in_background()
            breaker.force(CircuitAction.OPEN, int(time.time() * 1000), "test")

    consumer = FakeShareConsumer(lock_s=3.0)
    consumer.on_poll = once
    worker, _ = share_worker(
        PythonHandler(handle, timeout_s=0.5), consumer, tmp_path, breaker=breaker
    )
    running = Running(worker)
    try:
        wait_for(lambda: consumer.polls >= 2 and consumer.acks, 20, what="the probe's batch")
    finally:
        assert running.stop(10)
    assert consumer.refused == []  # no acknowledgement after its lock
    assert starts == {}  # no call started past its lock's budget


def test_a_process_whose_sync_call_hangs_still_exits() -> None:
    """A hung sync call's thread must not hold the process at exit (``concurrent.futures``
    joins its threads then): a worker stopping past ``max_abandoned_handlers`` must exit so
    that a new process is started."""
    code = (
        "import threading\n"
        "from retryd.handlers.base import Message\n"
        "from retryd.handlers.python_handler import PythonHandler\n"
        "from retryd.share.calls import Calls\n"
        "hang = PythonHandler(lambda m: threading.Event().wait(), timeout_s=0.1)\n"
        "calls = Calls(hang, 2, 0.1, 1)\n"
        "calls.start('t', Message(topic='orders', partition=0, offset=0))\n"
        "calls.close()\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], timeout=30, check=False, capture_output=True
    )
    assert proc.returncode == 0, proc.stderr


# ---------------------------------------------------------------- found by the property test
def test_a_probe_cut_off_then_sent_on_uncalled_does_not_stop_the_polls(tmp_path: Path) -> None:
    """Found by ``test_share_compose_properties`` (breaker, async def): the confirming call
    runs on the event loop of a call that swallows its cancellation; that loop is abandoned,
    the probe is cut off, and when it comes back its lock can no longer hold a call, so it
    goes on to its tier uncalled. The circuit is half-open and its probe gone: the next record
    must be the probe. Before, the worker kept the gone record as its probe and never polled
    again."""
    calls: dict[bytes | None, int] = {}

    async def swallow() -> None:
        while True:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                continue  # business code that swallows its cancellation

    async def handle(m: Message) -> None:
        calls[m.key] = calls.get(m.key, 0) + 1
        if m.key == b"stuck" or (m.key == b"probe" and calls[m.key] == 2):
            await swallow()
        if m.key == b"probe" and calls[m.key] == 1:
            raise ValueError("trips the window")

    consumer = FakeShareConsumer(lock_s=3.0)  # 0.7 s of it to start a call (0.3 s + 2 s)
    breaker = Breaker(
        BreakerPolicy(window_calls=1, min_failures=1, min_keys=1, probe_jitter=0.0), 0
    )
    worker, broker = share_worker(
        PythonHandler(handle, timeout_s=0.3), consumer, tmp_path, breaker=breaker
    )
    consumer.add(b"stuck")  # started first: its loop is abandoned 1.3 s later, past 0.7 s
    consumer.add(b"probe")  # fails, runs again in place as the probe on that loop: cut off
    running = Running(worker)
    try:
        wait_for(lambda: sorted(consumer.accepted()) == [0, 1], 10, what="both acknowledged")
        assert copies(broker) == [(b"stuck", b"timeout"), (b"probe", b"circuit_open")]
        assert calls == {b"stuck": 1, b"probe": 2}
        consumer.add(b"next")
        wait_for(lambda: 2 in consumer.accepted(), 10, what="a record polled after it")
        assert breaker.closed  # the next record was the probe, and its answer closed it
    finally:
        assert running.stop(10), "stop() did not complete"
    assert running.failure is None
