"""The explorer's actions: a dry run of a selection, its replay once confirmed, and the replay
jobs' pages (progress, cancel).

A selection is one record (``mode=one``), records ticked on the browse page (``selected``) or
everything a filter matches (``filter``). Each goes through ``retryd.api.actions``, the code
``/v1`` runs: one record through the single replay (its ledger check, rate ceiling and audit
line), the others through a bulk job of the same job manager (its limit of running jobs, its
rate and its audit lines; a selection is a job whose filter names those records). The dry run
is a dry-run job of the same selection, waited for a bounded time.
"""

from __future__ import annotations

import asyncio
import time
from typing import Annotated, Any

from fastapi import APIRouter, Path, Request
from fastapi.responses import JSONResponse, RedirectResponse, Response

from retryd.api import actions
from retryd.api.limits import offload
from retryd.explorer import preview as pv
from retryd.explorer.filters import FilterProblem, UiFilter, read_records
from retryd.explorer.newest import browse_newest
from retryd.explorer.routes import check_post, first, read_form, record_row, replay_error_page
from retryd.explorer.sessions import Session
from retryd.explorer.web import PAGE_METHODS, Explorer, SignedIn, Single, explorer_of
from retryd.policy.timespec import format_instant
from retryd.replay.browse import read_record
from retryd.replay.errors import ReplayError
from retryd.replay.jobs import JobSpec, ReplayJob
from retryd.replay.records import RecordFilter
from retryd.replay.sources import source_topic

router = APIRouter(prefix="/ui", include_in_schema=False)

DRY_RUN_WAIT_S = 20.0
DEFAULT_RATE = 100.0  # records per second, as POST /v1/replays
MAX_RATE = 100_000.0
SAMPLE_SIZE = 10
MODES = ("one", "selected", "filter")
STATE_WORDS = {
    "pending": "running",
    "counting": "running",
    "running": "running",
    "completed": "done",
    "cancelled": "cancelled",
    "failed": "failed",
}


class Selection:
    """What a dry-run or replay form names, checked."""

    def __init__(self, form: dict[str, list[str]], ex: Explorer) -> None:
        mode = first(form, "mode") or ""
        if mode not in MODES:
            raise FilterProblem("mode must be one, selected or filter")
        self.mode = mode
        self.ui = UiFilter.read(form)
        self.topic = source_topic(ex.settings, self.ui.topic)
        self.records: frozenset[tuple[int, int]] | None = None
        self.rate = read_rate(first(form, "max_per_second"))
        if mode == "filter":
            self.filter = self.ui.to_filter(int(time.time() * 1000))
        else:
            self.records = read_records(form.get("record", []))
            if mode == "one" and len(self.records) != 1:
                raise FilterProblem("replaying one record names exactly one")
            self.filter = RecordFilter(records=self.records)

    def fields(self) -> list[tuple[str, str]]:
        """The hidden inputs that carry this selection to the next form."""
        out = [("mode", self.mode), ("topic", self.topic)]
        if self.mode == "filter":
            out += [(n, v) for n, v in self.ui.items() if n != "topic"]
        else:
            out += [("record", f"{p}:{o}") for p, o in sorted(self.records or ())]
        return out

    def describe(self) -> str:
        if self.mode == "one":
            (p, o), *_ = sorted(self.records or ())
            return f"the dead letter {self.topic}/{p}/{o}"
        if self.mode == "selected":
            return f"{len(self.records or ())} selected dead letters of {self.topic}"
        parts = [f"{n}={v}" for n, v in self.ui.items() if n != "topic"]
        return f"every dead letter of {self.topic}" + (
            f" matching {', '.join(parts)}" if parts else ""
        )


def read_rate(text: str | None) -> float:
    """A job's ``max_per_second`` from the confirm form (the API's bounds and default)."""
    if text is None or not text.strip():
        return DEFAULT_RATE
    try:
        rate = float(text)
    except ValueError:
        raise FilterProblem("the rate is a number of records per second") from None
    if not 0 < rate <= MAX_RATE:
        raise FilterProblem(f"the rate must be above 0 and at most {MAX_RATE:g} per second")
    return rate


async def _act_form(
    request: Request,
) -> tuple[Session | None, Selection | None, Response | None]:
    ex = explorer_of(request)
    form = await read_form(request)
    session, answer = check_post(request, form, needs="replay")
    if session is None:
        return None, None, answer
    try:
        return session, Selection(form, ex), None
    except FilterProblem as exc:
        return (
            session,
            None,
            ex.message(
                request,
                400,
                "Nothing to replay",
                str(exc),
                session=session,
                back="/ui/dead-letters",
            ),
        )
    except ReplayError as exc:
        return session, None, replay_error_page(request, exc, session, "/ui/dead-letters")


@router.post("/replay/dry-run")
async def dry_run(request: Request) -> Response:
    session, sel, answer = await _act_form(request)
    if session is None or sel is None:
        assert answer is not None
        return answer
    ex = explorer_of(request)
    sc = ex.sidecar
    spec = JobSpec(filter=sel.filter, topic=sel.topic, dry_run=True, actor=session.token_id)

    def sample() -> list[dict[str, Any]]:
        from retryd.replay.records import render_record

        if sel.records is not None:
            out = []
            for p, o in sorted(sel.records, key=lambda r: (-r[1], r[0]))[:SAMPLE_SIZE]:
                try:
                    rec = read_record(sc.pool, p, o, sc.timeout_s, sel.topic)
                except ReplayError:
                    continue  # counted (or not) by the dry run itself
                out.append(render_record(rec, 64))
            return out
        page = browse_newest(
            sc.pool,
            sel.filter,
            cursor=None,
            limit=SAMPLE_SIZE,
            preview_bytes=64,
            timeout_s=sc.timeout_s,
            topic=sel.topic,
        )
        return page.items

    try:
        job = await offload(request, actions.start_job, sc, spec)
        items = await offload(request, sample)
    except ReplayError as exc:
        return replay_error_page(request, exc, session, "/ui/dead-letters")
    deadline = time.monotonic() + DRY_RUN_WAIT_S
    while not job.finished and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    snap = job.snapshot()
    return ex.render(
        request,
        "dry_run.html",
        200,
        session,
        active="browse",
        what=sel.describe(),
        snap=snap,
        state=STATE_WORDS.get(snap["state"], snap["state"]),
        finished=job.finished,
        job_id=job.id,
        sample=[record_row(item, sel.topic) for item in items],
        fields=sel.fields(),
        rate=sel.rate,
        bulk=sel.mode != "one",
    )


@router.post("/replay")
async def replay(request: Request) -> Response:
    session, sel, answer = await _act_form(request)
    if session is None or sel is None:
        assert answer is not None
        return answer
    ex = explorer_of(request)
    sc = ex.sidecar
    try:
        if sel.mode == "one":
            ((p, o),) = tuple(sel.records or ())
            outcome = await offload(
                request,
                actions.replay_one,
                sc,
                p,
                o,
                topic=sel.topic,
                target=None,
                force=False,
                actor=session.token_id,
            )
            job_id = ex.remember(Single(outcome, session.token_id, time.time()))
        else:
            spec = JobSpec(
                filter=sel.filter,
                topic=sel.topic,
                max_per_second=sel.rate,
                actor=session.token_id,
            )
            job = await offload(request, actions.start_job, sc, spec)
            job_id = job.id
    except ReplayError as exc:
        return replay_error_page(request, exc, session, "/ui/dead-letters")
    return RedirectResponse(f"/ui/jobs/{job_id}", status_code=303)


# ------------------------------------------------------------------ jobs


def skip_reasons(counts: dict[str, int]) -> str:
    """``too_large 1, target_not_allowed 2``: why records were skipped, most frequent first
    (reason codes are the API's, so a page and ``skipped_reasons`` read alike)."""
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    return ", ".join(f"{reason} {n}" for reason, n in ranked)


def progress_of(snap: dict[str, Any]) -> dict[str, Any]:
    """What the job page shows and its script polls."""
    return {
        "id": snap["id"],
        "state": STATE_WORDS.get(snap["state"], snap["state"]),
        "detail": snap["state"],
        "dry_run": snap["dry_run"],
        "matched": snap["matched"],
        "to_replay": snap["to_replay"],
        "replayed": snap["replayed"],
        "skipped": snap["skipped"],
        "skip_reasons": skip_reasons(snap["skipped_reasons"]),
        "errors": snap["failed"],
        "rate": snap["rate_per_second"],
        "eta": snap["eta_seconds"],
        "stop_reason": snap["stop_reason"],
        "error_lines": [pv.short(e, 300) for e in snap["errors"][:5]],
        "finished": snap["state"] in ("completed", "cancelled", "failed"),
    }


def single_progress(job_id: str, single: Single) -> dict[str, Any]:
    o = single.outcome
    return {
        "id": job_id,
        "state": "done",
        "detail": "completed",
        "dry_run": False,
        "matched": 1,
        "to_replay": 1,
        "replayed": 1,
        "skipped": 0,
        "skip_reasons": "",
        "errors": 0,
        "rate": 0.0,
        "eta": None,
        "stop_reason": (
            f"replayed {o.coordinate} to {o.target_topic}/{o.target_partition}/"
            f"{o.target_offset} (replay id {o.replay_id})"
        ),
        "error_lines": [],
        "finished": True,
    }


def _progress(ex: Explorer, job_id: str) -> tuple[dict[str, Any] | None, ReplayJob | None]:
    job = ex.sidecar.jobs.get(job_id)
    if job is not None:
        return progress_of(job.snapshot()), job
    single = ex.singles.get(job_id)
    return (single_progress(job_id, single) if single is not None else None), None


JobId = Annotated[str, Path(max_length=64)]


@router.api_route("/jobs", methods=PAGE_METHODS)
async def jobs_page(request: Request, session: SignedIn) -> Response:
    ex = explorer_of(request)
    jobs = sorted(ex.sidecar.jobs.list(), key=lambda j: -j.progress.created_at)
    rows = []
    for job in jobs[:200]:
        snap = job.snapshot()
        rows.append(
            {
                **progress_of(snap),
                "topic": snap["topic"],
                "by": snap["requested_by"],
                "created": format_instant(int(snap["created_at"] * 1000)),
                "filter": ", ".join(f"{k}={v}" for k, v in snap["filter"].items()),
            }
        )
    return ex.render(request, "jobs.html", 200, session, active="jobs", rows=rows)


@router.api_route("/jobs/{job_id}", methods=PAGE_METHODS)
async def job_page(request: Request, job_id: JobId, session: SignedIn) -> Response:
    ex = explorer_of(request)
    prog, job = _progress(ex, job_id)
    if prog is None:
        return ex.message(
            request,
            404,
            "No such job",
            "No replay job with that id in this sidecar process.",
            session=session,
            back="/ui/jobs",
        )
    return ex.render(
        request,
        "job.html",
        200,
        session,
        active="jobs",
        job=prog,
        snap=job.snapshot() if job is not None else None,
        can_act=session.allows("replay") and job is not None and not prog["finished"],
    )


@router.api_route("/jobs/{job_id}/progress", methods=PAGE_METHODS)
async def job_progress(request: Request, job_id: JobId) -> Response:
    ex = explorer_of(request)
    session, _ = ex.sessions.get(request.cookies.get("retryd_session"))
    if session is None:
        return JSONResponse({"error": "unauthorized", "detail": "sign in again"}, 401)
    prog, _ = _progress(ex, job_id)
    if prog is None:
        return JSONResponse({"error": "not_found", "detail": "no such job"}, 404)
    return JSONResponse(prog)


@router.post("/jobs/{job_id}/cancel")
async def cancel(request: Request, job_id: JobId) -> Response:
    ex = explorer_of(request)
    form = await read_form(request)
    session, answer = check_post(request, form, needs="replay")
    if session is None:
        assert answer is not None
        return answer
    job = ex.sidecar.jobs.get(job_id)
    if job is None:
        return ex.message(
            request,
            404,
            "No such job",
            "No running replay job with that id.",
            session=session,
            back="/ui/jobs",
        )
    actions.cancel_job(job, session.token_id)
    deadline = time.monotonic() + ex.sidecar.timeout_s * 2
    while not job.finished and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    return RedirectResponse(f"/ui/jobs/{job_id}", status_code=303)
