"""A shutdown fence: work in progress finishes, new work is refused, then resources close.

A replay is two writes (the copy, then its ledger entry). Closing the ledger's producer while
a replay is between them leaves a copy without its entry, and the next run replays the record
again. So the sidecar's shutdown closes the fence first: new replays get ShuttingDown (503),
and ``close`` waits for the ones in progress to reach a definite outcome before the producers
are closed.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from retryd.replay.errors import ShuttingDown


class Fence:
    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._active = 0
        self._closed = False

    @contextmanager
    def enter(self, what: str) -> Iterator[None]:
        """Run one unit of work, or raise ShuttingDown if the fence is closed."""
        with self._cond:
            if self._closed:
                raise ShuttingDown(f"the sidecar is shutting down: {what} refused, try another")
            self._active += 1
        try:
            yield
        finally:
            with self._cond:
                self._active -= 1
                self._cond.notify_all()

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self, timeout_s: float) -> int:
        """Refuse new work and wait up to ``timeout_s`` for the work in progress; returns how
        many units are still running (0 unless something exceeded its own bound)."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            self._closed = True
            while self._active > 0:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            return self._active
