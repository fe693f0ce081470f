"""Ordering: which records may run now, and which must wait for an earlier one.

Records are grouped into *runs*: records of one ordering key (``(topic, partition, key)`` for
``ordering=key``, ``(topic, partition)`` for ``partition``) taken from one poll, in offset
order. A run is executed start to finish by one handler slot (a pool thread or an event-loop
task), so a run of N records costs one hand-off, not N. A run whose key still has an earlier
run queued or running is *chained* behind it instead of being made ready: when the earlier run
finishes, the slot that ran it continues with the next one. So the records of one key never
run concurrently and run in offset order, while different keys run in parallel.

``ordering=none`` uses runs without a key: never chained, split so that every slot gets a share.

Thread safety: ``submit`` is called by the poll thread, ``take``/``finish``/``replace`` by the
handler slots; every structure is guarded by one lock, held for a few dictionary operations.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Hashable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from retryd.worker.work import Work


class Run:
    __slots__ = ("items", "key", "next")

    def __init__(self, items: list[Work], key: Hashable | None) -> None:
        self.items = items
        self.key = key
        self.next: Run | None = None


class Scheduler:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.ready: deque[Run] = deque()
        self._tails: dict[Hashable, Run] = {}  # last run (queued or running) of each busy key

    def __len__(self) -> int:
        """Runs ready to start (not counting chained ones)."""
        return len(self.ready)

    @property
    def busy_keys(self) -> int:
        return len(self._tails)

    def submit(self, runs: list[Run]) -> int:
        """Queue runs in order; returns how many became ready (the rest are chained)."""
        made_ready = 0
        tails = self._tails
        with self.lock:
            ready = self.ready
            for run in runs:
                key = run.key
                if key is None:
                    ready.append(run)
                    made_ready += 1
                    continue
                tail = tails.get(key)
                if tail is not None:
                    tail.next = run
                else:
                    ready.append(run)
                    made_ready += 1
                tails[key] = run
        return made_ready

    def take(self) -> Run | None:
        """The next ready run, or None."""
        with self.lock:
            return self.ready.popleft() if self.ready else None

    def finish(self, run: Run) -> Run | None:
        """``run`` is done: the run chained behind it (the caller continues with it), or None
        when its key has nothing more queued."""
        with self.lock:
            nxt = run.next
            if nxt is None and run.key is not None and self._tails.get(run.key) is run:
                del self._tails[run.key]
            return nxt

    def replace(self, run: Run, rest: Run) -> None:
        """A slot gave up ``run`` part-way (its call hung and was abandoned): ``rest`` takes its
        place in the key's chain and is made ready first."""
        with self.lock:
            rest.next = run.next
            if run.key is not None and self._tails.get(run.key) is run:
                self._tails[run.key] = rest
            self.ready.appendleft(rest)
