"""Handler slots: what both pool kinds share (see ``thread_pool`` and ``loop_pool``).

Where handler calls run, at most ``max_in_flight`` at a time per process.

Two kinds, one contract (``Pool``):

- ``ThreadPool`` for sync Python callables: up to ``size`` daemon threads. Threads are woken
  only as calls prove slow: a handler that returns in microseconds is served by one thread (more
  would only fight over the GIL), a handler blocked on I/O ramps up to ``size``. A call that
  overruns its timeout cannot be killed in Python: its thread is *abandoned* (counted, replaced)
  and the record gets a ``timeout`` result. Daemon threads never block interpreter exit, which
  is why this is not ``concurrent.futures``.
- ``LoopPool`` for ``async def`` callables and HTTP: ``size`` tasks on one event loop in a
  daemon thread; each call is cancelled at its timeout. A loop that stops answering (blocking
  code inside ``async def``, a task that swallows cancellation) is abandoned as a whole.

Slots take ready records from the ``Scheduler`` (ordering lives there). A success (or DROP) is
settled on the slot itself: the record is marked done and counted in the slot's own
monotonic counters, which the poll thread reads as deltas (``collect``) - no hand-off back per
record. Failures, which need a routed copy, go to ``completions`` for the poll thread.

Every transition of a record (claim, finish, expire, requeue) goes through the ``Lifecycle``:
a record whose assignment was closed by a revoke is not claimed (its next owner redoes it), a
slot that was abandoned claims nothing, and a call whose result arrives after the watchdog gave
up on it changes nothing.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from typing import Any, Protocol

from retryd.policy.classify import HandlerResult, Outcome, timeout_result
from retryd.worker.events import BatchStats, SlotStats
from retryd.worker.lifecycle import SUCCEEDED, Lifecycle
from retryd.worker.scheduler import Scheduler
from retryd.worker.work import Work

log = logging.getLogger(__name__)

# A call running longer than this is "slow": the pool wakes another thread for ready records.
SLOW_CALL_S = 0.0002
# Calls faster than this on average (smoothed, per slot) let records run as runs
# (``retryd.worker.runs``): half the slow mark, so a handler near it does not flap.
FAST_CALL_S = SLOW_CALL_S / 2
MAX_CHUNK = 256  # records a fast slot takes per lock acquisition
# A slot takes as many records as it can run in about this long (by its average call time), so
# fast calls cost one lock per chunk while slow ones never sit on records another slot could run.
CHUNK_BUDGET_S = 0.0005

perf = time.perf_counter
_SUCCESS = Outcome.SUCCESS
_DROP = Outcome.DROP


def adapter_failure(exc: BaseException) -> HandlerResult:
    """An exception escaped a handler *adapter* (retryd's own code around business code): a
    retryable failure of this record, never a process exit."""
    return HandlerResult(
        Outcome.RETRY, "handler_adapter_error", f"{type(exc).__name__}: {exc}"[:512]
    )


class Pool(Protocol):
    completions: deque[Work]
    timeout_s: float  # a call's longest run (the whole quick-retry sequence's, with one)

    def wake(self, ready: int) -> None:
        """``ready`` records are ready in the scheduler (called by the poll thread often)."""

    def watchdog(self) -> None:
        """Abandon calls past their timeout (called by the poll thread, often)."""

    def collect(self, stats: BatchStats) -> None:
        """Add what the slots settled since the last call to ``stats``."""

    def running(self) -> int:
        """Calls in flight."""

    @property
    def abandoned(self) -> int:
        """Calls abandoned after their timeout, ever."""

    @property
    def hung(self) -> int:
        """Abandoned calls still running somewhere."""

    def close(self, timeout_s: float) -> None: ...


class Slot:
    """One pool thread (or loop task), the records it holds, and the call it is running.

    ``abandoned`` is written under the ``Lifecycle`` lock (``Lifecycle.abandon``), so a slot
    never claims a record after its pool gave up on it."""

    __slots__ = ("abandoned", "attempt", "held", "index", "started", "stats", "work")

    def __init__(self) -> None:
        self.abandoned = False
        self.held: list[Work] = []  # records taken; ``index`` is the one running
        self.index = 0
        self.work: Work | None = None
        self.attempt = 0  # the running call's attempt (see Lifecycle.claim)
        self.started = 0.0  # perf_counter() at call start
        self.stats = SlotStats()


def record_call(
    w: Work, stage: object, result: HandlerResult, seconds: float, stats: SlotStats
) -> None:
    """Count a finished call in the slot's own counters (``stage`` from ``Lifecycle.finish``)."""
    topic = w.msg.topic
    durations = stats.durations.get(topic)
    if durations is None:
        durations = stats.duration(topic)
    durations.observe(seconds)
    if w.due:
        stats.late(topic).observe(max(0.0, time.time() - w.due / 1000 - seconds))
    if stage is SUCCEEDED:
        counts = stats.success if result.outcome is _SUCCESS else stats.dropped
        counts[topic] = counts.get(topic, 0) + 1
        if w.msg._env is not None or w.attempt > 1:  # it failed before: retry evidence
            stats.retried_ok += 1
    stats.calls += 1  # last: the collector's "nothing new" check reads it


class Collector:
    """Deltas of slots' monotonic counters, read by the poll thread."""

    def __init__(self) -> None:
        self._seen: dict[int, SlotStats] = {}

    def add(self, slot_stats: SlotStats, into: BatchStats) -> None:
        # ``calls`` is written last by a slot, after the counters and histograms of that call:
        # an unchanged count means nothing new, and a snapshot never misses part of a call it
        # counted (a call half-recorded at snapshot time is taken whole by a later one).
        key = id(slot_stats)
        before = self._seen.get(key)
        if before is not None and before.calls == slot_stats.calls:
            return
        now = slot_stats.snapshot()
        now.merge_delta(before, into)
        self._seen[key] = now

    def forget(self, slot_stats: SlotStats) -> None:
        self._seen.pop(id(slot_stats), None)

    def retire(self, retired: list[Any], into: BatchStats) -> None:
        """Slots given up on (``retired``, emptied here): their last counts, then forgotten."""
        for slot in retired:
            self.add(slot.stats, into)
            self.forget(slot.stats)
        retired.clear()


def hand_back(scheduler: Scheduler, held: list[Work], index: int) -> None:
    """A slot given up on (hung thread, abandoned loop): the records it ran release their lanes
    where they settled (a success, or a record its closed assignment refused; the hung one's
    outcome is decided by the poll thread); the ones it never started go back in line first,
    still heads of their lanes."""
    scheduler.release_settled(held[: index + 1])
    scheduler.requeue(held[index + 1 :])


def timed_out(
    lifecycle: Lifecycle,
    work: Work,
    attempt: int,
    timeout_s: float,
    stats: SlotStats,
    completions: deque[Work],
) -> bool:
    """A call abandoned by a watchdog: a timeout result, routed by the poll thread. False when
    the call had ended (or its record was discarded) in the meantime."""
    result = timeout_result(timeout_s)
    if not lifecycle.expire(work, attempt, result):
        return False
    stats.duration(work.msg.topic).observe(timeout_s)
    stats.calls += 1
    work.seconds = timeout_s
    completions.append(work)
    return True
