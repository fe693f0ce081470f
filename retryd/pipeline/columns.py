"""The columns every Kafka read in the pipeline yields, and turning records into Arrow batches.

The same columns come out of the Python data source and of Spark's native Kafka connector
(mapped in ``native.py``), so jobs never care which one read the data. Header parsing follows
``retryd.policy.headers.decode_lenient``: a bad retryd header becomes NULL, never an error.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

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
        "route STRING",
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
        # last, so archives written before it keep their column order (read them with
        # mergeSchema to see it)
        ("route", pa.string()),
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
    h.ROUTE: ("route", "str"),  # the error route a copy is on; null: retry_sequence or none
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


def _parse_value(raw: bytes | str | None, kind: str) -> Any:
    """One header value for its column: the semantics of ``decode_lenient`` + ``bounded``."""
    if isinstance(raw, str):
        raw = raw.encode("utf-8", "surrogatepass")
    if raw is None:
        return None
    if kind == "str":
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            return None
    if not raw.isdigit() or len(raw) > 19:  # ASCII digits only, never empty, fits int64
        return None  # (int() of thousands of digits raises: Python's int/str limit)
    return bounded(int(raw), kind)


def parse_retryd_headers(
    headers: Sequence[tuple[str, bytes | str | None]] | None,
) -> dict[str, Any]:
    """Parsed retryd columns of one record (absent headers are missing from the dict, bad
    values are None). Same result as ``decode_lenient`` then ``bounded``, without decoding
    the headers no column needs: this runs for every record of a scan."""
    out: dict[str, Any] = {}
    if not headers:
        return out
    specs = HEADER_COLUMNS
    for key, raw in headers:
        spec = specs.get(key)
        if spec is not None:
            out[spec[0]] = _parse_value(raw, spec[1])  # the last occurrence wins
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


class Record:
    """A record given field by field (tests, non-Kafka callers): quacks like a Message."""

    __slots__ = ("_headers", "_key", "_offset", "_partition", "_timestamp", "_topic", "_value")

    def __init__(
        self,
        topic: str,
        partition: int,
        offset: int,
        timestamp: tuple[int, int],
        key: bytes | None,
        value: bytes | None,
        headers: Sequence[tuple[str, bytes | None]] | None,
    ) -> None:
        self._topic, self._partition, self._offset = topic, partition, offset
        self._timestamp, self._key, self._value, self._headers = timestamp, key, value, headers

    def topic(self) -> str:
        return self._topic

    def partition(self) -> int:
        return self._partition

    def offset(self) -> int:
        return self._offset

    def timestamp(self) -> tuple[int, int]:
        return self._timestamp

    def key(self) -> bytes | None:
        return self._key

    def value(self) -> bytes | None:
        return self._value

    def headers(self) -> Sequence[tuple[str, bytes | None]] | None:
        return self._headers


def _constant(values: list[Any], n: int, arrow_type: pa.DataType) -> pa.Array:
    """One column; a run of one repeated value (topic, partition, timestamp type) is built
    without converting n Python objects."""
    if n and values.count(values[0]) == n:
        return pa.repeat(pa.scalar(values[0], arrow_type), n)
    return pa.array(values, arrow_type)


def _timestamps(stamps: list[tuple[int, int]], n: int) -> tuple[pa.Array, pa.Array]:
    """(timestamp column, timestamp_type column) from ``Message.timestamp()`` pairs."""
    kinds = [kind for kind, _ in stamps]
    millis = pa.array([ms for _, ms in stamps], pa.int64())
    valid = pc.and_(pc.greater_equal(millis, 0), pc.less_equal(millis, MAX_EPOCH_MS))
    if TIMESTAMP_NOT_AVAILABLE in kinds:
        valid = pc.and_(valid, pc.not_equal(pa.array(kinds, pa.int32()), TIMESTAMP_NOT_AVAILABLE))
    micros = pc.if_else(valid, pc.multiply(millis, 1000), None).cast(_TS)
    # Kafka ids: -1 none, 0 create time, 1 log append time (confluent-kafka counts from 0)
    kind_col = _constant([kind - 1 for kind in kinds], n, pa.int32())
    return micros, kind_col


_HEADER_NAMES = pa.array(list(HEADER_COLUMNS), pa.string())
_HEADERS_TYPE = ARROW_SCHEMA.field("headers").type
_SAFE_DIGITS = 18  # any number of up to 18 decimal digits fits in an int64


def _headers(all_headers: list[Any], n: int) -> tuple[pa.Array, dict[str, pa.Array]]:
    """The headers column and the parsed retryd columns.

    Arrow converts the header lists in one call; finding the retryd headers, keeping the last
    occurrence per record and parsing the values is vectorised (``_parse_headers``).
    """
    column = pa.array([hs or () for hs in all_headers], type=_HEADERS_TYPE)
    return column, _parse_headers(column, n)


def _parse_headers(column: pa.ListArray, n: int) -> dict[str, pa.Array]:
    """Parsed retryd columns from the headers column; the same values as
    ``parse_retryd_headers`` record by record (the last occurrence of a header wins, a bad
    value is null)."""
    out = {name: pa.nulls(n, ARROW_SCHEMA.field(name).type) for name in PARSED_COLUMNS}
    items = column.values
    if len(items) == 0:
        return out
    keys, values = items.field("key"), items.field("value")
    which = pc.fill_null(pc.index_in(keys, value_set=_HEADER_NAMES), -1).to_numpy()
    owners = pc.list_parent_indices(column).to_numpy()
    for i, (name, kind) in enumerate(HEADER_COLUMNS.values()):
        found = np.flatnonzero(which == i)
        if found.size == 0:
            continue
        records = owners[found]
        last = np.append(records[1:] != records[:-1], True)  # items are in record order
        found, records = found[last], records[last]
        parsed = _parse_array(values.take(pa.array(found)), kind, ARROW_SCHEMA.field(name).type)
        where = np.full(n, -1, dtype=np.int64)
        where[records] = np.arange(len(records))
        out[name] = parsed.take(pa.array(where, mask=where < 0))
    return out


def _parse_array(raw: pa.Array, kind: str, arrow_type: pa.DataType) -> pa.Array:
    """``_parse_value`` over a whole array: vectorised, with a per-value fallback for the
    rare inputs Arrow cannot convert (invalid UTF-8, numbers of more than 18 digits)."""
    if kind == "str":
        try:
            return raw.cast(pa.string())
        except pa.ArrowInvalid:
            return pa.array([_parse_value(v, kind) for v in raw.to_pylist()], arrow_type)
    # A byte-for-byte view as text (no UTF-8 check): a non-ASCII byte is never a decimal digit.
    text = raw.view(pa.string())
    digits = pc.fill_null(pc.ascii_is_decimal(text), False)
    short = pc.fill_null(pc.less_equal(pc.binary_length(raw), _SAFE_DIGITS), False)
    if pc.any(pc.and_(digits, pc.invert(short))).as_py():
        return pa.array([_parse_value(v, kind) for v in raw.to_pylist()], arrow_type)
    numbers = pc.if_else(digits, text, None).cast(pa.int64())
    if kind == "int32":
        return pc.if_else(pc.less_equal(numbers, INT32_MAX), numbers, None).cast(pa.int32())
    if kind == "int64":
        return numbers
    in_range = pc.less_equal(numbers, MAX_EPOCH_MS)  # ts: epoch ms -> us
    return pc.if_else(in_range, pc.multiply(numbers, 1000), None).cast(_TS)


def build_batch(msgs: Sequence[KafkaMessage]) -> pa.RecordBatch:
    """The records as one ``pyarrow.RecordBatch`` of ``ARROW_SCHEMA``.

    Built column by column: one list comprehension per message field, then vectorised Arrow
    work. Per record that is a few C method calls, which keeps a read task close to the speed
    of a plain ``consume()`` loop (a row-by-row builder cost 2-3x more).
    """
    n = len(msgs)
    timestamp, timestamp_type = _timestamps([m.timestamp() for m in msgs], n)
    # read through message_headers: the client's headers() raises, or returns a list holding
    # NULL, on a header name that is not UTF-8 (one such record failed or crashed the task)
    readable = h.message_headers
    headers, parsed = _headers([readable(m)[0] for m in msgs], n)
    columns: dict[str, pa.Array] = {
        "topic": _constant([m.topic() for m in msgs], n, pa.string()),
        "partition": _constant([m.partition() for m in msgs], n, pa.int32()),
        "offset": pa.array([m.offset() for m in msgs], pa.int64()),
        "timestamp": timestamp,
        "timestamp_type": timestamp_type,
        "key": pa.array([m.key() for m in msgs], pa.binary()),
        "value": pa.array([m.value() for m in msgs], pa.binary()),
        "headers": headers,
    }
    columns.update(parsed)
    return pa.RecordBatch.from_arrays([columns[f.name] for f in ARROW_SCHEMA], schema=ARROW_SCHEMA)


class BatchBuilder:
    """Accumulates records and emits ``pyarrow.RecordBatch``es (see ``build_batch``).

    Holds the message objects themselves until ``flush``: no per-record Python work happens
    before the columns are built.
    """

    def __init__(self) -> None:
        self._msgs: list[KafkaMessage] = []

    def __len__(self) -> int:
        return len(self._msgs)

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
        self._msgs.append(Record(topic, partition, offset, timestamp, key, value, headers))

    def add_message(self, msg: KafkaMessage) -> None:
        self._msgs.append(msg)

    def extend(self, msgs: Sequence[KafkaMessage]) -> None:
        self._msgs.extend(msgs)

    def flush(self) -> pa.RecordBatch:
        """The accumulated rows as one batch; the builder starts empty again."""
        msgs, self._msgs = self._msgs, []
        return build_batch(msgs)
