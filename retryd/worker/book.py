"""The partitions this process owns, and every consumer call that acts on one of them:
assign, pause, resume, store and commit offsets.

librdkafka cannot tell whether a partition is paused, so the book is the source of truth:
each partition carries a mask of *reasons* to be paused, and the consumer is paused when the
first reason appears and resumed when the last one goes.

No seek is ever needed: the worker keeps every record it consumed until it is settled (not-yet-
due tier records included), and a pause sets the fetch position to the last delivered record
+ 1 (see kafka-notes), which is exactly where consumption must continue after the resume.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any, Protocol

from confluent_kafka import KafkaException, TopicPartition

from retryd.worker.offsets import Committed, OffsetSink, StoredOffsets
from retryd.worker.partition import PAUSE_BACKLOG, PartitionState

log = logging.getLogger(__name__)

TP = tuple[str, int]


class ConsumerLike(Protocol):
    """The part of ``confluent_kafka.Consumer`` the worker uses (a stub implements it in the
    unit tests)."""

    def subscribe(self, topics: list[str], **callbacks: Any) -> None: ...

    def consume(self, num_messages: int = 1, timeout: float = -1) -> list[Any]: ...

    def incremental_assign(self, partitions: list[TopicPartition]) -> None: ...

    def incremental_unassign(self, partitions: list[TopicPartition]) -> None: ...

    def pause(self, partitions: list[TopicPartition]) -> None: ...

    def resume(self, partitions: list[TopicPartition]) -> None: ...

    def store_offsets(self, *args: Any, **kwargs: Any) -> None: ...

    def commit(self, *args: Any, **kwargs: Any) -> Any: ...

    def list_topics(self, *args: Any, **kwargs: Any) -> Any: ...

    def committed(self, partitions: list[TopicPartition], timeout: float = ...) -> Any: ...

    def consumer_group_metadata(self) -> Any: ...

    def close(self) -> None: ...


class PartitionBook:
    def __init__(
        self,
        consumer: ConsumerLike,
        tier_delays: Mapping[str, int],
        parts: dict[TP, PartitionState] | None = None,
        offsets: OffsetSink | None = None,
        tier_floors: Mapping[str, int] | None = None,
    ) -> None:
        self.consumer = consumer
        # tier topic -> the earliest one of its records can be due after its own timestamp
        # (``RetryPlan.tier_floors``; the delay itself without jitter)
        self.tier_floors = dict(tier_floors or {})
        # where settled prefixes go: the consumer's offset store, or a transaction
        self.offsets: OffsetSink = StoredOffsets(consumer) if offsets is None else offsets
        # tier topic -> the longest one of its records may wait past its own timestamp: the
        # tier delay plus the policy's largest jitter (``RetryPlan.tier_bounds``)
        self.tier_delays = dict(tier_delays)
        # ``parts`` may be shared with a reader built before the consumer (the lag reporter)
        self.parts: dict[TP, PartitionState] = {} if parts is None else parts
        # two-level index for the hot path: topic -> partition -> state (no tuple per record)
        self.by_topic: dict[str, dict[int, PartitionState]] = {}
        self.backlog_paused = False

    # -------------------------------------------------------------- ownership
    def assign(self, partitions: list[TopicPartition]) -> list[PartitionState]:
        states = []
        for p in partitions:
            topic = p.topic
            st = PartitionState(
                topic, p.partition, self.tier_delays.get(topic), self.tier_floors.get(topic)
            )
            self.parts[(p.topic, p.partition)] = st
            self.by_topic.setdefault(p.topic, {})[p.partition] = st
            states.append(st)
            if self.backlog_paused:
                st.paused |= PAUSE_BACKLOG
        self.consumer.incremental_assign(partitions)
        if partitions:
            # Pauses survive a revoke/re-assign inside librdkafka: start from a known state.
            self.consumer.resume(partitions)
            if self.backlog_paused:
                self.consumer.pause(partitions)
        return states

    def states(self, partitions: Iterable[TopicPartition]) -> list[PartitionState]:
        out = []
        for p in partitions:
            st = self.parts.get((p.topic, p.partition))
            if st is not None:
                out.append(st)
        return out

    def forget(self, states: Iterable[PartitionState]) -> None:
        states = list(states)
        self.offsets.forget([(st.topic, st.partition) for st in states])
        for st in states:
            self.parts.pop((st.topic, st.partition), None)
            topic = self.by_topic.get(st.topic)
            if topic is not None:
                topic.pop(st.partition, None)
                if not topic:
                    del self.by_topic[st.topic]

    # -------------------------------------------------------------- pausing
    def set_pause(self, st: PartitionState, reason: int, on: bool) -> None:
        """Add or remove one pause reason; pause/resume the consumer on the edges."""
        before = st.paused
        after = before | reason if on else before & ~reason
        if after == before:
            return
        st.paused = after
        if st.released:
            return
        part = [TopicPartition(st.topic, st.partition)]
        try:
            if before == 0:
                log.debug("%s[%d]: pause (reason %d)", st.topic, st.partition, after)
                self.consumer.pause(part)
            elif after == 0:
                log.debug("%s[%d]: resume", st.topic, st.partition)
                self.consumer.resume(part)
        except KafkaException as exc:  # no longer assigned (a rebalance raced us)
            log.warning("%s[%d]: pause/resume failed: %s", st.topic, st.partition, exc)

    def pause_all(self, reason: int, on: bool) -> None:
        for st in list(self.parts.values()):
            self.set_pause(st, reason, on)

    def set_backlog_pause(self, on: bool) -> None:
        """Pause (or resume) every partition because the pool is far behind."""
        self.backlog_paused = on
        self.pause_all(PAUSE_BACKLOG, on)

    def paused_by_topic(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for st in self.parts.values():
            if st.paused:
                counts[st.topic] = counts.get(st.topic, 0) + 1
        return counts

    # -------------------------------------------------------------- offsets
    def store(self, states: Iterable[PartitionState] | None = None) -> int:
        """Store, for each partition, the offset below which everything is settled; returns
        how many partitions advanced."""
        offsets = []
        for st in self.parts.values() if states is None else states:
            if st.lost:
                continue
            nxt = st.advance()
            if nxt is not None:
                offsets.append(TopicPartition(st.topic, st.partition, nxt))
        if offsets:
            self.offsets.store(offsets)
        return len(offsets)

    def commit_sync(self, states: Iterable[PartitionState] | None = None) -> Committed:
        """Commit synchronously: all stored offsets, or those of ``states`` only."""
        if states is None:
            return self.offsets.commit()
        return self.offsets.commit([(st.topic, st.partition) for st in states if not st.lost])

    # -------------------------------------------------------------- state
    def idle(self) -> bool:
        """Nothing waiting or in progress, every owned partition at its known end."""
        return all(st.drained() for st in self.parts.values())
