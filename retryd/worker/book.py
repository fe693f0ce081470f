"""The partitions this process owns, and every consumer call that acts on one of them:
pause until due, seek, resume, store and commit offsets.

librdkafka cannot tell whether a partition is paused, so the book is the source of truth.
Order matters (see kafka-notes): pause, then seek; store before seeking the same partition.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from retryd.metrics import registry as m
from retryd.worker.partition import PartitionState
from retryd.worker.schedule import TP, PauseSchedule

log = logging.getLogger(__name__)


class PartitionBook:
    def __init__(self, consumer: Consumer, tier_topics: Iterable[str]) -> None:
        self.consumer = consumer
        self.tier_topics = list(tier_topics)
        self.parts: dict[TP, PartitionState] = {}
        self.schedule = PauseSchedule()

    # -------------------------------------------------------------- ownership
    def assign(self, partitions: list[TopicPartition]) -> None:
        for p in partitions:
            self.parts[(p.topic, p.partition)] = PartitionState()
            self.schedule.drop((p.topic, p.partition))
        self.consumer.incremental_assign(partitions)
        if partitions:
            # Pauses survive a revoke/re-assign inside librdkafka: start from a known state.
            self.consumer.resume(partitions)

    def commit_revoked(self, partitions: list[TopicPartition]) -> None:
        """Store and synchronously commit what is finished on partitions we are giving up."""
        to_commit = []
        for p in partitions:
            state = self.parts.get((p.topic, p.partition))
            if state is not None and state.tracker.committable is not None:
                to_commit.append(TopicPartition(p.topic, p.partition, state.tracker.committable))
        if to_commit:
            try:
                self.consumer.store_offsets(offsets=to_commit)
            except KafkaException as exc:
                log.warning("revoke: storing offsets failed: %s", exc)
            self.commit_sync(to_commit)

    def forget(self, partitions: list[TopicPartition]) -> None:
        for p in partitions:
            tp = (p.topic, p.partition)
            self.parts.pop(tp, None)
            self.schedule.drop(tp)
            m.CONSUMER_LAG.labels(topic=p.topic, partition=str(p.partition)).set(0)
        self._update_paused_gauge()

    # -------------------------------------------------------------- waiting
    def pause_until(self, tp: TP, state: PartitionState, offset: int, due_ms: int) -> None:
        self.store(only=tp)  # store before seeking the same partition
        part = TopicPartition(tp[0], tp[1], offset)
        self.consumer.pause([part])
        self.consumer.seek(part)  # pause first, then seek: the batch behind it was "delivered"
        state.paused = True
        state.position = offset
        self.schedule.add(tp, offset, due_ms)
        self._update_paused_gauge()

    def resume_due(self, now_ms: int) -> None:
        if not len(self.schedule):
            return
        waits = self.schedule.pop_due(now_ms)
        if not waits:
            return
        parts = []
        for wait in waits:
            state = self.parts.get(wait.tp)
            if state is not None and state.paused:
                state.paused = False
                parts.append(TopicPartition(wait.tp[0], wait.tp[1]))
        if parts:
            self.consumer.resume(parts)
        self._update_paused_gauge()

    def rewind(self, first_unprocessed: dict[TP, int]) -> None:
        """Seek partitions back to their first unprocessed offset (paused ones stay paused)."""
        for tp, offset in first_unprocessed.items():
            state = self.parts.get(tp)
            if state is None:
                continue
            self.store(only=tp)  # store before seeking the same partition
            self.consumer.seek(TopicPartition(tp[0], tp[1], offset))
            state.position = offset

    def _update_paused_gauge(self) -> None:
        counts = self.schedule.topics()
        for topic in self.tier_topics:
            m.PAUSED_PARTITIONS.labels(topic=topic).set(counts.get(topic, 0))

    def clear_paused_gauge(self) -> None:
        for topic in self.tier_topics:
            m.PAUSED_PARTITIONS.labels(topic=topic).set(0)

    # -------------------------------------------------------------- offsets
    def store(self, only: TP | None = None) -> None:
        """Store, for each partition, the offset below which everything is finished."""
        if only is not None:
            state = self.parts.get(only)
            items = [(only, state)] if state is not None else []
        else:
            items = list(self.parts.items())
        offsets = []
        for tp, st in items:
            nxt = st.tracker.take_store()
            if nxt is not None:
                offsets.append(TopicPartition(tp[0], tp[1], nxt))
        if offsets:
            try:
                self.consumer.store_offsets(offsets=offsets)
            except KafkaException as exc:
                log.warning("storing offsets failed (partition no longer assigned?): %s", exc)

    def commit_sync(self, parts: list[TopicPartition] | None = None) -> None:
        try:
            if parts is None:
                self.consumer.commit(asynchronous=False)
            else:
                self.consumer.commit(offsets=parts, asynchronous=False)
        except KafkaException as exc:
            if exc.args and exc.args[0].code() == KafkaError._NO_OFFSET:
                return  # nothing new to commit
            log.warning("synchronous commit failed: %s", exc)

    # -------------------------------------------------------------- state
    def idle(self) -> bool:
        """No partition waiting or in progress, every one at its known end."""
        return not len(self.schedule) and all(s.drained() for s in self.parts.values())
