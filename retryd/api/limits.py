"""Bounded resources per request: body size, and a fixed share of threads per route group.

Body size: a request body larger than ``sidecar_max_body_bytes`` is refused with 413 before
anything parses it: at once when ``Content-Length`` says so, otherwise (chunked) as soon as the
bytes received pass the limit. Bodies within the limit are read here (at most the limit is
held) and handed on unchanged.

Route groups: a broker-bound route blocks a thread for as long as Kafka takes to answer, which
is long when the broker is down. Every group (``browse``: the GET /v1/failed routes,
``replay``: POST replay and POST /v1/replays, ``metrics``, ``circuit``: /v1/circuit, which
reads and writes small files in the state dir) has its own ``Bulkhead``: at most
``capacity`` requests in it at once, each running its blocking part on a thread of the group's
own limiter. A request that finds its group full is answered 503 with ``Retry-After`` at
once instead of queueing without bound, and no group can take the threads of another, or of
``/healthz`` (which runs on the event loop and needs no thread at all).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from typing import Any, TypeVar

import anyio
import anyio.to_thread
from fastapi import Request

from retryd.api.asgi import ASGIApp, Message, Receive, Scope, Send, header, reply

T = TypeVar("T")
RETRY_AFTER_S = 1
SCOPE_KEY = "retryd.bulkhead"
_READS = frozenset({"GET", "HEAD"})
GROUPS: tuple[tuple[str, frozenset[str], re.Pattern[str]], ...] = (
    ("browse", _READS, re.compile(r"/v1/failed(?:/[^/]+/[^/]+)?/?")),
    ("replay", frozenset({"POST"}), re.compile(r"/v1/(?:failed/[^/]+/[^/]+/replay|replays)/?")),
    ("metrics", _READS, re.compile(r"/metrics/?")),
    ("circuit", _READS | {"POST"}, re.compile(r"/v1/circuit/?")),
    # The explorer's pages that read or replay dead letters share the API's groups.
    ("browse", _READS, re.compile(r"/ui/(?:dead-letters(?:/[^/]+/[^/]+)?/?)?")),
    ("replay", frozenset({"POST"}), re.compile(r"/ui/replay(?:/dry-run)?/?")),
)


def route_group(method: str, path: str) -> str | None:
    for name, methods, pattern in GROUPS:
        if method in methods and pattern.fullmatch(path):
            return name
    return None


class Bulkhead:
    """At most ``capacity`` requests of one route group at a time, on their own threads.

    ``active`` is only touched on the event loop, so it needs no lock.
    """

    def __init__(self, name: str, capacity: int) -> None:
        self.name = name
        self.capacity = capacity
        self.active = 0
        self.rejected = 0
        self.limiter = anyio.CapacityLimiter(capacity)

    def try_enter(self) -> bool:
        if self.active >= self.capacity:
            self.rejected += 1
            return False
        self.active += 1
        return True

    def leave(self) -> None:
        self.active -= 1


def bulkheads(
    capacity: int, metrics_capacity: int = 4, circuit_capacity: int = 2
) -> dict[str, Bulkhead]:
    return {
        "browse": Bulkhead("browse", capacity),
        "replay": Bulkhead("replay", capacity),
        "metrics": Bulkhead("metrics", metrics_capacity),
        "circuit": Bulkhead("circuit", circuit_capacity),
    }


class AdmissionMiddleware:
    """Admits a request into its route group's bulkhead, or answers 503 + Retry-After."""

    def __init__(self, app: ASGIApp, groups: dict[str, Bulkhead]) -> None:
        self.app = app
        self.groups = groups

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope.get("type") != "http":
            await self.app(scope, receive, send)
            return
        name = route_group(str(scope.get("method", "")), str(scope.get("path", "")))
        group = self.groups.get(name) if name is not None else None
        if group is None:
            await self.app(scope, receive, send)
            return
        if not group.try_enter():
            await reply(
                send,
                503,
                "busy",
                f"{group.capacity} {group.name} requests are already in progress; "
                f"retry after {RETRY_AFTER_S}s",
                {"Retry-After": str(RETRY_AFTER_S)},
            )
            return
        scope[SCOPE_KEY] = group
        try:
            await self.app(scope, receive, send)
        finally:
            group.leave()


async def offload(request: Request, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Run blocking ``fn`` on a thread of the request's bulkhead (the default pool if none)."""
    group = request.scope.get(SCOPE_KEY)
    limiter = group.limiter if isinstance(group, Bulkhead) else None
    return await anyio.to_thread.run_sync(functools.partial(fn, *args, **kwargs), limiter=limiter)


class BodyLimitMiddleware:
    """413 for request bodies over ``max_bytes`` (see the module docstring)."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope.get("type") != "http":
            await self.app(scope, receive, send)
            return
        length = header(scope, b"content-length")
        chunked = header(scope, b"transfer-encoding") is not None
        if length is None and not chunked:
            await self.app(scope, receive, send)  # no body
            return
        if length is not None and length.strip().isdigit() and int(length) > self.max_bytes:
            await self._too_large(send)
            return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client went away
                await self.app(scope, _replay([message], receive), send)
                return
            chunk = bytes(message.get("body", b""))
            size += len(chunk)
            if size > self.max_bytes:
                await self._too_large(send)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        whole: Message = {"type": "http.request", "body": b"".join(chunks), "more_body": False}
        await self.app(scope, _replay([whole], receive), send)

    async def _too_large(self, send: Send) -> None:
        await reply(
            send,
            413,
            "payload_too_large",
            f"the request body is larger than {self.max_bytes} bytes (sidecar_max_body_bytes)",
            {"Connection": "close"},
        )


def _replay(first: list[Message], receive: Receive) -> Receive:
    """A ``receive`` that returns ``first`` and then defers to the real one."""
    pending = list(first)

    async def inner() -> Message:
        if pending:
            return pending.pop(0)
        return await receive()

    return inner
