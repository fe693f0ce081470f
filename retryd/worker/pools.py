"""Handler slots: where handler calls run, at most ``max_in_flight`` at a time per process.

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

A record whose partition was revoked before its call started is skipped (it stays QUEUED):
the partition's next owner redoes it from the committed offset.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import Protocol

from retryd.handlers.base import AsyncHandler, SyncHandler
from retryd.policy.classify import HandlerResult, Outcome, timeout_result
from retryd.worker.events import BatchStats, SlotStats
from retryd.worker.scheduler import Scheduler
from retryd.worker.work import Work

log = logging.getLogger(__name__)

# How long past its timeout an async call may take to acknowledge cancellation before the
# loop is declared stuck and abandoned.
ASYNC_CANCEL_GRACE_S = 1.0
# A call running longer than this is "slow": the pool wakes another thread for ready records.
SLOW_CALL_S = 0.0002
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

    def wake(self, ready: int) -> None:
        """``ready`` records are ready in the scheduler (called by the poll thread often)."""

    def watchdog(self) -> None:
        """Abandon calls past their timeout (called by the poll thread, often)."""

    def collect(self, stats: BatchStats) -> None:
        """Add what the slots settled since the last call to ``stats``."""

    def running(self, parts: Iterable[object] | None = None) -> int:
        """Calls in flight (of records of ``parts`` only, when given)."""

    @property
    def abandoned(self) -> int:
        """Calls abandoned after their timeout, ever."""

    @property
    def hung(self) -> int:
        """Abandoned calls still running somewhere."""

    def close(self, timeout_s: float) -> None: ...


class _Slot:
    """One pool thread (or loop task), the records it holds, and the call it is running."""

    __slots__ = ("abandoned", "held", "index", "lock", "started", "stats", "work")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.abandoned = False
        self.held: list[Work] = []  # records taken; ``index`` is the one running
        self.index = 0
        self.work: Work | None = None
        self.started = 0.0  # perf_counter() at call start
        self.stats = SlotStats()


def _settle_on_slot(w: Work, result: HandlerResult, seconds: float, stats: SlotStats) -> bool:
    """Record a finished call; True when it settled here (success/drop), False when the poll
    thread must route it."""
    topic = w.topic
    w.result = result
    stats.calls += 1
    durations = stats.durations.get(topic)
    if durations is None:
        durations = stats.duration(topic)
    durations.observe(seconds)
    if w.due:
        stats.late(topic).observe(max(0.0, time.time() - w.due / 1000 - seconds))
    outcome = result.outcome
    if outcome is _SUCCESS:
        success = stats.success
        success[topic] = success.get(topic, 0) + 1
        w.state = 4  # Work.DONE
        return True
    if outcome is _DROP:
        dropped = stats.dropped
        dropped[topic] = dropped.get(topic, 0) + 1
        w.state = 4
        return True
    return False


class _Collector:
    """Deltas of slots' monotonic counters, read by the poll thread."""

    def __init__(self) -> None:
        self._seen: dict[int, SlotStats] = {}

    def add(self, slot_stats: SlotStats, into: BatchStats) -> None:
        key = id(slot_stats)
        before = self._seen.get(key)
        if before is not None and before.calls == slot_stats.calls:
            return
        now = slot_stats.snapshot()
        now.merge_delta(before, into)
        self._seen[key] = now

    def forget(self, slot_stats: SlotStats) -> None:
        self._seen.pop(id(slot_stats), None)


class ThreadPool:
    def __init__(
        self,
        handler: SyncHandler,
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
        self._cond = threading.Condition(scheduler.lock)
        self._slots: list[_Slot] = []  # live (not abandoned) slots
        self._retired: list[_Slot] = []  # abandoned: their counters are read once more
        self._own = SlotStats()  # timeouts declared by the watchdog (poll thread)
        self._collector = _Collector()
        self._idle = 0
        self._abandoned = 0
        self._hung = 0
        self._hung_lock = threading.Lock()
        self._closed = False
        self._started = 0

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
        slot = _Slot()
        self._slots.append(slot)
        self._started += 1
        threading.Thread(
            target=self._serve, args=(slot,), name=f"retryd-handler-{self._started}", daemon=True
        ).start()

    def watchdog(self) -> None:
        limit = perf() - self.timeout_s
        for slot in list(self._slots):
            work = slot.work
            if work is None or slot.started > limit:
                continue
            with slot.lock:
                if slot.work is not work or slot.abandoned:
                    continue  # finished meanwhile
                slot.abandoned = True
                held, index = slot.held, slot.index
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
            _timed_out(work, self.timeout_s, self._own, self.completions)
            _hand_back(self.scheduler, held, index)
            self.wake(len(self.scheduler))
            if self._on_abandoned is not None:
                self._on_abandoned(self._abandoned)

    def collect(self, stats: BatchStats) -> None:
        collector = self._collector
        collector.add(self._own, stats)
        for slot in self._slots:
            collector.add(slot.stats, stats)
        if self._retired:
            for slot in self._retired:
                collector.add(slot.stats, stats)
                collector.forget(slot.stats)
            self._retired.clear()

    def running(self, parts: Iterable[object] | None = None) -> int:
        wanted = None if parts is None else set(map(id, parts))
        n = 0
        for slot in self._slots:
            work = slot.work
            if work is not None and (wanted is None or id(work.part) in wanted):
                n += 1
        return n

    @property
    def abandoned(self) -> int:
        return self._abandoned

    @property
    def hung(self) -> int:
        return self._hung

    def close(self, timeout_s: float) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        with contextlib.suppress(Exception):
            self.handler.close()

    # ---------------------------------------------------------------- slot-thread side
    def _serve(self, slot: _Slot) -> None:
        call = self.handler.call
        done = self.completions.append
        scheduler = self.scheduler
        ready = scheduler.ready
        take = scheduler.take_locked
        release = scheduler.release_locked
        stats = slot.stats
        lock = slot.lock
        chunk = 1
        average = SLOW_CALL_S  # call time, smoothed; start as if slow
        held: list[Work] = []
        success = HandlerResult.success()
        while True:
            with self._cond:
                if held:
                    release(held)  # records chained behind them become ready
                while not ready:
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
                    if w.part.revoked:
                        continue
                    slot.index = index
                    w.state = 1  # RUNNING
                    started = perf()
                    slot.started = started
                    slot.work = w
                    try:
                        result = call(w)
                    except BaseException as exc:  # adapters never raise; if one does, retry
                        result = adapter_failure(exc)
                    seconds = perf() - started
                    with lock:
                        if slot.abandoned:
                            self._late_return(w)
                            return
                        slot.work = None
                    # _settle_on_slot, inlined for the common case: a plain success
                    if result is success and not w.due:
                        w.result = result
                        topic = w.topic
                        stats.calls += 1
                        durations = stats.durations.get(topic) or stats.duration(topic)
                        durations.observe(seconds)
                        counts = stats.success
                        counts[topic] = counts.get(topic, 0) + 1
                        w.state = 4  # Work.DONE
                    elif not _settle_on_slot(w, result, seconds, stats):
                        w.result = result
                        w.seconds = seconds
                        w.state = 2  # FINISHED: the poll thread routes it
                        done(w)
                    average += (seconds - average) * 0.2
                chunk = max(1, min(MAX_CHUNK, int(CHUNK_BUDGET_S / max(average, 1e-7))))

    def _late_return(self, work: Work) -> None:
        with self._hung_lock:
            self._hung -= 1
        log.info("%s: abandoned handler call returned late; its thread exits", work.where)


def _hand_back(scheduler: Scheduler, held: list[Work], index: int) -> None:
    """An abandoned slot's records: the ones it ran (the hung one included) release their
    keys, so records chained behind them can run; the ones it never started go back first."""
    successors: list[Work] = []
    scheduler.release_many(held[: index + 1], successors)
    back = held[index + 1 :] + successors
    if back:
        scheduler.requeue(back)


def _timed_out(work: Work, timeout_s: float, stats: SlotStats, completions: deque[Work]) -> None:
    """A call abandoned by a watchdog: a timeout result, routed by the poll thread."""
    stats.calls += 1
    stats.duration(work.topic).observe(timeout_s)
    work.result = timeout_result(timeout_s)
    work.seconds = timeout_s
    work.state = Work.FINISHED
    completions.append(work)


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
        self._retired: list[_Slot] = []
        self._own = SlotStats()
        self._collector = _Collector()
        self._generation = 0

    def _current(self) -> _Loop:
        if self._loop is None:
            self._generation += 1
            self._loop = _Loop(self, self._generation)
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
            _timed_out(work, self.timeout_s, self._own, self.completions)
            _hand_back(self.scheduler, held, index)
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
        self.slots = [_Slot() for _ in range(pool.size)]
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
        self._tasks = [self.loop.create_task(self._serve(slot)) for slot in self.slots]
        self.loop.call_soon(started.set)
        try:
            self.loop.run_forever()
        finally:
            with contextlib.suppress(Exception):
                self.loop.close()

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

    async def _serve(self, slot: _Slot) -> None:
        pool = self.pool
        acall = pool.handler.acall
        timeout_s = pool.timeout_s
        done = pool.completions.append
        scheduler = pool.scheduler
        take = scheduler.take
        release = scheduler.release
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
                if not w.part.revoked:
                    slot.held = [w]
                    slot.index = 0
                    w.state = 1  # RUNNING
                    started = perf()
                    slot.started = started
                    slot.work = w
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
                    if not _settle_on_slot(w, result, seconds, stats):
                        w.result = result
                        w.seconds = seconds
                        w.state = 2  # FINISHED: the poll thread routes it
                        done(w)
                w = release(w)

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
