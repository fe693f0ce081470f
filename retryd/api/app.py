"""The sidecar FastAPI application: ``create_app(settings)``.

Middlewares, outermost first (each is pure ASGI and answers without touching the app when it
refuses a request):

1. ``RequestMetricsMiddleware``: counts every answer, with bounded label values;
2. ``BearerAuthMiddleware``: 401/403 for ``/v1`` (token and scope), before anything else;
3. ``BodyLimitMiddleware``: 413 past ``sidecar_max_body_bytes``, before parsing;
4. ``AdmissionMiddleware``: 503 + Retry-After when a route group's threads are all busy.
"""

from __future__ import annotations

import gc
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from starlette.routing import Route

from retryd import __version__
from retryd.api import errors, routes_circuit, routes_health, routes_v1
from retryd.api.auth import BearerAuthMiddleware
from retryd.api.credentials import Credentials, load_credentials
from retryd.api.limits import AdmissionMiddleware, BodyLimitMiddleware, bulkheads
from retryd.api.observe import RequestMetricsMiddleware
from retryd.api.readiness import ReadinessProbe
from retryd.api.state import Sidecar
from retryd.config import Settings
from retryd.explorer import install as _explorer_install
from retryd.explorer.web import UiHeadersMiddleware

DESCRIPTION = """\
Health, Prometheus metrics and replay of dead-lettered messages for a retryd deployment.

`/v1` needs `Authorization: Bearer <token>`: a `read` token may browse and read records, job
progress and the circuit breaker, a `replay` token may also replay and start or cancel jobs, a
`circuit` token may also order the group's circuit breaker open, closed or to probe (401
without a valid token, 403 without the scope). Without any configured token `/v1` answers 503.
Request bodies are limited to `sidecar_max_body_bytes` (413). Broker-bound routes answer 503
with `Retry-After` when too many of them are in progress. Every error is JSON:
`{"error": code, "detail": sentence, "problems": [one line per field]}`.
"""


def create_app(
    settings: Settings,
    sidecar: Sidecar | None = None,
    credentials: Credentials | None = None,
) -> FastAPI:
    """Raises ConfigError if the configured API tokens are unusable (see credentials)."""
    creds = credentials if credentials is not None else load_credentials(settings)
    state = sidecar or Sidecar(settings)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        import anyio.to_thread

        from retryd.metrics.registry import mark_build_info

        mark_build_info()
        state.start()
        # Everything loaded so far lives as long as the process: keep it out of the garbage
        # collector's full passes, whose pauses (tens of ms on this heap) would otherwise land
        # on whichever request is being served, /healthz included.
        gc.collect()
        gc.freeze()
        try:
            yield
        finally:
            # Blocks until every replay in flight is settled (bounded): off the event loop.
            await anyio.to_thread.run_sync(state.close)

    app = FastAPI(
        title="retryd sidecar",
        version=__version__,
        description=DESCRIPTION,
        lifespan=lifespan,
    )
    app.state.sidecar = state
    app.state.credentials = creds
    app.state.readiness = ReadinessProbe(state.readiness)
    errors.install(app)
    app.include_router(routes_health.router)
    app.include_router(routes_v1.router)
    app.include_router(routes_circuit.router)
    _explorer_install(app, settings, state, creds)  # /ui: the dead-letter explorer's pages
    # The leaf routes (full paths), for the Allow header of 405 answers and the route label.
    app.state.api_routes = [
        *routes_health.router.routes,
        *routes_v1.router.routes,
        *routes_circuit.router.routes,
    ]
    leaves = [*app.state.api_routes, *(r for r in app.routes if isinstance(r, Route))]
    state.collector.routes = frozenset(r.path for r in leaves if isinstance(r, Route))
    # add_middleware puts each one outside the ones before it: innermost first.
    app.add_middleware(AdmissionMiddleware, groups=bulkheads(settings.sidecar_max_inflight))
    app.add_middleware(BodyLimitMiddleware, max_bytes=settings.sidecar_max_body_bytes)
    app.add_middleware(BearerAuthMiddleware, credentials=creds)
    app.add_middleware(UiHeadersMiddleware)
    app.add_middleware(RequestMetricsMiddleware, routes=leaves)
    return app
