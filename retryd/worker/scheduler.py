"""Ordering: which records may run now, and which must wait for an earlier one.

Every record carries its *ordering key* (``lock``): ``(partition state, record key)`` for
``ordering=key``, the partition state for ``partition``, ``None`` for ``none``. The scheduler
keeps, per busy key, the last record queued or running (``_tails``). A record whose key is busy
is *chained* behind that record (``work.next``) instead of being made ready; when a slot
finishes a record, the record chained behind it becomes ready, behind the keys already waiting
(keys take turns). So the records of one key never run concurrently and run in offset order,
while different keys run in parallel, and a chained record is never "ready": a hot key holds
back only its own records.

Records are their own queue nodes (no run objects per key), and slots take ready records in
chunks under one lock acquisition, so a record costs a few dictionary and deque operations.

The *gate* (``set_gate``) is how the outage circuit breaker stops calls: ``permits`` None lets
every ready record start, 0 none (records stay ready, in order), 1 exactly one (the half-open
probe, remembered in ``probe``).

Thread safety: ``submit`` is called by the poll thread, ``take``/``handoff``/``release_*``/
``requeue`` by the handler slots; every structure is guarded by ``lock``.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Hashable, Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from retryd.worker.work import Work


class Scheduler:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.ready: deque[Work] = deque()
        self._tails: dict[Hashable, Work] = {}  # last record (queued or running) of a busy key
        # wait_below's signal: a plain lock kept acquired while nobody should wake (releasing a
        # C-level lock costs a fraction of an Event's Python-level condition).
        self._signal = threading.Lock()
        self._signal.acquire()
        self._want = False
        self._low = 0
        self.permits: int | None = None  # the gate: records that may still start; None = all
        self.probe: Work | None = None  # the last record let through a limited gate

    def __len__(self) -> int:
        """Records ready to start (not counting chained ones)."""
        return len(self.ready)

    @property
    def ready_items(self) -> int:
        return len(self.ready)

    @property
    def runnable(self) -> int:
        """Records a slot may take now: the ready ones, as far as the gate lets them."""
        permits = self.permits
        n = len(self.ready)
        return n if permits is None else min(n, permits)

    def set_gate(self, permits: int | None) -> None:
        """None: no limit; 0: nothing starts; more: one record more starts (the probe)."""
        with self.lock:
            self.permits = permits
            if permits:
                self.probe = None

    @property
    def busy_keys(self) -> int:
        return len(self._tails)

    def submit(self, works: Iterable[Work]) -> int:
        """Queue records in offset order (per key); returns how many became ready."""
        made_ready = 0
        tails = self._tails
        with self.lock:
            append = self.ready.append
            for w in works:
                key = w.lock
                if key is None:
                    append(w)
                    made_ready += 1
                    continue
                tail = tails.get(key)
                if tail is not None:
                    tail.next = w
                else:
                    append(w)
                    made_ready += 1
                tails[key] = w
        return made_ready

    def take_locked(self, n: int) -> list[Work]:
        """Up to ``n`` ready records (as far as the gate lets them); the caller holds
        ``lock``."""
        ready = self.ready
        permits = self.permits
        if permits is not None:
            if permits <= 0 or not ready:
                return []
            self.permits = 0
            self.probe = w = ready.popleft()
            return [w]
        if n == 1 or len(ready) == 1:
            out = [ready.popleft()]
        else:
            popleft = ready.popleft
            out = [popleft() for _ in range(min(n, len(ready)))]
        if self._want and len(ready) <= self._low:
            self._want = False
            self._signal.release()
        return out

    def take(self, n: int = 1) -> list[Work]:
        with self.lock:
            return self.take_locked(n) if self.ready else []

    def handoff(self, w: Work) -> Work | None:
        """``w`` finished: the record chained behind it goes to the *back* of the ready queue,
        and the slot gets the record at the front. Keys take turns: a slot that kept running one
        key's chain would leave the last wave of long chains on a few slots while the others
        idle (200 keys of 100 records on 64 slots: 4 waves of 2 s instead of 6.25 s of work)."""
        key = w.lock
        ready = self.ready
        with self.lock:
            if key is not None:
                nxt = w.next
                if nxt is not None:
                    ready.append(nxt)
                    w.next = None  # released once: a held record that runs again releases nothing
                elif self._tails.get(key) is w:
                    del self._tails[key]
            if not ready:
                return None
            out = self.take_locked(1)
            return out[0] if out else None

    def release_many(self, works: list[Work], into: list[Work]) -> None:
        """Records finished together (an abandoned slot's), under one lock; successors go to
        ``into``."""
        tails = self._tails
        with self.lock:
            for w in works:
                key = w.lock
                if key is None:
                    continue
                nxt = w.next
                if nxt is not None:
                    into.append(nxt)
                    w.next = None
                elif tails.get(key) is w:
                    del tails[key]

    def release_locked(self, works: list[Work]) -> None:
        """Records a slot finished together; records chained behind them
        become ready (any slot may run them: a slot that took several keys must not keep
        them all to itself). The caller holds ``lock``."""
        tails = self._tails
        append = self.ready.append
        for w in works:
            key = w.lock
            if key is None:
                continue
            nxt = w.next
            if nxt is not None:
                append(nxt)
                w.next = None
            elif tails.get(key) is w:
                del tails[key]

    def requeue(self, works: list[Work]) -> None:
        """Records a slot held but never started (its thread hung and was abandoned), or
        failed records the circuit breaker holds: back to the front, in order."""
        with self.lock:
            self.ready.extendleft(reversed(works))

    def requeue_last(self, w: Work) -> None:
        """A record to the *back* of the ready queue: a failed probe, so the next probe is
        another record (a poison record at the front must not keep an outage's circuit open)."""
        with self.lock:
            self.ready.append(w)

    def wait_below(self, low: int, timeout_s: float) -> None:
        """Block until at most ``low`` records are ready (slots took the rest), or the
        timeout: how the poll thread lets the pool catch up without consuming more."""
        with self.lock:
            if len(self.ready) <= low:
                return
            self._low = low
            self._want = True
        self._signal.acquire(timeout=timeout_s)
        with self.lock:
            if self._want:
                self._want = False  # timed out: nobody released the signal
            elif self._signal.acquire(blocking=False):
                pass  # released after our timeout: re-arm (keep it acquired)
