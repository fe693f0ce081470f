"""Error responses: every failure becomes ``ErrorBody`` JSON with a fitting 4xx/5xx status."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from retryd.api.circuit import CircuitOrderError
from retryd.api.limits import RETRY_AFTER_S
from retryd.api.schemas import ErrorBody
from retryd.replay.errors import (
    AlreadyReplayed,
    BrokerUnavailable,
    InvalidRequest,
    InvalidTarget,
    LedgerMisconfigured,
    NothingToReplay,
    RateLimited,
    RecordNotFound,
    RecordTooLarge,
    ReplayError,
    ReplayFailed,
    ScanIncomplete,
    ShuttingDown,
    TargetRefused,
    TargetReserved,
)
from retryd.replay.manager import TooManyJobs

log = logging.getLogger(__name__)

# First match wins: subclasses before their bases.
STATUS: list[tuple[type[ReplayError], int, str]] = [
    (RecordNotFound, 404, "not_found"),
    (AlreadyReplayed, 409, "already_replayed"),
    (InvalidTarget, 422, "invalid_target"),
    (RecordTooLarge, 422, "too_large"),  # a NothingToReplay: the skip reason a job gives it
    (NothingToReplay, 422, "nothing_to_replay"),
    (TargetReserved, 403, "target_reserved"),
    (TargetRefused, 403, "target_refused"),
    (InvalidRequest, 400, "bad_request"),
    (TooManyJobs, 429, "too_many_jobs"),
    (RateLimited, 429, "rate_limited"),
    (ScanIncomplete, 503, "incomplete_read"),
    (BrokerUnavailable, 503, "broker_unavailable"),
    (ShuttingDown, 503, "shutting_down"),
    (LedgerMisconfigured, 503, "ledger_misconfigured"),
    (ReplayFailed, 502, "replay_failed"),
]
# Worth retrying as is, after a moment (a misconfigured ledger is not).
RETRYABLE = (TooManyJobs, RateLimited, BrokerUnavailable, ShuttingDown)


def status_of(exc: ReplayError) -> tuple[int, str]:
    """The status code and error code the API answers ``exc`` with (the explorer's pages
    give the same)."""
    return next(
        ((status, code) for cls, status, code in STATUS if isinstance(exc, cls)),
        (400, "replay_error"),
    )


def error_json(
    status: int,
    error: str,
    detail: str,
    problems: list[str] | None = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    body = ErrorBody(error=error, detail=detail, problems=problems or [])
    return JSONResponse(body.model_dump(), status_code=status, headers=headers)


def _field(loc: Any) -> str:
    parts = [str(p) for p in loc if p not in ("body", "query", "path", "header")]
    where = str(loc[0]) if loc else "request"
    return f"{where} {'.'.join(parts)}".strip() if parts else where


def describe_validation(exc: RequestValidationError) -> list[str]:
    lines = []
    for err in exc.errors():
        msg = str(err.get("msg", "invalid")).removeprefix("Value error, ")
        if tuple(err.get("loc", ())) == ("body",) and err.get("type") in (
            "model_attributes_type",
            "dict_type",
        ):
            msg = "expected a JSON object (send Content-Type: application/json)"
        elif err.get("type") == "json_invalid":
            msg = f"invalid JSON ({err.get('ctx', {}).get('error', 'cannot parse')})"
        lines.append(f"{_field(err.get('loc', ()))}: {msg}")
    return lines


def allowed_methods(request: Request) -> list[str]:
    methods: set[str] = set()
    for route in getattr(request.app.state, "api_routes", ()):
        match, _ = route.matches(request.scope)
        if match is not Match.NONE:
            methods |= set(getattr(route, "methods", None) or ())
    return sorted(methods)


def install(app: FastAPI) -> None:
    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        problems = describe_validation(exc)
        return error_json(422, "invalid_request", "; ".join(problems)[:2000], problems)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        headers = dict(exc.headers or {})
        if exc.status_code == 400 and "parsing the body" in str(exc.detail):
            detail = "the request body is not valid JSON (UTF-8)"
            return error_json(422, "invalid_request", detail, [f"body: {detail}"])
        if exc.status_code == 405:
            # Starlette names only the first route's methods; list every route on this path.
            headers["Allow"] = ", ".join(allowed_methods(request))
        code = {404: "not_found", 405: "method_not_allowed", 413: "payload_too_large"}.get(
            exc.status_code, "error"
        )
        return error_json(exc.status_code, code, str(exc.detail), headers=headers)

    @app.exception_handler(ReplayError)
    async def _replay(request: Request, exc: ReplayError) -> JSONResponse:
        status, code = status_of(exc)
        if status >= 500:
            log.warning("%s %s: %s", request.method, request.url.path, exc)
        retry = {"Retry-After": str(RETRY_AFTER_S)} if isinstance(exc, RETRYABLE) else None
        return error_json(status, code, str(exc), headers=retry)

    @app.exception_handler(CircuitOrderError)
    async def _circuit(request: Request, exc: CircuitOrderError) -> JSONResponse:
        return error_json(503, "state_dir_unwritable", str(exc))

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("%s %s failed", request.method, request.url.path)
        return error_json(500, "internal_error", f"internal error ({exc.__class__.__name__})")
