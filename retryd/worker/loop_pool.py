"""``LoopPool``: ``async def`` handlers and HTTP on ``max_in_flight`` tasks of one event loop.

Each call is cancelled at its timeout. A loop that stops answering (blocking code inside
``async def``, a task that swallows cancellation) is abandoned as a whole and replaced.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections import deque
from collections.abc import Callable, Iterable

from retryd.handlers.base import AsyncHandler
from retryd.policy.classify import timeout_result
from retryd.worker.events import BatchStats, SlotStats
from retryd.worker.scheduler import Scheduler
from retryd.worker.slots import (
    Collector,
    Slot,
    adapter_failure,
    hand_back,
    perf,
    settle_on_slot,
    timed_out,
)
from retryd.worker.work import Work

log = logging.getLogger(__name__)

# How long past its timeout an async call may take to acknowledge cancellation before the
# loop is declared stuck and abandoned.
ASYNC_CANCEL_GRACE_S = 1.0


class LoopPool:
    """``size`` tasks on one event loop in a daemon thread, each running ready records."""

    def __init__(
        self,
        handler: AsyncHandler,
        scheduler: Scheduler,
        size: int,
        timeout_s: float,
        on_abandoned: Callable[[int], None] | None = None,
    ) -> None:
        self.handler = handler
        self.scheduler = scheduler
        self.size = size
        self.timeout_s = timeout_s
        self.completions: deque[Work] = deque()
        self._on_abandoned = on_abandoned
        self._abandoned = 0
        self._loop: _Loop | None = None
        self._stuck: list[tuple[_Loop, int]] = []  # abandoned loops and their hung calls
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
        loop = self._loop
        if loop is None:
            return
        limit = perf() - self.timeout_s - ASYNC_CANCEL_GRACE_S
        if not any(s.work is not None and s.started <= limit for s in loop.slots):
            return
        # The loop did not act on a cancellation in time: it is stuck. Give up on all of it.
        self._loop = None
        stuck = loop.abandon()
        self._abandoned += len(stuck)
        self._stuck.append((loop, len(stuck)))
        self._retired.extend(loop.slots)
        log.warning(
            "async handler still running %gs after its timeout was cancelled; abandoning its "
            "event loop with %d calls (%d abandoned)",
            ASYNC_CANCEL_GRACE_S,
            len(stuck),
            self._abandoned,
        )
        for work, held, index in stuck:
            timed_out(work, self.timeout_s, self._own, self.completions)
            hand_back(self.scheduler, held, index)
        if len(self.scheduler):
            self.wake(len(self.scheduler))
        if self._on_abandoned is not None:
            self._on_abandoned(self._abandoned)

    def collect(self, stats: BatchStats) -> None:
        collector = self._collector
        collector.add(self._own, stats)
        loop = self._loop
        if loop is not None:
            for slot in loop.slots:
                collector.add(slot.stats, stats)
        if self._retired:
            for slot in self._retired:
                collector.add(slot.stats, stats)
                collector.forget(slot.stats)
            self._retired.clear()

    def running(self, parts: Iterable[object] | None = None) -> int:
        loop = self._loop
        if loop is None:
            return 0
        wanted = None if parts is None else set(map(id, parts))
        return sum(
            1
            for s in loop.slots
            if s.work is not None and (wanted is None or id(s.work.part) in wanted)
        )

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


class _Loop:
    """One event loop thread and its ``size`` slot tasks."""

    def __init__(self, pool: LoopPool, generation: int) -> None:
        self.pool = pool
        self.generation = generation
        self.slots = [Slot() for _ in range(pool.size)]
        self.abandoned = False
        self.sleepers = 0
        self.loop = asyncio.new_event_loop()
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._tasks: list[asyncio.Task[None]] = []
        started = threading.Event()
        self.thread = threading.Thread(
            target=self._main,
            args=(started,),
            name=f"retryd-handler-loop-{generation}",
            daemon=True,
        )
        self.thread.start()
        started.wait(10)

    def _main(self, started: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.call_soon(started.set)
        try:
            self.loop.run_forever()
        finally:
            with contextlib.suppress(Exception):
                self.loop.close()

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
                started = perf()
                slot.started = started
                slot.work = w  # claim, then check (see ThreadPool._serve)
                part = w.part
                if part.revoked and w.offset >= part.run_below:
                    slot.work = None
                else:
                    w.state = 1  # RUNNING
                    try:
                        async with asyncio.timeout(timeout_s):
                            result = await acall(w)
                    except TimeoutError:
                        result = timeout_result(timeout_s)
                    except asyncio.CancelledError:
                        if self.abandoned or self.loop.is_closed():
                            return
                        result = timeout_result(timeout_s)
                    except BaseException as exc:  # adapters never raise; if one does, retry
                        result = adapter_failure(exc)
                    seconds = perf() - started
                    with slot.lock:
                        if self.abandoned:
                            return  # the pool already gave this call a timeout result
                        slot.work = None
                    if not settle_on_slot(w, result, seconds, stats):
                        w.result = result
                        w.seconds = seconds
                        w.state = 2  # FINISHED: the poll thread routes it
                        done(w)
                w = handoff(w)

    def abandon(self) -> list[tuple[Work, list[Work], int]]:
        """Give up on this loop: the calls it is running, each with the records its slot held
        and the position of the hung one."""
        self.abandoned = True  # a slot finishing from now on returns without completing
        stuck = []
        for slot in self.slots:
            with slot.lock:
                if slot.work is not None:
                    stuck.append((slot.work, slot.held, slot.index))
        with contextlib.suppress(RuntimeError):
            self.loop.call_soon_threadsafe(self.loop.stop)
        return stuck

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
