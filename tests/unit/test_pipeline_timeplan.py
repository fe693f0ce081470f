"""Planning offset ranges for --since/--until, and catching brokers that ignore timestamps.

A small model of a partition (offsets with gaps, timestamps) and of two brokers: one that
answers offsets-for-times by Kafka's contract, and one that answers offset 0 for everything
(as the embedded broker does). Whatever the broker, narrowed ranges plus the after-read
filter must return exactly the records of the window.
"""

from __future__ import annotations

from collections.abc import Callable

from hypothesis import given, settings
from hypothesis import strategies as st

from retryd.pipeline.timeplan import (
    SINCE,
    UNTIL,
    UNTIL_MARGIN_MS,
    Check,
    Sample,
    plan_window,
    probe_offsets,
    targets,
)
from retryd.policy.timespec import TimeWindow

TP = ("failed", 0)
Records = list[tuple[int, int]]  # (offset, timestamp ms), offsets increasing
Broker = Callable[[Records, int], "int | None"]


def kafka(records: Records, ts: int) -> int | None:
    """Kafka's contract: the earliest offset whose timestamp is >= ts."""
    return next((o for o, t in records if t >= ts), None)


def always_zero(records: Records, ts: int) -> int | None:
    return 0


def sample(records: Records, offset: int) -> Sample | None:
    return next((Sample(o, t) for o, t in records if o >= offset), None)


def plan_for(records: Records, high: int, window: TimeWindow, broker: Broker):  # type: ignore[no-untyped-def]
    low = records[0][0] if records else high
    extents = {TP: (low, high)}
    checks = {}
    for side, ts in targets(window).items():
        answer = broker(records, ts)
        offsets = probe_offsets(answer, low, high)
        found = {name: sample(records, off) for name, off in offsets.items()}
        checks[(TP, side)] = Check(answer, found.get("at"), found.get("before"), found.get("last"))
    return plan_window(window, extents, checks)


def read(records: Records, plan, window: TimeWindow) -> Records:  # type: ignore[no-untyped-def]
    start, end = plan.ranges[TP]
    return [(o, t) for o, t in records if start <= o < end and window.contains(t)]


@st.composite
def partitions(draw, disorder_ms: int) -> tuple[Records, int]:  # type: ignore[no-untyped-def]
    """Records with offset gaps; timestamps increase up to a jitter below ``disorder_ms``."""
    n = draw(st.integers(0, 25))
    offset = draw(st.integers(0, 5))
    clock = 1_700_000_000_000
    out = []
    for _ in range(n):
        clock += draw(st.integers(0, 120_000))
        jitter = draw(st.integers(0, disorder_ms)) if disorder_ms else 0
        out.append((offset, clock + jitter))
        offset += draw(st.sampled_from([1, 1, 1, 2]))  # 2: a transaction marker in between
    high = offset + draw(st.integers(0, 1))
    return out, high


def windows(records: Records) -> st.SearchStrategy[TimeWindow]:
    stamps = [t for _, t in records] or [1_700_000_000_000]
    around = st.integers(min(stamps) - 10**6, max(stamps) + 10**6)
    point = st.one_of(st.none(), st.sampled_from(stamps), around)
    return (
        st.tuples(point, point)
        .filter(lambda w: None in w or w[0] < w[1])
        .map(lambda w: TimeWindow(*w))
    )


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_kafka_answers_narrow_the_read_exactly(data: st.DataObject) -> None:
    records, high = data.draw(partitions(UNTIL_MARGIN_MS - 1))
    window = data.draw(windows(records))
    plan = plan_for(records, high, window, kafka)
    expected = [(o, t) for o, t in records if window.contains(t)]
    assert read(records, plan, window) == expected
    if not window.is_open:
        assert plan.narrowed, plan.note  # a correct broker is never called wrong


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_since_alone_is_exact_whatever_the_timestamp_order(data: st.DataObject) -> None:
    records, high = data.draw(partitions(disorder_ms=10 * UNTIL_MARGIN_MS))
    since = data.draw(windows(records)).since_ms
    window = TimeWindow(since, None)
    plan = plan_for(records, high, window, kafka)
    assert read(records, plan, window) == [(o, t) for o, t in records if window.contains(t)]


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_a_broker_ignoring_timestamps_never_loses_records(data: st.DataObject) -> None:
    records, high = data.draw(partitions(UNTIL_MARGIN_MS - 1))
    window = data.draw(windows(records))
    plan = plan_for(records, high, window, always_zero)
    assert read(records, plan, window) == [(o, t) for o, t in records if window.contains(t)]


def test_the_embedded_broker_case_is_named_in_the_note() -> None:
    records = [(o, 1_700_000_000_000 + o * 1000) for o in range(10)]
    window = TimeWindow(1_700_000_000_000 + 3000, 1_700_000_000_000 + 7000)
    plan = plan_for(records, 10, window, always_zero)
    assert not plan.narrowed and plan.method == "filter-after-read"
    assert plan.ranges[TP] == (0, 10)
    assert "not supported by this broker" in plan.note
    assert "failed[0]: the broker answered offset 0 for 2023-11-14T22:13:23Z" in plan.note
    assert "filtering after the read" in plan.note


def test_kafka_plan_reads_only_the_window() -> None:
    records = [(o, 1_700_000_000_000 + o * 3_600_000) for o in range(48)]  # one per hour
    window = TimeWindow(1_700_000_000_000 + 10 * 3_600_000, 1_700_000_000_000 + 20 * 3_600_000)
    plan = plan_for(records, 48, window, kafka)
    assert plan.narrowed and plan.method == "offsets-for-times"
    assert plan.ranges[TP] == (10, 21)  # until + 5m margin: the record at hour 20 is read
    assert "reading 11 of 48 offsets" in plan.note and "5m margin" in plan.note
    assert [o for o, _ in read(records, plan, window)] == list(range(10, 20))


def test_nothing_at_or_after_since() -> None:
    records = [(0, 1000), (1, 2000)]
    window = TimeWindow(5000, None)
    plan = plan_for(records, 2, window, kafka)
    assert plan.narrowed and plan.ranges[TP] == (2, 2)
    # a broker claiming "nothing" while the last record qualifies is caught
    plan = plan_for(records, 2, TimeWindow(1500, None), lambda r, t: None)
    assert not plan.narrowed and "offset 1 is stamped" in plan.note


def test_broker_errors_and_open_windows() -> None:
    extents = {TP: (3, 9)}
    plan = plan_window(TimeWindow(1, 2), extents, None, broker_error="UNSUPPORTED_VERSION")
    assert not plan.narrowed and plan.ranges[TP] == (3, 9)
    assert "offsets-for-times unavailable (UNSUPPORTED_VERSION)" in plan.note
    open_plan = plan_window(TimeWindow(), extents, None)
    assert open_plan.ranges[TP] == (3, 9) and open_plan.note == "no time filter"
    assert probe_offsets(None, 3, 3) == {} and probe_offsets(3, 3, 9) == {"at": 3}
    assert probe_offsets(5, 3, 9) == {"at": 5, "before": 4}
    assert probe_offsets(9, 3, 9) == {"last": 8}
    assert {SINCE, UNTIL} == set(targets(TimeWindow(1, 2)))
