"""Plain ASGI building blocks shared by the sidecar's middlewares.

The middlewares are pure ASGI (no ``BaseHTTPMiddleware``): they run before FastAPI's routing
and validation, cost microseconds per request, never buffer more than they must, and answer
with the same JSON error body as the rest of the API.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


def header(scope: Scope, name: bytes) -> bytes | None:
    """The first value of a request header (``name`` in lower case), or None."""
    for key, value in scope.get("headers") or ():
        if key.lower() == name:
            return bytes(value)
    return None


async def reply(
    send: Send,
    status: int,
    error: str,
    detail: str,
    headers: dict[str, str] | None = None,
) -> None:
    """Send a complete JSON error response ``{"error", "detail", "problems": []}``."""
    body = json.dumps({"error": error, "detail": detail, "problems": []}).encode()
    raw = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
    ]
    raw.extend(
        (k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in (headers or {}).items()
    )
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})
