"""``LoopPool``: ``async def`` handlers and HTTP on ``max_in_flight`` tasks of one event loop.

Each call is cancelled at its timeout. A call still running ``ASYNC_CANCEL_GRACE_S`` after
that (blocking code inside ``async def``, a task that swallows cancellation) means the loop
cannot be trusted: it is stopped and abandoned, and a new loop takes over. Of its calls,

- the overdue ones get a ``timeout`` result (routed) and count as *hung* while the abandoned
  loop's thread is alive;
- the others did nothing wrong: they are parked until the old loop's thread has ended (so
  a record never runs on two loops at once) and then run again, or, if that thread is still
  alive after another ``timeout_s``, get a ``timeout`` result. They never count as hung: one
  bad call must not make ``max_abandoned_handlers`` stop the worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from retryd.handlers.base import AsyncHandler
from retryd.policy.classify import timeout_result
from retryd.runtime.loop_thread import start_loop_thread
from retryd.worker.events import BatchStats, SlotStats
from retryd.worker.lifecycle import SUCCEEDED, Lifecycle
from retryd.worker.scheduler import Scheduler
from retryd.worker.slots import (
    Collector,
    Slot,
    adapter_failure,
    hand_back,
    perf,
    record_call,
    timed_out,
)
from retryd.worker.work import Work

log = logging.getLogger(__name__)

# How long past its timeout an async call may take to acknowledge cancellation before the
# loop is declared stuck and abandoned.
ASYNC_CANCEL_GRACE_S = 1.0


@dataclass(slots=True)
class _Parked:
    """A call cut off by its loop's abandonment, waiting for that loop's thread to end."""

    loop: _Loop
    work: Work
    attempt: int
    held: list[Work]
    index: int
    deadline: float  # monotonic: past this, it gets a timeout result instead


class LoopPool:
    """``size`` tasks on one event loop in a daemon thread, each running ready records."""

    def __init__(
        self,
        handler: AsyncHandler,
        scheduler: Scheduler,
        lifecycle: Lifecycle,
        size: int,
        timeout_s: float,
        on_abandoned: Callable[[int], None] | None = None,
    ) -> None:
        self.handler = handler
        self.scheduler = scheduler
        self.lifecycle = lifecycle
        self.size = size
        self.timeout_s = timeout_s
        self.completions: deque[Work] = deque()
        self._on_abandoned = on_abandoned
        self._abandoned = 0
        self._loop: _Loop | None = None
        self._stuck: list[tuple[_Loop, int]] = []  # abandoned loops and their overdue calls
        self._parked: list[_Parked] = []
        self._retired: list[Slot] = []
        self._own = SlotStats()
        self._collector = Collector()
        self._generation = 0

    def _current(self) -> _Loop:
        if self._loop is None:
            self._generation += 1
            loop = self._loop = _Loop(self, self._generation)
            loop.start_slots()  # once ``running()`` can see the loop's slots
        return self._loop

    def wake(self, ready: int) -> None:
        if ready > 0:
            self._current().wake(ready)

    def watchdog(self) -> None:
        if self._parked:
            self._unpark()
        loop = self._loop
        if loop is None:
            return
        limit = perf() - self.timeout_s - ASYNC_CANCEL_GRACE_S
        if not any(s.work is not None and s.started <= limit for s in loop.slots):
            return
        # The loop did not act on a cancellation in time: it is stuck. Give up on all of it.
        self._loop = None
        running = loop.abandon(self.lifecycle)
        overdue = [r for r in running if r[4] <= limit]
        self._abandoned += len(overdue)
        self._stuck.append((loop, len(overdue)))
        self._retired.extend(loop.slots)
        log.warning(
            "async handler still running %gs after its timeout was cancelled; abandoning its "
            "event loop (%d overdue calls, %d others to run again; %d abandoned in all)",
            ASYNC_CANCEL_GRACE_S,
            len(overdue),
            len(running) - len(overdue),
            self._abandoned,
        )
        deadline = time.monotonic() + self.timeout_s
        for work, attempt, held, index, started in running:
            if started <= limit:
                if timed_out(
                    self.lifecycle, work, attempt, self.timeout_s, self._own, self.completions
                ):
                    log.warning("%s: async call ignored its cancellation", work.where)
                hand_back(self.scheduler, held, index)
            else:
                self._parked.append(_Parked(loop, work, attempt, held, index, deadline))
        if self._parked:
            self._unpark()
        if len(self.scheduler):
            self.wake(len(self.scheduler))
        if self._on_abandoned is not None:
            self._on_abandoned(self._abandoned)

    def _unpark(self) -> None:
        """Run parked calls again once their old loop's thread is gone; time out the ones
        whose thread outlives the deadline."""
        now = time.monotonic()
        keep = []
        back: list[Work] = []
        for p in self._parked:
            if not p.loop.thread.is_alive():
                if self.lifecycle.requeue(p.work, p.attempt):
                    back.append(p.work)  # its key stays busy: order holds
                else:
                    hand_back(self.scheduler, p.held, p.index)
            elif now >= p.deadline:
                timed_out(
                    self.lifecycle, p.work, p.attempt, self.timeout_s, self._own, self.completions
                )
                hand_back(self.scheduler, p.held, p.index)
            else:
                keep.append(p)
        self._parked = keep
        if back:
            self.scheduler.requeue(back)
            self.wake(len(self.scheduler))

    def collect(self, stats: BatchStats) -> None:
        collector = self._collector
        collector.add(self._own, stats)
        loop = self._loop
        if loop is not None:
            for slot in loop.slots:
                collector.add(slot.stats, stats)
        if self._retired:
            collector.retire(self._retired, stats)

    def running(self) -> int:
        loop = self._loop
        if loop is None:
            return len(self._parked)
        return sum(1 for s in loop.slots if s.work is not None) + len(self._parked)

    @property
    def abandoned(self) -> int:
        return self._abandoned

    @property
    def hung(self) -> int:
        self._stuck = [(loop, n) for loop, n in self._stuck if loop.thread.is_alive()]
        return sum(n for _, n in self._stuck)

    def close(self, timeout_s: float) -> None:
        loop, self._loop = self._loop, None
        if loop is not None:
            loop.stop(self.handler, timeout_s)
            # A call that swallowed the cancellation is frozen in the stopped loop: cut off,
            # not failed. Its record stays unsettled (its offset uncommitted).
            for slot in loop.slots:
                work = slot.work
                if work is not None:
                    self.lifecycle.requeue(work, slot.attempt)
        for p in self._parked:
            self.lifecycle.requeue(p.work, p.attempt)
        self._parked = []


class _Loop:
    """One event loop thread and its ``size`` slot tasks."""

    def __init__(self, pool: LoopPool, generation: int) -> None:
        self.pool = pool
        self.generation = generation
        self.slots = [Slot() for _ in range(pool.size)]
        self.abandoned = False
        self.sleepers = 0
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._tasks: list[asyncio.Task[None]] = []
        self.loop, self.thread = start_loop_thread(f"retryd-handler-loop-{generation}")

    def start_slots(self) -> None:
        self.loop.call_soon_threadsafe(self._spawn)

    def _spawn(self) -> None:
        self._tasks = [self.loop.create_task(self._serve(slot)) for slot in self.slots]

    def wake(self, ready: int) -> None:
        if self.sleepers and not self.abandoned:
            with contextlib.suppress(RuntimeError):  # loop closed under us
                self.loop.call_soon_threadsafe(self._release, ready)

    def _release(self, n: int) -> None:
        """Wake up to ``n`` sleeping slots (runs on the loop)."""
        waiters = self._waiters
        while n > 0 and waiters:
            fut = waiters.popleft()
            if not fut.done():
                fut.set_result(None)
                n -= 1

    async def _serve(self, slot: Slot) -> None:
        pool = self.pool
        acall = pool.handler.acall
        timeout_s = pool.timeout_s
        done = pool.completions.append
        scheduler = pool.scheduler
        lifecycle = pool.lifecycle
        claim = lifecycle.claim
        finish = lifecycle.finish
        before_claim = lifecycle.hooks.before_claim
        take = scheduler.take
        handoff = scheduler.handoff
        stats = slot.stats
        while not self.abandoned:
            self.sleepers += 1  # before the last look: a submit after it will wake us
            held = take(1)
            if not held:
                fut = self.loop.create_future()
                self._waiters.append(fut)
                await fut
                self.sleepers -= 1
                continue
            self.sleepers -= 1
            w: Work | None = held[0]
            while w is not None:
                slot.held = [w]
                slot.index = 0
                before_claim()
                attempt = claim(w, slot)
                if not attempt:
                    if slot.abandoned:  # taken from the scheduler on a loop given up on
                        scheduler.requeue([w])
                        return
                    w = handoff(w)  # closed by a revoke: its next owner runs it
                    continue
                try:
                    async with asyncio.timeout(timeout_s):
                        result = await acall(w.msg)
                except TimeoutError:
                    result = timeout_result(timeout_s)
                except asyncio.CancelledError:
                    if slot.abandoned:
                        return  # the watchdog gave up on this loop: the pool owns the record
                    if self.abandoned or self.loop.is_closed():
                        # the pool is closing: the call was cut off, not failed; the record
                        # stays unsettled and its offset uncommitted (the next owner runs it)
                        lifecycle.requeue(w, attempt)
                        return
                    result = timeout_result(timeout_s)
                except BaseException as exc:  # adapters never raise; if one does, retry
                    result = adapter_failure(exc)
                seconds = perf() - slot.started
                stage = finish(w, attempt, result, slot)
                if stage is None:
                    if slot.abandoned:
                        return  # the pool owns the record now
                else:
                    record_call(w, stage, result, seconds, stats)
                    if stage is not SUCCEEDED:
                        w.seconds = seconds
                        done(w)  # FAILED: the poll thread routes it
                w = handoff(w)

    def abandon(self, lifecycle: Lifecycle) -> list[tuple[Work, int, list[Work], int, float]]:
        """Give up on this loop: from now on its slots claim nothing. Returns the calls it is
        running: (record, attempt, records its slot held, position of the running one, start)."""
        self.abandoned = True  # a slot finishing from now on returns without completing
        running = []
        with lifecycle.lock:
            for slot in self.slots:
                slot.abandoned = True
                if slot.work is not None:
                    running.append((slot.work, slot.attempt, slot.held, slot.index, slot.started))
        with contextlib.suppress(RuntimeError):
            self.loop.call_soon_threadsafe(self.loop.stop)
        return running

    def stop(self, handler: AsyncHandler, timeout_s: float) -> None:
        self.abandoned = True

        async def _shutdown() -> None:
            for task in self._tasks:
                task.cancel()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(handler.aclose(), timeout=max(timeout_s, 0.1))
            self.loop.stop()

        try:
            asyncio.run_coroutine_threadsafe(_shutdown(), self.loop)
        except RuntimeError:
            return
        self.thread.join(timeout=max(timeout_s, 0.1) + 1.0)
