"""Calls an in-process Python callable (sync or async) with a hard per-call timeout.

Sync callables run on daemon worker threads that are reused between calls (a queue hand-off
costs tens of microseconds, a new thread per call would cost far more). A call that overruns
its timeout cannot be killed in Python, so its thread is *abandoned*: counted in
``abandoned`` and replaced by a fresh one. Daemon threads never block interpreter exit, which
is why this does not use ``ThreadPoolExecutor`` (its threads are joined at exit).

Async callables run on one persistent event loop in a daemon thread; a timeout cancels the
coroutine (``asyncio.timeout``, like ``wait_for`` but it tells our timeout apart from a
``TimeoutError`` raised by business code). If the loop itself is stuck (blocking code inside
``async def``, or a coroutine that swallows cancellation) the caller gives up after a grace
period and the loop is abandoned like a hung thread.
"""

from __future__ import annotations

import inspect
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, cast

from retryd.handlers.async_runner import AsyncCall, LoopRunner
from retryd.handlers.base import HandlerShutdown, Message, call_sequentially
from retryd.policy.classify import HandlerResult, classify_exception, timeout_result

logger = logging.getLogger(__name__)

# How long past its timeout an async call may take to acknowledge cancellation before the
# caller stops waiting and abandons the event loop.
ASYNC_CANCEL_GRACE_S = 1.0

_STOP = object()
_DONE = object()
# (exception or None, return value)
_Out = tuple[BaseException | None, Any]


def where(message: Message) -> str:
    return f"{message.topic}[{message.partition}]@{message.offset}"


def is_async_callable(func: Callable[..., Any]) -> bool:
    """True for ``async def`` functions, partials of them and objects with ``async __call__``."""
    if inspect.iscoroutinefunction(func):
        return True
    call = getattr(type(func), "__call__", None)  # noqa: B004 - the method, not callability
    return call is not None and inspect.iscoroutinefunction(call)


class _SyncWorker:
    """One daemon thread that runs the callable for one message at a time."""

    __slots__ = ("_abandoned", "_func", "_jobs", "_lock", "_owner", "_results", "thread")

    def __init__(self, owner: PythonHandler, func: Callable[[Message], Any], name: str) -> None:
        self._owner = owner
        self._func = func
        self._jobs: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._results: queue.SimpleQueue[_Out] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._abandoned = False
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        func, jobs, results = self._func, self._jobs, self._results
        while True:
            message = jobs.get()
            if message is _STOP:
                return
            if isinstance(message, _Batch):
                if not self._run_batch(message):
                    return
                continue
            out: _Out
            try:
                out = (None, func(message))
            except BaseException as exc:  # business code may raise anything; the caller sorts it
                out = (exc, None)
            with self._lock:
                if self._abandoned:
                    self._owner._late_return(message)
                    return
                results.put(out)
            del out, message

    def _run_batch(self, batch: _Batch) -> bool:
        """Run a batch's messages in order; False if this thread was abandoned meanwhile."""
        func = self._func
        for index, message in enumerate(batch.messages):
            if batch.stop or batch.cancel():
                break
            started = time.monotonic()
            batch.current = (index, started)
            out: tuple[BaseException | None, Any, float]
            try:
                value = func(message)
                out = (None, value, time.monotonic() - started)
            except BaseException as exc:  # business code may raise anything; the caller sorts it
                out = (exc, None, time.monotonic() - started)
            with self._lock:
                if self._abandoned:
                    self._owner._late_return(message)
                    return False
                batch.results.put(out)
            del out, message
        batch.results.put(_DONE)
        return True

    def start_batch(self, batch: _Batch) -> None:
        self._jobs.put(batch)

    def wait_batch(self, batch: _Batch, index: int, timeout: float) -> _Out | object | None:
        """Outcome of message ``index`` of the batch, ``_DONE`` when the batch stopped early,
        or None if that call overran ``timeout`` (this worker is then abandoned)."""
        while True:
            current, started = batch.current
            remaining = timeout - (time.monotonic() - started) if current == index else timeout
            try:
                return batch.results.get(timeout=max(remaining, 0.0))
            except queue.Empty:
                current, started = batch.current
                if current != index or time.monotonic() - started < timeout:
                    continue  # not started yet when we began waiting: wait its full timeout
                with self._lock:
                    try:  # finished between the timeout and taking the lock
                        return batch.results.get_nowait()
                    except queue.Empty:
                        self._abandoned = True
                        batch.stop = True
                        self._owner._count_abandoned(+1)
                        return None

    def call(self, message: Message, timeout: float) -> _Out | None:
        """The call's outcome, or None if it timed out (this worker is then abandoned)."""
        self._jobs.put(message)
        try:
            return self._results.get(timeout=timeout)
        except queue.Empty:
            with self._lock:
                try:  # finished between the timeout and taking the lock
                    return self._results.get_nowait()
                except queue.Empty:
                    self._abandoned = True
                    self._owner._count_abandoned(+1)
                    return None

    def stop(self) -> None:
        self._jobs.put(_STOP)


class _Batch:
    """Messages handed to one worker thread at once, so a fast handler runs ahead of the
    caller instead of paying a thread hand-off per message."""

    __slots__ = ("abandoned_at", "cancel", "current", "messages", "results", "stop")

    def __init__(self, messages: Sequence[Message], cancel: Callable[[], bool]) -> None:
        self.messages = messages
        self.cancel = cancel
        self.results: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.current: tuple[int, float] = (-1, 0.0)  # (index, monotonic start) of the running call
        self.stop = False
        self.abandoned_at: int | None = None  # index of the call that overran its timeout


def _returns(value: Any) -> Callable[[Message], Any]:
    """A factory handing back an awaitable a sync callable returned."""
    return lambda _message: value


class PythonHandler:
    """Handler for ``python:package.module:function`` specs.

    Thread-safe: concurrent calls each get their own worker thread (sync) or task (async).
    """

    def __init__(
        self,
        func: Callable[[Message], Any],
        *,
        timeout_s: float,
        non_retryable: Iterable[str] = (),
        name: str = "handler",
    ) -> None:
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s!r}")
        self._func = func
        self._timeout_s = float(timeout_s)
        self._non_retryable = frozenset(non_retryable)
        self._name = name
        self._is_async = is_async_callable(func)
        self._count_lock = threading.Lock()
        self._abandoned = 0
        self._idle: list[_SyncWorker] = []
        self._workers_started = 0
        self._runner: LoopRunner | None = None
        self._runner_lock = threading.Lock()
        self._closed = False

    @property
    def abandoned(self) -> int:
        return self._abandoned

    @property
    def timeout_s(self) -> float:
        return self._timeout_s

    def __call__(self, message: Message) -> HandlerResult:
        if self._is_async:
            return self._call_async(message, self._func, self._timeout_s)
        try:
            worker = self._idle.pop()
        except IndexError:
            worker = self._new_worker()
        start = time.monotonic()
        out = worker.call(message, self._timeout_s)
        if out is None:
            logger.warning(
                "%s: handler %s did not finish within %gs; abandoning its thread (%d abandoned)",
                where(message),
                self._name,
                self._timeout_s,
                self._abandoned,
            )
            return timeout_result(self._timeout_s)
        if self._closed:
            worker.stop()
        else:
            self._idle.append(worker)
        exc, value = out
        if exc is not None:
            return self._failed(message, exc)
        if inspect.isawaitable(value):  # a sync callable that hands back a coroutine
            remaining = max(self._timeout_s - (time.monotonic() - start), 0.001)
            return self._call_async(message, lambda _m: value, remaining)
        return HandlerResult.success()

    def call_many(
        self, messages: Sequence[Message], cancel: Callable[[], bool] = lambda: False
    ) -> Iterator[tuple[HandlerResult, float]]:
        """(result, seconds) for ``messages`` in order, each call with its own timeout.

        Sync handlers get the whole batch on their thread (no hand-off per message). ``cancel``
        is checked before each call starts; once it returns True, results stop after the calls
        already started, so the caller knows exactly which messages ran.
        """
        if self._is_async:
            yield from call_sequentially(self, messages, cancel)
            return
        yield from self._pipelined(messages, cancel)

    def _pipelined(
        self, messages: Sequence[Message], cancel: Callable[[], bool]
    ) -> Iterator[tuple[HandlerResult, float]]:
        start = 0
        while start < len(messages):
            try:
                worker = self._idle.pop()
            except IndexError:
                worker = self._new_worker()
            batch = _Batch(messages[start:], cancel)
            worker.start_batch(batch)
            try:
                yield from self._drain(worker, batch)
            except GeneratorExit:
                batch.stop = True  # the caller walked away: stop after the running call
                self._idle.append(worker)  # its queue is FIFO: a later job waits for that call
                raise
            if batch.abandoned_at is None:
                self._idle.append(worker)
                return
            start += batch.abandoned_at + 1  # the rest of the batch runs on a fresh thread

    def _drain(self, worker: _SyncWorker, batch: _Batch) -> Iterator[tuple[HandlerResult, float]]:
        for index, message in enumerate(batch.messages):
            out = worker.wait_batch(batch, index, self._timeout_s)
            if out is _DONE:  # cancelled before this message started
                return
            if out is None:
                logger.warning(
                    "%s: handler %s did not finish within %gs; abandoning its thread "
                    "(%d abandoned)",
                    where(message),
                    self._name,
                    self._timeout_s,
                    self._abandoned,
                )
                batch.abandoned_at = index
                yield timeout_result(self._timeout_s), self._timeout_s
                return
            exc, value, seconds = cast(tuple[BaseException | None, Any, float], out)
            try:
                if exc is not None:
                    result = self._failed(message, exc)
                elif value is not None and inspect.isawaitable(value):
                    result = self._call_async(message, _returns(value), self._timeout_s)
                else:
                    result = HandlerResult.success()
            except HandlerShutdown:
                batch.stop = True
                raise
            yield result, seconds
        worker.wait_batch(batch, len(batch.messages), self._timeout_s)  # its end marker

    def close(self) -> None:
        """Stop idle workers and the event loop; abandoned threads die with the process."""
        self._closed = True
        while self._idle:
            self._idle.pop().stop()
        with self._runner_lock:
            runner, self._runner = self._runner, None
        if runner is not None:
            runner.stop()
            runner.thread.join(timeout=1.0)

    # -- sync ---------------------------------------------------------------------------------

    def _new_worker(self) -> _SyncWorker:
        with self._count_lock:
            self._workers_started += 1
            number = self._workers_started
        return _SyncWorker(self, self._func, f"retryd-handler-{self._name}-{number}")

    def _count_abandoned(self, delta: int) -> None:
        with self._count_lock:
            self._abandoned += delta

    def _late_return(self, message: Message) -> None:
        """An abandoned call finally returned: its thread exits."""
        self._count_abandoned(-1)
        logger.info(
            "%s: abandoned handler call %s returned late (%d still abandoned)",
            where(message),
            self._name,
            self._abandoned,
        )

    def _failed(self, message: Message, exc: BaseException) -> HandlerResult:
        if isinstance(exc, KeyboardInterrupt | SystemExit):
            raise HandlerShutdown(
                f"{where(message)}: handler {self._name} raised {type(exc).__name__}"
            ) from exc
        result = classify_exception(exc, self._non_retryable)
        logger.debug(
            "%s: handler %s raised %s (%s)",
            where(message),
            self._name,
            result.error_class,
            result.outcome.value,
            exc_info=exc,
        )
        return result

    # -- async --------------------------------------------------------------------------------

    def _get_runner(self) -> LoopRunner:
        with self._runner_lock:
            if self._runner is None:
                with self._count_lock:
                    self._workers_started += 1
                    number = self._workers_started
                self._runner = LoopRunner(self, f"retryd-handler-{self._name}-loop-{number}")
            return self._runner

    def _call_async(
        self, message: Message, factory: Callable[[Message], Any], timeout: float
    ) -> HandlerResult:
        runner = self._get_runner()
        call = AsyncCall(message)
        if not runner.submit(call, factory, timeout):
            return timeout_result(timeout)
        if not runner.wait(call, timeout + ASYNC_CANCEL_GRACE_S):
            with self._runner_lock:
                if self._runner is runner:
                    self._runner = None  # the next call gets a fresh loop
            logger.warning(
                "%s: async handler %s still running %gs after its timeout was cancelled; "
                "abandoning its event loop (%d abandoned)",
                where(message),
                self._name,
                ASYNC_CANCEL_GRACE_S,
                self._abandoned,
            )
            return timeout_result(timeout)
        if call.result is None:
            logger.warning(
                "%s: async handler %s did not finish within %gs; cancelled",
                where(message),
                self._name,
                timeout,
            )
            return timeout_result(timeout)
        exc, _value = call.result
        if exc is not None:
            return self._failed(message, exc)
        return HandlerResult.success()
