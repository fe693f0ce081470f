"""Offset ranges, chunking and the data source options (pure logic)."""

from __future__ import annotations

import itertools
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from retryd.pipeline.offsets import (
    Bound,
    OffsetRange,
    SourceOptionError,
    cap_offsets,
    clamp_range,
    offsets_from_json_dict,
    offsets_to_json_dict,
    parse_bound_spec,
    ranges_to_json,
    split_range,
)
from retryd.pipeline.options import SourceOptions


@given(
    start=st.integers(0, 10**12),
    span=st.integers(0, 10_000),
    chunk=st.one_of(st.none(), st.integers(1, 3000)),
)
def test_split_covers_the_range_exactly(start: int, span: int, chunk: int | None) -> None:
    rng = OffsetRange("t", 3, start, start + span)
    parts = split_range(rng, chunk)
    if span == 0:
        assert parts == []
        return
    assert parts[0].start == start and parts[-1].end == start + span
    for a, b in itertools.pairwise(parts):
        assert a.end == b.start  # contiguous, no overlap
    assert all(p.span > 0 and (chunk is None or p.span <= chunk) for p in parts)
    assert all((p.topic, p.partition) == ("t", 3) for p in parts)
    if chunk:
        assert len(parts) == -(-span // chunk)  # as few chunks as the limit allows


def test_split_is_even() -> None:
    parts = split_range(OffsetRange("t", 0, 0, 25), 10)
    assert [p.span for p in parts] == [9, 9, 7]


def test_bound_specs() -> None:
    assert parse_bound_spec("starting", None).default == Bound("earliest")
    assert parse_bound_spec("ending", None).default == Bound("latest")
    assert parse_bound_spec("starting", "LATEST").default == Bound("latest")
    spec = parse_bound_spec("starting", json.dumps({"a": {"0": 5, "1": -2, "2": -1}}))
    assert spec.for_partition("a", 0) == Bound("offset", 5)
    assert spec.for_partition("a", 1) == Bound("earliest")
    assert spec.for_partition("a", 2) == Bound("latest")
    assert spec.for_partition("a", 9) == Bound("earliest")  # unlisted: the side's default
    by_time = parse_bound_spec("ending", "latest", "1000", json.dumps({"a": {"0": 7}}))
    assert by_time.for_partition("a", 0) == Bound("timestamp", 7)
    assert by_time.default == Bound("latest")  # by-timestamp wins over the global timestamp
    assert parse_bound_spec("ending", "latest", "1000").default == Bound("timestamp", 1000)


@pytest.mark.parametrize(
    ("side", "offsets", "timestamp", "message"),
    [
        ("ending", "earliest", None, "endingOffsets cannot be 'earliest'"),
        ("ending", '{"a": {"0": -2}}', None, "not allowed as an ending offset"),
        ("starting", '{"a": {"0": -7}}', None, "offset -7 is invalid"),
        ("starting", '{"a": {"x": 1}}', None, "partition 'x'"),
        ("starting", '{"a": {"0": "1"}}', None, "must be an integer"),
        ("starting", '{"a": [1]}', None, "must map partition numbers"),
        ("starting", "{oops", None, "must be JSON"),
        ("starting", "yesterday", None, "use 'earliest', 'latest'"),
        ("starting", None, "soon", "startingTimestamp='soon' is not an integer"),
        ("starting", None, "-5", "must be epoch milliseconds"),
    ],
)
def test_bad_bounds(side: str, offsets: str | None, timestamp: str | None, message: str) -> None:
    with pytest.raises(SourceOptionError) as err:
        parse_bound_spec(side, offsets, timestamp)  # type: ignore[arg-type]
    assert message in str(err.value)


def test_clamp_and_json() -> None:
    assert clamp_range("t", 0, 2, 50, 5, 20) == OffsetRange("t", 0, 5, 20)
    assert clamp_range("t", 0, 30, 40, 5, 20) == OffsetRange("t", 0, 20, 20)
    ranges = [OffsetRange("t", 1, 4, 9), OffsetRange("t", 0, 0, 3)]
    assert json.loads(ranges_to_json(ranges, "starting")) == {"t": {"0": 0, "1": 4}}
    assert json.loads(ranges_to_json(ranges, "ending")) == {"t": {"0": 3, "1": 9}}
    assert str(ranges[0]) == "t[1]@4..9"


def test_source_options() -> None:
    opts = SourceOptions.parse(
        {
            "Bootstrap": "b:9092",
            "topics": "a, b",
            "kafka.security.protocol": "SASL_SSL",
            "maxRecordsPerPartition": "100",
            "startingOffsets": json.dumps({"a": {"0": 3}}),
        }
    )
    assert opts.topics == ("a", "b")
    assert opts.kafka_conf == {"bootstrap.servers": "b:9092", "security.protocol": "SASL_SSL"}
    assert opts.max_records_per_partition == 100
    assert opts.starting.for_partition("a", 0) == Bound("offset", 3)
    assert SourceOptions.parse({"kafka.bootstrap.servers": "x", "subscribe": "t"}).topics == ("t",)


def test_source_options_list_every_problem() -> None:
    with pytest.raises(SourceOptionError) as err:
        SourceOptions.parse(
            {
                "topics": "ok,bad topic",
                "startingOffsets": json.dumps({"other": {"0": 1}}),
                "maxRecordsPerPartition": "0",
                "kafka.enable.auto.commit": "true",
                "typo": "1",
            }
        )
    problems = err.value.problems
    assert any("'bootstrap'" in p for p in problems)
    assert any("'bad topic' is invalid" in p for p in problems)
    assert any("'other', which is not in 'topics'" in p for p in problems)
    assert any("maxrecordsperpartition=0" in p for p in problems)
    assert any("kafka.enable.auto.commit is set by the reader" in p for p in problems)
    assert any("unknown option 'typo'" in p for p in problems)
    with pytest.raises(SourceOptionError, match="'topics' is required"):
        SourceOptions.parse({"bootstrap": "x"})


# --- streaming offsets ------------------------------------------------------------------------

backlogs = st.dictionaries(
    st.tuples(st.sampled_from(["a", "b"]), st.integers(0, 20)),
    st.tuples(st.integers(0, 10**6), st.integers(0, 10**4)),
    min_size=1,
    max_size=12,
)


@given(backlogs, st.integers(1, 5000))
def test_cap_offsets_respects_the_budget_and_always_moves(
    positions: dict[tuple[str, int], tuple[int, int]], max_rows: int
) -> None:
    start = {tp: s for tp, (s, _) in positions.items()}
    latest = {tp: s + n for tp, (s, n) in positions.items()}
    end = cap_offsets(start, latest, max_rows)
    assert end.keys() == latest.keys()
    assert all(start[tp] <= end[tp] <= latest[tp] for tp in end)
    moved = sum(end[tp] - start[tp] for tp in end)
    backlog = sum(latest[tp] - start[tp] for tp in end)
    assert moved <= max_rows or moved == backlog
    if backlog:
        assert moved > 0  # a trigger always makes progress
    if backlog <= max_rows:
        assert end == latest


def test_cap_offsets_shares_by_backlog_and_starts_new_partitions_at_zero() -> None:
    start = {("t", 0): 0, ("t", 1): 100}
    latest = {("t", 0): 300, ("t", 1): 200, ("t", 2): 50}  # t[2] is new: read from 0
    assert cap_offsets(start, latest, 100) == {("t", 0): 66, ("t", 1): 122, ("t", 2): 11}
    assert cap_offsets(start, latest, 1000) == latest


def test_offsets_json_dict_is_ordered_and_round_trips() -> None:
    offsets = {("b", 10): 5, ("a", 2): 7, ("b", 2): 1}
    as_dict = offsets_to_json_dict(offsets)
    assert json.dumps(as_dict) == '{"a": {"2": 7}, "b": {"2": 1, "10": 5}}'
    assert offsets_from_json_dict(json.loads(json.dumps(as_dict))) == offsets
    with pytest.raises(SourceOptionError, match="must be a JSON object"):
        offsets_from_json_dict([1])
    with pytest.raises(SourceOptionError, match="is not a number"):
        offsets_from_json_dict({"a": {"x": 1}})
