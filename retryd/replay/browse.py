"""Browse a dead-letter topic (``failed_topic`` unless a request names an error route's
``dlt:`` topic or a foreign one, see ``sources``): filtered pages with an opaque cursor (next
offset per partition; a cursor belongs to the topic it was returned for). A foreign topic's
records are read through the pool's mapping (``ScannerPool.formats``)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from retryd.replay.errors import BrokerUnavailable, InvalidRequest, RecordNotFound
from retryd.replay.records import (
    FailedRecord,
    RecordFilter,
    decode_cursor,
    encode_cursor,
    render_record,
)
from retryd.replay.scan import ScannerPool, to_record

MAX_SCAN_PER_PAGE = 100_000
# A page's rendered items stop growing past this (estimated as their JSON size): with 500
# items of many headers each a page would otherwise be unbounded. The cursor continues after
# the last item, and ``has_more`` says so.
MAX_PAGE_BYTES = 4 * 1024 * 1024


@dataclass(frozen=True)
class Page:
    items: list[dict[str, Any]]
    next_cursor: str
    has_more: bool
    scanned: int


def browse(
    pool: ScannerPool,
    flt: RecordFilter,
    *,
    cursor: str | None,
    limit: int,
    preview_bytes: int,
    timeout_s: float = 10.0,
    time_budget_s: float = 5.0,
    max_page_bytes: int = MAX_PAGE_BYTES,
    topic: str | None = None,
) -> Page:
    """One page of matching records. A page ends when ``limit`` records matched, their
    rendering reached ``max_page_bytes``, every partition reached its current end, or the scan
    budget (records or time) ran out; in every case but the end of the partitions ``has_more``
    is true, even if the page is short.

    Each matching record is trimmed to its preview as soon as it is read, so a request holds
    one full record at a time, not ``limit`` of them (8 concurrent pages of 500 records of
    1 MB were 4 GB). ``topic`` is the one to read (default: the pool's, failed_topic)."""
    scanner = pool.acquire(timeout_s, topic)
    broken = False
    try:
        parts = scanner.partitions(timeout_s)
        if parts is None:
            return Page([], encode_cursor({}), False, 0)
        start = {p: 0 for p in parts}
        if cursor:
            given = decode_cursor(cursor)
            unknown = sorted(set(given) - set(parts))
            if unknown:
                raise InvalidRequest(
                    f"cursor names partition {unknown[0]} which {scanner.topic} does not have"
                )
            start.update(given)
        if flt.partition is not None:
            if flt.partition not in start:  # no such partition: nothing can match
                return Page([], encode_cursor(start), False, 0)
            start = {flt.partition: start[flt.partition]}
        items: list[tuple[int, int, int, dict[str, Any]]] = []
        page_bytes = 0
        scanned = 0
        exhausted = True
        for msg in scanner.scan(
            start, timeout_s=time_budget_s, idle_timeout_s=timeout_s, partial_ok=True
        ):
            scanned += 1
            rec: FailedRecord | None = to_record(msg, scanner.fmt)
            assert rec is not None
            if flt.matches(rec):
                item = render_record(rec, preview_bytes)
                items.append((rec.timestamp, rec.partition, rec.offset, item))
                page_bytes += len(json.dumps(item, separators=(",", ":"), default=str))
            rec = None  # the full value goes now: only its preview stays
            if len(items) >= limit or page_bytes >= max_page_bytes or scanned >= MAX_SCAN_PER_PAGE:
                exhausted = False
                break
        positions = dict(scanner.positions)
        at_end = exhausted and scanner.last_scan_complete
    except BrokerUnavailable:
        broken = True
        raise
    finally:
        pool.release(scanner, broken=broken)
    items.sort(key=lambda r: (r[0], r[1], r[2]))
    return Page(
        [item for _, _, _, item in items],
        encode_cursor(positions),
        not at_end,
        scanned,
    )


def read_record(
    pool: ScannerPool,
    partition: int,
    offset: int,
    timeout_s: float = 10.0,
    topic: str | None = None,
) -> FailedRecord:
    """The record at ``partition``/``offset`` of ``topic`` (default: the pool's)."""
    scanner = pool.acquire(timeout_s, topic)
    where = scanner.topic
    broken = False
    try:
        parts = scanner.partitions(timeout_s)
        if parts is None:
            raise RecordNotFound(f"topic {where} does not exist")
        if partition not in parts:
            raise RecordNotFound(f"{where} has no partition {partition}")
        msg = scanner.read_one(partition, offset, timeout_s)
    except BrokerUnavailable:
        broken = True
        raise
    finally:
        pool.release(scanner, broken=broken)
    if msg is None:
        raise RecordNotFound(f"no record at {where}[{partition}]@{offset}")
    return to_record(msg, scanner.fmt)
