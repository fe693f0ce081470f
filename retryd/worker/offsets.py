"""Where a partition's settled prefix goes: the consumer's offset store, or a transaction.

The book computes, per partition, the offset below which every record is settled; an
``OffsetSink`` makes that durable:

- ``StoredOffsets`` (the default, at-least-once): ``store_offsets`` per batch and librdkafka's
  auto-commit ships them; a revoke or shutdown commits synchronously. A crash between a routed
  copy's acknowledgement and the next commit redoes its input, so the copy can exist twice.
- ``TransactionalOffsets`` (``exactly_once``): the router's producer is transactional; routed
  copies and the input offsets commit in one Kafka transaction (``send_offsets_to_transaction``)
  every ``transaction_interval_ms``. A reader with ``isolation.level=read_committed`` (every
  retryd consumer) sees a copy only once the offset of its input is committed with it, so a
  crash at any point yields no duplicate copy: the aborted (or never committed) transaction's
  copies are invisible and its inputs are redone. Handler calls may still repeat.

A transaction that fails with an abortable error is aborted and the sink says so
(``Committed.ABORTED``): the engine rewinds every partition it owns to its committed offset,
discarding what it held, and redoes it. A fatal error (this producer was fenced by a newer
instance with the same ``transactional.id``, or by the group) ends the run.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from enum import Enum
from typing import Any, Protocol

from confluent_kafka import KafkaError, KafkaException, TopicPartition

from retryd.errors import KafkaRuntimeError
from retryd.worker.faults import Faults

log = logging.getLogger(__name__)

TP = tuple[str, int]
TXN_TIMEOUT_S = 30.0
# Transactions aborted in a row before the run ends (exit 5, restarted with backoff): a cause
# that persists (a target topic gone, the cluster refusing writes) must not spin the loop.
MAX_ABORTS_IN_A_ROW = 10


class Committed(Enum):
    """What a commit achieved."""

    NOTHING = "nothing"  # nothing new to commit
    DONE = "done"
    ABORTED = "aborted"  # the transaction was aborted: rewind to the committed offsets


class OffsetSink(Protocol):
    exactly_once: bool

    def store(self, offsets: list[TopicPartition]) -> None:
        """The settled prefix of these partitions advanced to these offsets."""

    def commit(self, partitions: Iterable[TP] | None = None) -> Committed:
        """Make stored offsets durable now (a revoke, a shutdown): those of ``partitions``, or
        all. Synchronous."""

    def tick(self) -> Committed:
        """Called once per poll-loop iteration: commit when it is time."""

    def forget(self, partitions: Iterable[TP]) -> None:
        """These partitions are given up: drop what is stored for them."""

    def abort(self) -> None:
        """Exactly-once: abort the open transaction (a lost assignment). A no-op otherwise."""


class _Consumer(Protocol):
    def store_offsets(self, *args: Any, **kwargs: Any) -> None: ...

    def commit(self, *args: Any, **kwargs: Any) -> Any: ...

    def consumer_group_metadata(self) -> Any: ...


class _TxnProducer(Protocol):
    def init_transactions(self, timeout: float = ...) -> None: ...

    def begin_transaction(self) -> None: ...

    def send_offsets_to_transaction(
        self, positions: list[TopicPartition], group_metadata: Any, timeout: float = ...
    ) -> None: ...

    def commit_transaction(self, timeout: float = ...) -> None: ...

    def abort_transaction(self, timeout: float = ...) -> None: ...


class StoredOffsets:
    """At-least-once: the consumer's offset store plus auto-commit."""

    exactly_once = False

    def __init__(self, consumer: _Consumer) -> None:
        self._consumer = consumer
        self._stored: dict[TP, int] = {}

    def store(self, offsets: list[TopicPartition]) -> None:
        for tp in offsets:
            self._stored[(tp.topic, tp.partition)] = tp.offset
        try:
            self._consumer.store_offsets(offsets=offsets)
        except KafkaException as exc:
            log.warning("storing offsets failed (partition no longer assigned?): %s", exc)

    def commit(self, partitions: Iterable[TP] | None = None) -> Committed:
        try:
            if partitions is None:
                self._consumer.commit(asynchronous=False)
                return Committed.DONE
            parts = [
                TopicPartition(t, p, self._stored[(t, p)])
                for t, p in partitions
                if (t, p) in self._stored
            ]
            if not parts:
                return Committed.NOTHING
            self._consumer.commit(offsets=parts, asynchronous=False)
        except KafkaException as exc:
            if exc.args and exc.args[0].code() == KafkaError._NO_OFFSET:
                return Committed.NOTHING
            log.warning("synchronous commit failed: %s", exc)
            return Committed.NOTHING
        return Committed.DONE

    def tick(self) -> Committed:
        return Committed.NOTHING  # auto-commit ships stored offsets in the background

    def forget(self, partitions: Iterable[TP]) -> None:
        for tp in partitions:
            self._stored.pop(tp, None)

    def abort(self) -> None:
        pass


class TransactionalOffsets:
    """Exactly-once routing: copies and input offsets commit in one transaction.

    A transaction is always open while the worker runs (``begin_transaction`` is local and
    cheap), so the router can produce at any time; ``tick`` commits it every ``interval_s``
    when anything happened, and ``commit`` commits it at once (revoke, shutdown)."""

    exactly_once = True

    def __init__(
        self,
        producer: _TxnProducer,
        consumer: _Consumer,
        interval_s: float,
        faults: Faults,
    ) -> None:
        self._producer = producer
        self._consumer = consumer
        self._interval_s = interval_s
        self._faults = faults
        self._dead = False  # fenced or failed: nothing more is committed
        self._aborts_in_a_row = 0
        self._pending: dict[TP, int] = {}
        self._last = time.monotonic()
        self.commits = 0
        self.aborts = 0

    def start(self) -> None:
        """Register the transactional id with the cluster (fencing any older instance of it:
        its open transaction is aborted) and open the first transaction."""
        try:
            self._producer.init_transactions(TXN_TIMEOUT_S)
        except KafkaException as exc:
            raise KafkaRuntimeError(f"cannot initialise transactions: {exc}") from exc
        self._begin()

    def _begin(self) -> None:
        self._producer.begin_transaction()

    def store(self, offsets: list[TopicPartition]) -> None:
        pending = self._pending
        for tp in offsets:
            pending[(tp.topic, tp.partition)] = tp.offset

    def tick(self) -> Committed:
        now = time.monotonic()
        if now - self._last < self._interval_s:
            return Committed.NOTHING
        self._last = now
        return self._commit()

    def commit(self, partitions: Iterable[TP] | None = None) -> Committed:
        # One transaction holds every partition's copies: committing "only these" offsets
        # would make copies of the others visible without their offsets. Commit it all.
        return self._commit()

    def forget(self, partitions: Iterable[TP]) -> None:
        for tp in partitions:
            self._pending.pop(tp, None)

    def abort(self) -> None:
        """Abort the open transaction (a lost assignment: its copies must not be seen)."""
        self._pending.clear()
        if self._dead:
            return
        try:
            self._producer.abort_transaction(TXN_TIMEOUT_S)
            self._begin()
        except KafkaException as exc:
            self._fatal(exc, "aborting")
            return
        self.aborts += 1
        self._aborts_in_a_row += 1
        if self._aborts_in_a_row > MAX_ABORTS_IN_A_ROW:
            self._dead = True
            self._faults.set(
                KafkaRuntimeError(
                    f"{self._aborts_in_a_row} transactions aborted in a row: stopping so the "
                    "process is restarted (its inputs are redone from the committed offsets)"
                )
            )

    def _commit(self) -> Committed:
        if self._dead:
            return Committed.NOTHING
        # Every copy is sent at its partition's settled frontier (``Settler.route_frontier``)
        # and its input's offset stored in the same iteration: a transaction holding copies
        # always has offsets to commit, and one without new offsets holds no copies.
        if not self._pending:
            return Committed.NOTHING
        positions = [TopicPartition(t, p, o) for (t, p), o in self._pending.items()]
        try:
            if positions:
                self._producer.send_offsets_to_transaction(
                    positions, self._consumer.consumer_group_metadata(), TXN_TIMEOUT_S
                )
            self._commit_retrying()
        except KafkaException as exc:
            err: KafkaError = exc.args[0]
            if err.fatal() or not err.txn_requires_abort():
                self._fatal(exc, "committing")
                return Committed.NOTHING
            log.warning(
                "transaction aborted (%s): rewinding to the committed offsets; its copies are "
                "discarded and its inputs redone",
                err.str(),
            )
            self.abort()
            return Committed.ABORTED
        self._pending.clear()
        self.commits += 1
        self._aborts_in_a_row = 0
        try:
            self._begin()
        except KafkaException as exc:
            self._fatal(exc, "beginning")
        return Committed.DONE

    def _commit_retrying(self) -> None:
        """commit_transaction, retried while librdkafka says the error is retriable (a
        coordinator moving, a request timing out): the outcome is then still unknown."""
        deadline = time.monotonic() + TXN_TIMEOUT_S
        while True:
            try:
                self._producer.commit_transaction(TXN_TIMEOUT_S)
                return
            except KafkaException as exc:
                err: KafkaError = exc.args[0]
                if not err.retriable() or time.monotonic() > deadline:
                    raise
                log.info("transaction commit: %s; retrying", err.str())

    def _fatal(self, exc: KafkaException, doing: str) -> None:
        """The producer cannot go on (fenced by a newer instance of its transactional id, or
        by the group): end the run; nothing of the open transaction becomes visible."""
        self._dead = True
        fault = KafkaRuntimeError(
            f"{doing} the transaction failed: {exc}; another instance with this transactional "
            "id took over, or the producer cannot continue (a restart resumes from the "
            "committed offsets)"
        )
        fault.__cause__ = exc
        self._faults.set(fault)
