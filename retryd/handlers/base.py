"""What a handler receives, and the two shapes of handler adapter the worker can drive.

``Message`` is a light view: over a consumed record it reads key, value, headers and timestamp
from the client's message object only when business code asks for them, so a handler that
looks at two fields does not pay for eleven. Built from fields (replays, tests, the HTTP
adapter's own tests) it simply holds them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

from retryd.policy.classify import HandlerResult
from retryd.policy.headers import message_headers

Headers = list[tuple[str, bytes | None]]


class Message:
    """A Kafka record as handed to business code.

    ``topic/partition/offset`` are where this copy was consumed (a main topic or a tier);
    ``original_*`` are where the message first entered retryd; ``retry_number`` is how many
    retries this copy has had scheduled (0 on a main topic).
    """

    __slots__ = (
        "_env",
        "_fields",
        "_hdrs",
        "_raw",
        "_trace",  # the call's trace when tracing is on (retryd.tracing); never set otherwise
        "offset",
        "partition",
        "topic",
    )

    _trace: Any  # retryd.tracing.context.AttemptTrace, set by a traced call only

    def __init__(
        self,
        key: bytes | None = None,
        value: bytes | None = None,
        headers: Sequence[tuple[str, bytes | None]] | None = None,
        topic: str = "",
        partition: int = 0,
        offset: int = 0,
        timestamp: int = 0,
        retry_number: int = 0,
        original_topic: str = "",
        original_partition: int = 0,
        original_offset: int = 0,
    ) -> None:
        self._raw: Any = None
        self._env: Any = None
        self._hdrs: tuple[Headers, str | None] | None = None
        self._fields: tuple[Any, ...] = (
            key,
            value,
            list(headers or ()),
            timestamp,
            retry_number,
            original_topic or topic,
            original_partition,
            original_offset,
        )
        self.topic = topic
        self.partition = partition
        self.offset = offset

    # The worker builds views with ``Message.__new__`` and sets the slots directly (see
    # ``retryd.worker.intake``): a constructor call with keyword defaults costs more than the
    # rest of the per-message work.

    @property
    def key(self) -> bytes | None:
        raw = self._raw
        return raw.key() if raw is not None else self._fields[0]

    @property
    def value(self) -> bytes | None:
        raw = self._raw
        return raw.value() if raw is not None else self._fields[1]

    @property
    def headers(self) -> Headers:
        """The record's headers. Read from the client once and kept: confluent-kafka's
        ``headers()`` raises on a header name that is not UTF-8 and, asked again, returns a
        list whose tuples for such names hold NULL (touching one crashes the interpreter).
        Names it cannot decode are left out (``headers_problem`` says so)."""
        raw = self._raw
        if raw is not None:
            hdrs = self._hdrs
            if hdrs is None:
                hdrs = self._hdrs = message_headers(raw)
            return hdrs[0]
        return self._fields[2]

    @property
    def headers_problem(self) -> str | None:
        """Why some of the record's headers could not be read (None when all could)."""
        if self._raw is None:
            return None
        self.headers  # noqa: B018 - reads and keeps them
        assert self._hdrs is not None
        return self._hdrs[1]

    @property
    def timestamp(self) -> int:
        raw = self._raw
        if raw is not None:
            return raw.timestamp()[1]
        return self._fields[3]

    @property
    def retry_number(self) -> int:
        if self._raw is not None:
            env = self._env
            return env.retry_number if env is not None else 0
        return self._fields[4]

    @property
    def original_topic(self) -> str:
        if self._raw is not None:
            env = self._env
            return env.original_topic if env is not None else self.topic
        return self._fields[5]

    @property
    def original_partition(self) -> int:
        if self._raw is not None:
            env = self._env
            return env.original_partition if env is not None else self.partition
        return self._fields[6]

    @property
    def original_offset(self) -> int:
        if self._raw is not None:
            env = self._env
            return env.original_offset if env is not None else self.offset
        return self._fields[7]

    def header(self, name: str) -> bytes | None:
        """Last value of header ``name`` (Kafka allows repeats; the last one wins), or None."""
        found = None
        for key, value in self.headers:
            if key == name:
                found = value
        return found

    @property
    def where(self) -> str:
        """``topic[partition]@offset``, for log lines."""
        return f"{self.topic}[{self.partition}]@{self.offset}"

    def __repr__(self) -> str:
        return f"Message({self.where}, retry_number={self.retry_number})"


@runtime_checkable
class SyncHandler(Protocol):
    """Calls blocking business code on a pool thread. ``call`` never raises: every outcome,
    exceptions of any kind included, is a ``HandlerResult``. The pool enforces the timeout."""

    timeout_s: float

    def call(self, message: Message) -> HandlerResult: ...

    def close(self) -> None: ...


@runtime_checkable
class AsyncHandler(Protocol):
    """Calls business code (or an HTTP endpoint) on the worker's event loop. ``acall`` never
    raises except ``asyncio.CancelledError`` when its timeout cancels it."""

    timeout_s: float

    async def acall(self, message: Message) -> HandlerResult: ...

    async def aclose(self) -> None: ...


@runtime_checkable
class SyncBatchHandler(Protocol):
    """Calls blocking business code with many records at once, on a pool thread: one call for
    up to ``max_batch`` ready records, one ``HandlerResult`` per record, in the order given.
    Each record then goes its own way (success, its own retry tiers, its own dead letter), so
    a batch call is never all-or-nothing. ``call_batch`` never raises: a failure of the whole
    call is that result for every record. The pool enforces ``timeout_s`` per call."""

    timeout_s: float
    max_batch: int

    def call_batch(self, messages: Sequence[Message]) -> Sequence[HandlerResult]: ...

    def close(self) -> None: ...


@runtime_checkable
class AsyncBatchHandler(Protocol):
    """``SyncBatchHandler`` on the worker's event loop (an ``async def handle_batch``, or the
    HTTP adapter's bulk mode: one request carrying many records, per-record outcomes in the
    answer). ``acall_batch`` never raises except ``asyncio.CancelledError`` on timeout."""

    timeout_s: float
    max_batch: int

    async def acall_batch(self, messages: Sequence[Message]) -> Sequence[HandlerResult]: ...

    async def aclose(self) -> None: ...


Handler = SyncHandler | AsyncHandler | SyncBatchHandler | AsyncBatchHandler


def is_async_handler(handler: Handler) -> bool:
    return hasattr(handler, "acall") or hasattr(handler, "acall_batch")


def is_batch_handler(handler: Handler) -> bool:
    return hasattr(handler, "call_batch") or hasattr(handler, "acall_batch")
