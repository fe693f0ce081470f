"""Unauthenticated operational routes: liveness, readiness, Prometheus metrics."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from retryd.api.schemas import ErrorBody, Health, Readiness
from retryd.api.state import Sidecar
from retryd.metrics.exposition import exposition

router = APIRouter(tags=["operations"])


def sidecar(request: Request) -> Sidecar:
    state: Sidecar = request.app.state.sidecar
    return state


@router.get("/healthz", response_model=Health, summary="Liveness: the process answers")
def healthz() -> Health:
    return Health()


@router.get(
    "/readyz",
    response_model=Readiness,
    summary="Readiness: broker reachable and workers on this host alive",
    responses={503: {"model": Readiness, "description": "not ready; `reasons` says why"}},
)
def readyz(request: Request) -> JSONResponse:
    report = Readiness.model_validate(sidecar(request).readiness())
    status = 200 if report.status == "ready" else 503
    return JSONResponse(report.model_dump(), status_code=status)


@router.get(
    "/metrics",
    summary="Prometheus metrics of every worker process on this host and of the sidecar",
    response_class=Response,
    responses={
        200: {"content": {"text/plain": {"schema": {"type": "string"}}}},
        500: {"model": ErrorBody, "description": "the metric files could not be read"},
    },
)
def metrics(request: Request) -> Response:
    body = exposition(sidecar(request).collector)
    return Response(body, media_type=CONTENT_TYPE_LATEST)
