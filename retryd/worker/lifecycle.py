"""A consumed record's life cycle, named once, with one owner of every transition.

::

    WAITING ─due─▶ QUEUED ─claim─▶ RUNNING ─finish─▶ SUCCEEDED                       (settled)
    (strict key order) DECIDING ─run─▶ QUEUED; ─park/dead─▶ FAILED; ─duplicate─▶ SKIPPED
                     ▲               │ └─finish/expire─▶ FAILED ─route─▶ ROUTING ─ack─▶ ACKED
                     ├───requeue─────┘                     │
                     └───────────hold (circuit not closed)──┘
    (intake: another group's tier record) ─────────▶ SKIPPED                         (settled)
    any unsettled stage ─release (assignment over)─▶ DISCARDED

A *run* (``retryd.worker.runs``: consecutive records of a partition, one entry) takes the same
path; each of its records starts through ``step``, and a run that stops part-way splits into
the records that succeeded (``split``: SUCCEEDED) and single records for the rest.

SUCCEEDED, SKIPPED and ACKED are *settled*: the record's offset may be stored once every lower
one is settled. DISCARDED never is: its assignment was given up and the partition's next owner
redoes it from the committed offset.

Every transition a handler slot or the revoke path makes goes through ``Lifecycle`` under its
one lock, so the races that used to live between modules are closed by construction:

- **Assignments have epochs.** Each assignment of a partition is a new ``PartitionState`` with
  its own epoch. Once it is *closed* nothing of it starts; once it is *released* its records
  are DISCARDED and a result that arrives later is dropped instead of routed (a late copy of a
  released record would put one message in two places).
- **Calls have attempts.** ``claim`` hands out an attempt number; ``finish`` with a stale one
  (the watchdog expired or requeued the call meanwhile) is ignored, so an abandoned call can
  never settle a record twice.
- **Slots can be abandoned.** ``claim`` refuses a slot that was abandoned (its loop or thread
  given up): a record taken by such a slot goes back to the scheduler instead of being stranded
  as "running" forever.

The poll thread reads stages without the lock (an attribute read is atomic): a stage only ever
moves forward to a settled or discarded one, so a stale read only delays a store.
"""

from __future__ import annotations

import threading
from enum import Enum
from time import perf_counter
from typing import TYPE_CHECKING, Protocol

from retryd.policy.classify import HandlerResult, Outcome

if TYPE_CHECKING:
    from retryd.handlers.base import Message
    from retryd.worker.partition import PartitionState
    from retryd.worker.work import Run, Work


class Stage(Enum):
    WAITING = "waiting"  # a tier record held in its partition's tail until it is due
    DECIDING = "deciding"  # strict key order: its key's lane head, its verdict not given yet
    QUEUED = "queued"  # waiting for its key's turn or a free slot
    RUNNING = "running"  # a handler call is in progress
    FAILED = "failed"  # the call failed (or timed out): the poll thread routes a copy
    ROUTING = "routing"  # the copy is sent, waiting for the broker's acknowledgement
    SUCCEEDED = "succeeded"  # handled (or dropped by the handler)
    SKIPPED = "skipped"  # another group's tier record
    ACKED = "acked"  # the routed copy was acknowledged (acks=all)
    DISCARDED = "discarded"  # its assignment was released: the next owner redoes it


WAITING = Stage.WAITING
DECIDING = Stage.DECIDING
QUEUED = Stage.QUEUED
RUNNING = Stage.RUNNING
FAILED = Stage.FAILED
ROUTING = Stage.ROUTING
SUCCEEDED = Stage.SUCCEEDED
SKIPPED = Stage.SKIPPED
ACKED = Stage.ACKED
DISCARDED = Stage.DISCARDED

SETTLED = frozenset({SUCCEEDED, SKIPPED, ACKED})
TERMINAL = frozenset({SUCCEEDED, SKIPPED, ACKED, DISCARDED})
# consumed, not yet settled (a record waiting for its due time apart)
UNFINISHED = frozenset({DECIDING, QUEUED, RUNNING, FAILED, ROUTING})

_SUCCESS = Outcome.SUCCESS
_DROP = Outcome.DROP


class SlotLike(Protocol):
    abandoned: bool
    work: Work | None
    attempt: int
    started: float


class RaceHooks:
    """Points where tests widen a race (a no-op in production; never a sleep in product code).
    Each is called with no lock held."""

    def before_claim(self) -> None:
        """A slot took a record from the scheduler and is about to claim it."""

    def before_release(self) -> None:
        """The revoke path is about to close a partition to new calls."""


NO_HOOKS = RaceHooks()


class Lifecycle:
    """The one owner of record transitions made outside the poll thread's own bookkeeping."""

    def __init__(self, hooks: RaceHooks = NO_HOOKS) -> None:
        self.lock = threading.Lock()
        self._acquire = self.lock.acquire
        self._release = self.lock.release
        self.hooks = hooks
        self.discarded_results = 0  # results that arrived for a released assignment

    # ------------------------------------------------------------ handler slots
    def claim(self, w: Work, slot: SlotLike) -> int:
        """QUEUED → RUNNING, the slot now runs ``w``; the call's attempt number, or 0 when it
        must not run: its slot was abandoned (the caller gives the record back), its assignment
        is closed (revoked: its next owner runs it), or it is no longer queued."""
        part = w.part
        started = perf_counter()  # the watchdog reads it only once ``slot.work`` is set
        self._acquire()  # (bound acquire/release: half the cost of ``with`` on this hot path)
        try:
            if (
                slot.abandoned
                or w.stage is not QUEUED
                or (part.closing and w.offset >= part.run_below)  # PartitionState.may_start
            ):
                return 0
            w.stage = RUNNING
            attempt = w.attempt + 1
            w.attempt = attempt
            part.running += 1
            slot.started = started
            slot.attempt = attempt
            slot.work = w
            return attempt
        finally:
            self._release()

    def step(self, run: Run, attempt: int, index: int, message: Message, slot: SlotLike) -> bool:
        """The record ``index`` of a running run (``retryd.worker.runs``) starts: every record
        before it succeeded. False when it must not: the slot was abandoned (the watchdog owns
        the run: the slot must exit), the call no longer owns the run (expired, requeued or
        discarded), or its assignment stopped starting records (a revoke: the run goes back to
        QUEUED, never to start again, and its next owner redoes it). Records of a run are
        calls like any other: each one starts here, under the lock a revoke closes with."""
        part = run.part
        started = perf_counter()
        self._acquire()
        try:
            if slot.abandoned:
                return False
            if run.attempt == attempt and run.stage is RUNNING:
                if not part.closing or message.offset < part.run_below:
                    run.done = index
                    run.msg = message  # the record running: what the watchdog names
                    slot.started = started
                    return True
                run.done = index  # every record before it succeeded
                run.stage = QUEUED  # its assignment stopped starting records
                part.running -= 1
            elif run.attempt == attempt:  # discarded while running: the call is over
                part.running -= 1
                self.discarded_results += 1
            slot.work = None
            return False
        finally:
            self._release()

    def pause(self, run: Run, attempt: int, index: int, slot: SlotLike) -> bool:
        """A running run stops before its record ``index`` (the circuit breaker shut the
        gate): RUNNING → QUEUED, to go on from that record. False when the call no longer owns
        the run (the slot checks ``abandoned``)."""
        with self.lock:
            if slot.abandoned:
                return False
            slot.work = None
            if run.attempt != attempt or run.stage is not RUNNING:
                if run.attempt == attempt:  # discarded while running: the call is over
                    run.part.running -= 1
                    self.discarded_results += 1
                return False
            run.done = index
            run.stage = QUEUED
            run.part.running -= 1
            return True

    def split(self, run: Run) -> bool:
        """A run gives way to its single records (``retryd.worker.runs``): the ones before
        ``run.done`` succeeded and stay settled as the run, FAILED or QUEUED → SUCCEEDED;
        False when it was discarded meanwhile."""
        with self.lock:
            if run.stage is not FAILED and run.stage is not QUEUED:
                return False
            run.stage = SUCCEEDED
            return True

    def finish(self, w: Work, attempt: int, result: HandlerResult, slot: SlotLike) -> Stage | None:
        """RUNNING → SUCCEEDED or FAILED, and the slot is free again. None when the slot was
        abandoned (the watchdog owns the record: the slot must exit), when the call no longer
        owns the record (expired or requeued) or when the record was discarded meanwhile."""
        self._acquire()
        try:
            if slot.abandoned:
                return None
            slot.work = None
            if w.attempt == attempt and w.stage is RUNNING:
                w.part.running -= 1
                w.result = result
                outcome = result.outcome
                stage = SUCCEEDED if outcome is _SUCCESS or outcome is _DROP else FAILED
                if stage is SUCCEEDED and w.part.strict and w.hold:
                    stage = FAILED  # strict order: its chain entry is removed before it settles
                w.stage = stage
                return stage
            if w.attempt == attempt:  # discarded while running: the call is over
                w.part.running -= 1
                self.discarded_results += 1
            return None
        finally:
            self._release()

    # ------------------------------------------------------------ the watchdog
    def expire(self, w: Work, attempt: int, result: HandlerResult) -> bool:
        """A call past its timeout: RUNNING → FAILED with ``result``; the call's own late
        return is ignored from now on. False when the call had already ended."""
        with self.lock:
            if not self._take_back(w, attempt):
                return False
            w.result = result
            w.stage = FAILED
            return True

    def requeue(self, w: Work, attempt: int) -> bool:
        """A call cut off through no fault of its own (its loop was abandoned because of
        another call, or the pool closed): RUNNING → QUEUED, to run again. False when it had
        already ended."""
        with self.lock:
            if not self._take_back(w, attempt):
                return False
            w.stage = QUEUED
            return True

    @staticmethod
    def _take_back(w: Work, attempt: int) -> bool:
        """The call ``attempt`` no longer owns ``w`` (its late return is ignored); True when
        ``w`` was still RUNNING under it. Called with the lock held."""
        if w.attempt != attempt:
            return False
        w.attempt = attempt + 1
        stage = w.stage
        if stage is RUNNING or stage is DISCARDED:
            w.part.running -= 1  # the call is over as far as the assignment is concerned
        return stage is RUNNING

    # ------------------------------------------------------------ poll thread
    def route(self, w: Work) -> bool:
        """FAILED → ROUTING (the copy is about to be sent); False when discarded."""
        with self.lock:
            if w.stage is not FAILED:
                return False
            w.stage = ROUTING
            return True

    def hold(self, w: Work) -> bool:
        """FAILED → QUEUED: the call failed during an outage (the circuit breaker is not
        closed), so the record is not moved on; it stays unsettled in its place and runs again.
        False when it was discarded meanwhile."""
        with self.lock:
            if w.stage is not FAILED:
                return False
            w.stage = QUEUED
            w.result = None
            return True

    def acked(self, w: Work) -> bool:
        """ROUTING → ACKED; False when the record was discarded while its copy was in flight
        (a lost assignment: the copy exists, and the next owner redoes the input)."""
        with self.lock:
            if w.stage is not ROUTING:
                return False
            w.stage = ACKED
            return True

    # ------------------------------------------------------------ assignments
    def close(self, part: PartitionState, run_below: int) -> None:
        """A revoke starts: only queued records below ``run_below`` may still start (so the
        commit can reach past every record already started)."""
        with self.lock:
            part.closing = True
            part.run_below = run_below

    def stop_starting(self, part: PartitionState) -> None:
        """Nothing more of ``part`` starts; calls already running may still settle."""
        self.hooks.before_release()
        with self.lock:
            part.closing = True
            part.run_below = 0

    def release(self, part: PartitionState) -> int:
        """The assignment is over: every unsettled record is DISCARDED and every result that
        arrives later is dropped. Returns how many records were discarded."""
        n = 0
        with self.lock:
            part.closing = True
            part.run_below = 0
            part.released = True
            for w in part.pending:
                if w.stage not in TERMINAL:
                    w.stage = DISCARDED
                    n += 1
        return n
