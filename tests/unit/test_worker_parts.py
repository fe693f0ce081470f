"""Pieces of the worker with no I/O of their own: the ordering scheduler, the partition window,
the router's back-pressure, the book's pause reasons, the due-time clamp, the event sinks."""

from __future__ import annotations

from typing import Any

from confluent_kafka import TopicPartition
from hypothesis import given
from hypothesis import strategies as st

from retryd.handlers.base import Message
from retryd.policy.routing import Route
from retryd.worker.book import PartitionBook
from retryd.worker.events import BatchStats, Buckets, SlotStats
from retryd.worker.flow import flow_control
from retryd.worker.intake import effective_due_ms
from retryd.worker.lifecycle import FAILED, QUEUED, RUNNING, SUCCEEDED
from retryd.worker.partition import PAUSE_BUFFER, PAUSE_PRODUCER, PartitionState
from retryd.worker.router import Router
from retryd.worker.scheduler import Scheduler
from retryd.worker.summary import RunSummary
from retryd.worker.work import Work, work_of_message
from tests.stub_kafka import StubBroker


def _work(offset: int, part: PartitionState | None = None) -> Work:
    part = part or PartitionState("t", 0, None)
    w = work_of_message(Message(topic="t", offset=offset), part)
    w.size = 10
    return w


# ------------------------------------------------------------------ scheduler
def _keyed(offset: int, key: object) -> Work:
    w = _work(offset)
    w.lock = key
    w.next = None
    w.stage = SUCCEEDED  # as a slot leaves it after a success (a success releases the lane)
    return w


def test_records_of_a_busy_key_chain_behind_it_and_continue_in_order() -> None:
    s = Scheduler()
    a1, b1, a2 = _keyed(0, "a"), _keyed(1, "b"), _keyed(2, "a")
    assert s.submit([a1, b1]) == 2
    assert s.submit([a2]) == 0  # "a" is busy: chained, not ready
    assert s.take(10) == [a1, b1] and s.take() == []
    assert s.handoff(a1) is a2  # nothing else ready: the slot runs the key's next record
    assert s.handoff(a2) is None and s.busy_keys == 1
    assert s.handoff(b1) is None and s.busy_keys == 0


def test_handoff_lets_keys_take_turns() -> None:
    """A finished record's successor queues behind the keys already waiting, so one slot
    does not run a long chain to its end while other keys' records wait."""
    s = Scheduler()
    a1, b1, a2, b2 = _keyed(0, "a"), _keyed(1, "b"), _keyed(2, "a"), _keyed(3, "b")
    s.submit([a1, b1, a2, b2])
    assert s.take() == [a1]
    assert s.handoff(a1) is b1  # b was waiting: its turn before a2
    assert s.handoff(b1) is a2
    assert s.handoff(a2) is b2
    assert s.handoff(b2) is None and s.busy_keys == 0


def test_a_failure_releases_its_lane_on_its_slot_only_while_the_gate_is_open() -> None:
    """Closed circuit: a failure will be routed, so its key moves on at once. Shut gate (the
    circuit not closed): the poll thread decides it, so the key waits."""
    s = Scheduler()
    a1, b1, a2, b2 = _keyed(0, "a"), _keyed(1, "b"), _keyed(2, "a"), _keyed(3, "b")
    s.submit([a1, b1, a2, b2])
    held = s.take(10)
    b1.stage = FAILED
    s.release_settled(held)
    assert s.take(10) == [a2, b2] and s.busy_keys == 2
    c1, c2 = _keyed(4, "c"), _keyed(5, "c")
    s.submit([c1, c2])
    assert s.take(10) == [c1]
    c1.stage = FAILED
    s.set_gate(False)
    s.release_settled([c1])
    s.set_gate(True)
    assert s.take(10) == []  # c2 waits behind c1 ...
    s.release(c1)  # ... until the poll thread routed it
    assert s.take(10) == [c2]


def test_a_held_failure_keeps_its_lane_until_it_ran_again() -> None:
    """A failure held in place (circuit breaker) goes back to the front and runs before the
    next record of its key, which never starts while it is held; a failure whose lane its slot
    already released cannot be held."""
    s = Scheduler()
    a1, a2 = _keyed(0, "a"), _keyed(1, "a")
    s.submit([a1, a2])
    assert s.take(10) == [a1]
    s.set_gate(False)
    a1.stage = FAILED
    assert s.handoff(a1) is None  # a2 stays chained behind the failed a1

    def hold(w: Work) -> bool:
        w.stage = QUEUED
        return True

    assert s.keep(a1, hold)
    s.set_gate(True)
    s.requeue([a1])
    assert s.take(10) == [a1]
    a1.stage = SUCCEEDED
    assert s.handoff(a1) is a2
    a2.stage = FAILED
    assert s.handoff(a2) is None  # gate open: released on its slot
    assert not s.keep(a2, hold) and a2.stage is FAILED  # so it is routed, never held


def test_the_shut_gate_lets_only_the_offered_probe_through() -> None:
    s = Scheduler()
    a1, b1, c1 = _keyed(0, "a"), _keyed(1, "b"), _keyed(2, "c")
    s.submit([a1, b1])
    s.set_gate(False)
    assert s.take(10) == [] and s.runnable == 0
    s.offer_probe(c1)
    assert s.runnable == 1 and s.take(10) == [c1] and s.take(10) == []
    s.offer_probe(c1)
    s.set_gate(True)  # not taken: back at the front of the line
    assert s.take(10) == [c1, a1, b1]


def test_keyless_records_never_chain() -> None:
    s = Scheduler()
    assert s.submit([_keyed(0, None), _keyed(1, None)]) == 2


def test_requeued_records_go_first_in_order() -> None:
    s = Scheduler()
    a, b, c = _keyed(0, "a"), _keyed(1, "b"), _keyed(2, "c")
    s.submit([a, b, c])
    assert s.take(2) == [a, b]
    s.requeue([a, b])
    assert s.take(3) == [a, b, c]


def test_wait_below_returns_once_slots_took_enough() -> None:
    import threading

    s = Scheduler()
    s.submit([_keyed(i, None) for i in range(10)])
    threading.Timer(0.05, lambda: s.take(8)).start()
    s.wait_below(2, 5.0)
    assert s.ready_items <= 2


# ------------------------------------------------------------------ partition window
@given(st.permutations(list(range(30))))
def test_stored_offset_is_the_contiguous_settled_prefix(order: list[int]) -> None:
    part = PartitionState("t", 0, None)
    works = [_work(o, part) for o in range(30)]
    part.pending.extend(works)
    stored: list[int] = []
    settled: set[int] = set()
    for o in order:
        works[o].stage = SUCCEEDED
        settled.add(o)
        nxt = part.advance()
        if nxt is not None:
            stored.append(nxt)
        expected = next(i for i in range(31) if i not in settled)
        assert part.stored == (expected if expected else None)
    assert stored == sorted(stored) and stored[-1] == 30


def test_gaps_in_offsets_store_past_them() -> None:
    part = PartitionState("t", 0, None)
    a, b = _work(10, part), _work(15, part)  # 11-14: compacted away or transaction markers
    part.pending.extend([a, b])
    a.stage = SUCCEEDED
    assert part.advance() == 11
    b.stage = SUCCEEDED
    assert part.advance() == 16


# ------------------------------------------------------------------ due-time clamp
def test_due_time_is_clamped_to_record_time_plus_delay() -> None:
    now = 4_500  # when this worker first sees the record
    assert effective_due_ms(5_000, 4_000, 1_000, now) == 5_000  # the normal case
    assert effective_due_ms(10**15, 4_000, 1_000, now) == 5_000  # absurd header
    assert effective_due_ms(3_000, 4_000, 1_000, now) == 3_000  # early is allowed (skewed host)
    assert effective_due_ms(10**15, -1, 1_000, 7_000) == 8_000  # no timestamp: consume time


def test_due_time_is_bounded_by_this_workers_clock_whatever_the_routing_host_wrote() -> None:
    """A routing host a day ahead writes both retry_timestamp and CreateTime a day ahead: the
    record still comes due one tier delay after this worker first saw it."""
    day = 86_400_000
    now = 1_700_000_000_000
    assert effective_due_ms(now + day + 1_000, now + day, 1_000, now) == now + 1_000
    assert effective_due_ms(now + 500, now + day, 1_000, now) == now + 500


# ------------------------------------------------------------------ router back-pressure
class _Full:
    """A producer whose queue is full for the first ``n`` produce calls."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.sent: list[Any] = []
        self.callbacks: list[Any] = []

    def produce(self, topic: str, value: Any, key: Any, partition: int, cb: Any, *_: Any) -> None:
        if self.n > 0:
            self.n -= 1
            raise BufferError("Local: Queue full")
        self.sent.append(key)
        self.callbacks.append(cb)

    def poll(self, timeout: float = 0) -> int:
        return 0

    def flush(self, timeout: float = 0) -> int:
        return 0


def _route() -> Route:
    return Route("tier", [], 0, 1, 0, None)


def test_router_keeps_copies_in_order_while_the_queue_is_full() -> None:
    producer = _Full(2)
    router = Router(producer, {"tier": 1})
    for i in range(3):
        router.send(_route(), b"%d" % i, b"v", 0, i)
    assert router.blocked and router.backlog == 3 and producer.sent == []
    router.poll()  # still full: nothing overtakes the head of the backlog
    assert router.blocked and producer.sent == []
    router.poll()  # room again: the backlog drains in order
    assert producer.sent == [b"0", b"1", b"2"] and not router.blocked
    for cb in producer.callbacks:
        cb(None, type("Out", (), {"partition": lambda s: 0, "offset": lambda s: 7})())
    acked = [r.context for r in router.reports if r.error is None]
    assert acked == [0, 1, 2] and router.produced_end == {("tier", 0): 8}


# ------------------------------------------------------------------ book: pause reasons
def test_a_partition_pauses_on_the_first_reason_and_resumes_after_the_last() -> None:
    broker = StubBroker()
    broker.create("t", 1)
    consumer = broker.consumer({"group.id": "g"})
    book = PartitionBook(consumer, {})
    [st_] = book.assign([TopicPartition("t", 0)])
    book.set_pause(st_, PAUSE_BUFFER, True)
    book.set_pause(st_, PAUSE_PRODUCER, True)
    book.set_pause(st_, PAUSE_BUFFER, False)
    assert consumer.pause_calls == [("t", 0)] and consumer.resume_calls == []
    book.set_pause(st_, PAUSE_PRODUCER, False)
    assert consumer.resume_calls == [("t", 0)]


# ------------------------------------------------------------------ events
def test_buckets_count_like_prometheus() -> None:
    b = Buckets((0.1, 1.0))
    for v in (0.05, 0.1, 0.5, 2.0):
        b.observe(v)
    assert b.counts == [2, 1, 1]  # le=0.1 is inclusive, like Histogram.observe
    assert b.total == 2.65


def test_run_summary_is_a_sink_of_batch_events() -> None:
    summary = RunSummary()
    stats = BatchStats()
    stats.outcomes[("t", "success")] += 3
    stats.dead["exhausted"] += 1
    stats.records = 3
    summary.batch(stats, 1.0, 2.0)
    summary.rebalance("assign", 2)
    assert summary.total("success") == 3 and summary.dead_reasons == {"exhausted": 1}
    assert summary.rebalances == {"assign": 1} and summary.busy_seconds == 1.0


# ------------------------------------------------------------------ flow control
def test_flow_control_pauses_at_each_limit_and_resumes_at_half() -> None:

    broker = StubBroker()
    broker.create("main", 1)
    broker.create("tier", 1)
    consumer = broker.consumer({"group.id": "g"})
    book = PartitionBook(consumer, {"tier": 1000})
    main, tier = book.assign([TopicPartition("main", 0), TopicPartition("tier", 0)])
    main.pending.extend(_work(i, main) for i in range(10))
    flow_control(
        book, partition_buffer=10, tier_buffer=4, buffer_bytes=10**9, producer_blocked=False
    )
    assert consumer.paused == {("main", 0)}
    for _ in range(5):
        main.pending.popleft()
    flow_control(
        book, partition_buffer=10, tier_buffer=4, buffer_bytes=10**9, producer_blocked=False
    )
    assert consumer.paused == set()  # resumed at half
    tier.tail.extend(_work(i, tier) for i in range(4))
    flow_control(
        book, partition_buffer=10, tier_buffer=4, buffer_bytes=10**9, producer_blocked=False
    )
    assert consumer.paused == {("tier", 0)}
    flow_control(
        book, partition_buffer=10, tier_buffer=4, buffer_bytes=10**9, producer_blocked=True
    )
    assert consumer.paused == {("main", 0), ("tier", 0)}  # a full producer queue pauses all
    tier.tail.clear()
    flow_control(
        book, partition_buffer=10, tier_buffer=4, buffer_bytes=10**9, producer_blocked=False
    )
    assert consumer.paused == set()
    main.pending_bytes = 100
    flow_control(book, partition_buffer=10, tier_buffer=4, buffer_bytes=100, producer_blocked=False)
    assert consumer.paused == {("main", 0), ("tier", 0)}  # memory: everything pauses


def test_a_full_jittered_tier_tail_resumes_before_unfetched_records_can_come_due() -> None:
    """A tier with a 10 s delay and 20 % jitter: a record not fetched yet is due at the
    earliest 8 s after the newest one in the tail. The full tail stays paused until shortly
    before then, and no longer (or those records would be late by up to the jitter's spread);
    past four times ``tier_buffer`` it stays paused whatever the time."""
    broker = StubBroker()
    broker.create("tier", 1)
    consumer = broker.consumer({"group.id": "g"})
    book = PartitionBook(consumer, {"tier": 12_000}, tier_floors={"tier": 8_000})
    [tier] = book.assign([TopicPartition("tier", 0)])
    newest = 1_000_000
    for i in range(4):
        w = work_of_message(Message(topic="tier", offset=i, timestamp=newest - 10 + i), tier)
        w.size = 10
        tier.tail.append(w)
    args = {"partition_buffer": 100, "tier_buffer": 4, "buffer_bytes": 10**9}
    flow_control(book, **args, producer_blocked=False, now_ms=newest + 1_000)
    assert consumer.paused == {("tier", 0)}  # full, and nothing unfetched can be due for 7 s
    flow_control(book, **args, producer_blocked=False, now_ms=newest + 7_600)
    assert consumer.paused == set()  # 0.4 s before the first unfetched one could be due
    for i in range(4, 16):
        w = work_of_message(Message(topic="tier", offset=i, timestamp=newest - 10), tier)
        w.size = 10
        tier.tail.append(w)
    flow_control(book, **args, producer_blocked=False, now_ms=newest + 7_600)
    assert consumer.paused == {("tier", 0)}  # 16 = 4 x tier_buffer: the hard cap


def test_collector_takes_a_call_recorded_while_it_was_reading() -> None:
    """A slot thread records a call while the poll thread collects: a snapshot taken halfway
    must not make the collector take the rest for "nothing new" (the last call of a run lost
    its duration that way)."""
    from retryd.policy.classify import HandlerResult
    from retryd.worker.events import LATENCY_BUCKETS
    from retryd.worker.slots import Collector, record_call

    stats = SlotStats()
    collector = Collector()
    total = BatchStats()

    class CollectedMidway(Buckets):
        def observe(self, value: float) -> None:
            collector.add(stats, total)  # the poll thread reads while the slot records
            super().observe(value)

    stats.durations["t"] = CollectedMidway(LATENCY_BUCKETS)
    w = _work(0)
    w.due = 0
    record_call(w, SUCCEEDED, HandlerResult.success(), 0.002, stats)
    collector.add(stats, total)  # the run's last collection
    assert total.duration("t").count == 1
    assert total.outcomes[("t", "success")] == 1


def test_a_revoke_runs_queued_records_below_the_last_started_one() -> None:
    """Keys complete out of order: a revoke that left a queued record below a started one
    would commit below the started one, and the next owner would redo it."""
    part = PartitionState("t", 0, None)
    works = [_work(o, part) for o in range(4)]
    part.pending.extend(works)
    assert part.started_end() == 0
    works[2].stage = RUNNING  # offset 2 started while 0 and 1 wait behind busy keys
    part.run_below = part.started_end()
    assert part.run_below == 3
    assert not part.gaps_done()
    for w in works[:3]:
        w.stage = SUCCEEDED
    assert part.gaps_done()  # offset 3 (never started) is left to the next owner
