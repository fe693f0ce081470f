"""Exactly-once routing on the stub broker: copies sent only at the settled frontier, offsets
committed by transactions, an aborted transaction rewinds and redoes, a fenced producer ends
the run. (The SIGKILL proof of zero duplicate copies runs on Apache Kafka:
tests/integration/test_exactly_once.py.)"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from retryd.errors import KafkaRuntimeError
from retryd.handlers.base import Message
from retryd.worker.faults import Faults
from retryd.worker.offsets import MAX_ABORTS_IN_A_ROW, Committed, TransactionalOffsets
from tests.stub_kafka import StubBroker
from tests.support import wait_for
from tests.unit.test_engine_loop import GROUP, MAIN, make_worker


def _live(broker: StubBroker, topic: str) -> list[bytes]:
    """Keys of the records a read_committed reader sees."""
    return [r.key or b"" for r in broker.records(topic) if not r.aborted]


def test_a_copy_waits_until_every_lower_offset_settled(tmp_path: Path) -> None:
    """Key a (offset 0) is slow and succeeds; key b (offset 1) fails at once. Sent before a
    finished, b's copy could be committed while offset 1 is not: whoever redoes offset 1 would
    route it again. It is sent only after a's call ended, and the offsets commit with it."""
    broker = StubBroker()
    a_done = threading.Event()
    copy_sent_after_a: list[bool] = []

    def handler(m: Message) -> None:
        if m.key == b"a":
            time.sleep(0.3)  # the slow call (a handler's own work, not synchronisation)
            a_done.set()
            return
        if m.retry_number == 0:
            raise RuntimeError("b fails once")

    worker = make_worker(broker, tmp_path, handler, exactly_once=True, max_in_flight=4)
    producer_append = broker.append

    def watching_append(topic: str, *args: object, **kw: object) -> object:
        if topic != MAIN:
            copy_sent_after_a.append(a_done.is_set())
        return producer_append(topic, *args, **kw)  # type: ignore[arg-type]

    broker.append(MAIN, b"a", b"1")
    broker.append(MAIN, b"b", b"2")
    broker.append = watching_append  # type: ignore[method-assign]
    worker.run(until_drained=True)

    assert copy_sent_after_a == [True]
    assert _live(broker, worker.settings.plan.tier_topics[0]) == [b"b"]
    assert broker.committed_offset(GROUP, MAIN) == 2
    [producer] = broker.producers
    assert producer.transactional and producer.commits >= 1 and producer.aborts == 0


def test_an_aborted_transaction_rewinds_and_redoes_its_inputs(tmp_path: Path) -> None:
    broker = StubBroker()
    calls: Counter[bytes] = Counter()
    lock = threading.Lock()

    def handler(m: Message) -> None:
        with lock:
            calls[m.key or b""] += 1
        if m.retry_number == 0 and (m.key or b"").startswith(b"f"):
            raise RuntimeError("fails once")

    worker = make_worker(broker, tmp_path, handler, exactly_once=True)
    [producer] = broker.producers
    producer.fail_commits.append(
        KafkaError(KafkaError._STATE, "coordinator lost the transaction", txn_requires_abort=True)
    )
    for i in range(20):
        broker.append(MAIN, b"f%d" % i if i % 2 else b"s%d" % i, b"v")
    worker.run(until_drained=True)

    assert producer.aborts == 1 and producer.commits >= 1
    tier = worker.settings.plan.tier_topics[0]
    # the aborted transaction's copies are invisible; the redo routed each failure once
    assert Counter(_live(broker, tier)) == Counter({b"f%d" % i: 1 for i in range(1, 20, 2)})
    assert any(r.aborted for r in broker.records(tier))
    # what the aborted transaction held was handled again (at-least-once for handler calls)
    assert sum(calls.values()) > 20 + 10
    assert broker.committed_offset(GROUP, MAIN) == 20
    assert worker.summary.total("dead") == 0


def test_a_fenced_producer_ends_the_run_without_committing(tmp_path: Path) -> None:
    broker = StubBroker()

    def handler(m: Message) -> None:
        raise RuntimeError("always")

    worker = make_worker(broker, tmp_path, handler, exactly_once=True)
    [producer] = broker.producers
    producer.fail_commits.append(KafkaError(KafkaError._FENCED, "fenced", fatal=True))
    broker.append(MAIN, b"k", b"v")
    with pytest.raises(KafkaRuntimeError, match="another instance"):
        worker.run(until_drained=True)
    assert broker.committed_offset(GROUP, MAIN) is None


def test_exactly_once_turns_auto_commit_off_and_names_the_transaction(tmp_path: Path) -> None:
    broker = StubBroker()
    worker = make_worker(
        broker, tmp_path, lambda m: None, exactly_once=True, transactional_id="orders-eu-1"
    )
    [consumer] = broker.consumers
    [producer] = broker.producers
    assert producer.conf["transactional.id"] == "orders-eu-1-0"
    assert producer.conf["enable.idempotence"] is True and producer.conf["acks"] == "all"
    assert consumer.conf["enable.auto.commit"] is False
    assert consumer.conf["isolation.level"] == "read_committed"
    worker.stop()


class _Txn:
    """A transactional producer whose commits fail as told (pure logic of the sink)."""

    def __init__(self, errors: list[KafkaError]) -> None:
        self.errors = errors
        self.calls: list[str] = []

    def init_transactions(self, timeout: float = -1) -> None:
        self.calls.append("init")

    def begin_transaction(self) -> None:
        self.calls.append("begin")

    def send_offsets_to_transaction(
        self, positions: list, meta: object, timeout: float = -1
    ) -> None:
        self.calls.append(f"offsets {[(p.topic, p.partition, p.offset) for p in positions]}")

    def commit_transaction(self, timeout: float = -1) -> None:
        if self.errors:
            self.calls.append("commit failed")
            raise KafkaException(self.errors.pop(0))
        self.calls.append("commit")

    def abort_transaction(self, timeout: float = -1) -> None:
        self.calls.append("abort")


class _Group:
    def consumer_group_metadata(self) -> str:
        return "meta"

    def store_offsets(self, *args: object, **kwargs: object) -> None:
        raise AssertionError("exactly-once never stores offsets in the consumer")

    def commit(self, *args: object, **kwargs: object) -> None:
        raise AssertionError("exactly-once never commits through the consumer")


def _sink(errors: list[KafkaError]) -> tuple[TransactionalOffsets, _Txn, Faults]:
    txn = _Txn(errors)
    faults = Faults()
    sink = TransactionalOffsets(txn, _Group(), 0.0, faults)
    sink.start()
    sink.store([TopicPartition("t", 0, 5)])
    return sink, txn, faults


def test_a_retriable_commit_error_is_retried_then_the_transaction_commits() -> None:
    sink, txn, faults = _sink([KafkaError(KafkaError.REQUEST_TIMED_OUT, "slow", retriable=True)])
    assert sink.commit() is Committed.DONE
    assert txn.calls == [
        "init",
        "begin",
        "offsets [('t', 0, 5)]",
        "commit failed",
        "commit",
        "begin",
    ]
    assert not faults
    assert sink.commit() is Committed.NOTHING


def test_aborts_in_a_row_end_the_run() -> None:
    abortable = KafkaError(KafkaError._STATE, "abort", txn_requires_abort=True)
    sink, _txn, faults = _sink([abortable] * (MAX_ABORTS_IN_A_ROW + 1))
    results = []
    for i in range(MAX_ABORTS_IN_A_ROW + 1):
        sink.store([TopicPartition("t", 0, 5 + i)])
        results.append(sink.commit())
    assert results == [Committed.ABORTED] * (MAX_ABORTS_IN_A_ROW + 1)
    assert isinstance(faults.first, KafkaRuntimeError)
    assert "aborted in a row" in str(faults.first)
    sink.store([TopicPartition("t", 0, 99)])
    assert sink.commit() is Committed.NOTHING


def test_copies_waiting_for_room_in_the_producer_are_committed_with_their_offsets(
    tmp_path: Path,
) -> None:
    """A full producer queue puts copies in the router's backlog. Each must enter a
    transaction no later than its input's offset: every commit is checked for a copy whose
    input offset is not below the offsets it commits."""
    from retryd.policy import headers as hdr

    broker = StubBroker()

    def handler(m: Message) -> None:
        if m.retry_number == 0:
            raise RuntimeError("fails once")

    worker = make_worker(broker, tmp_path, handler, exactly_once=True, max_in_flight=8)
    [producer] = broker.producers
    producer.queue_limit = 1  # BufferError beyond one unreported copy
    producer.hold = True  # and no report (no room) until the first commit flushes
    commit = producer.commit_transaction
    checked: list[int] = []

    def checking_commit(timeout: float = -1) -> None:
        committed = {tp.partition: tp.offset for _, tp in producer.txn_offsets if tp.topic == MAIN}
        end = committed.get(0, broker.committed_offset(GROUP, MAIN) or 0)
        for rec in producer.txn_records:
            origin = int(dict(rec.headers)[hdr.ORIGINAL_OFFSET] or b"-1")
            assert origin < end, f"copy of {origin} above the committed offset {end}"
            checked.append(origin)
        # every input below the offset committed now has its copy committed (now or before):
        # an offset committed ahead of its copy loses the message if the worker dies here
        missing = sorted(set(range(end)) - set(checked))
        assert not missing, f"offset {end} committed before the copies of {missing[:5]}"
        commit(timeout)

    producer.commit_transaction = checking_commit  # type: ignore[method-assign]
    for i in range(40):
        broker.append(MAIN, b"k%d" % i, b"v")
    worker.run(until_drained=True)

    assert producer.buffer_errors > 0  # the backlog was used
    assert sorted(checked) == list(range(40))
    tier = worker.settings.plan.tier_topics[0]
    assert Counter(_live(broker, tier)) == Counter({b"k%d" % i: 1 for i in range(40)})
    assert broker.committed_offset(GROUP, MAIN) == 40


def test_a_stop_routes_the_failed_records_it_finishes_without_waiting_out_its_timeout(
    tmp_path: Path,
) -> None:
    """Shutdown finishes consumed records: under exactly-once a failed one is finished when
    its copy is sent at the frontier, which the shutdown's settling must do too (it used to
    wait the whole shutdown_timeout_s, then leave them to the next owner)."""
    broker = StubBroker()
    started = threading.Event()

    def handler(m: Message) -> None:
        if m.offset == 0:  # the frontier: every failure behind it waits for it
            started.set()
            time.sleep(1.0)  # a slow call (the handler's own work, not synchronisation)
            return
        raise RuntimeError("always")

    worker = make_worker(
        broker, tmp_path, handler, exactly_once=True, sequence="1h", shutdown_timeout_s=30
    )
    for i in range(50):
        broker.append(MAIN, b"k%d" % i, b"v")
    runner = threading.Thread(target=worker.run, daemon=True)
    runner.start()
    assert started.wait(10)
    wait_for(lambda: worker.pool.completions or worker.summary, 5)  # the others failed
    worker.stop()
    runner.join(20)
    assert not runner.is_alive()  # well inside its 30 s shutdown timeout
    tier = worker.settings.plan.tier_topics[0]
    assert sorted(_live(broker, tier)) == sorted(b"k%d" % i for i in range(1, 50))
    assert broker.committed_offset(GROUP, MAIN) == 50


def test_a_rewind_never_runs_a_record_beside_its_own_call_still_running(tmp_path: Path) -> None:
    """An aborted transaction rewinds every owned partition to its committed offset. The
    partitions used to be assigned again at once, while a call of a rewound record was still
    running: with ``ordering=partition`` the redo of offset 0 started beside its own first
    call (a new assignment is a new lane). The first call here holds until a second call of
    its record starts, so that double call is seen whenever it happens; the rewind now
    assigns again only once every call of the old assignment ended (this one: cancelled at
    its timeout), and the redo starts after it."""
    broker = StubBroker()
    first_started = threading.Event()
    calls: list[list[float]] = []  # [start, end] of each call of partition 0's offset 0

    async def handler(m: Message) -> None:
        if m.partition != 0:
            return
        call = [time.perf_counter(), float("inf")]
        calls.append(call)
        try:
            if len(calls) == 1:
                first_started.set()
                while len(calls) == 1:  # held until its record runs again (or its timeout)
                    await asyncio.sleep(0.005)
        finally:
            call[1] = time.perf_counter()

    worker = make_worker(
        broker,
        tmp_path,
        handler,
        partitions=2,
        exactly_once=True,
        ordering="partition",
        transaction_interval_ms=10,
        handler_timeout_s=1.0,
    )
    [producer] = broker.producers
    broker.append(MAIN, b"a", b"v", partition=0)
    runner = threading.Thread(target=worker.run, kwargs={"until_drained": True}, daemon=True)
    runner.start()
    assert first_started.wait(10)
    producer.fail_commits.append(
        KafkaError(KafkaError._STATE, "coordinator lost the transaction", txn_requires_abort=True)
    )
    broker.append(MAIN, b"b", b"v", partition=1)  # settles: its commit aborts, and rewinds
    runner.join(30)
    assert not runner.is_alive()

    assert producer.aborts == 1
    assert len(calls) == 2  # offset 0 redone (its first call's result was discarded)
    assert calls[1][0] >= calls[0][1], "the redo started while the first call still ran"
    assert broker.committed_offset(GROUP, MAIN, 0) == 1
    assert broker.committed_offset(GROUP, MAIN, 1) == 1
