"""The streaming side of ``retryd_kafka``: PySpark's ``DataSourceStreamReader``.

``spark.readStream.format("retryd_kafka")`` takes the options of the batch source (plus
``maxOffsetsPerTrigger``). Offsets are ``{topic: {partition: next offset}}``; Structured
Streaming writes them to the query's checkpoint before a micro-batch runs and replays the same
range after a crash, so a restarted query reads every record once; the sink decides what
"once" means on its side (the archive drops what it already holds).

- ``initialOffset``: the ``startingOffsets`` of the options, resolved against the broker;
- ``latestOffset``: each partition's end from ListOffsets checked by a fetch's high watermark
  (``kafka_io.probe_extents``), new partitions included from their start, capped by the read
  limit;
- ``partitions``/``read``: the batch source's offset ranges and reader (executors, Arrow).

The reader lives in one long-running Python process on the driver, so it keeps one small
consumer for its probes and closes it in ``stop``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
from confluent_kafka import Consumer
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming import datasource as _streaming

from retryd.pipeline.kafka_io import (
    PROBE_TUNING,
    list_partitions,
    probe_extents,
    range_consumer,
    read_range,
    resolve_ranges,
)
from retryd.pipeline.offsets import (
    OffsetRange,
    cap_offsets,
    offsets_from_json_dict,
    offsets_to_json_dict,
    split_range,
)
from retryd.pipeline.options import SourceOptions

# PySpark >= 4.2 has read limits and Trigger.AvailableNow for Python sources; 4.0/4.1 call
# latestOffset() without arguments and have neither (maxOffsetsPerTrigger is then ignored).
_ReadAllAvailable: Any = getattr(_streaming, "ReadAllAvailable", None)
_ReadMaxRows: Any = getattr(_streaming, "ReadMaxRows", None)
_AvailableNow: Any = getattr(_streaming, "SupportsTriggerAvailableNow", object)

log = logging.getLogger(__name__)
TP = tuple[str, int]


class KafkaRangePartition(InputPartition):
    """One task's work: an offset range of one partition."""

    def __init__(self, rng: OffsetRange) -> None:
        super().__init__(str(rng))
        self.range = rng


def read_partition(opts: SourceOptions, partition: InputPartition) -> Iterator[pa.RecordBatch]:
    """Executor side, batch and streaming alike."""
    if not isinstance(partition, KafkaRangePartition):  # Spark's placeholder: no ranges
        return iter(())
    return read_range(opts.kafka_conf, partition.range, opts.batch_rows, opts.read_timeout_s)


class RetrydKafkaStreamReader(DataSourceStreamReader, _AvailableNow):
    def __init__(self, opts: SourceOptions) -> None:
        self.opts = opts
        self._consumer: Consumer | None = None
        self._target: dict[TP, int] | None = None  # Trigger.AvailableNow: where to stop

    def _probe(self) -> Consumer:
        if self._consumer is None:
            self._consumer = range_consumer(self.opts.kafka_conf, **PROBE_TUNING)
        return self._consumer

    def _high_watermarks(self, positions: dict[TP, int]) -> dict[TP, int]:
        """High watermark of every partition of the topics (new ones included)."""
        consumer = self._probe()
        tps = list_partitions(consumer, self.opts.topics, self.opts.read_timeout_s)
        extents = probe_extents(consumer, tps, self.opts.read_timeout_s)
        # never behind the position already reached (a lagging replica must not rewind)
        return {tp: max(extents[tp][1], positions.get(tp, 0)) for tp in tps}

    def initialOffset(self) -> dict[str, Any]:
        starts = {(r.topic, r.partition): r.start for r in resolve_ranges(self.opts)}
        log.info("stream starts at %s", starts)
        return offsets_to_json_dict(starts)

    def latestOffset(
        self, start: dict[str, Any] | None = None, limit: Any = None
    ) -> dict[str, Any]:
        current = offsets_from_json_dict(start) if start else {}
        latest = self._high_watermarks(current)
        if self._target is not None:
            latest = {
                tp: min(end, max(self._target.get(tp, 0), current.get(tp, 0)))
                for tp, end in latest.items()
            }
        max_rows = getattr(limit, "max_rows", None)
        if max_rows is not None:
            latest = cap_offsets(current, latest, int(max_rows))
        return offsets_to_json_dict(latest)

    def getDefaultReadLimit(self) -> Any:
        if self.opts.max_offsets_per_trigger and _ReadMaxRows is not None:
            return _ReadMaxRows(self.opts.max_offsets_per_trigger)
        return _ReadAllAvailable() if _ReadAllAvailable is not None else None

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self._high_watermarks({})

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[InputPartition]:
        begin, until = offsets_from_json_dict(start), offsets_from_json_dict(end)
        out: list[InputPartition] = []
        for (topic, part), stop in sorted(until.items()):
            # a partition new in this micro-batch starts at 0: the reader skips to its log start
            rng = OffsetRange(topic, part, begin.get((topic, part), 0), stop)
            chunks = split_range(rng, self.opts.max_records_per_partition)
            out.extend(KafkaRangePartition(chunk) for chunk in chunks)
        return out

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return read_partition(self.opts, partition)

    def commit(self, end: dict[str, Any]) -> None:
        """Nothing to do: progress lives in the query's checkpoint, never in Kafka."""

    def stop(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None
