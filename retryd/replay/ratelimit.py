"""Token-bucket rate limiting for bulk replays."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


class TokenBucket:
    """Rate limit: starts empty, refills at ``rate`` per second up to a small burst.

    Starting empty makes N takes last at least N / rate seconds.
    """

    def __init__(
        self, rate: float, burst: float | None = None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if rate <= 0:
            raise ValueError("rate must be positive")
        self.rate = rate
        self.capacity = burst if burst is not None else max(1.0, rate / 20)
        self.clock = clock
        self.tokens = 0.0
        self.last = clock()

    def _refill(self) -> None:
        now = self.clock()
        self.tokens = min(self.capacity, self.tokens + (now - self.last) * self.rate)
        self.last = now

    def try_take(self) -> float:
        """Take a token and return 0, or return how long to wait before one is available."""
        self._refill()
        if self.tokens >= 1 - 1e-9:  # tolerate float rounding of the refill
            self.tokens = max(0.0, self.tokens - 1)
            return 0.0
        return (1 - self.tokens) / self.rate

    def take(self, stop: threading.Event, idle: Callable[[float], None] | None = None) -> bool:
        """Block until a token is taken (True) or ``stop`` is set (False)."""
        return _take(self.try_take, stop, idle)


class SharedRateLimit:
    """One rate shared by many threads: the sidecar's ceiling across every bulk job and single
    replay (``replay_max_per_second``), on top of each job's own ``max_per_second``."""

    def __init__(
        self, rate: float, burst: float | None = None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._bucket = TokenBucket(rate, burst, clock)
        self._lock = threading.Lock()
        self.rate = rate

    def try_take(self) -> float:
        with self._lock:
            return self._bucket.try_take()

    def take(self, stop: threading.Event, idle: Callable[[float], None] | None = None) -> bool:
        return _take(self.try_take, stop, idle)

    def acquire(self, timeout_s: float) -> bool:
        """Take a token, waiting at most ``timeout_s``; False if none came in time."""
        deadline = time.monotonic() + timeout_s
        while True:
            wait = self.try_take()
            if wait == 0:
                return True
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            time.sleep(min(wait, left, 0.05))


def _take(
    try_take: Callable[[], float],
    stop: threading.Event,
    idle: Callable[[float], None] | None,
) -> bool:
    while not stop.is_set():
        wait = try_take()
        if wait == 0:
            return True
        if idle is not None:
            idle(min(wait, 0.05))
        else:
            stop.wait(min(wait, 0.05))
    return False
