"""Unauthenticated operational routes: liveness, readiness, Prometheus metrics.

``/healthz`` is ``async`` and answers at once on the event loop: it takes no thread, so no
amount of slow broker-bound work (which runs on the bounded thread groups of
``retryd.api.limits``) can delay it past a probe timeout.
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST

from retryd.api.credentials import bearer_token
from retryd.api.limits import offload
from retryd.api.readiness import ReadinessProbe
from retryd.api.schemas import ErrorBody, Health, Readiness
from retryd.api.state import Sidecar
from retryd.metrics.exposition import exposition

router = APIRouter(tags=["operations"])


def sidecar(request: Request) -> Sidecar:
    state: Sidecar = request.app.state.sidecar
    return state


@router.get("/healthz", response_model=Health, summary="Liveness: the process answers")
async def healthz() -> Health:
    return Health()


@router.get(
    "/readyz",
    response_model=Readiness,
    response_model_exclude_none=True,
    summary="Readiness: broker reachable and workers on this host alive",
    description="Status and reason codes for anyone; with a valid API token (any scope) "
    "also the details: reason sentences, the broker's answer and the worker heartbeats.",
    responses={503: {"model": Readiness, "description": "not ready; `reasons` says why"}},
)
async def readyz(request: Request) -> Response:
    probe: ReadinessProbe = request.app.state.readiness
    report = await probe.report()
    header = request.headers.get("authorization")
    given = bearer_token(header.encode("latin-1")) if header else None
    credentials = request.app.state.credentials
    detailed = given is not None and credentials.identify(given) is not None
    body = report.body(detailed, _render_readiness)
    status = 200 if report.status == "ready" else 503
    return Response(body, status_code=status, media_type="application/json")


def _render_readiness(body: dict[str, Any]) -> bytes:
    checked = Readiness.model_validate(body).model_dump(mode="json", exclude_none=True)
    return json.dumps(checked, separators=(",", ":")).encode()


@router.get(
    "/metrics",
    summary="Prometheus metrics of every worker process on this host and of the sidecar",
    response_class=Response,
    responses={
        200: {"content": {"text/plain": {"schema": {"type": "string"}}}},
        500: {"model": ErrorBody, "description": "the metric files could not be read"},
        503: {"model": ErrorBody, "description": "too many scrapes at once; see Retry-After"},
    },
)
async def metrics(request: Request) -> Response:
    body = await offload(request, exposition, sidecar(request).collector)
    return Response(body, media_type=CONTENT_TYPE_LATEST)
