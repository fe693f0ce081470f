"""What the worker knows about one assignment of a partition."""

from __future__ import annotations

import itertools
import json
from collections import deque
from typing import TYPE_CHECKING

from retryd.worker.lifecycle import (
    ACKED,
    DECIDING,
    QUEUED,
    RUNNING,
    SKIPPED,
    SUCCEEDED,
    UNFINISHED,
    WAITING,
)

if TYPE_CHECKING:
    from retryd.worker.work import Run, Work

# Why a partition is paused (a bit mask: it stays paused while any reason holds).
PAUSE_BUFFER = 1  # its consumed-but-unfinished records reached ``partition_buffer``
PAUSE_MEMORY = (
    2  # the process's buffered bytes (not-yet-due tier records apart) reached ``buffer_bytes``
)
PAUSE_PRODUCER = 4  # the producer's local queue is full: routed copies are backing up
PAUSE_TAIL = 8  # a tier partition holds ``tier_buffer`` records (or its share of bytes) not yet due
PAUSE_BACKLOG = 16  # the pool has been behind for a while: consume() serves the group only
PAUSE_CIRCUIT = 32  # the outage circuit breaker is open: nothing may start, nothing is fetched

_epochs = itertools.count(1)


NEVER = 2**63 - 1  # a due time no record has


class PartitionState:
    """One assignment of one partition: its consumed records, in offset order, until their
    offsets can be stored.

    ``pending`` holds every consumed record that is not yet settled (queued, running, routing,
    or waiting for its due time); its settled head is popped to advance the stored offset, so
    the stored offset never passes an unfinished record. ``tail`` (tier partitions) holds the
    consumed records that are not yet due, in offset order.

    Each assignment has its own ``epoch``: a partition revoked and assigned again is a new
    ``PartitionState``, and nothing of the old one (a late result, a late acknowledgement) can
    reach the new one. ``closing``/``run_below``/``released`` are written under the
    ``Lifecycle`` lock only.
    """

    __slots__ = (
        "closing",
        "delay_ms",
        "eof_at",
        "epoch",
        "floor_ms",
        "known_end",
        "lanes",
        "lost",
        "partition",
        "paused",
        "pending",
        "pending_bytes",
        "pending_extra",
        "position",
        "released",
        "run_below",
        "running",
        "runs_from",
        "stored",
        "strict",
        "tail",
        "tail_bytes",
        "tail_due",
        "topic",
    )

    def __init__(
        self, topic: str, partition: int, delay_ms: int | None, floor_ms: int | None = None
    ) -> None:
        self.topic = topic
        self.partition = partition
        self.epoch = next(_epochs)
        self.delay_ms = delay_ms  # tier delay (plus largest jitter); None on a main topic
        # tier delay minus largest jitter: how soon a record not fetched yet can come due
        self.floor_ms = delay_ms if floor_ms is None else floor_ms
        self.pending: deque[Work] = deque()
        self.pending_bytes = 0
        self.pending_extra = 0  # records of ``pending`` beyond one per entry (runs)
        # ordering = key: the scheduler's key lanes of this assignment (the records of a key
        # queued or running); the scheduler queues a run of its records only while there are
        # none (``retryd.worker.run_policy``)
        self.lanes = 0
        self.runs_from = 0  # no run is offered below this offset (a run failed just before)
        self.tail: deque[Work] = deque()
        self.tail_bytes = 0
        # the earliest due time among tail records that wait for their time (not for an
        # earlier record of their key): nothing in the tail can be released before it
        self.tail_due = NEVER
        self.paused = 0  # PAUSE_* mask
        self.position: int | None = None  # next offset to consume
        self.eof_at: int | None = None  # high watermark from the last end-of-partition event
        self.known_end = 0  # one past the highest offset we know exists (our own deliveries)
        self.stored: int | None = None  # last offset handed to store_offsets
        self.running = 0  # handler calls of this assignment in progress
        # A revoke *closes* the assignment: only queued records below ``run_below`` still start
        # (so the commit covers every record already started: keys complete out of order).
        self.closing = False
        self.run_below = 0
        self.released = False  # over: its unsettled records are discarded
        self.lost = False  # taken away without a revoke (no commit possible)
        # key_order = strict: records here may be in a key's chain (retryd.worker.strict)
        self.strict = False

    def __repr__(self) -> str:
        return f"{self.topic}[{self.partition}]#{self.epoch}"

    @property
    def where(self) -> str:
        return f"{self.topic}[{self.partition}]"

    def may_start(self, offset: int) -> bool:
        """May a queued record at ``offset`` start now? (Called under the Lifecycle lock.)"""
        return not self.closing or offset < self.run_below

    def started_end(self) -> int:
        """One past the highest offset whose call started (0 if none): the records below it
        that are still queued must run before a revoke commits, or the next owner redoes
        every started record above them."""
        for w in reversed(self.pending):
            stage = w.stage
            if w.many and stage is not SUCCEEDED:
                # a run (retryd.worker.runs): up to the record running or failed, or the last
                # one that ran before it stopped (QUEUED)
                run: Run = w  # type: ignore[assignment]
                started = run.done + (0 if stage is QUEUED else 1)
                if started:
                    return int(run.raws[started - 1].offset()) + 1
                continue
            if stage is not QUEUED and stage is not WAITING and stage is not DECIDING:
                return w.offset + 1
        return 0

    def gaps_done(self) -> bool:
        """Every record below ``run_below`` has finished its call."""
        for w in self.pending:
            if w.offset >= self.run_below:
                return True
            if w.stage is QUEUED or w.stage is RUNNING or w.stage is DECIDING:
                return False
        return True

    @property
    def is_tier(self) -> bool:
        return self.delay_ms is not None

    def advance(self) -> int | None:
        """Pop the settled head; the offset to store if it moved (everything below is done)."""
        pending = self.pending
        nxt = None
        # identity tests: an Enum member's hash is a Python-level call, once per record here
        while pending and (
            (stage := pending[0].stage) is SUCCEEDED or stage is ACKED or stage is SKIPPED
        ):
            w = pending.popleft()
            self.pending_bytes -= w.size
            self.pending_extra -= w.extra
            nxt = w.offset + 1
        if nxt is None:
            return None
        if self.stored is not None and nxt <= self.stored:
            return None
        self.stored = nxt
        return nxt

    @property
    def records(self) -> int:
        """Consumed records not yet settled (a run counts each of its records)."""
        return len(self.pending) + self.pending_extra

    def unfinished(self) -> bool:
        """Anything consumed and not yet settled, not counting records waiting for their due
        time."""
        unfinished = UNFINISHED
        return any(w.stage in unfinished for w in self.pending)

    def drained(self) -> bool:
        """At the end of the partition as far as we know, with nothing in progress."""
        if self.pending or self.eof_at is None:
            return False
        position = self.eof_at if self.position is None else self.position
        return position >= max(self.eof_at, self.known_end)


def partition_lags(raw_stats: str) -> dict[tuple[str, int], int]:
    """Consumer lag per partition from librdkafka's statistics JSON (unknown lags left out)."""
    try:
        stats = json.loads(raw_stats)
    except ValueError:
        return {}
    out: dict[tuple[str, int], int] = {}
    for topic, tdata in stats.get("topics", {}).items():
        for pid, pdata in tdata.get("partitions", {}).items():
            lag = pdata.get("consumer_lag", -1)
            if pid != "-1" and isinstance(lag, int) and lag >= 0:
                out[(topic, int(pid))] = lag
    return out
