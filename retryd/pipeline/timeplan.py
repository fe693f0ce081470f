"""Turning a time window into offset ranges, and deciding whether the broker can be trusted
to do it (pure logic; the reads that feed it are in ``kafka_io``).

Kafka's ListOffsets-by-timestamp ("offsets for times") answers, per partition, the earliest
offset whose record timestamp is at or after T (or "none" when no record is). From that:

- **since**: every record before the answer is stamped before ``since``, so starting the read
  there loses nothing, whatever the order of timestamps along the partition;
- **until**: records after the answer may still be stamped before ``until`` when producers'
  clocks disagree (CreateTime). The read therefore ends at the answer for
  ``until + UNTIL_MARGIN_MS``: exact as long as timestamps along a partition are out of order
  by less than the margin (retryd's own dead letters carry the producing worker's clock).

Every record read is still filtered on its timestamp afterwards, so the narrowed read returns
exactly the window. Some Kafka-compatible brokers answer offsets-for-times without looking at
record timestamps (one measured here returns offset 0 for every timestamp). Each answer is
therefore checked against the records around it; a single contradiction, or an error, makes
the whole read fall back to full ranges filtered after the read, and the plan says why.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from retryd.policy.timespec import TimeWindow, format_instant

TP = tuple[str, int]
UNTIL_MARGIN_MS = 5 * 60_000
SINCE, UNTIL = "since", "until"


@dataclass(frozen=True, slots=True)
class Sample:
    """One record read back to check an answer: its offset and timestamp (epoch ms)."""

    offset: int
    timestamp_ms: int


@dataclass(frozen=True, slots=True)
class Check:
    """What is needed to check the broker's answer for one partition and one side.

    ``at``: the first record at or after the answer; ``before``: the record just before it
    (when offset ``answer - 1`` holds one); ``last``: the partition's last record (checked
    when the answer is "none").
    """

    answer: int | None
    at: Sample | None = None
    before: Sample | None = None
    last: Sample | None = None


def probe_offsets(answer: int | None, low: int, high: int) -> dict[str, int]:
    """Which offsets to read back to check one answer: name -> the offset to start reading at
    (the first record at or after it is the sample)."""
    if answer is None or answer >= high:
        return {"last": high - 1} if high > low else {}
    out = {"at": max(answer, low)}
    if answer > low:
        out["before"] = answer - 1
    return out


def contradiction(tp: TP, target_ms: int, low: int, high: int, check: Check) -> str | None:
    """Why the answer cannot be right for a broker that honours record timestamps, or None.

    Only necessary conditions of the contract are tested, so a correct broker always passes.
    """
    where = f"{tp[0]}[{tp[1]}]"
    when = format_instant(target_ms)
    answer = check.answer
    if answer is None or answer >= high:
        last = check.last
        if last is not None and last.timestamp_ms >= target_ms:
            return (
                f"{where}: the broker found no record at/after {when}, but offset {last.offset} "
                f"is stamped {format_instant(last.timestamp_ms)}"
            )
        return None
    if answer < low:
        return f"{where}: the broker answered offset {answer} for {when}, below the log start {low}"
    at, before = check.at, check.before
    if at is not None and at.offset == answer and at.timestamp_ms < target_ms:
        return (
            f"{where}: the broker answered offset {answer} for {when}, but that record is "
            f"stamped {format_instant(at.timestamp_ms)}"
        )
    if before is not None and before.offset == answer - 1 and before.timestamp_ms >= target_ms:
        return (
            f"{where}: the broker answered offset {answer} for {when}, but the record before it "
            f"is stamped {format_instant(before.timestamp_ms)}"
        )
    return None


@dataclass(frozen=True)
class TimePlan:
    """Offset ranges for a window; ``narrowed`` False means full ranges filtered after read."""

    window: TimeWindow
    ranges: Mapping[TP, tuple[int, int]]
    narrowed: bool
    note: str

    @property
    def method(self) -> str:
        return "offsets-for-times" if self.narrowed else "filter-after-read"


def targets(window: TimeWindow) -> dict[str, int]:
    """The timestamps to ask the broker about, per side."""
    out: dict[str, int] = {}
    if window.since_ms is not None:
        out[SINCE] = window.since_ms
    if window.until_ms is not None:
        out[UNTIL] = window.until_ms + UNTIL_MARGIN_MS
    return out


def full_ranges(extents: Mapping[TP, tuple[int, int]]) -> dict[TP, tuple[int, int]]:
    return {tp: (low, high) for tp, (low, high) in extents.items()}


def plan_window(
    window: TimeWindow,
    extents: Mapping[TP, tuple[int, int]],
    checks: Mapping[tuple[TP, str], Check] | None,
    broker_error: str | None = None,
) -> TimePlan:
    """The ranges to read for ``window``.

    ``extents``: (first offset, high watermark) per partition; ``checks``: the broker's answer
    and the records read back, per (partition, side), or None with ``broker_error`` when the
    broker could not answer at all.
    """
    if window.is_open:
        return TimePlan(window, full_ranges(extents), False, "no time filter")
    fallback = "reading whole partitions and filtering after the read"
    if broker_error is not None or checks is None:
        reason = broker_error or "no answer"
        note = f"offsets-for-times unavailable ({reason}): {fallback}"
        return TimePlan(window, full_ranges(extents), False, note)
    wanted = targets(window)
    for (tp, side), check in sorted(checks.items()):
        low, high = extents[tp]
        problem = contradiction(tp, wanted[side], low, high, check)
        if problem is not None:
            note = f"offsets-for-times not supported by this broker ({problem}): {fallback}"
            return TimePlan(window, full_ranges(extents), False, note)
    ranges: dict[TP, tuple[int, int]] = {}
    for tp, (low, high) in extents.items():
        start, end = low, high
        since = checks.get((tp, SINCE))
        if since is not None:
            start = high if since.answer is None else min(max(since.answer, low), high)
        until = checks.get((tp, UNTIL))
        if until is not None and until.answer is not None:
            end = min(max(until.answer, low), high)
        ranges[tp] = (start, max(start, end))
    kept = sum(e - s for s, e in ranges.values())
    total = sum(h - lo for lo, h in extents.values())
    margin = f"; until + {UNTIL_MARGIN_MS // 60_000}m margin" if window.until_ms is not None else ""
    note = (
        f"offsets-for-times: reading {kept} of {total} offsets{margin}, "
        "then filtering on the record timestamp"
    )
    return TimePlan(window, ranges, True, note)
