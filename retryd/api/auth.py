"""Bearer-token protection of ``/v1``: checked before routing, so every /v1 request without
a valid token gets 401 whatever else is wrong with it, and nothing is disabled silently."""

from __future__ import annotations

import hmac
import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from fastapi.security import HTTPBearer

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

PROTECTED_PREFIX = "/v1"
# Documents the scheme in OpenAPI; enforcement is the middleware below.
bearer_scheme = HTTPBearer(auto_error=False, description="Authorization: Bearer <api_token>")


def token_matches(header: bytes | None, token: bytes) -> bool:
    """Constant-time comparison of ``Authorization: Bearer <token>``."""
    if not header:
        return False
    scheme, _, given = header.partition(b" ")
    if scheme.lower() != b"bearer":
        return False
    return hmac.compare_digest(given.strip(), token)


def _authorization(scope: Scope) -> bytes | None:
    for name, value in scope.get("headers") or ():
        if name.lower() == b"authorization":
            return bytes(value)
    return None


class BearerAuthMiddleware:
    """Pure ASGI middleware (no body buffering)."""

    def __init__(self, app: ASGIApp, token: str | None) -> None:
        self.app = app
        self.token = token.encode("utf-8") if token else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = str(scope.get("path", ""))
        if scope.get("type") != "http" or not (
            path == PROTECTED_PREFIX or path.startswith(PROTECTED_PREFIX + "/")
        ):
            await self.app(scope, receive, send)
            return
        if self.token is None:
            await _reply(
                send,
                503,
                "disabled",
                "disabled: no api_token configured (set RETRYD_API_TOKEN to enable /v1)",
            )
            return
        header = _authorization(scope)
        if header is None:
            await _reply(send, 401, "unauthorized", "missing Authorization: Bearer <token>")
            return
        if not token_matches(header, self.token):
            await _reply(send, 401, "unauthorized", "invalid bearer token")
            return
        await self.app(scope, receive, send)


async def _reply(send: Send, status: int, error: str, detail: str) -> None:
    body = json.dumps({"error": error, "detail": detail, "problems": []}).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
    ]
    if status == 401:
        headers.append((b"www-authenticate", b'Bearer realm="retryd"'))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
