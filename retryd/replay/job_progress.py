"""What a bulk replay job is asked to do (``JobSpec``), how far it got (``JobProgress``), and the
pure functions that turn progress into the rate and the snapshot the API and the CLI show."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from retryd.replay.records import RecordFilter

RATE_WINDOW_S = 5.0


@dataclass(frozen=True)
class JobSpec:
    filter: RecordFilter = field(default_factory=RecordFilter)
    # The dead-letter topic to read (an error route's dlt: topic, checked by
    # ``retryd.replay.sources``); None: the job's failed_topic.
    topic: str | None = None
    target: str | None = None
    max_per_second: float = 100.0
    max_messages: int | None = None
    dry_run: bool = False
    force: bool = False
    actor: str = "cli"  # who asked: the API token's id, or "cli"


@dataclass
class JobProgress:
    state: str = "pending"  # pending|counting|running|completed|cancelled|failed
    scanned: int = 0
    matched: int = 0
    to_replay: int = 0
    replayed: int = 0
    skipped: int = 0
    failed: int = 0
    skipped_reasons: Counter[str] = field(default_factory=Counter)
    by_target: Counter[str] = field(default_factory=Counter)
    by_dead_reason: Counter[str] = field(default_factory=Counter)
    by_error_class: Counter[str] = field(default_factory=Counter)
    errors: list[str] = field(default_factory=list)
    stop_reason: str | None = None
    created_at: float = field(default_factory=time.time)
    started_at: float | None = None
    finished_at: float | None = None
    end_offsets: dict[int, int] = field(default_factory=dict)
    position: dict[int, int] = field(default_factory=dict)
    last_replayed: str | None = None


def rate_per_second(
    samples: Sequence[tuple[float, int]],
    replayed: int,
    began: float | None,
    finished: float | None,
    now: float,
) -> float:
    """Replays per second: over the last few seconds while running, overall once done.
    ``samples`` are ``(monotonic time, replayed so far)``."""
    if began is None or replayed == 0:
        return 0.0
    if finished is not None:
        elapsed = finished - began
        return replayed / elapsed if elapsed > 0 else 0.0
    window = [s for s in samples if now - s[0] <= RATE_WINDOW_S]
    t0, n0 = window[0] if window else (began, 0)
    if now - t0 < 1.0:
        t0, n0 = began, 0
    elapsed = now - t0
    return (replayed - n0) / elapsed if elapsed > 0 else 0.0


def render_snapshot(
    job_id: str, spec: JobSpec, p: JobProgress, rate: float, topic: str | None = None
) -> dict[str, Any]:
    """Progress as plain data (the API's and the CLI's view); ``topic`` is the one read."""
    remaining = max(0, p.to_replay - p.replayed - p.failed)
    running = p.state in ("pending", "counting", "running")
    eta = remaining / rate if running and rate > 0 and remaining else None
    if running and remaining == 0 and p.state == "running":
        eta = 0.0
    return {
        "id": job_id,
        "state": p.state,
        "dry_run": spec.dry_run,
        "topic": topic or spec.topic,
        "filter": spec.filter.describe(),
        "target": spec.target,
        "max_per_second": spec.max_per_second,
        "max_messages": spec.max_messages,
        "force": spec.force,
        "requested_by": spec.actor,
        "scanned": p.scanned,
        "matched": p.matched,
        "to_replay": p.to_replay,
        "replayed": p.replayed,
        "skipped": p.skipped,
        "failed": p.failed,
        "skipped_reasons": dict(p.skipped_reasons),
        "by_target": dict(p.by_target),
        "by_dead_reason": dict(p.by_dead_reason),
        "by_error_class": dict(p.by_error_class),
        "rate_per_second": round(rate, 2),
        "eta_seconds": round(eta, 2) if eta is not None else None,
        "created_at": p.created_at,
        "started_at": p.started_at,
        "finished_at": p.finished_at,
        "stop_reason": p.stop_reason,
        "position": {str(k): v for k, v in sorted(p.position.items())},
        "end_offsets": {str(k): v for k, v in sorted(p.end_offsets.items())},
        "last_replayed": p.last_replayed,
        "errors": list(p.errors),
    }
