"""Phase 1 of every poll, no business code: consumed records become work.

For each record: find its partition, keep it (``pending``) until its offset may be stored,
and then either
- queue it for the handler with its ordering key (``retryd.worker.scheduler``);
- hold it in its tier partition's ``tail`` until it is due (a bounded in-memory wait: no
  pause/seek/resume per record under steady inflow);
- settle it at once: a tier record of another consumer group (skipped, counted), or a tier
  record whose retryd headers are unusable (dead-lettered as malformed).

The due time of a tier record is clamped to ``min(retry_timestamp, record timestamp + tier
delay)``: a skewed clock or an absurd header cannot freeze a tier partition.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from retryd.config import Ordering
from retryd.errors import HeaderError
from retryd.policy.headers import decode_tier_envelope
from retryd.policy.routing import Route, route_malformed
from retryd.policy.sequence import RetryPlan
from retryd.worker.book import PartitionBook
from retryd.worker.events import BatchStats
from retryd.worker.partition import PartitionState
from retryd.worker.work import Work, new_work

log = logging.getLogger(__name__)

WAITING = -1  # Work.state of a tier record held until due
SKIP_OTHER_GROUP = "other_group"


def effective_due_ms(
    retry_timestamp: int, record_timestamp: int, delay_ms: int, now_ms: int
) -> int:
    """When a tier record may run: its ``retry_timestamp``, but never later than its own
    timestamp plus the tier's delay (the consume time stands in for a missing timestamp)."""
    bound = (record_timestamp if record_timestamp > 0 else now_ms) + delay_ms
    return retry_timestamp if retry_timestamp < bound else bound


class Intake:
    def __init__(
        self,
        book: PartitionBook,
        plan: RetryPlan,
        group: str,
        ordering: Ordering,
        max_in_flight: int,
        route: Callable[[Work, Route], None],
        on_error: Callable[[Any], None],
    ) -> None:
        self.book = book
        self.plan = plan
        self.group = group
        self.ordering = ordering
        self.max_in_flight = max_in_flight
        self._route = route
        self._on_error = on_error
        self.waiting: set[PartitionState] = set()  # tier partitions with a non-empty tail
        self._new: list[Work] = []

    # ------------------------------------------------------------------ records in
    def take(self, batch: list[Any], now_ms: int, stats: BatchStats) -> None:
        by_topic = self.book.by_topic
        last_topic: str | None = None
        last_partition = -1
        st: PartitionState | None = None
        new = self._new.append
        ordering = self.ordering
        by_key = ordering is Ordering.KEY
        by_partition = ordering is Ordering.PARTITION
        stats.records += len(batch)
        for raw in batch:
            if raw.error() is not None:
                self._on_error(raw)
                continue
            topic = raw.topic()
            partition = raw.partition()
            if partition != last_partition or topic != last_topic:
                parts = by_topic.get(topic)
                st = parts.get(partition) if parts is not None else None
                last_topic, last_partition = topic, partition
            if st is None or st.revoked:
                continue  # no longer ours: its next owner consumes it
            offset = raw.offset()
            position = st.position
            if position is not None and offset < position:
                continue  # delivered twice (never expected without seeks; harmless to skip)
            st.position = offset + 1
            w = new_work(raw, topic, partition, offset, st)
            size = len(raw)  # the value's bytes: what buffers hold (keys are small)
            w.size = size
            st.pending.append(w)
            st.pending_bytes += size
            if st.delay_ms is None:
                w.lock = (st, raw.key()) if by_key else (st if by_partition else None)
                new(w)
            else:
                self._tier_record(w, st, raw.key() if by_key else None, now_ms, stats)

    def _tier_record(
        self, w: Work, st: PartitionState, key: bytes | None, now_ms: int, stats: BatchStats
    ) -> None:
        raw = w._raw
        headers = raw.headers()
        try:
            env = decode_tier_envelope(headers)
        except HeaderError as exc:
            log.warning("malformed retryd headers at %s: %s", w.where, exc)
            route = route_malformed(
                self.plan,
                w.topic,
                w.partition,
                w.offset,
                raw.timestamp()[1],
                headers,
                str(exc),
                now_ms,
                self.group,
            )
            self._route(w, route)
            return
        if env.group is not None and env.group != self.group:
            w.state = Work.DONE
            stats.skipped[SKIP_OTHER_GROUP] += 1
            return
        w._env = env
        assert st.delay_ms is not None and env.retry_timestamp is not None
        w.due = effective_due_ms(env.retry_timestamp, raw.timestamp()[1], st.delay_ms, now_ms)
        if w.due > now_ms or st.tail:
            w.state = WAITING
            st.tail.append(w)
            self.waiting.add(st)
            return
        self._queue(w, st, key)

    def release_due(self, now_ms: int) -> None:
        """Queue the tier records whose due time has come (heads of the tails)."""
        if not self.waiting:
            return
        emptied = []
        for st in self.waiting:
            tail = st.tail
            while tail and tail[0].due <= now_ms:
                w = tail.popleft()
                if st.revoked:
                    continue
                w.state = Work.QUEUED
                self._queue(w, st, w._raw.key())
            if not tail:
                emptied.append(st)
        for st in emptied:
            self.waiting.discard(st)

    def next_due_ms(self) -> int | None:
        due = None
        for st in self.waiting:
            if st.tail:
                head = st.tail[0].due
                if due is None or head < due:
                    due = head
        return due

    def forget(self, st: PartitionState) -> None:
        st.tail.clear()
        self.waiting.discard(st)

    # ------------------------------------------------------------------ records out
    def _queue(self, w: Work, st: PartitionState, key: bytes | None) -> None:
        ordering = self.ordering
        if ordering is Ordering.KEY:
            w.lock = (st, key)
        elif ordering is Ordering.PARTITION:
            w.lock = st
        else:
            w.lock = None
        self._new.append(w)

    def works(self) -> list[Work]:
        """The records queued since the last call, in consumption order."""
        new = self._new
        if new:
            self._new = []
        return new
