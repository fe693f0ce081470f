"""Adapters for in-process batch callables (``python:package.module:function`` with
``handler_batch`` > 0): ``handle_batch(records: list[Message]) -> Sequence[outcome]``.

One call answers for many ready records, one outcome per record, in the order given:

- ``None`` or ``True``: success;
- an exception *instance*: classified exactly as if it had been raised (retryable, or dead
  when its class is in ``non_retryable`` or derives from ``NonRetryableError``);
- ``retryd.Retry("reason")`` / ``retryd.Dead("reason")``: retry / dead letter, with the
  reason as the error class.

Why per record and not all-or-nothing: each record then takes its own way (success, its own
tiers, its own dead letter), so one poison record does not drag a batch of good ones through
the retry tiers. A call that raises, or an answer that is not one outcome per record (wrong
length, an unknown outcome), gives that one result to every record of the call: the batch's
outcome is unknown, so every record is retried (or dead-lettered, for a non-retryable
exception). Such a mistake is logged once per kind (it is a bug in the handler, not traffic),
naming the first record of the call. A call that returns ``None`` as a whole answered "all
succeeded", like a per-record handler that returns nothing.

Neither adapter enforces the timeout (the batch pools do) and neither raises.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from retryd.handlers.base import AsyncBatchHandler, Message, SyncBatchHandler
from retryd.handlers.python_handler import is_async_callable
from retryd.outcomes import Dead, Retry
from retryd.policy.classify import Classifier, HandlerResult, Outcome

logger = logging.getLogger(__name__)

_SUCCESS = HandlerResult.success()
BAD_ANSWER = "handler_bad_answer"  # error class of a call whose answer could not be read


class _BatchAdapter:
    """What both batch adapters share: the callable, its limits, and turning an answer into
    one ``HandlerResult`` per record."""

    def __init__(
        self,
        func: Callable[[list[Message]], Any],
        *,
        timeout_s: float,
        max_batch: int,
        non_retryable: Iterable[str] = (),
        name: str = "handler",
    ) -> None:
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s!r}")
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch!r}")
        self._func = func
        self.timeout_s = float(timeout_s)
        self.max_batch = int(max_batch)
        self.name = name
        self._classify = Classifier(non_retryable)
        self._logged: set[tuple[str, str]] = set()
        self._log_lock = threading.Lock()

    def _once(self, kind: tuple[str, str], messages: Sequence[Message], text: str) -> None:
        """Log a handler mistake at ERROR the first time it happens (DEBUG afterwards): a bug
        repeats on every call, and one line says it as well as a million."""
        with self._log_lock:
            first = kind not in self._logged
            self._logged.add(kind)
        where = messages[0].where if messages else "-"
        logger.log(
            logging.ERROR if first else logging.DEBUG,
            "%s (+%d more): batch handler %s %s; every record of the call gets that result",
            where,
            len(messages) - 1,
            self.name,
            text,
        )

    def _raised(self, messages: Sequence[Message], exc: BaseException) -> list[HandlerResult]:
        result = self._classify(exc)
        if isinstance(exc, KeyboardInterrupt | SystemExit):
            text = f"raised {type(exc).__name__}: a retryable failure (stop it with SIGTERM)"
        else:
            text = f"raised {result.error_class} ({result.outcome.value}): {result.error_message}"
        self._once(("raised", result.error_class or ""), messages, text)
        return [result] * len(messages)

    def _bad(self, messages: Sequence[Message], kind: str, text: str) -> list[HandlerResult]:
        self._once(("answer", kind), messages, text)
        result = HandlerResult(Outcome.RETRY, BAD_ANSWER, text[:512])
        return [result] * len(messages)

    def _results(self, messages: Sequence[Message], answer: Any) -> list[HandlerResult]:
        n = len(messages)
        if answer is None:
            return [_SUCCESS] * n
        if isinstance(answer, str | bytes) or not isinstance(answer, Sequence):
            return self._bad(
                messages,
                f"type:{type(answer).__name__}",
                f"returned a {type(answer).__name__}, not a sequence of one outcome per record",
            )
        if len(answer) != n:
            return self._bad(
                messages,
                "length",
                f"returned {len(answer)} outcomes for {n} records",
            )
        out = [_SUCCESS if o is None or o is True else o for o in answer]
        for i, o in enumerate(out):
            if o is _SUCCESS:
                continue
            if isinstance(o, BaseException):
                out[i] = self._classify(o)
            elif isinstance(o, Retry):
                out[i] = HandlerResult(Outcome.RETRY, o.reason or "retry", o.reason or None)
            elif isinstance(o, Dead):
                out[i] = HandlerResult(Outcome.DEAD, o.reason or "dead", o.reason or None)
            else:
                return self._bad(
                    messages,
                    f"outcome:{type(o).__name__}",
                    f"returned {o!r} for {messages[i].where} (expected None, True, an "
                    "exception, retryd.Retry or retryd.Dead)",
                )
        return out


class SyncPythonBatchHandler(_BatchAdapter):
    """A blocking ``handle_batch``, called on a pool thread (``SyncBatchHandler``)."""

    def call_batch(self, messages: Sequence[Message]) -> Sequence[HandlerResult]:
        batch = list(messages)
        try:
            answer = self._func(batch)
        except BaseException as exc:  # business code may raise anything
            return self._raised(batch, exc)
        try:
            return self._results(batch, answer)
        except BaseException as exc:  # an answer whose len() or iteration raises
            return self._raised(batch, exc)

    def close(self) -> None:
        pass


class AsyncPythonBatchHandler(_BatchAdapter):
    """An ``async def handle_batch``, awaited on the worker's event loop
    (``AsyncBatchHandler``)."""

    async def acall_batch(self, messages: Sequence[Message]) -> Sequence[HandlerResult]:
        batch = list(messages)
        try:
            answer = await self._func(batch)
        except asyncio.CancelledError as exc:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # our timeout (or shutdown) cancelling the call
            return self._raised(batch, exc)  # business code raised it itself
        except GeneratorExit:
            raise  # the call is being closed (its abandoned loop stopped): no answer at all
        except BaseException as exc:  # business code may raise anything
            return self._raised(batch, exc)
        try:
            return self._results(batch, answer)
        except BaseException as exc:
            return self._raised(batch, exc)

    async def aclose(self) -> None:
        pass


def PythonBatchHandler(
    func: Callable[[list[Message]], Any],
    *,
    timeout_s: float,
    max_batch: int,
    non_retryable: Iterable[str] = (),
    name: str = "handler",
) -> SyncBatchHandler | AsyncBatchHandler:
    """The batch adapter that fits ``func``: async for ``async def``, sync otherwise."""
    cls: Any = AsyncPythonBatchHandler if is_async_callable(func) else SyncPythonBatchHandler
    handler: SyncBatchHandler | AsyncBatchHandler = cls(
        func, timeout_s=timeout_s, max_batch=max_batch, non_retryable=non_retryable, name=name
    )
    return handler
