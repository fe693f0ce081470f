"""``GET /ui/``: the overview of one deployment (group).

Per dead-letter topic it reads at most ``explorer_overview_scan_max`` of the newest records
(spread over the partitions) and tallies them (``overview.Tally``); replayed records (with a
ledger entry) are not waiting. Tier backlog and lag come from the sidecar's lag monitor, the
workers alive and the circuit breaker from the workers' heartbeats, the running jobs from the
job manager: the numbers ``/metrics`` and ``/readyz`` give.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

from fastapi import APIRouter, Request
from fastapi.responses import Response

from retryd.api.limits import offload
from retryd.api.readiness import circuit_summary, worker_states
from retryd.api.state import Sidecar
from retryd.explorer.newest import _bounds
from retryd.explorer.overview import Tally, buckets, sparkline_points
from retryd.explorer.web import PAGE_METHODS, SignedIn, explorer_of
from retryd.policy.timespec import format_instant
from retryd.replay.errors import ReplayError
from retryd.replay.scan import to_record
from retryd.replay.sources import dead_letter_topics

router = APIRouter(prefix="/ui", include_in_schema=False)
SCAN_TIME_S = 5.0


@dataclass
class TopicView:
    topic: str
    total: int  # records in the topic (high - low watermarks)
    tally: Tally
    complete: bool  # the scan read every record of the topic
    error: str | None = None


def scan_topic(sc: Sidecar, topic: str, scan_max: int) -> TopicView:
    """Tally the newest ``scan_max`` records of ``topic`` (bounded in records and time)."""
    tally = Tally()
    try:
        scanner = sc.pool.acquire(sc.timeout_s, topic)
    except ReplayError as exc:
        return TopicView(topic, 0, tally, False, str(exc)[:300])
    broken = False
    try:
        parts = scanner.partitions(sc.timeout_s)
        if not parts:
            return TopicView(topic, 0, tally, True, "the topic does not exist yet")
        bounds = _bounds(scanner, parts, sc.timeout_s)
        total = sum(high - low for low, high in bounds.values())
        share = max(1, scan_max // len(parts))
        start = {p: max(low, high - share) for p, (low, high) in bounds.items()}
        stop = {p: high for p, (_, high) in bounds.items()}
        complete = all(start[p] == bounds[p][0] for p in parts)
        ledger = sc.ready_ledger()
        for msg in scanner.scan(start, stop, timeout_s=SCAN_TIME_S, partial_ok=True):
            rec = to_record(msg, scanner.fmt)
            tally.add(rec.envelope, rec.timestamp, ledger.is_replayed(rec.coord))
        complete = complete and scanner.last_scan_complete
    except ReplayError as exc:
        broken = True
        return TopicView(topic, 0, tally, False, str(exc)[:300])
    finally:
        sc.pool.release(scanner, broken=broken)
    return TopicView(topic, total, tally, complete)


def _fingerprint_rows(view: TopicView, now_ms: int) -> list[dict[str, Any]]:
    start = view.tally.first_ms or now_ms
    out = []
    for row in view.tally.top():
        counts = buckets(row.times, start, now_ms)
        query = urlencode({"topic": view.topic, "fingerprint": row.id})
        out.append(
            {
                "id": row.id,
                "error_class": row.error_class,
                "template": row.template,
                "count": row.count,
                "first": format_instant(row.first_ms),
                "last": format_instant(row.last_ms),
                "points": sparkline_points(counts),
                "counts": ", ".join(str(c) for c in counts),
                "href": None if row.id == "other" else f"/ui/dead-letters?{query}",
            }
        )
    return out


@router.api_route("/", methods=PAGE_METHODS)
async def overview(request: Request, session: SignedIn) -> Response:
    ex = explorer_of(request)
    sc = ex.sidecar
    settings = ex.settings

    def work() -> list[TopicView]:
        return [
            scan_topic(sc, topic, settings.explorer_overview_scan_max)
            for topic in dead_letter_topics(settings)
        ]

    views = await offload(request, work)
    now_ms = int(time.time() * 1000)
    lag = sc.lag.snapshot()
    tiers = []
    for topic in [*settings.main_topics, *settings.plan.tier_topics]:
        parts = {p: v for (t, p), v in lag.items() if t == topic}
        tiers.append(
            {
                "topic": topic,
                "kind": "main" if topic in settings.main_topics else "tier",
                "lag": sum(parts.values()) if parts else None,
                "partitions": len(parts),
            }
        )
    workers = worker_states(settings)
    circuit = circuit_summary(workers) if settings.circuit_breaker else None
    running = sum(1 for j in sc.jobs.list() if not j.finished)
    return ex.render(
        request,
        "overview.html",
        200,
        session,
        active="overview",
        topics=[
            {
                "view": v,
                "reasons": sorted(v.tally.by_reason.items(), key=lambda kv: (-kv[1], kv[0])),
                "fingerprints": _fingerprint_rows(v, now_ms),
                "since": format_instant(v.tally.first_ms) if v.tally.first_ms else None,
                "browse": "/ui/dead-letters?" + urlencode({"topic": v.topic}),
            }
            for v in views
        ],
        tiers=tiers,
        lag_known=bool(lag),
        workers_alive=sum(1 for w in workers if w["alive"]),
        workers_total=len(workers),
        jobs_running=running,
        circuit=circuit,
        scan_max=settings.explorer_overview_scan_max,
    )
