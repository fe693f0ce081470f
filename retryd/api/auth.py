"""Bearer-token protection of ``/v1`` with scopes, checked before routing: every /v1 request
without a valid token gets 401 and every one whose token lacks the scope 403, whatever else is
wrong with it, and nothing is disabled silently. Rejections are counted by reason
(``retryd_http_auth_failures_total``). The accepted token is left in the ASGI scope
(``SCOPE_KEY``) for the audit trail."""

from __future__ import annotations

from fastapi import Request
from fastapi.security import HTTPBearer

from retryd.api.asgi import ASGIApp, Receive, Scope, Send, header, reply
from retryd.api.credentials import CIRCUIT, READ, REPLAY, ApiToken, Credentials
from retryd.metrics.http import count_auth_failure

PROTECTED_PREFIX = "/v1"
SCOPE_KEY = "retryd.token"
# Documents the scheme in OpenAPI; enforcement is the middleware below.
bearer_scheme = HTTPBearer(
    auto_error=False,
    description="Authorization: Bearer <token>; read scope for GET, circuit scope for POST "
    "/v1/circuit, replay scope for the rest",
)
_READ_METHODS = frozenset({"GET", "HEAD"})
CIRCUIT_PATHS = frozenset({"/v1/circuit", "/v1/circuit/"})


def required_scope(method: str, path: str = "") -> str:
    """Reading needs ``read``; ordering the circuit breaker needs ``circuit``; anything else
    that may change something needs ``replay``."""
    if method.upper() in _READ_METHODS:
        return READ
    return CIRCUIT if path in CIRCUIT_PATHS else REPLAY


def protected(path: str) -> bool:
    return path == PROTECTED_PREFIX or path.startswith(PROTECTED_PREFIX + "/")


def token_of(request: Request) -> ApiToken | None:
    """The token that authenticated this request (set by the middleware)."""
    token = request.scope.get(SCOPE_KEY)
    return token if isinstance(token, ApiToken) else None


def actor_of(request: Request) -> str:
    token = token_of(request)
    return token.id if token is not None else "anonymous"


class BearerAuthMiddleware:
    """Pure ASGI middleware (no body buffering)."""

    def __init__(self, app: ASGIApp, credentials: Credentials) -> None:
        self.app = app
        self.credentials = credentials

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope.get("type") != "http" or not protected(str(scope.get("path", ""))):
            await self.app(scope, receive, send)
            return
        if not self.credentials.enabled:
            await reply(
                send,
                503,
                "disabled",
                "disabled: no api_token configured (set RETRYD_API_TOKEN(S) to enable /v1)",
            )
            return
        token, reason = self.credentials.authenticate(header(scope, b"authorization"))
        if token is None:
            count_auth_failure(reason)
            detail = (
                "missing Authorization: Bearer <token>"
                if reason == "missing_token"
                else "invalid bearer token"
            )
            await reply(send, 401, "unauthorized", detail, {"WWW-Authenticate": _CHALLENGE})
            return
        method = str(scope.get("method", "GET"))
        needed = required_scope(method, str(scope.get("path", "")))
        if not token.allows(needed):
            count_auth_failure("insufficient_scope")
            await reply(
                send,
                403,
                "forbidden",
                f"token {token.id} has scope {token.scope}; {method} needs scope {needed}",
                {"WWW-Authenticate": f'{_CHALLENGE}, error="insufficient_scope"'},
            )
            return
        scope[SCOPE_KEY] = token
        await self.app(scope, receive, send)


_CHALLENGE = 'Bearer realm="retryd"'
