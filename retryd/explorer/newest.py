"""Browse a dead-letter topic newest first, with the API's filters and cursor encoding.

``/v1/failed`` pages forward from the oldest record; an operator looks at the latest failures
first. This reads backwards: each partition in windows that end where the previous page
stopped, merged across partitions by timestamp (a k-way merge that never passes a partition
whose older records it has not read yet, so pages are in order across partitions too). The
cursor is ``retryd.replay.records.encode_cursor`` of, per partition, the exclusive upper
offset still to show.

Bounded like the API's browse: at most ``MAX_SCAN`` records read and ``time_budget_s`` spent
per page (a page may then be short, with ``has_more``), and every matching record is cut to
its preview as soon as it is read.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

from confluent_kafka import KafkaException, TopicPartition

from retryd.replay.errors import BrokerUnavailable, InvalidRequest
from retryd.replay.records import RecordFilter, decode_cursor, encode_cursor, render_record
from retryd.replay.scan import ScannerPool, TopicScanner, to_record

MAX_SCAN = 100_000
FIRST_WINDOW = 200
MAX_WINDOW = 5_000


@dataclass(frozen=True)
class NewestPage:
    items: list[dict[str, Any]]
    next_cursor: str
    has_more: bool
    scanned: int
    complete: bool  # False: the scan budget ran out before the page was full


def _bounds(
    scanner: TopicScanner, parts: list[int], timeout_s: float
) -> dict[int, tuple[int, int]]:
    out = {}
    for part in parts:
        try:
            low, high = scanner.consumer.get_watermark_offsets(
                TopicPartition(scanner.topic, part), timeout=timeout_s
            )
        except KafkaException as exc:
            raise BrokerUnavailable(f"reading the offsets of {scanner.topic}: {exc}") from exc
        out[part] = (max(0, low), max(0, high))
    return out


def browse_newest(
    pool: ScannerPool,
    flt: RecordFilter,
    *,
    cursor: str | None,
    limit: int,
    preview_bytes: int,
    timeout_s: float,
    time_budget_s: float = 5.0,
    topic: str | None = None,
    max_scan: int = MAX_SCAN,
) -> NewestPage:
    """One page of matching records, newest first (see the module docstring)."""
    import time

    deadline = time.monotonic() + time_budget_s
    scanner = pool.acquire(timeout_s, topic)
    broken = False
    try:
        parts = scanner.partitions(timeout_s)
        if parts is None:
            return NewestPage([], encode_cursor({}), False, 0, True)
        if flt.partition is not None:
            parts = [p for p in parts if p == flt.partition]
        bounds = _bounds(scanner, parts, timeout_s)
        upper = {p: high for p, (_, high) in bounds.items()}
        if cursor:
            given = decode_cursor(cursor)
            unknown = sorted(set(given) - set(bounds))
            if unknown and flt.partition is None:
                raise InvalidRequest(
                    f"cursor names partition {unknown[0]} which {scanner.topic} does not have"
                )
            upper.update({p: min(o, bounds[p][1]) for p, o in given.items() if p in bounds})
        low = {p: bounds[p][0] for p in parts}
        window = dict.fromkeys(parts, FIRST_WINDOW)
        # Matching records read but not shown yet, newest (highest offset) first.
        buffers: dict[int, deque[tuple[int, int, dict[str, Any]]]] = {p: deque() for p in parts}
        items: list[dict[str, Any]] = []
        scanned = 0
        complete = True
        while len(items) < limit:
            need = [p for p in parts if not buffers[p] and upper[p] > low[p]]
            if need:
                if scanned >= max_scan or time.monotonic() > deadline:
                    complete = False
                    break
                start = {p: max(low[p], upper[p] - window[p]) for p in need}
                stop = {p: upper[p] for p in need}
                found: dict[int, list[tuple[int, int, dict[str, Any]]]] = {p: [] for p in need}
                for msg in scanner.scan(start, stop, timeout_s=timeout_s * 3):
                    scanned += 1
                    rec = to_record(msg, scanner.fmt)
                    if flt.matches(rec):
                        found[rec.partition].append(
                            (rec.timestamp, rec.offset, render_record(rec, preview_bytes))
                        )
                for p in need:
                    buffers[p].extend(sorted(found[p], key=lambda r: -r[1]))
                    upper[p] = start[p]  # everything at or above it is read (or buffered)
                    window[p] = min(MAX_WINDOW, window[p] * 2)
                continue
            ready = [p for p in parts if buffers[p]]
            if not ready:
                break  # every partition read back to its start
            newest = max(ready, key=lambda p: (buffers[p][0][0], p))
            items.append(buffers[newest].popleft()[2])
        # Per partition: the upper bound still to show (buffered records are shown again).
        positions = {p: (buffers[p][0][1] + 1 if buffers[p] else upper[p]) for p in parts}
        has_more = any(positions[p] > low[p] for p in parts)
    except BrokerUnavailable:
        broken = True
        raise
    finally:
        pool.release(scanner, broken=broken)
    return NewestPage(items, encode_cursor(positions), has_more, scanned, complete)
