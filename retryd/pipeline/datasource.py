"""``retryd_kafka``: a PySpark Python Data Source reading Kafka offset ranges.

Use::

    spark.dataSource.register(RetrydKafkaDataSource)
    df = (spark.read.format("retryd_kafka")
          .option("bootstrap", "host:9092").option("topics", "failed_topic")
          .option("startingOffsets", "earliest").option("endingOffsets", "latest")
          .option("maxRecordsPerPartition", 100000)
          .option("kafka.security.protocol", "SASL_SSL")   # any librdkafka setting
          .load())

Ranges are fixed when the DataFrame is planned (``partitions()`` on the driver); each input
partition is read by one task with confluent-kafka and comes back as Arrow batches. Not named
``kafka``: built-in and JVM sources win a name clash.

``spark.readStream.format("retryd_kafka")`` is the same source as a Structured Streaming
source (``stream.RetrydKafkaStreamReader``).
"""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.types import StructType

from retryd.pipeline.columns import SCHEMA_DDL
from retryd.pipeline.kafka_io import plan_ranges
from retryd.pipeline.options import SourceOptions
from retryd.pipeline.stream import KafkaRangePartition, RetrydKafkaStreamReader, read_partition

SOURCE_NAME = "retryd_kafka"
__all__ = ["SOURCE_NAME", "KafkaRangePartition", "RetrydKafkaDataSource"]


class RetrydKafkaReader(DataSourceReader):
    def __init__(self, opts: SourceOptions) -> None:
        self.opts = opts

    def partitions(self) -> list[InputPartition]:
        return [KafkaRangePartition(rng) for rng in plan_ranges(self.opts)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return read_partition(self.opts, partition)


class RetrydKafkaDataSource(DataSource):
    """Batch and streaming reads of Kafka topics with retryd's header columns parsed."""

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self) -> str:
        return SCHEMA_DDL

    def reader(self, schema: StructType) -> DataSourceReader:
        return RetrydKafkaReader(SourceOptions.parse(self.options))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return RetrydKafkaStreamReader(SourceOptions.parse(self.options))
