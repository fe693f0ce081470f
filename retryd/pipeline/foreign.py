"""Other systems' dead letters in the pipeline: their headers mapped onto the parsed columns.

Both readers (the Python data source and Spark's Kafka connector) fill ``original_topic``,
``error_class`` and the rest from retryd's headers only. For a topic of
``foreign_dead_letters`` those columns are recomputed from the ``headers`` column with
``retryd.policy.foreign`` (the sidecar's mapping, the same fields), so a report or a replay
over a Spring, Karafka, Kafka Connect or share-group dead-letter topic sees the same columns
as over ``failed_topic``. Rows of other topics pass through untouched.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from retryd.pipeline.columns import HEADER_COLUMNS, bounded
from retryd.policy.foreign import ForeignFormat, parse_format, record_format, to_dead_letter_fields

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

# the columns a mapping gives (retry and replay columns stay as the headers have them)
_MAPPED = {
    name: HEADER_COLUMNS[name]
    for name in HEADER_COLUMNS
    if name in to_dead_letter_fields(ForeignFormat.SPRING, []).fields
}


def map_batch(batch: pa.RecordBatch, formats: Mapping[str, str]) -> pa.RecordBatch:
    """``batch`` with the mapped columns of its foreign rows recomputed; other rows as they
    were. A batch with no row of a foreign topic is returned as it is (no Python per row)."""
    names = batch.schema.names
    if batch.num_rows == 0 or "topic" not in names or "headers" not in names:
        return batch
    topics = batch.column("topic")
    foreign = pc.fill_null(pc.is_in(topics, value_set=pa.array(list(formats), pa.string())), False)
    if not pc.any(foreign).as_py():
        return batch
    configured = {topic: parse_format(name) for topic, name in formats.items()}
    # timestamps as epoch µs (the column's storage), every other column as Python values
    columns: dict[str, list[Any]] = {}
    for column, kind in _MAPPED.values():
        if column in names:
            values = batch.column(column)
            columns[column] = (values.cast(pa.int64()) if kind == "ts" else values).to_pylist()
    headers = batch.column("headers").to_pylist()
    stamps = (
        batch.column("timestamp").cast(pa.int64()).to_pylist() if "timestamp" in names else None
    )
    for i in foreign.to_numpy(zero_copy_only=False).nonzero()[0].tolist():
        pairs = [(item["key"], item["value"]) for item in headers[i] or ()]
        fmt = record_format(configured[topics[i].as_py()], pairs)
        if fmt is ForeignFormat.RETRYD:
            continue  # an auto topic's record without a known foreign format: as it was
        stamp = stamps[i] if stamps is not None else None
        fields = to_dead_letter_fields(
            fmt, pairs, timestamp=stamp // 1000 if stamp is not None else None
        ).fields
        for header, (column, kind) in _MAPPED.items():
            if column in columns:
                columns[column][i] = bounded(fields.get(header), kind)
    arrays = []
    for name in names:
        is_ts = any(c == name and k == "ts" for c, k in _MAPPED.values())
        if name not in columns:
            arrays.append(batch.column(name))
        elif is_ts:
            arrays.append(pa.array(columns[name], pa.int64()).cast(batch.schema.field(name).type))
        else:
            arrays.append(pa.array(columns[name], batch.schema.field(name).type))
    return pa.RecordBatch.from_arrays(arrays, schema=batch.schema)


def map_foreign(df: DataFrame, formats: Mapping[str, str]) -> DataFrame:
    """``df`` (the pipeline's columns) with foreign dead letters read through their mapping;
    ``df`` itself when no foreign topic is configured."""
    if not formats:
        return df
    wanted = dict(formats)

    def mapped(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            yield map_batch(batch, wanted)

    return df.mapInArrow(mapped, df.schema)
