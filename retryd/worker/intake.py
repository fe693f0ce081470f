"""Phase 1 of every poll, no business code: consumed records become work.

For each record: find its partition, keep it (``pending``) until its offset may be stored,
and then either
- queue it for the handler with its ordering key (``retryd.worker.scheduler``);
- hold it in its tier partition's ``tail`` until it is due (a bounded in-memory wait: no
  pause/seek/resume per record under steady inflow);
- settle it at once: a tier record of another consumer group (skipped, counted), or a tier
  record whose retryd headers are unusable (dead-lettered as malformed).

Nothing a record carries can raise out of here: whatever the client or the header decoder
raises for one record makes that record malformed (dead-lettered with the reason), never a
poll-thread exit.

The due time of a tier record is ``min(retry_timestamp, record timestamp + tier delay, first
seen here + tier delay)``: a skewed routing host (its clock writes both the header and the
record's CreateTime) or an absurd header can delay a record by at most one tier delay past
the moment this worker first saw it, never freeze a tier partition.
"""

from __future__ import annotations

import logging
from collections import deque
from typing import TYPE_CHECKING, Any

from confluent_kafka import KafkaError

from retryd.config import Ordering
from retryd.errors import HeaderError, KafkaRuntimeError
from retryd.policy.headers import decode_tier_envelope
from retryd.policy.key_order import DEAD_BLOCKED, Verdict
from retryd.policy.routing import route_malformed
from retryd.policy.sequence import RetryPlan
from retryd.worker.book import PartitionBook
from retryd.worker.events import SKIP_OTHER_GROUP, BatchStats
from retryd.worker.faults import Faults
from retryd.worker.lifecycle import FAILED, QUEUED, SKIPPED, WAITING
from retryd.worker.partition import NEVER, PartitionState
from retryd.worker.reading import readable_headers
from retryd.worker.run_intake import RunIntake
from retryd.worker.scheduler import Scheduler
from retryd.worker.settle import Settler
from retryd.worker.work import Work, new_work

if TYPE_CHECKING:
    from retryd.worker.strict import StrictOrder

log = logging.getLogger(__name__)

_UNREADABLE = object()  # a tail record's key could not be read (it was dead-lettered)


def effective_due_ms(
    retry_timestamp: int, record_timestamp: int, delay_ms: int, now_ms: int
) -> int:
    """When a tier record may run: its ``retry_timestamp``, but never later than one tier
    delay after its own timestamp, nor than one tier delay after ``now_ms`` (when this worker
    first saw it: the bound that holds whatever clock wrote the record)."""
    bound = now_ms + delay_ms
    if 0 < record_timestamp < now_ms:
        bound = record_timestamp + delay_ms
    return retry_timestamp if retry_timestamp < bound else bound


class Intake:
    def __init__(
        self,
        book: PartitionBook,
        plan: RetryPlan,
        group: str,
        ordering: Ordering,
        settler: Settler,
        faults: Faults,
        scheduler: Scheduler,
        strict: StrictOrder | None = None,
    ) -> None:
        self.strict = strict  # key_order = strict (retryd.worker.strict)
        self.scheduler = scheduler  # where strict lane heads are admitted once decided
        self.book = book
        self.plan = plan
        self.group = group
        self.ordering = ordering
        self.settler = settler
        self.faults = faults
        self.waiting: set[PartitionState] = set()  # partitions with a non-empty tail
        self._new: list[Work] = []
        self.runs = RunIntake(ordering, scheduler, settler.lifecycle)  # retryd.worker.runs
        self.first_delay_ms = plan.first_delay_ms  # main-topic records wait this long first

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
        first_delay = self.first_delay_ms
        strict = self.strict
        stats.records += len(batch)
        # runs (retryd.worker.runs): consecutive records of a partition, collected in ``run``
        # and offered to the scheduler as one entry, which takes it as one or unfolds it
        runs = not first_delay and self.scheduler.calls_fast()
        offer = self.runs.offer
        as_run = False
        run: list[Any] = []
        run_bytes = 0
        for raw in batch:
            if raw.error() is not None:
                self.consumer_error(raw)
                continue
            topic = raw.topic()
            partition = raw.partition()
            if partition != last_partition or topic != last_topic:
                if run:
                    self.runs.make(st, run, run_bytes, self._new)  # type: ignore[arg-type]
                    run = []
                    run_bytes = 0
                parts = by_topic.get(topic)
                st = parts.get(partition) if parts is not None else None
                last_topic, last_partition = topic, partition
                as_run = runs and st is not None and offer(st)
            if st is None or st.closing:
                continue  # no longer ours: its next owner consumes it
            offset = raw.offset()
            position = st.position
            if position is not None and offset < position:
                continue  # delivered twice (never expected without seeks; harmless to skip)
            st.position = offset + 1
            if as_run:
                run.append(raw)
                run_bytes += len(raw)
                continue
            w = new_work(raw, topic, partition, offset, st)
            size = len(raw)  # the value's bytes: what buffers hold (keys are small)
            w.size = size
            st.pending.append(w)
            st.pending_bytes += size
            try:
                if strict is not None and st.strict:
                    w.chain = None
                    w.steps = None
                    w.hold = False
                    w.clean = False
                if st.delay_ms is None:
                    if first_delay:
                        self._delayed(w, st, by_key, first_delay, now_ms)
                        continue
                    if strict is not None and st.strict:
                        self._queue(w, st, raw.key())
                        continue
                    w.lock = (st, raw.key()) if by_key else (st if by_partition else None)
                    new(w)
                else:
                    self._tier_record(w, st, by_key, now_ms, stats)
            except Exception as exc:  # the record's content; never the poll thread's end
                self._malformed(w, f"unreadable record: {type(exc).__name__}: {exc}", now_ms)
        if run:
            self.runs.make(st, run, run_bytes, self._new)  # type: ignore[arg-type]

    def _tier_record(
        self, w: Work, st: PartitionState, by_key: bool, now_ms: int, stats: BatchStats
    ) -> None:
        raw = w.raw
        headers, problem = readable_headers(w.msg)
        if problem is not None:
            self._malformed(w, problem, now_ms)
            return
        try:
            env = decode_tier_envelope(headers)
        except HeaderError as exc:
            self._malformed(w, str(exc), now_ms)
            return
        if env.group is not None and env.group != self.group:
            w.stage = SKIPPED
            stats.skipped[SKIP_OTHER_GROUP] += 1
            return
        w.msg._env = env
        assert st.delay_ms is not None and env.retry_timestamp is not None
        w.due = effective_due_ms(env.retry_timestamp, raw.timestamp()[1], st.delay_ms, now_ms)
        self._wait_or_queue(w, st, by_key, now_ms)

    def _delayed(
        self, w: Work, st: PartitionState, by_key: bool, delay_ms: int, now_ms: int
    ) -> None:
        """A main-topic record with a delay before its first attempt: it waits in its
        partition's tail (like a tier record) until its timestamp plus the delay."""
        timestamp = _timestamp(w.raw)
        w.due = effective_due_ms(timestamp + delay_ms, timestamp, delay_ms, now_ms)
        self._wait_or_queue(w, st, by_key, now_ms)

    def _wait_or_queue(self, w: Work, st: PartitionState, by_key: bool, now_ms: int) -> None:
        if w.due > now_ms or st.tail:
            w.stage = WAITING
            st.tail.append(w)
            st.tail_bytes += w.size
            if w.due < st.tail_due:
                st.tail_due = w.due
            self.waiting.add(st)
            return
        self._queue(w, st, w.raw.key() if by_key else None)

    def _malformed(self, w: Work, problem: str, now_ms: int) -> None:
        """Dead-letter a record retryd cannot read, keeping whatever of it is readable."""
        raw = w.raw
        log.warning("malformed record at %s: %s", w.where, problem)
        headers, _ = readable_headers(w.msg)
        timestamp = _timestamp(raw)
        args = (self.plan, w.msg.topic, w.msg.partition, w.offset, timestamp)
        try:
            route = route_malformed(*args, headers, problem, now_ms, self.group)
        except Exception as exc:  # last resort: the dead letter keeps no header of the record
            log.warning("%s: its headers cannot be copied either (%s)", w.where, exc)
            route = route_malformed(*args, None, problem, now_ms, self.group)
        w.lock = None
        w.stage = FAILED
        self.settler.route(w, route)

    def release_due(self, now_ms: int) -> None:
        """Queue the tier records whose due time has come.

        Due times in a tail are not in offset order when the policy has jitter (a copy routed
        later may be due earlier), so a tail is not released head first: every due record goes
        unless an earlier record that must run before it still waits, i.e. one of its key
        (``ordering=key``) or any (``ordering=partition``). A tail is scanned only once its
        ``tail_due`` has come, so a partition whose records all wait costs nothing."""
        if not self.waiting:
            return
        emptied = []
        ordering = self.ordering
        by_key = ordering is Ordering.KEY
        # Without jitter due times follow offsets (within a tier delay): head first is exact.
        head_first = ordering is Ordering.PARTITION or not self.plan.jitter
        for st in self.waiting:
            if st.tail_due > now_ms:
                continue
            if head_first:
                self._release_head(st, now_ms, by_key)
                st.tail_due = st.tail[0].due if st.tail else NEVER
            else:
                self._release_scan(st, by_key, now_ms)
                st.tail_due = _next_due(st.tail, now_ms)
            if not st.tail:
                emptied.append(st)
        for st in emptied:
            self.waiting.discard(st)

    def _release_head(self, st: PartitionState, now_ms: int, by_key: bool) -> None:
        """Release from the head while due (strict offset order)."""
        tail = st.tail
        while tail and tail[0].due <= now_ms:
            w = tail.popleft()
            st.tail_bytes -= w.size
            if st.closing:
                continue  # its next owner redoes it
            key = self._tail_key(w, by_key, now_ms)
            if key is not _UNREADABLE:
                self._requeue(w, st, key)

    def _release_scan(self, st: PartitionState, by_key: bool, now_ms: int) -> None:
        """Release every due record whose key has no earlier record still waiting (any due
        record with ``ordering=none``)."""
        kept: deque[Work] = deque()
        blocked: set[bytes | None] = set()
        for w in st.tail:
            key = self._tail_key(w, by_key, now_ms)
            if key is _UNREADABLE:
                st.tail_bytes -= w.size  # dead-lettered
            elif w.due <= now_ms and key not in blocked:
                st.tail_bytes -= w.size
                self._requeue(w, st, key)
            else:
                kept.append(w)
                if by_key:
                    blocked.add(key)
        st.tail = kept

    def _tail_key(self, w: Work, by_key: bool, now_ms: int) -> Any:
        """The record's ordering key (None unless ``ordering=key``), or ``_UNREADABLE`` once a
        record whose key cannot be read was dead-lettered."""
        try:
            return w.raw.key() if by_key else None
        except Exception as exc:  # pragma: no cover - the client returns bytes or None
            self._malformed(w, f"unreadable key: {exc}", now_ms)
            return _UNREADABLE

    def _requeue(self, w: Work, st: PartitionState, key: bytes | None) -> None:
        """A due record leaves its tail for the scheduler (dropped if its assignment is
        closing: its next owner redoes it)."""
        if st.closing:
            return
        w.stage = QUEUED
        self._queue(w, st, key)

    def next_due_ms(self) -> int | None:
        due = None
        for st in self.waiting:
            if st.tail and (due is None or st.tail_due < due):
                due = st.tail_due
        return due

    def forget(self, st: PartitionState) -> None:
        if self.strict is not None:
            self.strict.forget(st)
        st.tail.clear()
        st.tail_bytes = 0
        st.tail_due = NEVER
        self.waiting.discard(st)

    # ------------------------------------------------------------------ client events
    def consumer_error(self, raw: Any) -> None:
        """End-of-partition bookkeeping; a fatal client error stops the run; anything else is
        logged (client errors carry no topic)."""
        err: KafkaError = raw.error()
        topic, partition, offset = raw.topic(), raw.partition(), raw.offset()
        if err.code() == KafkaError._PARTITION_EOF and topic is not None:
            st = self.book.parts.get((topic, partition))
            if st is not None:
                st.eof_at = offset
                # Everything below the end was delivered: transaction markers and aborted
                # records take offsets but are never handed over as records.
                if st.position is None or offset > st.position:
                    st.position = offset
            return
        if err.fatal():
            self.faults.set(KafkaRuntimeError(f"fatal consumer error: {err}"))
        where = f"{topic}[{partition}]" if topic is not None else "consumer"
        log.error("%s error: %s", where, err)

    # ------------------------------------------------------------------ records out
    def _queue(self, w: Work, st: PartitionState, key: bytes | None) -> None:
        strict = self.strict
        if strict is not None and st.strict and key is not None and strict.mark(w, key):
            # a record of a strict key: decided when it heads its key's lane (DECIDING). The
            # lane is the key's chain, across this worker's partitions: its main-topic records
            # and its tier copies run one at a time here, so two copies of one record (a
            # record redone after a crash or a held record's restart, beside the copy it had
            # routed) never run side by side, and the entry decides which one counts.
            w.lock = w.chain
            self._new.append(w)
            return
        ordering = self.ordering
        if ordering is Ordering.KEY:
            w.lock = (st, key)
        elif ordering is Ordering.PARTITION:
            w.lock = st
        else:
            w.lock = None
        self._new.append(w)

    # ------------------------------------------------------------------ strict key order
    def decide_strict(self, now_ms: int) -> None:
        """Read the key-state view, then decide every strict lane head waiting for a verdict
        (``retryd.worker.strict``): it runs, is parked behind its key's chain (keeping its
        lane until the park is written), is dropped as a duplicate, or is dead-lettered behind
        a dead-lettered head."""
        strict = self.strict
        if strict is None:
            return
        strict.tick(now_ms)
        scheduler = self.scheduler
        stats = self.settler.stats
        for w, verdict in strict.heads(now_ms):
            if verdict is Verdict.RUN or verdict is Verdict.RUN_RELEASED:
                if verdict is Verdict.RUN_RELEASED:
                    stats.key_order["released"] += 1
                w.stage = QUEUED
                scheduler.admit(w)
            elif verdict is Verdict.DUPLICATE:
                w.stage = SKIPPED
                stats.key_order["duplicate"] += 1
                scheduler.release(w)
            else:
                w.stage = FAILED
                dead = DEAD_BLOCKED if verdict is Verdict.DEAD else None
                self.settler.route(w, strict.park_route(w, now_ms, dead))
        if strict.waited:
            stats.key_order["waited"] += strict.waited
            strict.waited = 0
        for step in strict.take_side_writes():
            self.settler.side_write(step)

    def works(self) -> list[Work]:
        """The records queued since the last call, in consumption order."""
        if self.runs.waiting:
            self.runs.release()
        new = self._new
        if new:
            self._new = []
        return new


def _next_due(tail: deque[Work], now_ms: int) -> int:
    """The earliest time anything left in a scanned ``tail`` can be released: the earliest
    not-yet-due record's due time (a due record still there waits for an earlier one of its key,
    which is not due yet)."""
    due = NEVER
    for w in tail:
        if now_ms < w.due < due:
            due = w.due
    return due


def _timestamp(raw: Any) -> int:
    try:
        ts = raw.timestamp()[1]
    except Exception:  # a record we cannot read at all: its consume time stands in
        return 0
    return ts if isinstance(ts, int) and ts > 0 else 0
