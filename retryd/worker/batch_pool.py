"""``BatchThreadPool``: a sync batch handler (``handle_batch``) on a few daemon threads.

A thread takes up to ``max_batch`` ready records from the scheduler at once (whatever it
allows now: key lanes still hold, so under ``ordering=key`` a batch has at most one record per
key; with the circuit's gate shut only the probe is handed out, and it goes alone), claims
each, makes *one* call, and completes each record with its own result exactly as the
per-record ``ThreadPool`` does: a success settles on the thread, a failure goes to
``completions`` for the poll thread to route through its own tiers. It never waits for a batch
to fill: a call carries what is ready.

Concurrency is counted in records: ``threads`` = ``max_in_flight // max_batch`` (at least one)
batch calls, so at most about ``max_in_flight`` records are in flight. Threads are woken only
as calls prove slow, as in ``ThreadPool``: a batch handler that returns in microseconds is
served by one thread.

Timeouts are per call: a batch call that overruns ``timeout_s`` has its thread *abandoned*
(counted once, replaced) and every record of it still running gets a ``timeout`` result.
"""

from __future__ import annotations

import logging
import threading
from bisect import bisect_left
from collections.abc import Callable, Sequence

from retryd.handlers.base import SyncBatchHandler
from retryd.policy.classify import HandlerResult
from retryd.worker.events import Buckets
from retryd.worker.lifecycle import RUNNING, SUCCEEDED, Lifecycle
from retryd.worker.scheduler import Scheduler
from retryd.worker.slots import (
    Slot,
    adapter_failure,
    hand_back,
    perf,
    record_call,
    timed_out,
)
from retryd.worker.thread_slots import ThreadSlots
from retryd.worker.work import Work

log = logging.getLogger(__name__)

# A batch call running longer than this is "slow": the pool wakes another thread for ready
# records. Higher than the per-record pool's: a batch call is many records' work.
SLOW_BATCH_S = 0.002


class BatchSlot(Slot):
    """A slot running one batch call: ``batch`` the records it claimed, ``attempts`` theirs.

    ``Lifecycle`` sees the slot as running the last record it claimed (``work``); the batch
    pools themselves look at ``batch``: a watchdog must time out every record of the call."""

    __slots__ = ("attempts", "batch", "calling")

    def __init__(self) -> None:
        super().__init__()
        self.batch: list[Work] = []
        self.attempts: list[int] = []
        self.calling = False  # in the handler call (not claiming or completing)


def observe_many(b: Buckets, value: float, n: int) -> None:
    """``n`` observations of one value (every record of one call took the call's time)."""
    b.counts[bisect_left(b.bounds, value)] += n
    b.total += value * n


def running_of(lifecycle: Lifecycle, slot: BatchSlot) -> list[tuple[Work, int]]:
    """The records of ``slot``'s call still running under its attempts. The caller holds the
    lifecycle lock."""
    return [
        (w, a)
        for w, a in zip(slot.batch, slot.attempts, strict=False)
        if w.attempt == a and w.stage is RUNNING
    ]


def results_for(results: Sequence[HandlerResult], n: int) -> Sequence[HandlerResult]:
    """An adapter's answer, or one adapter failure per record when it is not one result per
    record (adapters check this themselves; this guards the contract)."""
    if len(results) == n:
        return results
    failure = adapter_failure(ValueError(f"batch adapter gave {len(results)} results for {n}"))
    return [failure] * n


def complete(
    lifecycle: Lifecycle,
    slot: BatchSlot,
    batch: list[Work],
    attempts: list[int],
    results: Sequence[HandlerResult],
    seconds: float,
    done: Callable[[Work], None],
) -> bool:
    """Finish every record of a call with its own result and count it in the slot's
    counters; failures go to ``done`` (the poll thread routes them). False when the slot was
    abandoned meanwhile (the watchdog owns the records it did not finish)."""
    finish = lifecycle.finish
    stats = slot.stats
    success = HandlerResult.success()
    plain: dict[str, int] = {}  # first-attempt successes of main-topic records, per topic
    for w, attempt, result in zip(batch, attempts, results, strict=True):
        stage = finish(w, attempt, result, slot)
        if stage is None:
            if slot.abandoned:
                return False
            continue  # discarded: its assignment was released while it ran
        if result is success and stage is SUCCEEDED and not w.due and attempt == 1:
            topic = w.msg.topic
            plain[topic] = plain.get(topic, 0) + 1
        else:
            record_call(w, stage, result, seconds, stats)
            if stage is not SUCCEEDED:
                w.seconds = seconds
                done(w)
    if plain:
        total = 0
        for topic, n in plain.items():
            durations = stats.durations.get(topic) or stats.duration(topic)
            observe_many(durations, seconds, n)
            stats.success[topic] = stats.success.get(topic, 0) + n
            total += n
        stats.calls += total  # last (see Collector.add)
    return True


class BatchThreadPool(ThreadSlots[BatchSlot]):
    _call = "batch call"

    def __init__(
        self,
        handler: SyncBatchHandler,
        scheduler: Scheduler,
        lifecycle: Lifecycle,
        size: int,
        timeout_s: float,
        on_abandoned: Callable[[int], None] | None = None,
    ) -> None:
        super().__init__(scheduler, lifecycle, size, timeout_s, on_abandoned)  # size: threads
        self.handler = handler
        self.max_batch = handler.max_batch

    def _close_handler(self) -> None:
        self.handler.close()

    # ---------------------------------------------------------------- poll-thread side
    def wake(self, ready: int) -> None:
        if ready <= 0:
            return
        now = perf()
        slow = sum(1 for s in self._slots if s.calling and now - s.started > SLOW_BATCH_S)
        with self._cond:
            idle = self._idle
            if len(self._slots) - idle - slow > 0:
                return  # a thread between calls takes them
            want = min(max(1, slow), -(-ready // self.max_batch))
            woken = min(want, idle)
            if woken:
                self._cond.notify(woken)
            missing = min(want - woken, self.size - len(self._slots))
        for _ in range(max(missing, 0)):
            self._start_slot()

    def _start_slot(self) -> None:
        slot = BatchSlot()
        self._slots.append(slot)
        self._started += 1
        threading.Thread(
            target=self._serve, args=(slot,), name=f"retryd-batch-{self._started}", daemon=True
        ).start()

    def watchdog(self) -> None:
        limit = perf() - self.timeout_s
        lifecycle = self.lifecycle
        for slot in list(self._slots):
            if slot.work is None or slot.started > limit:
                continue
            with lifecycle.lock:
                if slot.work is None or slot.abandoned or slot.started > limit:
                    continue  # finished meanwhile
                slot.abandoned = True
                running = running_of(lifecycle, slot)
                held = slot.held
            self._slots.remove(slot)
            self._retired.append(slot)
            self._abandoned += 1
            with self._hung_lock:
                self._hung += 1
            log.warning(
                "%s (+%d more): batch handler did not finish within %gs; abandoning its thread "
                "(%d abandoned)",
                running[0][0].where if running else "-",
                max(0, len(running) - 1),
                self.timeout_s,
                self._abandoned,
            )
            for work, attempt in running:
                timed_out(lifecycle, work, attempt, self.timeout_s, self._own, self.completions)
            hand_back(self.scheduler, held, len(held) - 1)
            self.wake(len(self.scheduler))
            if self._on_abandoned is not None:
                self._on_abandoned(self._abandoned)

    def running(self) -> int:
        """Records in flight (a batch call counts each of its records)."""
        return sum(len(s.batch) for s in self._slots if s.work is not None)

    # ---------------------------------------------------------------- slot-thread side
    def _serve(self, slot: BatchSlot) -> None:
        call_batch = self.handler.call_batch
        done = self.completions.append
        scheduler = self.scheduler
        lifecycle = self.lifecycle
        claim = lifecycle.claim
        ready = scheduler.ready
        take = scheduler.take_locked
        release = scheduler.release_locked
        max_batch = self.max_batch
        held: list[Work] = []
        while True:
            with self._cond:
                if held:
                    release(held)  # lanes of the successes: records chained behind them run
                while not (ready if scheduler.gate_open else scheduler.probe is not None):
                    if self._closed:
                        return
                    self._idle += 1
                    self._cond.wait()
                    self._idle -= 1
                held = take(max_batch)
            if not held:
                continue
            slot.held = held
            batch: list[Work] = []
            attempts: list[int] = []
            slot.batch, slot.attempts = batch, attempts  # before claiming: the watchdog reads
            for w in held:
                # Claim under the lifecycle lock: a record of a closed assignment never starts.
                attempt = claim(w, slot)
                if attempt:
                    batch.append(w)
                    attempts.append(attempt)
            if not batch:
                continue
            slot.started = started = perf()
            slot.calling = True
            try:
                results = results_for(call_batch([w.msg for w in batch]), len(batch))
            except BaseException as exc:  # adapters never raise; if one does, retry all
                results = [adapter_failure(exc)] * len(batch)
            slot.calling = False
            if not complete(lifecycle, slot, batch, attempts, results, perf() - started, done):
                self._late_return(batch[0])
                return
