"""The overview's numbers: dead letters by reason and by error fingerprint, with first/last
seen and a sparkline over time (pure logic; the scan that feeds it is in ``overview_page``).

Every table is bounded: at most ``MAX_FINGERPRINTS`` distinct fingerprints are told apart
(later ones are counted under ``other``), and only the most frequent ``SHOWN`` are shown.
When the scan did not reach a topic's oldest record, every count is a lower bound and the page
says so.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from retryd.explorer.preview import record_fingerprint, short
from retryd.policy import headers as h

MAX_FINGERPRINTS = 1000
SHOWN = 50
BUCKETS = 24
OTHER = "other"


@dataclass
class FingerprintRow:
    id: str
    error_class: str
    template: str
    count: int = 0
    first_ms: int = 0
    last_ms: int = 0
    times: list[int] = field(default_factory=list)  # bounded: see Tally.add


@dataclass
class Tally:
    """Counts of one dead-letter topic's scanned records."""

    scanned: int = 0
    waiting: int = 0  # not replayed yet (the ledger has no entry)
    by_reason: Counter[str] = field(default_factory=Counter)
    rows: dict[str, FingerprintRow] = field(default_factory=dict)
    first_ms: int | None = None
    last_ms: int | None = None
    max_times: int = 4096  # timestamps kept per fingerprint for its sparkline

    def add(self, envelope: dict[str, str | int | None], timestamp: int, replayed: bool) -> None:
        self.scanned += 1
        if replayed:
            return
        self.waiting += 1
        reason = envelope.get(h.DEAD_REASON)
        self.by_reason[short(reason, 64) if isinstance(reason, str) else "(none)"] += 1
        fp_id, template = record_fingerprint(envelope)
        row = self.rows.get(fp_id)
        if row is None:
            if len(self.rows) >= MAX_FINGERPRINTS:
                fp_id, template = OTHER, "(more distinct errors than the overview tells apart)"
                row = self.rows.get(OTHER)
            if row is None:
                cls = envelope.get(h.ERROR_CLASS)
                row = FingerprintRow(
                    fp_id,
                    short(cls, 120) if isinstance(cls, str) and fp_id != OTHER else "",
                    short(template, 200),
                    first_ms=timestamp,
                    last_ms=timestamp,
                )
                self.rows[fp_id] = row
        row.count += 1
        row.first_ms = min(row.first_ms, timestamp)
        row.last_ms = max(row.last_ms, timestamp)
        if len(row.times) < self.max_times:
            row.times.append(timestamp)
        self.first_ms = timestamp if self.first_ms is None else min(self.first_ms, timestamp)
        self.last_ms = timestamp if self.last_ms is None else max(self.last_ms, timestamp)

    def top(self, n: int = SHOWN) -> list[FingerprintRow]:
        return sorted(self.rows.values(), key=lambda r: (-r.count, r.id))[:n]


def buckets(times: list[int], start_ms: int, end_ms: int, n: int = BUCKETS) -> list[int]:
    """How many of ``times`` fall in each of ``n`` equal slices of ``[start_ms, end_ms]``."""
    counts = [0] * n
    span = max(1, end_ms - start_ms)
    for t in times:
        if start_ms <= t <= end_ms:
            counts[min(n - 1, (t - start_ms) * n // span)] += 1
    return counts


def sparkline_points(counts: list[int], width: int = 120, height: int = 24) -> str:
    """The ``points`` of an SVG polyline drawing ``counts`` (0 at the bottom)."""
    if not counts:
        return ""
    top = max(counts) or 1
    step = width / max(1, len(counts) - 1)
    return " ".join(
        f"{i * step:.1f},{height - 1 - (c / top) * (height - 2):.1f}" for i, c in enumerate(counts)
    )
