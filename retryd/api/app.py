"""The sidecar FastAPI application: ``create_app(settings)``."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request, Response

from retryd import __version__
from retryd.api import errors, routes_health, routes_v1
from retryd.api.auth import BearerAuthMiddleware
from retryd.api.state import Sidecar
from retryd.config import Settings
from retryd.metrics.exposition import observe_request

DESCRIPTION = """\
Health, Prometheus metrics and replay of dead-lettered messages for a retryd deployment.

`/v1` needs `Authorization: Bearer <api_token>`; without a configured token it answers 503.
Every error is JSON: `{"error": code, "detail": sentence, "problems": [one line per field]}`.
"""


def create_app(settings: Settings, sidecar: Sidecar | None = None) -> FastAPI:
    state = sidecar or Sidecar(settings)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        from retryd.metrics.registry import mark_build_info

        mark_build_info()
        state.start()
        try:
            yield
        finally:
            state.close()

    app = FastAPI(
        title="retryd sidecar",
        version=__version__,
        description=DESCRIPTION,
        lifespan=lifespan,
    )
    app.state.sidecar = state
    errors.install(app)
    app.include_router(routes_health.router)
    app.include_router(routes_v1.router)
    # The leaf routes (full paths), for the Allow header of 405 answers.
    app.state.api_routes = [*routes_health.router.routes, *routes_v1.router.routes]

    @app.middleware("http")
    async def count_requests(
        request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        started = time.perf_counter()
        status = 500
        try:
            response = await call_next(request)
            status = response.status_code
            return response
        finally:
            route = request.scope.get("route")
            template = getattr(route, "path", None) or (
                "/v1/*" if request.url.path.startswith("/v1") else "unmatched"
            )
            observe_request(request.method, template, status, time.perf_counter() - started)

    token = settings.api_token.get_secret_value() if settings.api_token else None
    app.add_middleware(BearerAuthMiddleware, token=token)
    return app
