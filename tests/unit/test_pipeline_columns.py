"""Records to Arrow columns, native option mapping, Java version parsing (pure logic)."""

from __future__ import annotations

import pytest

pa = pytest.importorskip("pyarrow")

from retryd.pipeline.columns import (  # noqa: E402
    ARROW_SCHEMA,
    COLUMNS,
    MAX_EPOCH_MS,
    BatchBuilder,
    parse_retryd_headers,
)
from retryd.pipeline.native import native_options  # noqa: E402
from retryd.pipeline.session import java_major  # noqa: E402
from retryd.policy.headers import Envelope, routed_headers  # noqa: E402


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
