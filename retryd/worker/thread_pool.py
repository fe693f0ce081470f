"""``ThreadPool``: sync Python handlers on up to ``max_in_flight`` daemon threads.

Threads are woken only as calls prove slow: a handler that returns in microseconds is served by
one thread (more would only fight over the GIL), a handler blocked on I/O ramps up to the
limit. A call that overruns its timeout cannot be killed in Python: its thread is *abandoned*
(counted, replaced) and the record gets a ``timeout`` result. Daemon threads never block
interpreter exit, which is why this is not ``concurrent.futures``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from retryd.handlers.base import SyncHandler
from retryd.policy.classify import HandlerResult
from retryd.worker.lifecycle import SUCCEEDED, Lifecycle
from retryd.worker.runs import call_run
from retryd.worker.scheduler import Scheduler
from retryd.worker.slots import (
    CHUNK_BUDGET_S,
    FAST_CALL_S,
    MAX_CHUNK,
    SLOW_CALL_S,
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


class ThreadPool(ThreadSlots[Slot]):
    def __init__(
        self,
        handler: SyncHandler,
        scheduler: Scheduler,
        lifecycle: Lifecycle,
        size: int,
        timeout_s: float,
        on_abandoned: Callable[[int], None] | None = None,
    ) -> None:
        super().__init__(scheduler, lifecycle, size, timeout_s, on_abandoned)
        self.handler = handler

    def _close_handler(self) -> None:
        self.handler.close()

    # ---------------------------------------------------------------- poll-thread side
    def wake(self, ready: int) -> None:
        if ready <= 0:
            return
        now = perf()
        slow = sum(1 for s in self._slots if s.work is not None and now - s.started > SLOW_CALL_S)
        with self._cond:
            idle = self._idle
            free = len(self._slots) - idle - slow  # busy slots that are not stuck in a call
            if free > 0:
                return  # they will take the ready records
            want = min(max(1, slow), ready)  # everyone is slow: double up
            woken = min(want, idle)
            if woken:
                self._cond.notify(woken)
            missing = min(want - woken, self.size - len(self._slots))
        for _ in range(max(missing, 0)):
            self._start_slot()

    def _start_slot(self) -> None:
        slot = Slot()
        self._slots.append(slot)
        self._started += 1
        threading.Thread(
            target=self._serve, args=(slot,), name=f"retryd-handler-{self._started}", daemon=True
        ).start()

    def watchdog(self) -> None:
        limit = perf() - self.timeout_s
        lifecycle = self.lifecycle
        for slot in list(self._slots):
            work = slot.work
            if work is None or slot.started > limit:
                continue
            with lifecycle.lock:
                if slot.work is not work or slot.abandoned or slot.started > limit:
                    continue  # finished meanwhile (or a run's next record started)
                slot.abandoned = True
                held, index, attempt = slot.held, slot.index, slot.attempt
            self._slots.remove(slot)
            self._retired.append(slot)
            self._abandoned += 1
            with self._hung_lock:
                self._hung += 1
            log.warning(
                "%s: handler did not finish within %gs; abandoning its thread (%d abandoned)",
                work.where,
                self.timeout_s,
                self._abandoned,
            )
            timed_out(lifecycle, work, attempt, self.timeout_s, self._own, self.completions)
            hand_back(self.scheduler, held, index)
            self.wake(len(self.scheduler))
            if self._on_abandoned is not None:
                self._on_abandoned(self._abandoned)

    def running(self) -> int:
        return sum(1 for slot in self._slots if slot.work is not None)

    # ---------------------------------------------------------------- slot-thread side
    def _serve(self, slot: Slot) -> None:
        call = self.handler.call
        done = self.completions.append
        scheduler = self.scheduler
        lifecycle = self.lifecycle
        finish = lifecycle.finish
        claim = lifecycle.claim
        ready = scheduler.ready
        take = scheduler.take_locked
        release = scheduler.release_locked
        stats = slot.stats
        chunk = 1
        average = SLOW_CALL_S  # call time, smoothed; start as if slow
        held: list[Work] = []
        success = HandlerResult.success()
        while True:
            with self._cond:
                if held:
                    release(held)  # lanes of the successes: records chained behind them run
                # nothing ready, or the gate is shut and no probe offered
                while not (ready if scheduler.gate_open else scheduler.probe is not None):
                    if self._closed:
                        return
                    self._idle += 1
                    self._cond.wait()
                    self._idle -= 1
                held = take(chunk)
            if held:
                slot.held = held
                for index in range(len(held)):
                    w = held[index]
                    slot.index = index
                    # Claim under the lifecycle lock: a revoke closes the partition under the
                    # same lock, so a record of a closed assignment never starts.
                    attempt = claim(w, slot)
                    if not attempt:
                        continue  # closed by a revoke: its next owner runs it
                    if w.many:  # a run (retryd.worker.runs): its records one by one
                        result, seconds = call_run(
                            w,  # type: ignore[arg-type]
                            attempt,
                            slot,
                            call,
                            lifecycle,
                            scheduler,
                            stats,
                        )
                        stage = None if result is None else finish(w, attempt, result, slot)
                        if stage is None:
                            if slot.abandoned:
                                self._late_return(w)
                                return
                        elif stage is not SUCCEEDED:
                            w.seconds = seconds
                            done(w)  # a record failed: the poll thread splits the run
                        average += (seconds - average) * 0.2
                        continue
                    started = slot.started
                    try:
                        result = call(w.msg)
                    except BaseException as exc:  # adapters never raise; if one does, retry
                        result = adapter_failure(exc)
                    seconds = perf() - started
                    stage = finish(w, attempt, result, slot)
                    if stage is None:
                        if slot.abandoned:  # the watchdog gave up on this thread
                            self._late_return(w)
                            return
                        # else discarded: its assignment was released while it ran
                    elif (
                        result is success and stage is SUCCEEDED and not w.due and attempt == 1
                    ):  # the common case, inlined
                        topic = w.msg.topic
                        durations = stats.durations.get(topic) or stats.duration(topic)
                        durations.observe(seconds)
                        counts = stats.success
                        counts[topic] = counts.get(topic, 0) + 1
                        stats.calls += 1  # last (see Collector.add)
                    else:
                        record_call(w, stage, result, seconds, stats)
                        if stage is not SUCCEEDED:
                            w.seconds = seconds
                            done(w)  # FAILED: the poll thread routes it
                    average += (seconds - average) * 0.2
                chunk = max(1, min(MAX_CHUNK, int(CHUNK_BUDGET_S / max(average, 1e-7))))
                scheduler.fast_calls = average < FAST_CALL_S
