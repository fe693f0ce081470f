"""The whole worker loop against the in-memory stub broker: ordering, tiers, flow control,
back-pressure, rebalances, faults. (The same behaviours run against a real broker in
tests/integration; these run in milliseconds and can stage exact interleavings.)"""

from __future__ import annotations

import itertools
import random
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from retryd.config import load_settings
from retryd.errors import DeliveryError, HungHandlersError
from retryd.handlers.base import Message
from retryd.handlers.python_handler import PythonHandler
from retryd.policy import headers as h
from retryd.worker.assembly import build_worker
from retryd.worker.engine import Worker
from retryd.worker.lifecycle import NO_HOOKS, RaceHooks
from retryd.worker.summary import RunSummary
from tests.stub_kafka import StubBroker
from tests.support import wait_for

MAIN = "orders"
GROUP = "g"


class Calls:
    """Every handler call with its start and end (thread-safe)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.items: list[dict[str, Any]] = []

    def record(self, m: Message, start: float, end: float) -> None:
        with self.lock:
            self.items.append(
                {
                    "topic": m.topic,
                    "partition": m.partition,
                    "offset": m.offset,
                    "key": m.key,
                    "retry": m.retry_number,
                    "start": start,
                    "end": end,
                }
            )

    def offsets(self, topic: str = MAIN) -> list[int]:
        return sorted(c["offset"] for c in self.items if c["topic"] == topic)


@pytest.fixture
def broker() -> StubBroker:
    return StubBroker()


def make_worker(
    broker: StubBroker,
    tmp_path: Path,
    func: Callable[[Message], Any],
    *,
    partitions: int = 1,
    sequence: str = "1s",
    hooks: RaceHooks = NO_HOOKS,
    consumer_factory: Callable[[dict[str, Any]], Any] | None = None,
    create_topics: bool = True,
    **overrides: Any,
) -> Worker:
    settings = load_settings(
        bootstrap_servers="stub:9092",
        main_topics=MAIN,
        retry_sequence=sequence,
        group_id=GROUP,
        state_dir=tmp_path / "state",
        handler=f"python:{__name__}:unused",
        handler_timeout_s=overrides.pop("handler_timeout_s", 2.0),
        max_poll_interval_ms=30_000,
        session_timeout_ms=6_000,
        poll_timeout_s=0.05,
        # these tests fail records on purpose, from many keys: the outage circuit breaker
        # (tests/unit/test_engine_circuit.py) would hold them instead of routing them
        circuit_breaker=overrides.pop("circuit_breaker", False),
        **overrides,
    )
    if create_topics:
        broker.create(MAIN, partitions)
        for tier in settings.plan.tier_topics:
            broker.create(tier, partitions)
        broker.create(settings.failed_topic, 1)
    handler = PythonHandler(func, timeout_s=settings.handler_timeout_s)
    return build_worker(
        settings,
        handler,
        drain_grace_s=0.1,
        consumer_factory=consumer_factory or broker.consumer,
        producer_factory=broker.producer,
        hooks=hooks,
    )


def send(broker: StubBroker, n: int, *, keys: int | None = None, partitions: int = 1) -> None:
    for i in range(n):
        key = str(i % keys).encode() if keys else str(i).encode()
        broker.append(MAIN, key, b"v%d" % i, partition=i % partitions)


def recorded(calls: Calls, inner: Callable[[Message], Any] | None = None) -> Callable[..., Any]:
    def func(m: Message) -> Any:
        start = time.perf_counter()
        try:
            return inner(m) if inner else None
        finally:
            calls.record(m, start, time.perf_counter())

    return func


@pytest.fixture
def running() -> Iterator[Callable[[Worker], threading.Thread]]:
    """Run a worker in a thread; stopped and joined at teardown."""
    threads: list[tuple[Worker, threading.Thread]] = []
    errors: list[BaseException] = []

    def start(worker: Worker) -> threading.Thread:
        def target() -> None:
            try:
                worker.run()
            except BaseException as exc:  # surfaced at teardown
                errors.append(exc)

        t = threading.Thread(target=target, daemon=True)
        t.start()
        threads.append((worker, t))
        return t

    yield start
    for worker, t in threads:
        worker.stop()
        t.join(10)
        assert not t.is_alive()
    assert not errors, errors


# ------------------------------------------------------------------ success and routing
def test_success_path_commits_every_offset(broker: StubBroker, tmp_path: Path) -> None:
    calls = Calls()
    worker = make_worker(broker, tmp_path, recorded(calls), partitions=2)
    send(broker, 500, partitions=2)
    summary = worker.run(until_drained=True)
    assert calls.offsets() == sorted([*range(250), *range(250)])
    assert summary.total("success") == 500
    assert broker.committed_offset(GROUP, MAIN, 0) == 250
    assert broker.committed_offset(GROUP, MAIN, 1) == 250


def test_failures_route_copies_that_name_their_group(broker: StubBroker, tmp_path: Path) -> None:
    calls = Calls()

    def fail_once(m: Message) -> None:
        if m.retry_number == 0:
            raise ValueError("first attempt")

    worker = make_worker(broker, tmp_path, recorded(calls, fail_once), sequence="1s")
    send(broker, 20)
    summary = worker.run(until_drained=True)
    tier = broker.records("retry_1s")
    assert len(tier) == 20
    for rec in tier:
        hdrs = dict(rec.headers)
        assert hdrs[h.GROUP] == GROUP.encode()
        assert hdrs[h.RETRY_NUMBER] == b"1"
        assert hdrs[h.ERROR_CLASS] == b"ValueError"
    assert sorted(c["retry"] for c in calls.items) == [0] * 20 + [1] * 20
    assert summary.total("retried") == 20 and summary.total("success") == 20
    assert broker.committed_offset(GROUP, MAIN) == 20
    assert broker.committed_offset(GROUP, "retry_1s") == 20


# ------------------------------------------------------------------ ordering
def _overlaps(intervals: list[tuple[float, float]]) -> bool:
    intervals = sorted(intervals)
    return any(b[0] < a[1] for a, b in itertools.pairwise(intervals))


def _max_concurrency(items: list[dict[str, Any]]) -> int:
    events = sorted([(c["start"], 1) for c in items] + [(c["end"], -1) for c in items])
    now = best = 0
    for _, delta in events:
        now += delta
        best = max(best, now)
    return best


def _jitter(m: Message) -> None:
    time.sleep(random.uniform(0, 0.002))
    if m.offset % 7 == 3 and m.retry_number == 0:
        raise ValueError("some fail")


def test_key_ordering_never_overlaps_a_key_and_keeps_offset_order(
    broker: StubBroker, tmp_path: Path
) -> None:
    calls = Calls()
    worker = make_worker(broker, tmp_path, recorded(calls, _jitter), partitions=2, max_in_flight=16)
    send(broker, 400, keys=12, partitions=2)
    worker.run(until_drained=True)
    main = [c for c in calls.items if c["topic"] == MAIN]
    assert len(main) == 400
    by_key: dict[tuple[int, bytes], list[dict[str, Any]]] = defaultdict(list)
    for c in main:
        by_key[(c["partition"], c["key"])].append(c)
    for key, items in by_key.items():
        items.sort(key=lambda c: c["start"])
        assert [c["offset"] for c in items] == sorted(c["offset"] for c in items), key
        assert not _overlaps([(c["start"], c["end"]) for c in items]), key
    assert _max_concurrency(main) > 1  # different keys did run in parallel


def test_partition_ordering_runs_one_call_per_partition(broker: StubBroker, tmp_path: Path) -> None:
    calls = Calls()
    worker = make_worker(
        broker,
        tmp_path,
        recorded(calls, _jitter),
        partitions=3,
        max_in_flight=16,
        ordering="partition",
    )
    send(broker, 150, keys=50, partitions=3)
    worker.run(until_drained=True)
    main = [c for c in calls.items if c["topic"] == MAIN]
    for p in range(3):
        items = sorted((c for c in main if c["partition"] == p), key=lambda c: c["start"])
        assert [c["offset"] for c in items] == list(range(50))
        assert not _overlaps([(c["start"], c["end"]) for c in items])
    assert _max_concurrency(main) > 1  # partitions in parallel


def test_ordering_none_runs_one_partition_concurrently(broker: StubBroker, tmp_path: Path) -> None:
    calls = Calls()
    barrier = threading.Barrier(4, timeout=5)

    def meet(m: Message) -> None:
        if m.offset < 4:
            barrier.wait()  # four records of one partition in flight at once

    worker = make_worker(broker, tmp_path, recorded(calls, meet), max_in_flight=4, ordering="none")
    send(broker, 40, keys=1)
    worker.run(until_drained=True)
    assert calls.offsets() == list(range(40))


def test_in_flight_calls_never_exceed_max_in_flight(broker: StubBroker, tmp_path: Path) -> None:
    calls = Calls()
    worker = make_worker(
        broker,
        tmp_path,
        recorded(calls, lambda m: time.sleep(0.002)),
        partitions=2,
        max_in_flight=5,
        ordering="none",
    )
    send(broker, 200, partitions=2)
    worker.run(until_drained=True)
    assert len(calls.items) == 200
    assert 1 < _max_concurrency(calls.items) <= 5


# ------------------------------------------------------------------ tiers
def _tier_headers(due_ms: int, group: str | None = GROUP) -> list[tuple[str, bytes | None]]:
    hdrs: list[tuple[str, bytes | None]] = [
        (h.RETRY_NUMBER, b"1"),
        (h.RETRY_TIMESTAMP, str(due_ms).encode()),
        (h.ORIGINAL_TOPIC, MAIN.encode()),
        (h.ORIGINAL_PARTITION, b"0"),
        (h.ORIGINAL_OFFSET, b"0"),
    ]
    if group is not None:
        hdrs.append((h.GROUP, group.encode()))
    return hdrs


def test_tier_record_runs_when_due_never_before(broker: StubBroker, tmp_path: Path) -> None:
    calls = Calls()
    worker = make_worker(broker, tmp_path, recorded(calls), sequence="1s")
    now = int(time.time() * 1000)
    broker.append("retry_1s", b"k", b"v", _tier_headers(now + 800), timestamp=now)
    summary = worker.run(until_drained=True)
    [call] = calls.items
    called_ms = (call["start"] - time.perf_counter()) * 1000 + time.time() * 1000
    assert called_ms >= now + 800 - 5
    assert summary.outcomes[("retry_1s", "success")] == 1


def test_absurd_retry_timestamp_is_clamped_to_record_time_plus_delay(
    broker: StubBroker, tmp_path: Path
) -> None:
    calls = Calls()
    worker = make_worker(broker, tmp_path, recorded(calls), sequence="1s")
    now = int(time.time() * 1000)
    ten_days = now + 10 * 86_400_000
    broker.append("retry_1s", b"k", b"v", _tier_headers(ten_days), timestamp=now)
    worker.run(until_drained=True)  # returns: the record did not wait ten days
    [call] = calls.items
    called_ms = (call["start"] - time.perf_counter()) * 1000 + time.time() * 1000
    assert called_ms >= now + 1000 - 5  # due one tier delay after it was written, not before


def test_other_groups_tier_records_are_skipped_and_counted(
    broker: StubBroker, tmp_path: Path
) -> None:
    calls = Calls()
    worker = make_worker(broker, tmp_path, recorded(calls), sequence="1s")
    now = int(time.time() * 1000)
    broker.append("retry_1s", b"mine", b"v", _tier_headers(now, GROUP), timestamp=now)
    broker.append("retry_1s", b"theirs", b"v", _tier_headers(now, "other"), timestamp=now)
    broker.append("retry_1s", b"legacy", b"v", _tier_headers(now, None), timestamp=now)
    summary = worker.run(until_drained=True)
    assert sorted(c["key"] for c in calls.items) == [b"legacy", b"mine"]
    assert summary.skipped == {"other_group": 1}
    assert broker.committed_offset(GROUP, "retry_1s") == 3


# ------------------------------------------------------------------ flow control
def test_a_full_partition_is_paused_and_resumed_while_polling_continues(
    broker: StubBroker, tmp_path: Path, running: Callable[[Worker], threading.Thread]
) -> None:
    gate = threading.Event()
    calls = Calls()
    worker = make_worker(
        broker,
        tmp_path,
        recorded(calls, lambda m: gate.wait(10)),
        partition_buffer=20,
        max_in_flight=2,
        batch_size=10,
    )
    send(broker, 100)
    running(worker)
    consumer = broker.consumers[0]
    wait_for(lambda: (MAIN, 0) in consumer.pause_calls, 5, what="the partition to pause")
    pending = len(worker.book.parts[(MAIN, 0)].pending)
    assert 20 <= pending <= 30  # buffer + at most one batch, not all 100
    gate.set()
    wait_for(lambda: len(calls.items) == 100, 10, what="all records handled")
    assert (MAIN, 0) in consumer.resume_calls


def test_producer_back_pressure_pauses_instead_of_spinning(
    broker: StubBroker, tmp_path: Path
) -> None:
    def fail(m: Message) -> None:
        if m.retry_number == 0:
            raise ValueError("route me")

    worker = make_worker(broker, tmp_path, fail, sequence="1s", max_in_flight=4)
    broker.producers[0].queue_limit = 3  # librdkafka's local queue "full" after three copies
    send(broker, 60)
    summary = worker.run(until_drained=True)
    producer = broker.producers[0]
    assert producer.buffer_errors > 0
    assert summary.total("retried") == 60
    assert len(broker.records("retry_1s")) == 60
    assert broker.consumers[0].pause_calls  # partitions paused while copies backed up


# ------------------------------------------------------------------ rebalance
def test_revoke_settles_in_flight_calls_before_committing(
    broker: StubBroker, tmp_path: Path, running: Callable[[Worker], threading.Thread]
) -> None:
    in_call = threading.Event()
    release = threading.Event()
    calls = Calls()

    def block_at_5(m: Message) -> None:
        if m.offset == 5:
            in_call.set()
            release.wait(10)

    worker = make_worker(
        broker, tmp_path, recorded(calls, block_at_5), max_in_flight=1, batch_size=100
    )
    send(broker, 50, keys=1)
    running(worker)
    assert in_call.wait(5)
    consumer = broker.consumers[0]
    consumer.trigger_revoke([(MAIN, 0)])
    threading.Timer(0.3, release.set).start()  # the call finishes while the revoke waits
    wait_for(lambda: (MAIN, 0) not in consumer.assigned, 10, what="the revoke to complete")
    # the in-flight call was settled and committed; nothing queued after it ran
    assert broker.committed_offset(GROUP, MAIN) == 6
    assert calls.offsets() == list(range(6))


def test_lost_partitions_discard_their_results(
    broker: StubBroker, tmp_path: Path, running: Callable[[Worker], threading.Thread]
) -> None:
    in_call = threading.Event()
    release = threading.Event()

    def block(m: Message) -> None:
        if m.offset == 0:
            in_call.set()
            release.wait(10)
        raise ValueError("would be routed")

    worker = make_worker(broker, tmp_path, block, max_in_flight=1)
    send(broker, 5, keys=1)
    running(worker)
    assert in_call.wait(5)
    consumer = broker.consumers[0]
    consumer.trigger_lost([(MAIN, 0)])
    wait_for(lambda: (MAIN, 0) not in consumer.assigned, 10, what="the loss to be handled")
    release.set()
    wait_for(lambda: not worker.pool.running(), 5, what="the call to return")
    time.sleep(0.2)  # a few loop iterations: a discarded result must not be routed
    assert broker.records("retry_1s") == []
    assert broker.committed_offset(GROUP, MAIN) is None


# ------------------------------------------------------------------ faults
def test_a_copy_refused_for_now_is_sent_again_and_the_worker_keeps_running(
    broker: StubBroker, tmp_path: Path
) -> None:
    """An outage below min.insync.replicas outlasting message.timeout.ms made the copy time
    out in the client: the worker stopped with exit 3 although the cluster would take the
    copy a moment later. Transient refusals are sent again; the input waits, uncommitted."""
    from confluent_kafka import KafkaError

    def fail(m: Message) -> None:
        if m.retry_number == 0 and m.offset % 2:
            raise ValueError("route me")

    worker = make_worker(broker, tmp_path, fail)
    broker.producers[0].fail_next["retry_1s"] = [
        KafkaError._MSG_TIMED_OUT,
        KafkaError.NOT_ENOUGH_REPLICAS,
        KafkaError.NOT_ENOUGH_REPLICAS_AFTER_APPEND,
    ]
    send(broker, 10, keys=10)
    worker.run(until_drained=True)
    assert worker.settler.resent == 3
    assert len(broker.records("retry_1s")) == 5  # each routed copy once
    assert broker.committed_offset(GROUP, MAIN) == 10


def test_undeliverable_copy_stops_with_delivery_error_input_uncommitted(
    broker: StubBroker, tmp_path: Path
) -> None:
    from confluent_kafka import KafkaError

    def fail(m: Message) -> None:
        if m.offset == 3:
            raise ValueError("route me")

    worker = make_worker(broker, tmp_path, fail, max_in_flight=1)
    broker.producers[0].fail_topics["retry_1s"] = KafkaError.TOPIC_AUTHORIZATION_FAILED
    send(broker, 10, keys=1)
    with pytest.raises(DeliveryError, match=r"orders\[0\]@3.*retry_1s"):
        worker.run(until_drained=True)
    assert broker.committed_offset(GROUP, MAIN) == 3


def test_hung_calls_past_the_limit_stop_the_worker_for_a_restart(
    broker: StubBroker, tmp_path: Path
) -> None:
    release = threading.Event()

    def hang(m: Message) -> None:
        if m.retry_number == 0 and m.offset < 3:
            release.wait(30)

    worker = make_worker(
        broker,
        tmp_path,
        hang,
        handler_timeout_s=0.2,
        max_abandoned_handlers=2,
        max_in_flight=4,
        ordering="none",
    )
    send(broker, 6)
    try:
        with pytest.raises(HungHandlersError, match="3 handler calls are hung"):
            worker.run(until_drained=True)
    finally:
        release.set()
    # the hung calls were timed out, routed and committed before the exit
    assert len(broker.records("retry_1s")) == 3
    assert broker.committed_offset(GROUP, MAIN) == 6


def test_stop_finishes_consumed_records_then_commits(broker: StubBroker, tmp_path: Path) -> None:
    calls = Calls()
    worker = make_worker(
        broker,
        tmp_path,
        recorded(calls, lambda m: time.sleep(0.005)),
        max_in_flight=4,
        partition_buffer=500,
    )
    send(broker, 10_000, keys=40)
    result: list[RunSummary] = []
    t = threading.Thread(target=lambda: result.append(worker.run()), daemon=True)
    t.start()
    wait_for(lambda: len(calls.items) > 50, 10, what="some calls")
    worker.stop()
    t.join(30)
    assert not t.is_alive()
    handled = calls.offsets()
    assert len(handled) == len(set(handled))  # nothing twice
    committed = broker.committed_offset(GROUP, MAIN)
    assert committed is not None and handled == list(range(committed))  # all handled committed
    assert committed < 10_000  # it stopped rather than draining the topic


def test_handler_raising_system_exit_does_not_stop_the_worker(
    broker: StubBroker, tmp_path: Path
) -> None:
    def odd(m: Message) -> None:
        if m.retry_number == 0:
            raise SystemExit(3)

    worker = make_worker(broker, tmp_path, odd, sequence="1s")
    send(broker, 5)
    summary = worker.run(until_drained=True)
    assert summary.total("retried") == 5 and summary.total("success") == 5


def unused(m: Message) -> None:  # the settings' handler spec (the worker gets its own)
    raise AssertionError("not called")
