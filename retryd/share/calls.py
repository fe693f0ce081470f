"""Handler calls of the share-group worker: started by its poll thread, finished anywhere.

The consumer-group engine's pools are built around partitions, key lanes and its scheduler;
a share group has none of these (the broker hands out single records), so this is a small
pool of its own. The poll thread starts at most ``max_in_flight`` calls; each finished call
lands in ``done`` (a thread-safe queue the poll thread waits on, so it wakes the moment a call
ends, never on a timer).

- A sync handler runs on a thread. A call still running at its timeout is reported as a
  timeout by ``expire`` (a retryable failure) and its thread is abandoned: business code cannot
  be interrupted. ``hung`` counts the abandoned threads still running; the worker exits past
  ``max_abandoned_handlers`` so that a new process frees them.
- An async handler (``async def``, or the HTTP handler) runs on one event loop thread, and
  ``asyncio.wait_for`` cancels it at its timeout.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, NamedTuple

from retryd.handlers.base import AsyncHandler, Handler, Message, SyncHandler, is_async_handler
from retryd.policy.classify import HandlerResult, classify_exception, timeout_result

log = logging.getLogger(__name__)


class Finished(NamedTuple):
    """One call's end: what it was started for, its result and how long it took."""

    token: Any
    result: HandlerResult
    seconds: float


class Calls:
    """Runs handler calls, at most ``max_in_flight`` at a time (the caller keeps to it)."""

    def __init__(
        self, handler: Handler, max_in_flight: int, timeout_s: float, max_abandoned: int
    ) -> None:
        self.handler = handler
        self.timeout_s = timeout_s
        self.done: queue.SimpleQueue[Finished] = queue.SimpleQueue()
        self.hung = 0  # abandoned sync calls still running
        self.abandoned = 0  # calls abandoned at their timeout, ever
        self._lock = threading.Lock()
        self._running: dict[int, tuple[Any, float, float]] = {}  # id -> (token, start, deadline)
        self._async = is_async_handler(handler)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pool: ThreadPoolExecutor | None = None
        if self._async:
            self._loop = asyncio.new_event_loop()
            threading.Thread(
                target=self._loop.run_forever, name="retryd-share-loop", daemon=True
            ).start()
        else:
            # room for the abandoned threads too: a hung call must not take a slot for good
            self._pool = ThreadPoolExecutor(
                max_in_flight + max_abandoned + 1, thread_name_prefix="retryd-share-call"
            )

    @property
    def running(self) -> int:
        with self._lock:
            return len(self._running)

    def start(self, token: Any, message: Message) -> None:
        started = time.monotonic()
        with self._lock:
            self._running[id(token)] = (token, started, started + self.timeout_s)
        if self._loop is not None:
            asyncio.run_coroutine_threadsafe(self._acall(token, message, started), self._loop)
        else:
            assert self._pool is not None
            self._pool.submit(self._call, token, message, started)

    def _end(self, token: Any, result: HandlerResult, started: float) -> None:
        with self._lock:
            if self._running.pop(id(token), None) is None:
                self.hung -= 1  # expired before: its timeout was reported, the thread is free
                return
        self.done.put(Finished(token, result, time.monotonic() - started))

    def _call(self, token: Any, message: Message, started: float) -> None:
        handler = self.handler
        assert isinstance(handler, SyncHandler)
        try:
            result = handler.call(message)
        except BaseException as exc:  # call() never raises; a bug must not lose the record
            log.exception("handler call raised: %s", exc)
            result = classify_exception(exc)
        self._end(token, result, started)

    async def _acall(self, token: Any, message: Message, started: float) -> None:
        handler = self.handler
        assert isinstance(handler, AsyncHandler)
        try:
            result = await asyncio.wait_for(handler.acall(message), self.timeout_s)
        except TimeoutError:
            result = timeout_result(self.timeout_s)
        except Exception as exc:  # acall() never raises; a bug must not lose the record
            log.exception("handler call raised: %s", exc)
            result = classify_exception(exc)
        self._end(token, result, started)

    def expire(self, now: float) -> list[Finished]:
        """Sync calls past their timeout: reported as timeouts, their threads abandoned. (An
        async call is cancelled by its own ``wait_for``.)"""
        if self._async:
            return []
        out = []
        with self._lock:
            for key, (token, started, deadline) in list(self._running.items()):
                if now >= deadline:
                    del self._running[key]
                    self.hung += 1
                    self.abandoned += 1
                    out.append(Finished(token, timeout_result(self.timeout_s), now - started))
        if out:
            log.warning(
                "%d handler calls still running after %gs: timeouts (threads abandoned)",
                len(out),
                self.timeout_s,
            )
        return out

    def next_deadline(self) -> float | None:
        if self._async:
            return None
        with self._lock:
            return min((d for _, _, d in self._running.values()), default=None)

    def close(self, timeout_s: float = 1.0) -> None:
        if self._loop is not None:
            loop = self._loop
            closer = getattr(self.handler, "aclose", None)
            if closer is not None:
                try:
                    asyncio.run_coroutine_threadsafe(closer(), loop).result(timeout_s)
                except Exception as exc:  # closing must never hide how the worker ended
                    log.warning("closing the handler: %s", exc)
            loop.call_soon_threadsafe(loop.stop)
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            closer = getattr(self.handler, "close", None)
            if closer is not None:
                closer()
