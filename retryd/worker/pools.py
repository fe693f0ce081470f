"""Handler slots: where handler calls run, at most ``max_in_flight`` at a time per process.

Two kinds, one contract (``Pool``):

- ``ThreadPool`` for sync Python callables: up to ``size`` daemon threads, started on demand.
  A call that overruns its timeout cannot be killed in Python: its thread is *abandoned*
  (counted, replaced by a fresh one) and the record gets a ``timeout`` result. Daemon threads
  never block interpreter exit, which is why this is not ``concurrent.futures``.
- ``LoopPool`` for ``async def`` callables and HTTP: ``size`` tasks on one event loop in a
  daemon thread; each call is cancelled at its timeout. A loop that stops answering (blocking
  code inside ``async def``, a task that swallows cancellation) is abandoned as a whole and
  replaced.

Slots take *runs* from the ``Scheduler`` (ordering lives there) and append finished ``Work``
(with ``result``, ``started`` and ``seconds`` set) to ``completions``, a deque the poll thread
drains: the poll loop never waits on a slot, and a slot never touches consumer state.

A record whose partition was revoked before its call started is skipped (``state`` stays
QUEUED): the partition's next owner redoes it from the committed offset.
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
from retryd.worker.scheduler import Run, Scheduler
from retryd.worker.work import Work

log = logging.getLogger(__name__)

# How long past its timeout an async call may take to acknowledge cancellation before the
# loop is declared stuck and abandoned.
ASYNC_CANCEL_GRACE_S = 1.0

perf = time.perf_counter


def adapter_failure(exc: BaseException) -> HandlerResult:
    """An exception escaped a handler *adapter* (retryd's own code around business code): a
    retryable failure of this record, never a process exit."""
    return HandlerResult(
        Outcome.RETRY, "handler_adapter_error", f"{type(exc).__name__}: {exc}"[:512]
    )


class Pool(Protocol):
    completions: deque[Work]

    def wake(self, ready: int) -> None:
        """``ready`` runs were just made ready in the scheduler."""

    def watchdog(self) -> None:
        """Abandon calls past their timeout (called by the poll thread, often)."""

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
    """One pool thread (or loop task) and the call it is running."""

    __slots__ = ("abandoned", "index", "lock", "run", "started", "work")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.abandoned = False
        self.run: Run | None = None
        self.index = 0
        self.work: Work | None = None
        self.started = 0.0  # perf_counter() at call start


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
        with self._cond:
            idle = self._idle
            if idle:
                self._cond.notify(min(idle, ready))
            missing = min(ready - idle, self.size - len(self._slots))
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
                run, index = slot.run, slot.index
            self._slots.remove(slot)
            self._abandoned += 1
            with self._hung_lock:
                self._hung += 1
            log.warning(
                "%s: handler did not finish within %gs; abandoning its thread (%d abandoned)",
                work.where,
                self.timeout_s,
                self._abandoned,
            )
            work.result = timeout_result(self.timeout_s)
            work.started = slot.started
            work.seconds = self.timeout_s
            work.state = Work.FINISHED
            self.completions.append(work)
            if run is not None:
                self.scheduler.replace(run, Run(run.items[index + 1 :], run.key))
                self.wake(1)
            if self._on_abandoned is not None:
                self._on_abandoned(self._abandoned)

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
        """Abandoned calls still running (they return late, or never)."""
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
        ready = self.scheduler.ready
        finish = self.scheduler.finish
        while True:
            with self._cond:
                while not ready:
                    if self._closed:
                        return
                    self._idle += 1
                    self._cond.wait()
                    self._idle -= 1
                run: Run | None = ready.popleft()
            while run is not None:
                slot.run = run
                items = run.items
                for index in range(len(items)):
                    work = items[index]
                    if work.part.revoked:
                        continue
                    slot.index = index
                    work.state = 1  # RUNNING
                    started = perf()
                    slot.started = started
                    slot.work = work
                    try:
                        result = call(work)
                    except BaseException as exc:  # adapters never raise; if one does, retry
                        result = adapter_failure(exc)
                    ended = perf()
                    with slot.lock:
                        if slot.abandoned:
                            self._late_return(work)
                            return
                        slot.work = None
                    work.result = result
                    work.started = started
                    work.seconds = ended - started
                    work.state = 2  # FINISHED
                    done(work)
                slot.run = None
                run = finish(run)

    def _late_return(self, work: Work) -> None:
        with self._hung_lock:
            self._hung -= 1
        log.info("%s: abandoned handler call returned late; its thread exits", work.where)


class LoopPool:
    """``size`` tasks on one event loop in a daemon thread, each running runs of records."""

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
        log.warning(
            "async handler still running %gs after its timeout was cancelled; abandoning its "
            "event loop with %d calls (%d abandoned)",
            ASYNC_CANCEL_GRACE_S,
            len(stuck),
            self._abandoned,
        )
        for work, run, index, started in stuck:
            work.result = timeout_result(self.timeout_s)
            work.started = started
            work.seconds = self.timeout_s
            work.state = Work.FINISHED
            self.completions.append(work)
            if run is not None:
                self.scheduler.replace(run, Run(run.items[index + 1 :], run.key))
        if len(self.scheduler):
            self.wake(len(self.scheduler))
        if self._on_abandoned is not None:
            self._on_abandoned(self._abandoned)

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
        take = pool.scheduler.take
        finish = pool.scheduler.finish
        while not self.abandoned:
            self.sleepers += 1  # before the last look: a submit after it will wake us
            run = take()
            if run is None:
                fut = self.loop.create_future()
                self._waiters.append(fut)
                await fut
                self.sleepers -= 1
                continue
            self.sleepers -= 1
            while run is not None:
                slot.run = run
                items = run.items
                for index in range(len(items)):
                    work = items[index]
                    if work.part.revoked:
                        continue
                    slot.index = index
                    work.state = 1  # RUNNING
                    started = perf()
                    slot.started = started
                    slot.work = work
                    try:
                        async with asyncio.timeout(timeout_s):
                            result = await acall(work)
                    except TimeoutError:
                        result = timeout_result(timeout_s)
                    except asyncio.CancelledError:
                        if self.abandoned or self.loop.is_closed():
                            return
                        result = timeout_result(timeout_s)
                    except BaseException as exc:  # adapters never raise; if one does, retry
                        result = adapter_failure(exc)
                    with slot.lock:
                        if self.abandoned:
                            return  # the pool already gave this call a timeout result
                        slot.work = None
                    work.result = result
                    work.started = started
                    work.seconds = perf() - started
                    work.state = 2  # FINISHED
                    done(work)
                slot.run = None
                run = finish(run)

    def abandon(self) -> list[tuple[Work, Run | None, int, float]]:
        """Give up on this loop: the calls it is running, with where each stood in its run."""
        self.abandoned = True  # a slot finishing from now on returns without completing
        stuck = []
        for slot in self.slots:
            with slot.lock:
                if slot.work is not None:
                    stuck.append((slot.work, slot.run, slot.index, slot.started))
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
