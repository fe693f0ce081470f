"""Newest-first browsing: the k-way merge across partitions and its cursor, on an in-memory
topic (a stand-in for the scanner pool, in addition to the real-broker test in
tests/integration/test_explorer_http.py). Property: paging through with any page size yields
every matching record exactly once, newest first across partitions."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from retryd.explorer import newest
from retryd.policy.foreign import ForeignFormat
from retryd.policy.headers import Envelope, routed_headers
from retryd.replay.records import RecordFilter


class Msg:
    def __init__(self, partition: int, offset: int, timestamp: int, reason: str) -> None:
        self._p, self._o, self._t = partition, offset, timestamp
        env = Envelope(
            original_topic="orders",
            original_partition=0,
            original_offset=offset,
            original_timestamp=1,
            retry_number=1,
            first_failure_timestamp=1,
            error_class="E",
            error_message="boom",
            dead_reason=reason,
        )
        self._headers = routed_headers([], env)

    def topic(self) -> str:
        return "failed"

    def partition(self) -> int:
        return self._p

    def offset(self) -> int:
        return self._o

    def timestamp(self) -> tuple[int, int]:
        return (1, self._t)

    def key(self) -> bytes:
        return f"k{self._p}-{self._o}".encode()

    def value(self) -> bytes:
        return b"{}"

    def headers(self) -> list[tuple[str, bytes | None]]:
        return self._headers

    def error(self) -> None:
        return None


class Consumer:
    def __init__(self, data: dict[int, list[Msg]], low: int) -> None:
        self.data, self.low = data, low

    def get_watermark_offsets(self, tp: Any, timeout: float = 0) -> tuple[int, int]:
        return self.low, self.low + len(self.data[tp.partition])


class Scanner:
    topic = "failed"
    fmt = ForeignFormat.RETRYD

    def __init__(self, data: dict[int, list[Msg]], low: int) -> None:
        self.data, self.low = data, low
        self.consumer = Consumer(data, low)
        self.scanned = 0

    def partitions(self, timeout_s: float) -> list[int]:
        return sorted(self.data)

    def scan(self, start: dict[int, int], stop: dict[int, int], timeout_s: float) -> Iterator[Msg]:
        for p in sorted(start):
            for msg in self.data[p][start[p] - self.low : stop[p] - self.low]:
                self.scanned += 1
                yield msg


class Pool:
    def __init__(self, scanner: Scanner) -> None:
        self.scanner = scanner

    def acquire(self, timeout_s: float, topic: str | None = None) -> Scanner:
        return self.scanner

    def release(self, scanner: Scanner, broken: bool = False) -> None:
        pass


def topic(times: list[list[int]], low: int = 0) -> dict[int, list[Msg]]:
    """Partition p holds ``times[p]`` (sorted: a partition's timestamps do not go back);
    every third record is non_retryable."""
    return {
        p: [
            Msg(p, low + i, t, "non_retryable" if i % 3 == 0 else "exhausted")
            for i, t in enumerate(sorted(ts))
        ]
        for p, ts in enumerate(times)
    }


def page_through(pool: Pool, flt: RecordFilter, limit: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    cursor = None
    for _ in range(1000):
        page = newest.browse_newest(
            pool,  # type: ignore[arg-type]
            flt,
            cursor=cursor,
            limit=limit,
            preview_bytes=16,
            timeout_s=1,
        )
        assert len(page.items) <= limit
        out += page.items
        if not page.has_more:
            return out
        cursor = page.next_cursor
    raise AssertionError("paging did not end")


@pytest.fixture(autouse=True)
def small_windows(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(newest, "FIRST_WINDOW", 2)
    monkeypatch.setattr(newest, "MAX_WINDOW", 5)


@settings(max_examples=60, deadline=None)
@given(
    times=st.lists(st.lists(st.integers(0, 50), max_size=25), min_size=1, max_size=4),
    limit=st.integers(1, 7),
    only_non_retryable=st.booleans(),
    low=st.sampled_from([0, 1000]),
)
def test_every_match_once_newest_first(
    times: list[list[int]], limit: int, only_non_retryable: bool, low: int
) -> None:
    data = topic(times, low)
    flt = RecordFilter(dead_reason="non_retryable" if only_non_retryable else None)
    items = page_through(Pool(Scanner(data, low)), flt, limit)
    coords = [(i["partition"], i["offset"]) for i in items]
    expected = {
        (m.partition(), m.offset())
        for msgs in data.values()
        for i, m in enumerate(msgs)
        if not only_non_retryable or i % 3 == 0
    }
    assert len(coords) == len(set(coords)) and set(coords) == expected
    stamps = [i["timestamp"] for i in items]
    assert stamps == sorted(stamps, reverse=True)


def test_a_page_is_bounded_by_the_scan_budget() -> None:
    data = topic([list(range(100)), list(range(100))])
    scanner = Scanner(data, 0)
    flt = RecordFilter(dead_reason="malformed")  # nothing matches
    page = newest.browse_newest(
        Pool(scanner),  # type: ignore[arg-type]
        flt,
        cursor=None,
        limit=10,
        preview_bytes=16,
        timeout_s=1,
        max_scan=20,
    )
    assert page.items == [] and page.has_more and not page.complete
    assert scanner.scanned < 40


def test_a_cursor_for_another_topic_is_refused() -> None:
    from retryd.replay.errors import InvalidRequest
    from retryd.replay.records import encode_cursor

    pool = Pool(Scanner(topic([[1, 2]]), 0))
    with pytest.raises(InvalidRequest):
        newest.browse_newest(
            pool,  # type: ignore[arg-type]
            RecordFilter(),
            cursor=encode_cursor({7: 3}),
            limit=5,
            preview_bytes=16,
            timeout_s=1,
        )


def test_a_selection_job_reads_only_its_partitions_from_its_lowest_offsets() -> None:
    from retryd.replay.jobs import selection_start

    assert selection_start([0, 1, 2], None) == {0: 0, 1: 0, 2: 0}
    chosen = frozenset({(1, 40), (1, 7), (2, 3), (9, 1)})  # partition 9 does not exist
    assert selection_start([0, 1, 2], chosen) == {1: 7, 2: 3}
    assert selection_start([0], frozenset()) == {}
