"""Records to Arrow columns, native option mapping, Java version parsing (pure logic)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pa = pytest.importorskip("pyarrow")

from retryd.pipeline.columns import (  # noqa: E402
    ARROW_SCHEMA,
    COLUMNS,
    HEADER_COLUMNS,
    MAX_EPOCH_MS,
    PARSED_COLUMNS,
    BatchBuilder,
    Record,
    bounded,
    build_batch,
    parse_retryd_headers,
)
from retryd.pipeline.native import native_options  # noqa: E402
from retryd.pipeline.session import java_major  # noqa: E402
from retryd.policy import headers as h  # noqa: E402
from retryd.policy.headers import Envelope, routed_headers  # noqa: E402


def reference_parse(headers: Any) -> dict[str, Any]:
    """The definition: ``decode_lenient`` then ``bounded`` (the fast parser must agree)."""
    out: dict[str, Any] = {}
    for name, value in h.decode_lenient(headers).items():
        spec = HEADER_COLUMNS.get(name)
        if spec is not None:
            out[spec[0]] = bounded(value, spec[1])
    return out


def reference_rows(records: list[Record]) -> list[dict[str, Any]]:
    """Row by row, the obvious way: what ``build_batch`` must produce, column for column."""
    rows = []
    for r in records:
        kind, ms = r.timestamp()
        row = {
            "topic": r.topic(),
            "partition": r.partition(),
            "offset": r.offset(),
            "timestamp": None if kind == 0 or ms < 0 or ms > MAX_EPOCH_MS else ms * 1000,
            "timestamp_type": kind - 1,
            "key": r.key(),
            "value": r.value(),
            "headers": [{"key": k, "value": v} for k, v in (r.headers() or [])],
        }
        row.update({name: None for name in PARSED_COLUMNS})
        row.update(reference_parse(r.headers()))
        rows.append(row)
    return rows


header_names = st.sampled_from([*HEADER_COLUMNS, "retryd_group", "trace", "", "x" * 40])
header_values = st.one_of(
    st.none(),
    st.binary(max_size=12),
    st.integers(0, 2**64).map(lambda i: str(i).encode()),
    st.sampled_from([b"12", b"0", b"-1", b" 7", b"\xef\xbc\x95", b"\xff", b"", b"orders"]),
)
records = st.builds(
    Record,
    topic=st.sampled_from(["failed", "t.x"]),
    partition=st.integers(0, 3),
    offset=st.integers(0, 2**40),
    timestamp=st.tuples(st.integers(0, 2), st.integers(-5, MAX_EPOCH_MS + 5)),
    key=st.one_of(st.none(), st.binary(max_size=8)),
    value=st.one_of(st.none(), st.binary(max_size=8)),
    headers=st.one_of(st.none(), st.lists(st.tuples(header_names, header_values), max_size=6)),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(header_names, header_values), max_size=8))
def test_fast_header_parse_matches_decode_lenient(headers: list) -> None:
    assert parse_retryd_headers(headers) == reference_parse(headers)


@settings(max_examples=150, deadline=None)
@given(st.lists(records, max_size=30))
def test_columnar_batch_matches_row_by_row(recs: list[Record]) -> None:
    batch = build_batch(recs)
    assert batch.schema.equals(ARROW_SCHEMA) and batch.num_rows == len(recs)
    # timestamps compared as epoch microseconds
    as_ints = [
        col.cast(pa.int64()) if pa.types.is_timestamp(col.type) else col for col in batch.columns
    ]
    got = pa.RecordBatch.from_arrays(as_ints, names=batch.schema.names).to_pylist()
    assert got == reference_rows(recs)


def test_batch_keeps_bytes_and_parses_envelope() -> None:
    env = Envelope("orders", 2, 41, 1_700_000_000_000, 3, 1_700_000_060_000, 1_700_000_000_500,
                   "TimeoutError", "slow", "exhausted")  # fmt: skip
    headers = routed_headers([("trace", b"\x00\xff"), ("nil", None)], env)
    builder = BatchBuilder()
    builder.add("failed", 1, 7, (1, 1_700_000_100_000), None, b"\x01\x02", headers)
    builder.add("failed", 1, 9, (0, -1), b"k", None, None)
    batch = builder.flush()
    assert len(builder) == 0
    assert batch.schema.equals(ARROW_SCHEMA) and tuple(batch.schema.names) == COLUMNS
    first, second = batch.to_pylist()
    assert [(h["key"], h["value"]) for h in first["headers"]] == headers
    assert (first["key"], first["value"], first["timestamp_type"]) == (None, b"\x01\x02", 0)
    assert first["timestamp"].timestamp() == 1_700_000_100
    assert (first["original_topic"], first["original_partition"], first["original_offset"]) == (
        "orders", 2, 41,
    )  # fmt: skip
    assert (first["retry_number"], first["error_class"], first["dead_reason"]) == (
        3, "TimeoutError", "exhausted",
    )  # fmt: skip
    assert first["retry_timestamp"].timestamp() == 1_700_000_060
    assert second["timestamp"] is None and second["timestamp_type"] == -1
    assert second["headers"] == [] and second["retry_number"] is None


def test_bad_header_values_become_null() -> None:
    parsed = parse_retryd_headers(
        [
            ("retry_number", b"2"),
            ("retry_number", b"x"),  # the last one wins, and it is bad
            ("retryd_original_partition", str(2**31).encode()),
            ("retryd_original_offset", str(2**63).encode()),
            ("retry_timestamp", str(MAX_EPOCH_MS + 1).encode()),
            ("retryd_error_class", b"\xff"),
            ("retryd_original_topic", b"orders"),
            ("user", b"ignored"),
        ]
    )
    assert parsed == {
        "retry_number": None,
        "original_partition": None,
        "original_offset": None,
        "retry_timestamp": None,
        "error_class": None,
        "original_topic": "orders",
    }


def test_native_options_mapping() -> None:
    mapped = native_options(
        {
            "bootstrap": "b:1",
            "topics": "a,b",
            "startingoffsets": "earliest",
            "maxRecordsPerPartition": "10",
            "kafka.security.protocol": "SSL",
            "batchRows": "5",
        }
    )
    assert mapped == {
        "includeHeaders": "true",
        "failOnDataLoss": "false",
        "kafka.bootstrap.servers": "b:1",
        "subscribe": "a,b",
        "startingOffsets": "earliest",
        "maxRecordsPerPartition": "10",
        "kafka.security.protocol": "SSL",
    }


@pytest.mark.parametrize(
    ("text", "major"),
    [
        ('openjdk version "17.0.15" 2025-04-15', 17),
        ('java version "1.8.0_392"', 8),
        ('openjdk version "21" 2023-09-19', 21),
        ('openjdk version "11.0.2-ea"', 11),
        ("no version here", None),
    ],
)
def test_java_major(text: str, major: int | None) -> None:
    assert java_major(text) == major


def test_fewer_gc_passes_is_scoped() -> None:
    import gc

    from retryd.pipeline.kafka_io import fewer_gc_passes

    before = gc.get_threshold()
    with pytest.raises(RuntimeError), fewer_gc_passes(123_456):
        assert gc.get_threshold() == (max(before[0], 123_456), *before[1:])
        raise RuntimeError("a read failed")
    assert gc.get_threshold() == before


def test_spark_replay_never_targets_retryd_own_topics() -> None:
    from retryd.config import load_settings
    from retryd.pipeline.replay import ReplaySpec, _check_targets
    from retryd.replay.targets import reserved_topics

    settings = load_settings(main_topics="orders", retry_sequence="5m,1h")
    spec = ReplaySpec(
        kafka_conf={"bootstrap.servers": "127.0.0.1:1"},
        failed_topic=settings.failed_topic,
        ledger_topic=settings.ledger_topic,
        # an allow-list that wrongly names retryd's own topics must not make them targets
        allowlist=("retry_5m", "failed_topic", "retryd_replay_ledger", "__consumer_offsets"),
        reserved=tuple(reserved_topics(settings).items()),
    )
    out = _check_targets(spec, ["retry_5m", "failed_topic", "retryd_replay_ledger"])
    assert out == dict.fromkeys(
        ["retry_5m", "failed_topic", "retryd_replay_ledger"], "target_reserved"
    )
    assert _check_targets(spec, ["__consumer_offsets"]) == {"__consumer_offsets": "target_reserved"}


def test_thousands_of_digits_become_null_in_both_parse_paths() -> None:
    """int() of more than 4,300 digits raises: a hostile header used to end a Spark task."""
    huge = b"9" * 5000
    assert parse_retryd_headers([("retryd_original_offset", huge)]) == {"original_offset": None}
    recs = [
        Record("t", 0, i, (1, 0), b"k", b"v", [("retryd_original_offset", v)])
        for i, v in enumerate([huge, b"12"])
    ]
    batch = build_batch(recs)
    assert batch.column("original_offset").to_pylist() == [None, 12]


def test_a_header_name_the_client_cannot_decode_costs_that_header_only() -> None:
    """confluent-kafka's ``headers()`` raises on a header name that is not UTF-8 (then hands
    back what it could read): the batch keeps the readable headers and the other records."""

    class Undecodable(Record):
        calls = 0

        def headers(self) -> Any:
            type(self).calls += 1
            if type(self).calls == 1:
                raise SystemError("returned a result with an exception set")
            return [("kept", b"yes")]

    builder = BatchBuilder()
    builder.add_message(Undecodable("failed", 0, 1, (0, 1), b"k", b"v", None))
    builder.add("failed", 0, 2, (0, 2), b"k2", b"v2", [("ok", b"1")])
    first, second = builder.flush().to_pylist()
    assert [(x["key"], x["value"]) for x in first["headers"]] == [("kept", b"yes")]
    assert [(x["key"], x["value"]) for x in second["headers"]] == [("ok", b"1")]
