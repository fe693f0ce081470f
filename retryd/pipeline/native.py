"""``--source native``: Spark's own Kafka connector, mapped to the retryd_kafka columns.

The connector is the Maven artifact ``org.apache.spark:spark-sql-kafka-0-10_2.13`` (added with
``--packages`` or ``spark.jars``). Header parsing is done in Spark SQL with exactly the
semantics of ``decode_lenient``: the last occurrence of a header wins, a value that is not
valid UTF-8 or not a decimal number (for numeric headers) or out of range becomes NULL.

The offset ranges are planned by retryd (``kafka_io.resolve_ranges``) and handed to the
connector as explicit offsets: the connector would take partition ends from ListOffsets alone,
which a Kafka-compatible broker can answer wrongly (the embedded Tansu does), and the two
sources then read the same records.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from retryd.errors import RetrydError
from retryd.pipeline.columns import COLUMNS, HEADER_COLUMNS, MAX_EPOCH_MS
from retryd.pipeline.offsets import OffsetRange, ranges_to_json

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

CONNECTOR = "org.apache.spark:spark-sql-kafka-0-10_2.13"
_NOT_FOUND = ("KAFKA_DATA_SOURCE_NOT_ENABLED", "DATA_SOURCE_NOT_FOUND")
# Options of the Python source that the native one does not know.
_PYTHON_ONLY = {"batchrows", "readtimeoutms", "bootstrap", "topics", "path"}
# Options with the same meaning and name in both sources (Spark spells them in camelCase).
_SHARED = {
    "startingoffsets": "startingOffsets",
    "endingoffsets": "endingOffsets",
    "startingtimestamp": "startingTimestamp",
    "endingtimestamp": "endingTimestamp",
    "startingoffsetsbytimestamp": "startingOffsetsByTimestamp",
    "endingoffsetsbytimestamp": "endingOffsetsByTimestamp",
    "maxrecordsperpartition": "maxRecordsPerPartition",
    "maxoffsetspertrigger": "maxOffsetsPerTrigger",
}


class NativeSourceUnavailable(RetrydError):
    """Spark's Kafka connector is not on the classpath."""


# The options that select offsets: replaced by explicit offsets when retryd planned the ranges.
_BOUNDS = {k for k in _SHARED if k.startswith(("starting", "ending"))}


def native_options(
    options: Mapping[str, str], ranges: list[OffsetRange] | None = None
) -> dict[str, str]:
    """The native connector's options for the same read (``kafka.*`` passes through);
    ``ranges`` (every partition of the topics) replace the options that select offsets."""
    opts = {str(k).lower(): str(v) for k, v in options.items()}
    if ranges:
        opts = {k: v for k, v in opts.items() if k not in _BOUNDS}
        opts["startingoffsets"] = ranges_to_json(ranges, "starting")
        opts["endingoffsets"] = ranges_to_json(ranges, "ending")
    out: dict[str, str] = {"includeHeaders": "true", "failOnDataLoss": "false"}
    if "bootstrap" in opts:
        out["kafka.bootstrap.servers"] = opts["bootstrap"]
    out["subscribe"] = opts.get("topics", opts.get("subscribe", ""))
    for key, value in opts.items():
        if key.startswith("kafka."):
            out[key] = value
        elif key in _SHARED:
            out[_SHARED[key]] = value
    out.pop("kafka.group.id", None)  # the connector picks its own group ids
    return out


def _header(name: str) -> Column:
    """Raw value of the last header called ``name`` (NULL when absent)."""
    from pyspark.sql import functions as F

    matches = F.filter(F.col("headers"), lambda h: h["key"] == F.lit(name))
    return F.try_element_at(matches, F.lit(-1))["value"]


def _parsed(name: str, kind: str) -> Column:
    from pyspark.sql import functions as F

    text = _header(name).cast("string")
    valid = F.when(F.is_valid_utf8(text), text)
    if kind == "str":
        return valid
    digits = F.when(valid.rlike("^[0-9]+$"), valid)
    if kind == "int32":
        return digits.try_cast("int")
    number = digits.try_cast("bigint")
    if kind == "int64":
        return number
    return F.when(number <= F.lit(MAX_EPOCH_MS), F.timestamp_millis(number))


def to_retryd_columns(df: DataFrame) -> DataFrame:
    """Map the native connector's schema to the retryd_kafka columns, in the same order."""
    from pyspark.sql import functions as F

    empty = F.array().cast("array<struct<key:string,value:binary>>")
    base = df.select(
        F.col("topic"),
        F.col("partition").cast("int").alias("partition"),
        F.col("offset").cast("bigint").alias("offset"),
        F.col("timestamp"),
        F.col("timestampType").cast("int").alias("timestamp_type"),
        F.col("key"),
        F.col("value"),
        F.coalesce(F.col("headers"), empty).alias("headers"),
    )
    parsed = {column: _parsed(header, kind) for header, (column, kind) in HEADER_COLUMNS.items()}
    return base.select(*base.columns, *[parsed[c].alias(c) for c in COLUMNS[8:]])


def read_native(spark: SparkSession, options: Mapping[str, str]) -> DataFrame:
    """Read through Spark's Kafka connector, or say clearly that it is not installed."""
    from pyspark.errors import AnalysisException

    from retryd.pipeline.kafka_io import resolve_ranges
    from retryd.pipeline.options import SourceOptions

    ranges = resolve_ranges(SourceOptions.parse(options))
    try:
        raw = spark.read.format("kafka").options(**native_options(options, ranges)).load()
    except AnalysisException as exc:
        condition = exc.getCondition() or ""
        if condition in _NOT_FOUND or "Failed to find data source: kafka" in str(exc):
            raise NativeSourceUnavailable(
                "Spark's Kafka connector is not on the classpath: start Spark with "
                f"--packages {CONNECTOR}:{spark.version} (or spark.jars), "
                "or use --source python"
            ) from exc
        raise
    return to_retryd_columns(raw)
