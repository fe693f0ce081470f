"""Quick retries in place: a handler that calls the business handler again, a moment later,
when a main-topic record fails with a retryable error (``quick=<n>@<delay>`` in
``retry_sequence``).

Why a wrapper around the handler and not a stage of the engine: to the engine a record with
quick retries is one longer call. It stays RUNNING in its handler slot, so everything the
engine guarantees for a call holds unchanged: its key's later records wait behind it (per-key
offset order on the main topic), a revoke waits for it or discards its result, its offset is
stored only once it is settled, and a crash redoes it. The wait between two attempts happens on
the handler slot (a thread, or a task of the event loop), never on the poll thread; it holds a
slot meanwhile, which slows calls down while the business service is struggling.

The slot's timeout covers the whole sequence (``quick_timeout_s``); an ``async def`` or HTTP
handler's attempts are each also cut at ``handler_timeout_s`` (a timed-out attempt is retryable
and retried in place too). Tier records are never retried in place: a record already in a tier
has its delay.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable

from retryd.handlers.base import AsyncHandler, Handler, Message, SyncHandler, is_async_handler
from retryd.policy.classify import HandlerResult, Outcome, timeout_result

_RETRY = Outcome.RETRY


def _never(result: HandlerResult) -> bool:
    return False


class QuickCounts:
    """Quick retries made, and records they rescued: written by handler slots (any thread,
    only on the failure path), taken by the poll thread once per iteration."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._retries = 0
        self._rescued = 0

    def add(self, retries: int, result: HandlerResult) -> None:
        with self._lock:
            self._retries += retries
            if result.outcome is Outcome.SUCCESS or result.outcome is Outcome.DROP:
                self._rescued += 1

    def take(self) -> tuple[int, int]:
        """(retries, rescued) since the last take."""
        with self._lock:
            out = (self._retries, self._rescued)
            self._retries = self._rescued = 0
            return out


def quick_timeout_s(handler_timeout_s: float, quick: int, quick_delay_ms: int) -> float:
    """How long a slot may hold a record through its attempts and the waits between them."""
    return handler_timeout_s * (quick + 1) + quick * quick_delay_ms / 1000.0


class QuickRetrySync:
    """``SyncHandler`` calling ``inner`` up to ``quick`` more times for a retryable failure."""

    def __init__(
        self,
        inner: SyncHandler,
        quick: int,
        quick_delay_ms: int,
        terminal: Callable[[HandlerResult], bool] = _never,
        counts: QuickCounts | None = None,
    ) -> None:
        self.inner = inner
        self.counts = counts or QuickCounts()
        self.quick = quick
        self.terminal = terminal  # an error route dead-letters this failure: no retry helps
        self.delay_s = quick_delay_ms / 1000.0
        self.timeout_s = quick_timeout_s(inner.timeout_s, quick, quick_delay_ms)

    def call(self, message: Message) -> HandlerResult:
        result = self.inner.call(message)
        if message.retry_number:
            return result
        retries = 0
        for _ in range(self.quick):
            if result.outcome is not _RETRY or self.terminal(result):
                break
            time.sleep(self.delay_s)  # a handler slot's own thread, never the poll loop
            result = self.inner.call(message)
            retries += 1
        if retries:
            self.counts.add(retries, result)
        return result

    def close(self) -> None:
        self.inner.close()


class QuickRetryAsync:
    """``AsyncHandler`` version: waits with ``asyncio.sleep``; each attempt is cut at the
    handler timeout."""

    def __init__(
        self,
        inner: AsyncHandler,
        quick: int,
        quick_delay_ms: int,
        timeout_s: float,
        terminal: Callable[[HandlerResult], bool] = _never,
        counts: QuickCounts | None = None,
    ) -> None:
        self.inner = inner
        self.counts = counts or QuickCounts()
        self.quick = quick
        self.terminal = terminal
        self.delay_s = quick_delay_ms / 1000.0
        self.attempt_timeout_s = timeout_s
        self.timeout_s = quick_timeout_s(timeout_s, quick, quick_delay_ms)

    async def _attempt(self, message: Message) -> HandlerResult:
        try:
            async with asyncio.timeout(self.attempt_timeout_s):
                return await self.inner.acall(message)
        except TimeoutError:
            return timeout_result(self.attempt_timeout_s)

    async def acall(self, message: Message) -> HandlerResult:
        if message.retry_number:
            return await self.inner.acall(message)  # the slot's own timeout applies
        result = await self._attempt(message)
        retries = 0
        for _ in range(self.quick):
            if result.outcome is not _RETRY or self.terminal(result):
                break
            await asyncio.sleep(self.delay_s)
            result = await self._attempt(message)
            retries += 1
        if retries:
            self.counts.add(retries, result)
        return result

    async def aclose(self) -> None:
        await self.inner.aclose()


def with_quick_retries(
    handler: Handler,
    quick: int,
    quick_delay_ms: int,
    timeout_s: float,
    terminal: Callable[[HandlerResult], bool] = _never,
    counts: QuickCounts | None = None,
) -> Handler:
    """``handler`` itself when there are no quick retries, else the matching wrapper.
    ``terminal`` says which retryable failures an error route dead-letters at once (those are
    not retried in place either)."""
    if quick <= 0:
        return handler
    if is_async_handler(handler):
        assert isinstance(handler, AsyncHandler)
        return QuickRetryAsync(handler, quick, quick_delay_ms, timeout_s, terminal, counts)
    assert isinstance(handler, SyncHandler)
    return QuickRetrySync(handler, quick, quick_delay_ms, terminal, counts)
