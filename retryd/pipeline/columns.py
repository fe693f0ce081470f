"""The columns every Kafka read in the pipeline yields, and turning records into Arrow batches.

The same columns come out of the Python data source and of Spark's native Kafka connector
(mapped in ``native.py``), so jobs never care which one read the data. Header parsing follows
``retryd.policy.headers.decode_lenient``: a bad retryd header becomes NULL, never an error.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import pyarrow as pa

from retryd.policy import headers as h

# Spark DDL of the output; ``ARROW_SCHEMA`` below is what Spark derives from it.
SCHEMA_DDL = ", ".join(
    [
        "topic STRING",
        "partition INT",
        "offset BIGINT",
        "timestamp TIMESTAMP",
        "timestamp_type INT",
        "key BINARY",
        "value BINARY",
        "headers ARRAY<STRUCT<key: STRING, value: BINARY>>",
        "original_topic STRING",
        "original_partition INT",
        "original_offset BIGINT",
        "original_timestamp TIMESTAMP",
        "retry_number INT",
        "retry_timestamp TIMESTAMP",
        "first_failure_timestamp TIMESTAMP",
        "error_class STRING",
        "error_message STRING",
        "dead_reason STRING",
        "replay_id STRING",
        "replayed_from STRING",
    ]
)

_TS = pa.timestamp("us", tz="UTC")
HEADER_TYPE = pa.struct([("key", pa.string()), ("value", pa.binary())])
ARROW_SCHEMA = pa.schema(
    [
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("timestamp", _TS),
        ("timestamp_type", pa.int32()),
        ("key", pa.binary()),
        ("value", pa.binary()),
        ("headers", pa.list_(pa.field("element", HEADER_TYPE))),
        ("original_topic", pa.string()),
        ("original_partition", pa.int32()),
        ("original_offset", pa.int64()),
        ("original_timestamp", _TS),
        ("retry_number", pa.int32()),
        ("retry_timestamp", _TS),
        ("first_failure_timestamp", _TS),
        ("error_class", pa.string()),
        ("error_message", pa.string()),
        ("dead_reason", pa.string()),
        ("replay_id", pa.string()),
        ("replayed_from", pa.string()),
    ]
)
COLUMNS = tuple(ARROW_SCHEMA.names)
RAW_COLUMNS = COLUMNS[:8]
PARSED_COLUMNS = COLUMNS[8:]

# retryd header -> (column, kind); kinds bound the value so Spark types never overflow.
HEADER_COLUMNS: dict[str, tuple[str, str]] = {
    h.ORIGINAL_TOPIC: ("original_topic", "str"),
    h.ORIGINAL_PARTITION: ("original_partition", "int32"),
    h.ORIGINAL_OFFSET: ("original_offset", "int64"),
    h.ORIGINAL_TIMESTAMP: ("original_timestamp", "ts"),
    h.RETRY_NUMBER: ("retry_number", "int32"),
    h.RETRY_TIMESTAMP: ("retry_timestamp", "ts"),
    h.FIRST_FAILURE_TIMESTAMP: ("first_failure_timestamp", "ts"),
    h.ERROR_CLASS: ("error_class", "str"),
    h.ERROR_MESSAGE: ("error_message", "str"),
    h.DEAD_REASON: ("dead_reason", "str"),
    h.REPLAY_ID: ("replay_id", "str"),
    h.REPLAYED_FROM: ("replayed_from", "str"),
}
INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1
# Epoch milliseconds Spark can hold as a timestamp: up to the end of year 9999.
MAX_EPOCH_MS = 253_402_300_799_999
TIMESTAMP_NOT_AVAILABLE = 0  # confluent_kafka.TIMESTAMP_NOT_AVAILABLE


def bounded(value: object, kind: str) -> Any:
    """A decoded header value fit for its column, or None when it does not fit."""
    if kind == "str":
        return value if isinstance(value, str) else None
    if not isinstance(value, int):
        return None
    if kind == "int32":
        return value if value <= INT32_MAX else None
    if kind == "int64":
        return value if value <= INT64_MAX else None
    return value * 1000 if value <= MAX_EPOCH_MS else None  # ts: ms -> us


def parse_retryd_headers(headers: Sequence[tuple[str, bytes | None]] | None) -> dict[str, Any]:
    """Parsed retryd columns of one record (absent or bad headers are missing from the dict)."""
    if not headers:
        return {}
    decoded = h.decode_lenient(headers)
    out: dict[str, Any] = {}
    for name, value in decoded.items():
        spec = HEADER_COLUMNS.get(name)
        if spec is not None:
            out[spec[0]] = bounded(value, spec[1])
    return out


class KafkaMessage(Protocol):
    """The part of ``confluent_kafka.Message`` the batch builder reads."""

    def topic(self) -> str | None: ...
    def partition(self) -> int | None: ...
    def offset(self) -> int | None: ...
    def timestamp(self) -> tuple[int, int]: ...
    def key(self) -> bytes | None: ...
    def value(self) -> bytes | None: ...
    def headers(self) -> Any: ...


class BatchBuilder:
    """Accumulates records and emits ``pyarrow.RecordBatch``es.

    Rows are kept as tuples and turned into columns at ``flush``: per record that is a handful
    of C calls, which keeps a task near the speed of a plain consume loop.
    """

    def __init__(self) -> None:
        self._rows: list[tuple[Any, ...]] = []

    def __len__(self) -> int:
        return len(self._rows)

    def add(
        self,
        topic: str,
        partition: int,
        offset: int,
        timestamp: tuple[int, int],
        key: bytes | None,
        value: bytes | None,
        headers: Sequence[tuple[str, bytes | None]] | None,
    ) -> None:
        self._rows.append((topic, partition, offset, timestamp, key, value, headers))

    def add_message(self, msg: KafkaMessage) -> None:
        self._rows.append(
            (
                msg.topic(),
                msg.partition(),
                msg.offset(),
                msg.timestamp(),
                msg.key(),
                msg.value(),
                msg.headers(),
            )
        )

    def flush(self) -> pa.RecordBatch:
        """The accumulated rows as one batch; the builder starts empty again."""
        rows, self._rows = self._rows, []
        n = len(rows)
        if n:
            topics, partitions, offsets, stamps, keys, values, headers = zip(*rows, strict=True)
        else:
            topics = partitions = offsets = stamps = keys = values = headers = ()
        cols: dict[str, Any] = {
            "topic": topics,
            "partition": partitions,
            "offset": offsets,
            "timestamp": [
                None if t == TIMESTAMP_NOT_AVAILABLE or ms < 0 or ms > MAX_EPOCH_MS else ms * 1000
                for t, ms in stamps
            ],
            "timestamp_type": [t - 1 for t, _ in stamps],  # Kafka ids: -1 none, 0 create, 1 append
            "key": keys,
            "value": values,
            "headers": [list(h) if h else [] for h in headers],
        }
        parsed_cols: dict[str, list[Any]] = {name: [None] * n for name in PARSED_COLUMNS}
        for i, hs in enumerate(headers):
            if hs:
                for name, value in parse_retryd_headers(hs).items():
                    parsed_cols[name][i] = value
        cols.update(parsed_cols)
        arrays = [pa.array(cols[f.name], type=f.type) for f in ARROW_SCHEMA]
        return pa.RecordBatch.from_arrays(arrays, schema=ARROW_SCHEMA)
