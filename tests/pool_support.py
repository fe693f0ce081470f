"""Drive handler adapters through the worker's real pools and scheduler, without Kafka."""

from __future__ import annotations

from collections.abc import Hashable, Sequence

from retryd.handlers.base import AsyncHandler, Handler, Message, SyncHandler, is_async_handler
from retryd.policy.classify import HandlerResult
from retryd.worker.partition import PartitionState
from retryd.worker.pools import LoopPool, Pool, ThreadPool
from retryd.worker.scheduler import Run, Scheduler
from retryd.worker.work import Work
from tests.support import wait_for


def work_of(message: Message, part: PartitionState | None = None) -> Work:
    """A Work carrying ``message``'s fields (as the worker builds them from Kafka records)."""
    w = Work.__new__(Work)
    w._raw = None
    w._env = None
    w._fields = message._fields
    w.topic, w.partition, w.offset = message.topic, message.partition, message.offset
    w.part = part or PartitionState(message.topic, message.partition, None)
    w.due = 0
    w.state = Work.QUEUED
    w.result = None
    w.size = 0
    return w


class Harness:
    """A scheduler and a pool for one handler; ``submit`` runs, ``results`` waits for them."""

    def __init__(self, handler: Handler, *, max_in_flight: int = 4, timeout_s: float = 5.0):
        self.scheduler = Scheduler()
        self.abandoned_events: list[int] = []
        pool: Pool
        if is_async_handler(handler):
            assert isinstance(handler, AsyncHandler)
            pool = LoopPool(
                handler, self.scheduler, max_in_flight, timeout_s, self.abandoned_events.append
            )
        else:
            assert isinstance(handler, SyncHandler)
            pool = ThreadPool(
                handler, self.scheduler, max_in_flight, timeout_s, self.abandoned_events.append
            )
        self.pool = pool
        self.done: list[Work] = []

    def submit(self, groups: Sequence[tuple[Hashable | None, Sequence[Work]]]) -> None:
        runs = [Run(list(items), key) for key, items in groups]
        self.pool.wake(self.scheduler.submit(runs))

    def collect(self, n: int, timeout: float = 10.0) -> list[Work]:
        """Wait until ``n`` more calls finished (running the watchdog like the poll loop)."""

        def enough() -> bool:
            self.pool.watchdog()
            while self.pool.completions:
                self.done.append(self.pool.completions.popleft())
            return len(self.done) >= n

        wait_for(enough, timeout, interval=0.005, what=f"{n} handler calls to finish")
        out, self.done = self.done[:n], self.done[n:]
        return out

    def call(self, message: Message, timeout: float = 10.0) -> HandlerResult:
        """One call through the pool: the result the worker would settle."""
        w = work_of(message)
        self.submit([(None, [w])])
        [done] = self.collect(1, timeout)
        assert done.result is not None
        return done.result

    def close(self) -> None:
        self.pool.close(1.0)
