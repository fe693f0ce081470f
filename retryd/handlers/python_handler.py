"""Adapters for in-process Python callables (``python:package.module:function`` specs).

``SyncPythonHandler`` runs a plain function on one of the worker's pool threads;
``AsyncPythonHandler`` awaits an ``async def`` on the worker's event loop. Neither enforces the
timeout itself (the pool does: it abandons a hung thread, or cancels the coroutine), and
neither raises: whatever business code raises, ``KeyboardInterrupt`` and ``SystemExit``
included, becomes a ``HandlerResult`` (a record must never be able to stop a worker).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Callable, Iterable
from typing import Any

from retryd.handlers.base import AsyncHandler, Message, SyncHandler
from retryd.policy.classify import Classifier, HandlerResult, timeout_result

logger = logging.getLogger(__name__)

_SUCCESS = HandlerResult.success()


def is_async_callable(func: Callable[..., Any]) -> bool:
    """True for ``async def`` functions, partials of them and objects with ``async __call__``."""
    if inspect.iscoroutinefunction(func):
        return True
    call = getattr(type(func), "__call__", None)  # noqa: B004 - the method, not callability
    return call is not None and inspect.iscoroutinefunction(call)


class _Failures:
    """Exception -> result, logged once per call at DEBUG (failures are normal traffic)."""

    def __init__(self, name: str, non_retryable: Iterable[str]) -> None:
        self.name = name
        self._classify = Classifier(non_retryable)

    def __call__(self, message: Message, exc: BaseException) -> HandlerResult:
        result = self._classify(exc)
        if isinstance(exc, KeyboardInterrupt | SystemExit):
            logger.warning(
                "%s: handler %s raised %s; treated as a retryable failure (a record cannot "
                "stop the worker: stop it with SIGTERM)",
                message.where,
                self.name,
                type(exc).__name__,
            )
        else:
            logger.debug(
                "%s: handler %s raised %s (%s)",
                message.where,
                self.name,
                result.error_class,
                result.outcome.value,
                exc_info=exc,
            )
        return result


class _Adapter:
    """What both Python adapters hold: the callable, its timeout and failure classification."""

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
        self.timeout_s = float(timeout_s)
        self.name = name
        self._failed = _Failures(name, non_retryable)


class SyncPythonHandler(_Adapter):
    """A blocking callable, called on a pool thread (``SyncHandler``)."""

    def call(self, message: Message) -> HandlerResult:
        try:
            value = self._func(message)
        except BaseException as exc:  # business code may raise anything
            return self._failed(message, exc)
        if value is not None and inspect.isawaitable(value):
            return self._await(message, value)
        return _SUCCESS

    def _await(self, message: Message, awaitable: Any) -> HandlerResult:
        """A sync callable that hands back a coroutine: run it here, on this pool thread."""

        async def run() -> Any:
            async with asyncio.timeout(self.timeout_s):
                return await awaitable

        try:
            asyncio.run(run())
        except TimeoutError:
            return timeout_result(self.timeout_s)
        except BaseException as exc:
            return self._failed(message, exc)
        return _SUCCESS

    def close(self) -> None:
        pass


class AsyncPythonHandler(_Adapter):
    """An ``async def`` callable, awaited on the worker's event loop (``AsyncHandler``)."""

    async def acall(self, message: Message) -> HandlerResult:
        try:
            await self._func(message)
        except asyncio.CancelledError as exc:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # our timeout (or shutdown) cancelling the call
            return self._failed(message, exc)  # business code raised it itself
        except GeneratorExit:
            raise  # the call is being closed (its abandoned loop stopped): no answer at all
        except BaseException as exc:  # business code may raise anything
            return self._failed(message, exc)
        return _SUCCESS

    async def aclose(self) -> None:
        pass


def PythonHandler(
    func: Callable[[Message], Any],
    *,
    timeout_s: float,
    non_retryable: Iterable[str] = (),
    name: str = "handler",
) -> SyncHandler | AsyncHandler:
    """The adapter that fits ``func``: async for ``async def`` callables, sync otherwise."""
    cls: Any = AsyncPythonHandler if is_async_callable(func) else SyncPythonHandler
    handler: SyncHandler | AsyncHandler = cls(
        func, timeout_s=timeout_s, non_retryable=non_retryable, name=name
    )
    return handler
