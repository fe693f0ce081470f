"""What a handler receives and the interface every handler kind implements."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from retryd.policy.classify import HandlerResult


@dataclass(frozen=True, slots=True)
class Message:
    """A Kafka record as handed to business code.

    ``topic/partition/offset`` are where this copy was consumed (a main topic or a tier);
    ``original_*`` are where the message first entered retryd.
    """

    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes | None]] = field(default_factory=list)
    topic: str = ""
    partition: int = 0
    offset: int = 0
    timestamp: int = 0
    retry_number: int = 0
    original_topic: str = ""
    original_partition: int = 0
    original_offset: int = 0

    def header(self, name: str) -> bytes | None:
        found = None
        for key, value in self.headers:
            if key == name:
                found = value
        return found


class Handler(Protocol):
    """Calls business code. Never raises for business failures: returns a HandlerResult.

    ``HandlerShutdown`` may escape when business code asked the process to exit.
    """

    def __call__(self, message: Message) -> HandlerResult: ...

    def call_many(
        self, messages: Sequence[Message], cancel: Callable[[], bool] = ...
    ) -> Iterator[tuple[HandlerResult, float]]:
        """(result, seconds) in order; stops early, after the calls already started, once
        ``cancel()`` is true."""
        ...

    def close(self) -> None: ...

    @property
    def abandoned(self) -> int:
        """Calls that timed out and are still running somewhere (hung business code)."""
        ...


class HandlerShutdown(Exception):
    """Business code raised KeyboardInterrupt/SystemExit: stop the worker, do not ack."""


def call_sequentially(
    handler: Handler, messages: Sequence[Message], cancel: Callable[[], bool]
) -> Iterator[tuple[HandlerResult, float]]:
    """``call_many`` for handlers with nothing to gain from batching (one call at a time)."""
    for message in messages:
        if cancel():
            return
        started = time.perf_counter()
        result = handler(message)
        yield result, time.perf_counter() - started
