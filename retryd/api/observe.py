"""Request metrics as pure ASGI middleware, outermost, so every answer is counted: the
handlers', and the 401/403/413/503 that the other middlewares give before routing.

The ``route`` label is the template of the route the path matches (``/v1/failed/{partition}/
{offset}``), found by matching the app's own routes when routing did not run, or
``unmatched``; ``method`` and ``status`` are bounded in ``retryd.metrics.http``. Nothing a
client sends becomes a label value.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from starlette.routing import BaseRoute, Match

from retryd.api.asgi import ASGIApp, Message, Receive, Scope, Send
from retryd.metrics.http import UNMATCHED, observe_request


def route_template(scope: Scope, routes: Sequence[BaseRoute]) -> str:
    route = scope.get("route")
    path = getattr(route, "path", None)
    if isinstance(path, str):
        return path
    probe = {**scope, "type": "http"}
    for candidate in routes:
        match, _ = candidate.matches(probe)
        if match is not Match.NONE:
            found = getattr(candidate, "path", None)
            if isinstance(found, str):
                return found
    return UNMATCHED


class RequestMetricsMiddleware:
    def __init__(self, app: ASGIApp, routes: Sequence[BaseRoute]) -> None:
        self.app = app
        self.routes = routes  # the app's route list (read when a request is counted)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope.get("type") != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500

        async def counting_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, counting_send)
        finally:
            observe_request(
                str(scope.get("method", "")),
                route_template(scope, self.routes),
                status,
                time.perf_counter() - started,
            )
