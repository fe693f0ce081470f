"""Drive handler adapters through the worker's real pools and scheduler, without Kafka."""

from __future__ import annotations

from collections.abc import Hashable, Sequence

from retryd.handlers.base import AsyncHandler, Handler, Message, SyncHandler, is_async_handler
from retryd.policy.classify import HandlerResult
from retryd.worker.lifecycle import Lifecycle
from retryd.worker.partition import PartitionState
from retryd.worker.pools import LoopPool, Pool, ThreadPool
from retryd.worker.scheduler import Scheduler
from retryd.worker.work import Work, work_of_message
from tests.support import wait_for


def work_of(message: Message, part: PartitionState | None = None) -> Work:
    """A Work carrying ``message`` (as the worker builds them from Kafka records)."""
    return work_of_message(message, part or PartitionState(message.topic, message.partition, None))


class Harness:
    """A scheduler and a pool for one handler; ``submit`` runs, ``results`` waits for them."""

    def __init__(self, handler: Handler, *, max_in_flight: int = 4, timeout_s: float = 5.0):
        self.scheduler = Scheduler()
        self.lifecycle = Lifecycle()
        self.abandoned_events: list[int] = []
        pool: Pool
        if is_async_handler(handler):
            assert isinstance(handler, AsyncHandler)
            pool = LoopPool(
                handler,
                self.scheduler,
                self.lifecycle,
                max_in_flight,
                timeout_s,
                self.abandoned_events.append,
            )
        else:
            assert isinstance(handler, SyncHandler)
            pool = ThreadPool(
                handler,
                self.scheduler,
                self.lifecycle,
                max_in_flight,
                timeout_s,
                self.abandoned_events.append,
            )
        self.pool = pool
        self.pending: list[Work] = []

    def submit(self, groups: Sequence[tuple[Hashable | None, Sequence[Work]]]) -> None:
        """Queue records: each group's records share an ordering key (None: no ordering)."""
        works = []
        for key, items in groups:
            for w in items:
                w.lock = key
                works.append(w)
        self.pending.extend(works)
        self.scheduler.submit(works)
        self.pool.wake(len(self.scheduler))

    def collect(self, n: int, timeout: float = 10.0) -> list[Work]:
        """Wait until the first ``n`` submitted records have a result (running the watchdog
        and waking slots like the poll loop); returns them in submission order."""

        def enough() -> bool:
            self.pool.watchdog()
            self.pool.wake(len(self.scheduler))
            # failures: results are on the records already; the poll thread would decide
            # them, which releases their keys' lanes
            while self.pool.completions:
                self.scheduler.release(self.pool.completions.popleft())
            return all(w.result is not None for w in self.pending[:n])

        wait_for(enough, timeout, interval=0.005, what=f"{n} handler calls to finish")
        out, self.pending = self.pending[:n], self.pending[n:]
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
