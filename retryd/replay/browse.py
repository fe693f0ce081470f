"""Browse ``failed_topic``: filtered pages with an opaque cursor (next offset per partition)."""

from __future__ import annotations

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
) -> Page:
    """One page of matching records. A page ends when ``limit`` records matched, every
    partition reached its current end, or the scan budget (records or time) ran out; in the
    last case ``has_more`` is true even if the page is short."""
    scanner = pool.acquire(timeout_s)
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
                    f"cursor names partition {unknown[0]} which {pool.topic} does not have"
                )
            start.update(given)
        if flt.partition is not None:
            if flt.partition not in start:  # no such partition: nothing can match
                return Page([], encode_cursor(start), False, 0)
            start = {flt.partition: start[flt.partition]}
        items: list[FailedRecord] = []
        scanned = 0
        exhausted = True
        for msg in scanner.scan(
            start, timeout_s=time_budget_s, idle_timeout_s=timeout_s, partial_ok=True
        ):
            scanned += 1
            rec = to_record(msg)
            if flt.matches(rec):
                items.append(rec)
            if len(items) >= limit or scanned >= MAX_SCAN_PER_PAGE:
                exhausted = False
                break
        positions = dict(scanner.positions)
        at_end = exhausted and scanner.last_scan_complete
    except BrokerUnavailable:
        broken = True
        raise
    finally:
        pool.release(scanner, broken=broken)
    items.sort(key=lambda r: (r.timestamp, r.partition, r.offset))
    return Page(
        [render_record(r, preview_bytes) for r in items],
        encode_cursor(positions),
        not at_end,
        scanned,
    )


def read_record(
    pool: ScannerPool, partition: int, offset: int, timeout_s: float = 10.0
) -> FailedRecord:
    scanner = pool.acquire(timeout_s)
    broken = False
    try:
        parts = scanner.partitions(timeout_s)
        if parts is None:
            raise RecordNotFound(f"topic {pool.topic} does not exist")
        if partition not in parts:
            raise RecordNotFound(f"{pool.topic} has no partition {partition}")
        msg = scanner.read_one(partition, offset, timeout_s)
    except BrokerUnavailable:
        broken = True
        raise
    finally:
        pool.release(scanner, broken=broken)
    if msg is None:
        raise RecordNotFound(f"no record at {pool.topic}[{partition}]@{offset}")
    return to_record(msg)
