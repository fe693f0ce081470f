"""``/v1``: browse failed_topic, replay one record, bulk replay jobs (bearer token required).

``topic`` (query, or body of a job) reads an error route's dead-letter topic instead of
failed_topic; any other topic is refused (``retryd.replay.sources``).

Every handler is ``async`` and runs its blocking Kafka work through ``offload``: on a thread of
its route group's bulkhead (``retryd.api.limits``), never on the shared default pool.
"""

from __future__ import annotations

import asyncio
import time
from typing import Annotated, Any

from fastapi import APIRouter, Body, Path, Query, Request, Security

from retryd.api import actions
from retryd.api.auth import actor_of, bearer_scheme
from retryd.api.limits import offload
from retryd.api.schemas import (
    BASE64_PATTERN,
    MAX_CURSOR_QUERY_CHARS,
    MAX_KEY_BASE64_CHARS,
    MAX_KEY_CHARS,
    MAX_MS,
    MAX_OFFSET,
    MAX_PARTITION,
    SOURCE_TOPIC_FORMS,
    TIME_FORMS,
    TOPIC_PATTERN,
    DeadReason,
    ErrorBody,
    FailedPage,
    FailedRecordOut,
    FilterIn,
    LedgerEntryOut,
    ReplayJobIn,
    ReplayJobList,
    ReplayJobOut,
    ReplayOneIn,
    ReplayOneOut,
)
from retryd.api.state import Sidecar
from retryd.errors import TimeSpecError
from retryd.policy.timespec import TIME_PATTERN, parse_instant
from retryd.replay.browse import browse, read_record
from retryd.replay.errors import InvalidRequest, RecordNotFound
from retryd.replay.jobs import JobSpec
from retryd.replay.ledger import LedgerEntry
from retryd.replay.records import PREVIEW_MAX, RecordFilter, key_from, render_record
from retryd.replay.sources import source_topic


def err_doc(description: str) -> dict[str, Any]:
    """An error response's OpenAPI entry (every error has the ``ErrorBody`` shape)."""
    return {"model": ErrorBody, "description": description}


COMMON: dict[int | str, dict[str, Any]] = {
    401: err_doc("missing or invalid bearer token"),
    413: err_doc("the request body is larger than sidecar_max_body_bytes"),
    422: err_doc("invalid request: `problems` lists each invalid field"),
    503: err_doc(
        "/v1 disabled (no api_token configured), Kafka did not answer, the replay ledger "
        "could not be read to its end, too many requests of this kind at once (Retry-After), "
        "or the sidecar is shutting down"
    ),
}
FORBIDDEN = err_doc("the token lacks the replay scope, or the target topic is refused")

router = APIRouter(
    prefix="/v1",
    tags=["failed messages"],
    dependencies=[Security(bearer_scheme)],
    responses=COMMON,
)

PartitionPath = Annotated[
    int, Path(ge=0, le=MAX_PARTITION, description="partition of the dead-letter topic")
]
TopicQuery = Annotated[
    str | None, Query(pattern=TOPIC_PATTERN, description=f"the topic to read: {SOURCE_TOPIC_FORMS}")
]
OffsetPath = Annotated[int, Path(ge=0, le=MAX_OFFSET, description="offset in that partition")]


def _sidecar(request: Request) -> Sidecar:
    state: Sidecar = request.app.state.sidecar
    return state


def _ledger_out(entry: LedgerEntry | None) -> LedgerEntryOut | None:
    if entry is None:
        return None
    return LedgerEntryOut.model_validate(entry, from_attributes=True)


def _instant(name: str, text: str | None, epoch_ms: int | None, now_ms: int) -> int | None:
    """``since``/``until`` (ISO-8601 or relative to now) or their epoch-ms twins; 400 when
    both are given or a value of the right shape is no time (a 13th month)."""
    if text is None:
        return epoch_ms
    if epoch_ms is not None:
        raise InvalidRequest(f"give {name} or {name}_ms, not both")
    try:
        return parse_instant(text, now_ms)
    except TimeSpecError as exc:
        raise InvalidRequest(f"{name}: {exc}") from None


def to_filter(f: FilterIn) -> RecordFilter:
    key, contradictory = key_from(f.key, f.key_base64)
    now_ms = int(time.time() * 1000)  # one 'now' for both ends
    return RecordFilter(
        original_topic=f.original_topic,
        error_class=f.error_class,
        dead_reason=f.dead_reason,
        since_ms=_instant("since", f.since, f.since_ms, now_ms),
        until_ms=_instant("until", f.until, f.until_ms, now_ms),
        key=key,
        partition=f.partition,
        nothing=contradictory,
    )


@router.get(
    "/failed",
    response_model=FailedPage,
    summary="Browse failed_topic (or a route's dead-letter topic) with filters and a cursor",
    responses={
        400: {
            **err_doc(
                "the cursor is not valid for this topic, or topic is not a dead-letter topic "
                "(JSON); or, as text/plain from the HTTP server itself, a request line longer "
                "than 64 KiB"
            ),
            "content": {"text/plain": {"schema": {"type": "string"}}},
        }
    },
)
async def list_failed(
    request: Request,
    topic: TopicQuery = None,
    original_topic: Annotated[str | None, Query(max_length=249)] = None,
    error_class: Annotated[str | None, Query(max_length=1024)] = None,
    dead_reason: Annotated[DeadReason | None, Query()] = None,
    since_ms: Annotated[
        int | None, Query(ge=0, le=MAX_MS, description="epoch ms, inclusive")
    ] = None,
    until_ms: Annotated[
        int | None, Query(ge=0, le=MAX_MS, description="epoch ms, exclusive")
    ] = None,
    since: Annotated[
        str | None,
        Query(
            max_length=64, pattern=TIME_PATTERN, description=f"instead of since_ms: {TIME_FORMS}"
        ),
    ] = None,
    until: Annotated[
        str | None,
        Query(
            max_length=64, pattern=TIME_PATTERN, description=f"instead of until_ms: {TIME_FORMS}"
        ),
    ] = None,
    key: Annotated[
        str | None, Query(max_length=MAX_KEY_CHARS, description="exact key (UTF-8)")
    ] = None,
    key_base64: Annotated[
        str | None, Query(max_length=MAX_KEY_BASE64_CHARS, pattern=BASE64_PATTERN)
    ] = None,
    partition: Annotated[int | None, Query(ge=0, le=MAX_PARTITION)] = None,
    cursor: Annotated[
        str | None, Query(max_length=MAX_CURSOR_QUERY_CHARS, description="next_cursor")
    ] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    preview_bytes: Annotated[int, Query(ge=0, le=65536)] = 1024,
) -> FailedPage:
    sc = _sidecar(request)
    source = source_topic(sc.settings, topic)
    flt = to_filter(
        FilterIn(
            original_topic=original_topic,
            error_class=error_class,
            dead_reason=dead_reason,
            since_ms=since_ms,
            until_ms=until_ms,
            since=since,
            until=until,
            key=key,
            key_base64=key_base64,
            partition=partition,
        )
    )

    def work() -> FailedPage:
        page = browse(
            sc.pool,
            flt,
            cursor=cursor,
            limit=limit,
            preview_bytes=preview_bytes,
            timeout_s=sc.timeout_s,
            topic=source,
        )
        ledger = sc.ready_ledger()
        items = [
            FailedRecordOut(**item, replayed=_ledger_out(ledger.get(item["coordinate"])))
            for item in page.items
        ]
        return FailedPage(
            items=items, next_cursor=page.next_cursor, has_more=page.has_more, scanned=page.scanned
        )

    return await offload(request, work)


@router.get(
    "/failed/{partition}/{offset}",
    response_model=FailedRecordOut,
    summary="One failed record, headers decoded",
    responses={
        400: err_doc("topic is not a dead-letter topic"),
        404: err_doc("no record at that partition/offset"),
    },
)
async def get_failed(
    request: Request,
    partition: PartitionPath,
    offset: OffsetPath,
    preview_bytes: Annotated[int, Query(ge=0, le=PREVIEW_MAX)] = 65536,
    topic: TopicQuery = None,
) -> FailedRecordOut:
    sc = _sidecar(request)
    source = source_topic(sc.settings, topic)

    def work() -> FailedRecordOut:
        rec = read_record(sc.pool, partition, offset, sc.timeout_s, source)
        ledger = sc.ready_ledger()
        return FailedRecordOut(
            **render_record(rec, preview_bytes), replayed=_ledger_out(ledger.get(rec.coord))
        )

    return await offload(request, work)


@router.post(
    "/failed/{partition}/{offset}/replay",
    response_model=ReplayOneOut,
    summary="Replay one failed record (fresh retry sequence)",
    responses={
        400: err_doc("topic is not a dead-letter topic"),
        403: FORBIDDEN,
        404: err_doc("no record at that partition/offset"),
        409: err_doc("already replayed (see the ledger entry); pass force=true to replay again"),
        422: err_doc(
            "invalid request (`problems` lists each invalid field), or nothing can be replayed: "
            "`nothing_to_replay` (a dead letter of headers only) or `too_large` (the target "
            "refuses the copy for its size; nothing was written, a job skips it as too_large)"
        ),
        429: err_doc("the sidecar's replay rate ceiling (replay_max_per_second) is reached"),
        502: err_doc("producing the copy or its ledger record failed"),
    },
)
async def replay_one(
    request: Request,
    partition: PartitionPath,
    offset: OffsetPath,
    body: Annotated[ReplayOneIn | None, Body()] = None,
    force: Annotated[bool, Query(description="same as body force")] = False,
    topic: TopicQuery = None,
) -> ReplayOneOut:
    sc = _sidecar(request)
    want = body or ReplayOneIn()
    actor = actor_of(request)
    source = source_topic(sc.settings, topic)

    def work() -> Any:
        return actions.replay_one(
            sc,
            partition,
            offset,
            topic=source,
            target=want.target,
            force=want.force or force,
            actor=actor,
        )

    out = await offload(request, work)  # RecordTooLarge: 422 too_large (api.errors.STATUS)
    return ReplayOneOut(
        replay_id=out.replay_id,
        coordinate=out.coordinate,
        target_topic=out.target_topic,
        target_partition=out.target_partition,
        target_offset=out.target_offset,
        forced=out.forced,
        previous=_ledger_out(out.previous),
        concurrent_replays=[e for e in map(_ledger_out, out.concurrent) if e is not None],
    )


@router.post(
    "/replays",
    response_model=ReplayJobOut,
    status_code=202,
    summary="Start a bulk replay job (or a dry run)",
    responses={
        400: err_doc(
            "since/until given with since_ms/until_ms, not a real time, or topic is not a "
            "dead-letter topic"
        ),
        403: FORBIDDEN,
        429: err_doc("too many jobs running in this sidecar"),
    },
)
async def create_job(request: Request, body: ReplayJobIn) -> ReplayJobOut:
    sc = _sidecar(request)
    flt = to_filter(body.filter)
    source = source_topic(sc.settings, body.topic)
    actor = actor_of(request)

    def work() -> ReplayJobOut:
        job = actions.start_job(
            sc,
            JobSpec(
                filter=flt,
                topic=source,
                target=body.target,
                max_per_second=body.max_per_second,
                max_messages=body.max_messages,
                dry_run=body.dry_run,
                force=body.force,
                actor=actor,
            ),
        )
        return ReplayJobOut(**job.snapshot())

    return await offload(request, work)


@router.get("/replays", response_model=ReplayJobList, summary="Jobs of this sidecar process")
async def list_jobs(request: Request) -> ReplayJobList:
    return ReplayJobList(jobs=[ReplayJobOut(**j.snapshot()) for j in _sidecar(request).jobs.list()])


JobIdPath = Annotated[str, Path(max_length=64, description="job id from POST /v1/replays")]


@router.get(
    "/replays/{job_id}",
    response_model=ReplayJobOut,
    summary="Progress of a replay job",
    responses={404: err_doc("no such job in this sidecar process")},
)
async def get_job(request: Request, job_id: JobIdPath) -> ReplayJobOut:
    job = _sidecar(request).jobs.get(job_id)
    if job is None:
        raise RecordNotFound(f"no replay job {job_id} in this sidecar process")
    return ReplayJobOut(**job.snapshot())


@router.delete(
    "/replays/{job_id}",
    response_model=ReplayJobOut,
    summary="Cancel a replay job; returns its progress once it stopped",
    responses={403: FORBIDDEN, 404: err_doc("no such job in this sidecar process")},
)
async def cancel_job(request: Request, job_id: JobIdPath) -> ReplayJobOut:
    sc = _sidecar(request)
    job = sc.jobs.get(job_id)
    if job is None:
        raise RecordNotFound(f"no replay job {job_id} in this sidecar process")
    actions.cancel_job(job, actor_of(request))
    # Wait on the event loop (no thread) for the job to stop; its progress says where.
    deadline = time.monotonic() + sc.timeout_s * 2
    while not job.finished and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    return ReplayJobOut(**job.snapshot())
