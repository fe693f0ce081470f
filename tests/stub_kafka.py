"""An in-memory Kafka for unit tests of the worker loop (in the spirit of dramatiq's StubBroker).

It implements the consumer and producer calls the worker makes, with the semantics the worker
relies on: batch ``consume`` over assigned, non-paused partitions; end-of-partition events;
``pause`` dropping nothing we care about (positions are the broker's own); ``store_offsets`` +
auto-commit; delivery reports served from ``poll``/``flush``; rebalances triggered by the test.
It is *in addition to* the integration tests against a real broker, never instead.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import KafkaError, KafkaException, TopicPartition

TP = tuple[str, int]


@dataclass
class StubRecord:
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes | None]]
    timestamp: int
    aborted: bool = False  # written in a transaction that aborted: read_committed skips it


class StubMessage:
    """Quacks like ``confluent_kafka.Message``."""

    __slots__ = ("_err", "_rec", "_tp")

    def __init__(
        self, rec: StubRecord | None, err: KafkaError | None = None, tp: TP | None = None
    ) -> None:
        self._rec = rec
        self._err = err
        self._tp = tp

    def error(self) -> KafkaError | None:
        return self._err

    def topic(self) -> str | None:
        return self._rec.topic if self._rec else (self._tp[0] if self._tp else None)

    def partition(self) -> int | None:
        return self._rec.partition if self._rec else (self._tp[1] if self._tp else None)

    def offset(self) -> int | None:
        return self._rec.offset if self._rec else None

    def key(self) -> bytes | None:
        return self._rec.key if self._rec else None

    def value(self) -> bytes | None:
        return self._rec.value if self._rec else None

    def headers(self) -> list[tuple[str, bytes | None]] | None:
        if not (self._rec and self._rec.headers):
            return None
        out = []
        for name, value in self._rec.headers:
            if isinstance(name, bytes):  # as the client: names are decoded as UTF-8, strictly
                name = name.decode("utf-8")
            out.append((name, value))
        return out

    def timestamp(self) -> tuple[int, int]:
        return (1, self._rec.timestamp) if self._rec else (0, -1)

    def __len__(self) -> int:
        """Like confluent_kafka.Message: the value's length."""
        return len(self._rec.value or b"") if self._rec else 0


class _EofMessage(StubMessage):
    """An end-of-partition event: its offset is the partition's end."""

    __slots__ = ("_end",)

    def __init__(self, tp: TP, end: int) -> None:
        super().__init__(None, KafkaError(KafkaError._PARTITION_EOF), tp)
        self._end = end

    def offset(self) -> int | None:
        return self._end


@dataclass
class _Meta:
    partitions: dict[int, Any]
    error: Any = None


@dataclass
class _ClusterMeta:
    topics: dict[str, _Meta]


class StubBroker:
    def __init__(self, *, interleave: int = 0) -> None:
        self.lock = threading.Condition()
        # consume() interleaves partitions inside one batch, this many records of a partition
        # at a time (0: each partition's records together); a consumer's conf may override it
        # with "stub.interleave" (``StubConsumer._take``)
        self.interleave = interleave
        self.logs: dict[str, list[list[StubRecord]]] = {}
        self.committed: dict[tuple[str, str, int], int] = {}  # (group, topic, partition)
        # every change of a committed offset: (perf_counter(), group, topic, partition, offset)
        self.commit_log: list[tuple[float, str, str, int, int]] = []
        self.consumers: list[StubConsumer] = []
        self.producers: list[StubProducer] = []
        # a topic's max.message.bytes, as the broker enforces it: a record over it is refused
        # with every record batched with it (a producer batches what it was given before its
        # next poll, unless it is configured batch.num.messages=1)
        self.max_bytes: dict[str, int] = {}

    def create(self, topic: str, partitions: int = 1) -> None:
        with self.lock:
            self.logs.setdefault(topic, [[] for _ in range(partitions)])

    def append(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        headers: list[tuple[str, bytes | None]] | None = None,
        partition: int | None = None,
        timestamp: int | None = None,
    ) -> StubRecord:
        with self.lock:
            parts = self.logs[topic]
            if partition is None:
                partition = (hash(key) % len(parts)) if key is not None else 0
            log = parts[partition]
            rec = StubRecord(
                topic,
                partition,
                len(log),
                key,
                value,
                list(headers or []),
                timestamp if timestamp is not None else int(time.time() * 1000),
            )
            log.append(rec)
            self.lock.notify_all()
            return rec

    def records(self, topic: str) -> list[StubRecord]:
        with self.lock:
            return [r for part in self.logs[topic] for r in part]

    def committed_offset(self, group: str, topic: str, partition: int = 0) -> int | None:
        return self.committed.get((group, topic, partition))

    # factories with the shape the Worker expects
    def consumer(self, conf: dict[str, Any]) -> StubConsumer:
        c = StubConsumer(self, conf)
        self.consumers.append(c)
        return c

    def producer(self, conf: dict[str, Any]) -> StubProducer:
        p = StubProducer(self, conf)
        self.producers.append(p)
        return p


@dataclass(frozen=True)
class Serve:
    """One ``StubConsumer.consume``: the count asked for, the records it could have handed
    out when it took them (``StubConsumer.ready``), the records and all messages (records
    and end-of-partition events) it handed out."""

    asked: int
    ready: int
    records: int
    messages: int


class StubConsumer:
    def __init__(self, broker: StubBroker, conf: dict[str, Any]) -> None:
        self.broker = broker
        self.conf = conf
        self.group = str(conf["group.id"])
        self.eof_enabled = bool(conf.get("enable.partition.eof"))
        self.topics: list[str] = []
        self.callbacks: dict[str, Callable[..., None]] = {}
        self.assigned: list[TP] = []
        self.paused: set[TP] = set()
        self.positions: dict[TP, int] = {}
        self.stored: dict[TP, int] = {}
        self.eof_sent: set[TP] = set()
        self.pause_calls: list[TP] = []
        self.resume_calls: list[TP] = []
        self.closed = False
        self._pending_revoke: list[TP] = []
        self._pending_lost: list[TP] = []
        self._pending_assign: list[TP] = []
        # "stub.manual_assign": join with no partitions; the test assigns with trigger_assign
        self._joined = bool(conf.get("stub.manual_assign"))
        interleave = conf.get("stub.interleave")
        self.interleave: int | None = None if interleave is None else int(interleave)
        # a test that sets a list here gets one ``Serve`` per consume() (opt-in: unbounded)
        self.serves: list[Serve] | None = None

    # -- test hooks
    def trigger_revoke(self, tps: list[TP]) -> None:
        """The next consume() runs the revoke callback for ``tps`` (like a rebalance)."""
        self._pending_revoke.extend(tps)

    def trigger_lost(self, tps: list[TP]) -> None:
        self._pending_lost.extend(tps)

    def trigger_assign(self, tps: list[TP]) -> None:
        """The next consume() runs the assign callback for ``tps`` (like a rebalance)."""
        self._pending_assign.extend(tps)

    # -- Consumer API
    def list_topics(self, topic: str | None = None, timeout: float = -1) -> _ClusterMeta:
        with self.broker.lock:
            return _ClusterMeta(
                {t: _Meta({i: None for i in range(len(p))}) for t, p in self.broker.logs.items()}
            )

    def subscribe(self, topics: list[str], **callbacks: Callable[..., None]) -> None:
        self.topics = list(topics)
        self.callbacks = callbacks

    def _start_of(self, tp: TP) -> int:
        return self.broker.committed.get((self.group, *tp), 0)

    def incremental_assign(self, partitions: list[TopicPartition]) -> None:
        for p in partitions:
            tp = (p.topic, p.partition)
            if tp not in self.assigned:
                self.assigned.append(tp)
            self.positions[tp] = self._start_of(tp)
            self.eof_sent.discard(tp)

    def committed(self, partitions: list[TopicPartition], timeout: float = -1) -> list[Any]:
        with self.broker.lock:
            done = self.broker.committed
            return [
                TopicPartition(t, p, done.get((self.group, t, p), -1001))
                for t, p in ((tp.topic, tp.partition) for tp in partitions)
            ]

    def consumer_group_metadata(self) -> str:
        return self.group

    def incremental_unassign(self, partitions: list[TopicPartition]) -> None:
        for p in partitions:
            tp = (p.topic, p.partition)
            if tp in self.assigned:
                self.assigned.remove(tp)
            self.paused.discard(tp)
            self.stored.pop(tp, None)  # like librdkafka: an unassign drops stored offsets

    def pause(self, partitions: list[TopicPartition]) -> None:
        for p in partitions:
            self.paused.add((p.topic, p.partition))
            self.pause_calls.append((p.topic, p.partition))

    def resume(self, partitions: list[TopicPartition]) -> None:
        for p in partitions:
            tp = (p.topic, p.partition)
            if tp in self.paused:
                self.resume_calls.append(tp)
            self.paused.discard(tp)

    def store_offsets(
        self, message: Any = None, offsets: list[TopicPartition] | None = None
    ) -> None:
        for p in offsets or []:
            tp = (p.topic, p.partition)
            if tp not in self.assigned:
                raise AssertionError(f"store_offsets for unassigned {tp}")
            self.stored[tp] = p.offset

    def commit(
        self, offsets: list[TopicPartition] | None = None, asynchronous: bool = True
    ) -> None:
        with self.broker.lock:
            if offsets is None:
                for tp, off in self.stored.items():
                    self._commit_one(tp[0], tp[1], off)
            else:
                for p in offsets:
                    self._commit_one(p.topic, p.partition, p.offset)

    def _commit_one(self, topic: str, partition: int, offset: int) -> None:
        key = (self.group, topic, partition)
        if self.broker.committed.get(key) != offset:
            self.broker.committed[key] = offset
            self.broker.commit_log.append(
                (time.perf_counter(), self.group, topic, partition, offset)
            )

    def _rebalance(self) -> None:
        if not self._joined:
            self._joined = True
            with self.broker.lock:
                tps = [
                    TopicPartition(t, i)
                    for t in self.topics
                    for i in range(len(self.broker.logs.get(t, [])))
                ]
            self.callbacks["on_assign"](self, tps)
        if self._pending_assign and "on_assign" in self.callbacks:
            tps = [TopicPartition(t, p) for t, p in self._pending_assign]
            self._pending_assign = []
            self.callbacks["on_assign"](self, tps)
        if self._pending_revoke:
            tps = [TopicPartition(t, p) for t, p in self._pending_revoke]
            self._pending_revoke = []
            self.callbacks["on_revoke"](self, tps)
            self.incremental_unassign(tps)
        if self._pending_lost:
            tps = [TopicPartition(t, p) for t, p in self._pending_lost]
            self._pending_lost = []
            self.callbacks["on_lost"](self, tps)
            self.incremental_unassign(tps)

    def consume(self, num_messages: int = 1, timeout: float = -1) -> list[Any]:
        assert not self.closed
        self._rebalance()
        self.commit()  # auto-commit of stored offsets
        deadline = time.monotonic() + max(timeout, 0)
        with self.broker.lock:
            while True:
                ready = self.ready(num_messages) if self.serves is not None else 0
                out = self._take(num_messages)
                if out or time.monotonic() >= deadline:
                    if self.serves is not None:
                        records = sum(1 for m in out if m.error() is None)
                        self.serves.append(Serve(num_messages, ready, records, len(out)))
                    return out
                self.broker.lock.wait(max(0.0, min(0.05, deadline - time.monotonic())))

    def ready(self, limit: int | None = None) -> int:
        """Records a consume() could hand out now, counted up to ``limit``: from each
        assigned, unpaused partition's position to its end (aborted ones never are)."""
        count = 0
        with self.broker.lock:
            for tp in self.assigned:
                if tp in self.paused:
                    continue
                log = self.broker.logs[tp[0]][tp[1]]
                for pos in range(self.positions[tp], len(log)):
                    if limit is not None and count >= limit:
                        return count
                    count += not log[pos].aborted
        return count

    def _take(self, n: int) -> list[Any]:
        chunk = self.broker.interleave if self.interleave is None else self.interleave
        if chunk > 0:
            return self._take_interleaved(n, chunk)
        out: list[Any] = []
        for tp in list(self.assigned):
            if tp in self.paused:
                continue
            self._take_from(tp, n, out)
        return out

    def _take_interleaved(self, n: int, chunk: int) -> list[Any]:
        """A batch as librdkafka's queue hands one over when fetch responses of several
        partitions arrive between two polls: ``chunk`` records of one partition, then of the
        next, then the first one's next ``chunk`` again (P0-low, P1, P0-high), until ``n``."""
        out: list[Any] = []
        live = [tp for tp in self.assigned if tp not in self.paused]
        while live and len(out) < n:
            for tp in list(live):
                before = self.positions[tp]
                self._take_from(tp, min(n, len(out) + chunk), out)
                log = self.broker.logs[tp[0]][tp[1]]
                if self.positions[tp] == before or self.positions[tp] >= len(log):
                    live.remove(tp)
                if len(out) >= n:
                    break
        return out

    def _take_from(self, tp: TP, n: int, out: list[Any]) -> None:
        """Records of ``tp`` from its position onto ``out`` until it holds ``n`` (then its
        end-of-partition event, if it reached the end with room left)."""
        log = self.broker.logs[tp[0]][tp[1]]
        pos = self.positions[tp]
        while pos < len(log) and len(out) < n:
            if not log[pos].aborted:
                out.append(StubMessage(log[pos]))
            pos += 1
            self.eof_sent.discard(tp)
        self.positions[tp] = pos
        if pos >= len(log) and self.eof_enabled and tp not in self.eof_sent and len(out) < n:
            out.append(_EofMessage(tp, pos))
            self.eof_sent.add(tp)

    def close(self) -> None:
        if self.assigned and "on_revoke" in self.callbacks:
            self.callbacks["on_revoke"](self, [TopicPartition(t, p) for t, p in self.assigned])
        self.commit()
        self.closed = True


class StubMembers:
    """A worker's group members on the stub, driven as one: role ``all`` has a main member and
    a tiers member (retryd.worker.split_consumer); a test's rebalance of a mix of main and tier
    partitions reaches each member with its own share, as the broker's would."""

    def __init__(self, consumer: Any) -> None:
        main, tiers = getattr(consumer, "main", consumer), getattr(consumer, "tiers", None)
        self.main: StubConsumer = main
        self.tiers: StubConsumer | None = tiers
        self._tier_topics: frozenset[str] = getattr(consumer, "_tier_topics", frozenset())

    def _split(self, tps: list[TP]) -> list[tuple[StubConsumer, list[TP]]]:
        if self.tiers is None:
            return [(self.main, tps)]
        tiers = [tp for tp in tps if tp[0] in self._tier_topics]
        main = [tp for tp in tps if tp[0] not in self._tier_topics]
        return [(m, part) for m, part in ((self.main, main), (self.tiers, tiers)) if part]

    def trigger_assign(self, tps: list[TP]) -> None:
        for member, part in self._split(tps):
            member.trigger_assign(part)

    def trigger_revoke(self, tps: list[TP]) -> None:
        for member, part in self._split(tps):
            member.trigger_revoke(part)

    def trigger_lost(self, tps: list[TP]) -> None:
        for member, part in self._split(tps):
            member.trigger_lost(part)

    @property
    def assigned(self) -> list[TP]:
        return self.main.assigned + (self.tiers.assigned if self.tiers is not None else [])

    @property
    def pause_calls(self) -> list[TP]:
        return self.main.pause_calls + (self.tiers.pause_calls if self.tiers else [])


def members(worker: Any) -> StubMembers:
    """The stub members of ``worker`` (a retryd Worker built on this stub)."""
    return StubMembers(worker.parts.consumer)


@dataclass
class _Pending:
    callback: Callable[[KafkaError | None, Any], None] | None
    record: StubRecord | None
    error: KafkaError | None


@dataclass
class StubProducer:
    broker: StubBroker
    conf: dict[str, Any]
    queue_limit: int = 100_000
    fail_topics: dict[str, int] = field(default_factory=dict)  # topic -> KafkaError code
    fail_next: dict[str, list[int]] = field(default_factory=dict)  # topic -> codes, used once
    hold: bool = False  # keep delivery reports until released (acks in flight)
    pending: list[_Pending] = field(default_factory=list)
    buffer_errors: int = 0
    produced: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    # transactions (exactly-once routing): records and offsets of the open one, and errors
    # the next commit_transaction calls raise (a KafkaError each)
    transactional: bool = False
    txn_records: list[StubRecord] = field(default_factory=list)
    txn_offsets: list[tuple[str, TopicPartition]] = field(default_factory=list)
    fail_commits: list[KafkaError] = field(default_factory=list)
    commits: int = 0
    aborts: int = 0

    def produce(self, topic: str, *args: Any, **kw: Any) -> None:
        # the client's positional order ("callback" and "on_delivery" are aliases)
        names = ("value", "key", "partition", "on_delivery", "_alias", "timestamp", "headers")
        kw.update(zip(names, args, strict=False))
        if kw.get("on_delivery") is None:
            kw["on_delivery"] = kw.get("_alias")
        if kw.get("partition") == -1:
            kw["partition"] = None  # unassigned: the partitioner decides
        if len(self.pending) >= self.queue_limit:
            self.buffer_errors += 1
            raise BufferError("Local: Queue full")
        cb = kw.get("on_delivery")
        if topic in self.fail_topics:
            self.pending.append(_Pending(cb, None, KafkaError(self.fail_topics[topic])))
            return
        if self.fail_next.get(topic):
            self.pending.append(_Pending(cb, None, KafkaError(self.fail_next[topic].pop(0))))
            return
        limit = self.broker.max_bytes.get(topic)
        if limit is not None:
            size = len(kw.get("value") or b"") + len(kw.get("key") or b"")
            alone = str(self.conf.get("batch.num.messages")) == "1"
            if size > limit:
                # the broker refuses the whole batch: what this producer holds for the topic
                too_large = KafkaError(KafkaError.MSG_SIZE_TOO_LARGE)
                if not alone:
                    for p in self.pending:
                        if p.record is not None and p.record.topic == topic:
                            p.record.aborted = True  # never written
                            p.record, p.error = None, too_large
                self.pending.append(_Pending(cb, None, too_large))
                return
        rec = self.broker.append(
            topic,
            kw.get("key"),
            kw.get("value"),
            kw.get("headers"),
            kw.get("partition"),
            kw.get("timestamp"),
        )
        self.produced[topic] += 1
        if self.transactional:
            self.txn_records.append(rec)
        self.pending.append(_Pending(cb, rec, None))

    def init_transactions(self, timeout: float = -1) -> None:
        self.transactional = True

    def begin_transaction(self) -> None:
        assert self.transactional and not self.txn_records and not self.txn_offsets

    def send_offsets_to_transaction(
        self, positions: list[TopicPartition], group_metadata: Any, timeout: float = -1
    ) -> None:
        self.txn_offsets += [(str(group_metadata), tp) for tp in positions]

    def commit_transaction(self, timeout: float = -1) -> None:
        self.flush()
        if self.fail_commits:
            raise KafkaException(self.fail_commits.pop(0))
        with self.broker.lock:
            now = time.perf_counter()
            for group, tp in self.txn_offsets:
                self.broker.committed[(group, tp.topic, tp.partition)] = tp.offset
                self.broker.commit_log.append((now, group, tp.topic, tp.partition, tp.offset))
        self.txn_records, self.txn_offsets = [], []
        self.commits += 1

    def abort_transaction(self, timeout: float = -1) -> None:
        for rec in self.txn_records:
            rec.aborted = True
        self.txn_records, self.txn_offsets = [], []
        self.aborts += 1

    def poll(self, timeout: float = 0) -> int:
        if self.hold:
            return 0
        served, self.pending = self.pending, []
        for p in served:
            if p.callback is not None:
                p.callback(p.error, _Delivered(p.record) if p.record else None)
        return len(served)

    def flush(self, timeout: float = -1) -> int:
        self.hold = False
        self.poll()
        return 0


@dataclass
class LateAcksProducer(StubProducer):
    """A producer whose acknowledgements arrive ``delay()`` seconds after each write (read at
    each write, so a test can change it while a run goes on), as from a broker whose replicas
    are slow; ``flush`` waits for them, as librdkafka's does."""

    delay: Callable[[], float] = field(default=lambda: 0.0)
    due: dict[int, float] = field(default_factory=dict)

    def produce(self, topic: str, *args: Any, **kw: Any) -> None:
        super().produce(topic, *args, **kw)
        self.due[id(self.pending[-1])] = time.monotonic() + self.delay()

    def poll(self, timeout: float = 0) -> int:
        due = self.due
        now = time.monotonic()
        ready = [p for p in self.pending if due.get(id(p), 0) <= now]
        if not ready:
            return 0
        self.pending = [p for p in self.pending if due.get(id(p), 0) > now]
        for p in ready:
            due.pop(id(p), None)
            if p.callback is not None:
                p.callback(p.error, _Delivered(p.record) if p.record else None)
        return len(ready)

    def flush(self, timeout: float = -1) -> int:
        deadline = time.monotonic() + (timeout if timeout >= 0 else 60)
        while self.pending and time.monotonic() < deadline:
            self.poll()
            if self.pending:
                time.sleep(0.002)  # the client's flush blocks until acknowledged
        return len(self.pending)


class _Delivered:
    def __init__(self, rec: StubRecord) -> None:
        self._rec = rec

    def partition(self) -> int:
        return self._rec.partition

    def offset(self) -> int:
        return self._rec.offset


class StubReader:
    """A consumer reading by explicit assignment (no group), as the replay code's scanners,
    the ledger and the target policy use one: ``assign`` at offsets, ``consume`` to each
    partition's end (then an end-of-partition event), watermarks, metadata."""

    def __init__(self, broker: StubBroker, conf: dict[str, Any]) -> None:
        self.broker = broker
        self.positions: dict[TP, int] = {}
        self.eof_sent: set[TP] = set()

    def list_topics(self, topic: str | None = None, timeout: float = -1) -> _ClusterMeta:
        with self.broker.lock:
            logs = self.broker.logs
            names = [topic] if topic is not None else list(logs)
            return _ClusterMeta(
                {t: _Meta({i: None for i in range(len(logs[t]))}) for t in names if t in logs}
            )

    def assign(self, partitions: list[TopicPartition]) -> None:
        self.positions = {(p.topic, p.partition): max(p.offset, 0) for p in partitions}
        self.eof_sent = set()

    def unassign(self) -> None:
        self.positions = {}

    def get_watermark_offsets(self, tp: TopicPartition, **kwargs: Any) -> tuple[int, int]:
        with self.broker.lock:
            return 0, len(self.broker.logs[tp.topic][tp.partition])

    def consume(self, num_messages: int = 1, timeout: float = -1) -> list[Any]:
        out: list[Any] = []
        with self.broker.lock:
            for tp, pos in list(self.positions.items()):
                log = self.broker.logs[tp[0]][tp[1]]
                while pos < len(log) and len(out) < num_messages:
                    out.append(StubMessage(log[pos]))
                    pos += 1
                self.positions[tp] = pos
                if pos >= len(log) and tp not in self.eof_sent and len(out) < num_messages:
                    out.append(_EofMessage(tp, pos))
                    self.eof_sent.add(tp)
        return out

    def close(self) -> None:
        self.positions = {}


def replay_clients(broker: StubBroker) -> Any:
    """``ReplayClients`` over the stub: scanners and metadata read by assignment, producers
    append to the stub's logs."""
    from retryd.replay.clients import ReplayClients

    return ReplayClients(
        consumer=lambda conf: StubReader(broker, conf),
        producer=broker.producer,
        admin=lambda conf: StubReader(broker, conf),
    )
