"""What both thread pools share (``ThreadPool`` for per-record calls, ``BatchThreadPool`` for
batch calls): the slot threads' bookkeeping, their counters read as deltas, the count of
abandoned and still-hung threads, and closing. Each pool keeps its own ``wake``,
``watchdog``, ``running`` and slot loop, which differ by what a call carries."""

from __future__ import annotations

import contextlib
import logging
import threading
from collections import deque
from collections.abc import Callable
from typing import Generic, TypeVar

from retryd.worker.events import BatchStats, SlotStats
from retryd.worker.lifecycle import Lifecycle
from retryd.worker.scheduler import Scheduler
from retryd.worker.slots import Collector, Slot
from retryd.worker.work import Work

log = logging.getLogger(__name__)

S = TypeVar("S", bound=Slot)


class ThreadSlots(Generic[S]):
    _call = "handler call"  # what a slot runs, for the log line of a late return

    def __init__(
        self,
        scheduler: Scheduler,
        lifecycle: Lifecycle,
        size: int,
        timeout_s: float,
        on_abandoned: Callable[[int], None] | None,
    ) -> None:
        self.scheduler = scheduler
        self.lifecycle = lifecycle
        self.size = size
        self.timeout_s = timeout_s
        self.completions: deque[Work] = deque()
        self._on_abandoned = on_abandoned
        self._cond = threading.Condition(scheduler.lock)
        self._slots: list[S] = []  # live (not abandoned) slots
        self._retired: list[S] = []  # abandoned: their counters are read once more
        self._own = SlotStats()  # timeouts declared by the watchdog (poll thread)
        self._collector = Collector()
        self._idle = 0
        self._abandoned = 0
        self._hung = 0
        self._hung_lock = threading.Lock()
        self._closed = False
        self._started = 0

    def _close_handler(self) -> None:
        raise NotImplementedError

    def collect(self, stats: BatchStats) -> None:
        collector = self._collector
        collector.add(self._own, stats)
        for slot in self._slots:
            collector.add(slot.stats, stats)
        if self._retired:
            collector.retire(self._retired, stats)

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
            self._close_handler()

    def _late_return(self, work: Work) -> None:
        with self._hung_lock:
            self._hung -= 1
        log.info("%s: abandoned %s returned late; its thread exits", work.where, self._call)
