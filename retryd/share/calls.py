"""Handler calls of the share-group worker: started by its poll thread, finished anywhere.

The consumer-group engine's pools (``retryd.worker.loop_pool``, ``thread_pool``) take their
records from its scheduler and settle them through its ``Lifecycle`` over partition
assignments; a share group has none of these (the broker hands out single records, each
acknowledged on its own), so this is a small pool of its own that keeps the engine's rules:

- **Attempts.** Every ``start`` gets a fresh attempt number (returned, and carried by its
  ``Finished``). A call's end is taken only while that attempt is still running: once it
  was reported as a timeout (``expire``), its late answer is dropped, so it can never settle
  a rerun of the same record (the confirming call of the circuit breaker runs the record
  again in place), nor stop that rerun from being watched for its own timeout.
- **Sync handlers** run on daemon threads (never ``concurrent.futures``: its threads are
  joined at interpreter exit, so a hung call would keep a stopped worker from exiting). A
  call still running at its timeout is reported as a timeout by ``expire`` (a retryable
  failure) and its thread is abandoned: business code cannot be interrupted. ``hung`` counts
  abandoned calls still running; the worker exits past ``max_abandoned_handlers`` so that a
  new process frees them.
- **Async handlers** (``async def``, or the HTTP handler) run on one event loop thread and are
  cancelled at their timeout. A call still running ``ASYNC_CANCEL_GRACE_S`` after that (it
  swallowed its cancellation, or blocking code froze the loop) means the loop cannot be
  trusted: as group mode's ``LoopPool`` does, ``expire`` stops and abandons it, and a new
  loop takes the later calls. Its overdue calls are reported as timeouts once, and count as
  hung while the old loop's thread is alive. Its other calls did nothing wrong: they are cut
  off: an answer one still gives (the loop runs one last step as it stops) is taken, the
  others come back as ``Finished`` with no result (run it again) once the old thread has
  ended, so a record never runs on two loops at once; if that thread outlives the call's own
  deadline, they get a timeout instead (not counted as hung).

Every call has a deadline (``next_deadline``), so the poll thread's waits are bounded by the
next one and ``stop()`` always completes: nothing waits on business code without one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
import time
from dataclasses import dataclass
from typing import Any, NamedTuple

from retryd.handlers.base import AsyncHandler, Handler, Message, SyncHandler, is_async_handler
from retryd.policy.classify import HandlerResult, timeout_result
from retryd.runtime.loop_thread import start_loop_thread
from retryd.worker.loop_pool import ASYNC_CANCEL_GRACE_S
from retryd.worker.slots import adapter_failure

log = logging.getLogger(__name__)


class Finished(NamedTuple):
    """One call's end: what it was started for, its attempt, its result (None: cut off by
    an abandoned loop, not answered: run it again) and how long it took."""

    token: Any
    attempt: int
    result: HandlerResult | None
    seconds: float


@dataclass(slots=True)
class _Call:
    token: Any
    started: float  # monotonic
    deadline: float  # past this, ``expire`` acts
    loop: _Loop | None = None  # the event loop it runs on (async)
    cut: bool = False  # its loop was abandoned because of another call


class Calls:
    """Runs handler calls, at most ``max_in_flight`` at a time (the caller keeps to it)."""

    def __init__(
        self, handler: Handler, max_in_flight: int, timeout_s: float, max_abandoned: int
    ) -> None:
        self.handler = handler
        self.timeout_s = timeout_s
        self.done: queue.SimpleQueue[Finished] = queue.SimpleQueue()
        self.abandoned = 0  # calls abandoned at their deadline, ever
        self._hung_sync = 0  # abandoned sync calls still running
        self._lock = threading.Lock()
        self._running: dict[int, _Call] = {}  # attempt -> its call
        self._expired: set[int] = set()  # abandoned sync attempts still running
        self._attempts = 0
        self._async = is_async_handler(handler)
        self._grace = ASYNC_CANCEL_GRACE_S if self._async else 0.0
        self._loop: _Loop | None = None
        self._stuck: list[tuple[_Loop, int]] = []  # abandoned loops, their overdue calls
        self._generation = 0
        self._threads = _Threads(self) if not self._async else None

    @property
    def running(self) -> int:
        """Calls holding a slot: running, or cut off and not yet given back."""
        with self._lock:
            return len(self._running)

    @property
    def hung(self) -> int:
        """Abandoned calls still running somewhere (a thread, or an abandoned loop's thread)."""
        with self._lock:
            self._stuck = [(lp, n) for lp, n in self._stuck if lp.thread.is_alive()]
            return self._hung_sync + sum(n for _, n in self._stuck)

    def start(self, token: Any, message: Message) -> int:
        """Start a call for ``token``; returns its attempt number."""
        started = time.monotonic()
        with self._lock:
            self._attempts += 1
            attempt = self._attempts
            call = _Call(token, started, started + self.timeout_s + self._grace)
            self._running[attempt] = call
            if self._async:
                call.loop = self._current()
        if call.loop is not None:
            call.loop.submit(self._acall(attempt, message, started))
        else:
            assert self._threads is not None
            self._threads.submit(attempt, message, started)
        return attempt

    def _current(self) -> _Loop:
        if self._loop is None:
            self._generation += 1
            self._loop = _Loop(self, self._generation)
        return self._loop

    def _end(self, attempt: int, result: HandlerResult, started: float) -> None:
        """A call returned: its result counts only while its attempt still runs."""
        with self._lock:
            call = self._running.pop(attempt, None)
            if call is None:
                if attempt in self._expired:
                    self._expired.discard(attempt)
                    self._hung_sync -= 1  # its timeout was reported; the thread is free
                    log.info("an abandoned handler call returned late; its answer is dropped")
                return
        self.done.put(Finished(call.token, attempt, result, time.monotonic() - started))

    def _call(self, attempt: int, message: Message, started: float) -> None:
        handler = self.handler
        assert isinstance(handler, SyncHandler)
        try:
            result = handler.call(message)
        except BaseException as exc:  # call() never raises; a bug must not lose the record
            log.exception("handler call raised: %s", exc)
            result = adapter_failure(exc)
        self._end(attempt, result, started)

    async def _acall(self, attempt: int, message: Message, started: float) -> None:
        handler = self.handler
        assert isinstance(handler, AsyncHandler)
        try:
            async with asyncio.timeout(self.timeout_s):
                result = await handler.acall(message)
        except TimeoutError:
            result = timeout_result(self.timeout_s)
        except asyncio.CancelledError:  # not by its timeout (that is TimeoutError): as one
            result = timeout_result(self.timeout_s)
        except GeneratorExit:
            raise  # closed with its abandoned loop (garbage collected): no answer at all
        except BaseException as exc:  # acall() never raises; a bug must not lose the record
            log.exception("handler call raised: %s", exc)
            result = adapter_failure(exc)
        self._end(attempt, result, started)

    # ------------------------------------------------------------------ the poll thread
    def expire(self, now: float) -> list[Finished]:
        """Calls past their deadline: reported as timeouts (module docstring); an async one
        abandons its loop."""
        out: list[Finished] = []
        with self._lock:
            overdue = [(a, c) for a, c in self._running.items() if now >= c.deadline]
            if not overdue:
                return out
            loop = self._loop
            if self._async and loop is not None and any(c.loop is loop for _, c in overdue):
                self._abandon(loop, now)
            for attempt, call in overdue:
                del self._running[attempt]
                if call.cut:
                    pass  # its old loop's thread outlived it: a timeout, not a hung call
                elif call.loop is None:
                    self._expired.add(attempt)
                    self._hung_sync += 1
                    self.abandoned += 1
                else:
                    self.abandoned += 1  # counted as hung with its loop (``_abandon``)
                result = timeout_result(self.timeout_s)
                out.append(Finished(call.token, attempt, result, now - call.started))
        log.warning(
            "%d handler calls still running %gs after they started: timeouts (%s abandoned)",
            len(out),
            self.timeout_s + self._grace,
            "their event loop" if self._async else "their threads",
        )
        return out

    def _abandon(self, loop: _Loop, now: float) -> None:
        """The loop did not act on a cancellation in time: give up on all of it (lock held)."""
        self._loop = None
        overdue = 0
        for call in self._running.values():
            if call.loop is loop:
                if now >= call.deadline:
                    overdue += 1
                else:
                    call.cut = True
        self._stuck.append((loop, overdue))
        loop.abandon()
        log.warning(
            "async handler still running %gs after its timeout was cancelled: its event loop "
            "is abandoned and a new one takes the next calls (%d overdue, %d cut off to run "
            "again)",
            self._grace,
            overdue,
            sum(1 for c in self._running.values() if c.loop is loop and c.cut),
        )

    def _loop_ended(self, loop: _Loop) -> None:
        """``loop``'s thread is ending: its cut-off calls may run again now (any thread)."""
        with self._lock:
            cut = [(a, c) for a, c in self._running.items() if c.loop is loop and c.cut]
            for attempt, _ in cut:
                del self._running[attempt]
        for attempt, call in cut:
            self.done.put(Finished(call.token, attempt, None, 0.0))

    def next_deadline(self) -> float | None:
        with self._lock:
            return min((c.deadline for c in self._running.values()), default=None)

    def close(self, timeout_s: float = 1.0) -> None:
        loop, self._loop = self._loop, None
        if loop is not None:
            closer = getattr(self.handler, "aclose", None)
            if closer is not None:
                try:
                    loop.run(closer(), timeout_s)
                except Exception as exc:  # closing must never hide how the worker ended
                    log.warning("closing the handler: %s", exc)
            loop.abandon()
        if self._threads is not None:
            self._threads.close()
            closer = getattr(self.handler, "close", None)
            if closer is not None:
                closer()


class _Threads:
    """Daemon threads for sync calls: an idle one takes the next call, else a new one starts
    (so an abandoned thread never holds a slot), and each waits for work without a timer."""

    def __init__(self, calls: Calls) -> None:
        self.calls = calls
        self._jobs: queue.SimpleQueue[tuple[int, Message, float] | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._idle = 0  # threads waiting for a job
        self._queued = 0  # jobs no thread took yet
        self._count = 0

    def submit(self, attempt: int, message: Message, started: float) -> None:
        with self._lock:
            self._queued += 1
            spawn = self._queued > self._idle
            if spawn:
                self._count += 1
                self._idle += 1  # the new thread's first wait
        if spawn:
            threading.Thread(
                target=self._serve, name=f"retryd-share-call-{self._count}", daemon=True
            ).start()
        self._jobs.put((attempt, message, started))

    def _serve(self) -> None:
        while True:
            job = self._jobs.get()
            with self._lock:
                self._idle -= 1
                if job is not None:
                    self._queued -= 1
            if job is None:
                return
            self.calls._call(*job)
            with self._lock:
                self._idle += 1

    def close(self) -> None:
        with self._lock:
            idle = self._idle
        for _ in range(idle):
            self._jobs.put(None)


class _Loop:
    """One event loop and its daemon thread; ``abandon`` stops it from any thread."""

    def __init__(self, calls: Calls, generation: int) -> None:
        self.calls = calls
        self.loop, self.thread = start_loop_thread(
            f"retryd-share-loop-{generation}", on_exit=lambda: calls._loop_ended(self)
        )

    def submit(self, coro: Any) -> None:
        try:
            asyncio.run_coroutine_threadsafe(coro, self.loop)
        except RuntimeError:  # closed under us (the worker is closing): never started
            coro.close()

    def run(self, coro: Any, timeout_s: float) -> None:
        asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout_s)

    def abandon(self) -> None:
        with contextlib.suppress(RuntimeError):  # closed already
            self.loop.call_soon_threadsafe(self.loop.stop)
