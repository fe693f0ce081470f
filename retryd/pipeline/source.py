"""One entry point for the jobs to read Kafka: the Python data source or Spark's native one.

Both give the columns of ``retryd.pipeline.columns`` and take the same option names
(``topics``, ``startingOffsets``, ``endingOffsets``, ``kafka.*`` ...).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import TYPE_CHECKING

from retryd.pipeline.datasource import SOURCE_NAME
from retryd.pipeline.native import read_native
from retryd.pipeline.options import SourceOptions

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


class Source(enum.StrEnum):
    PYTHON = "python"
    NATIVE = "native"


def kafka_options(
    kafka_conf: Mapping[str, str], topics: list[str] | tuple[str, ...], **extra: object
) -> dict[str, str]:
    """Data source options from librdkafka settings (``bootstrap.servers`` included)."""
    opts = {f"kafka.{k}": str(v) for k, v in kafka_conf.items()}
    opts["topics"] = ",".join(topics)
    for key, value in extra.items():
        if value is not None:
            opts[key] = str(value)
    return opts


def read_kafka(
    spark: SparkSession, options: Mapping[str, str], source: Source | str = Source.PYTHON
) -> DataFrame:
    """A DataFrame over the selected offset ranges; ranges are fixed now, at planning."""
    SourceOptions.parse(options)  # same validation and messages for both sources
    if Source(source) is Source.NATIVE:
        return read_native(spark, options)
    return spark.read.format(SOURCE_NAME).options(**dict(options)).load()
