"""``--since/--until`` for the Spark jobs: plan offset ranges for a time window (through the
broker's offsets-for-times, checked, see ``timeplan``) and filter the read on the record
timestamp, so the result is exactly the window whichever way the ranges were found."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from retryd.pipeline.kafka_io import (
    PROBE_TUNING,
    KafkaReadError,
    list_partitions,
    offsets_for_times,
    probe_extents,
    range_consumer,
    read_samples,
)
from retryd.pipeline.offsets import OffsetRange, ranges_to_json
from retryd.pipeline.source import Source, kafka_options, read_kafka
from retryd.pipeline.timeplan import (
    TP,
    Check,
    Sample,
    TimePlan,
    plan_window,
    probe_offsets,
    targets,
)
from retryd.policy.timespec import TimeWindow

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)


def plan_time_window(
    conf: Mapping[str, str], topics: Sequence[str], window: TimeWindow, timeout_s: float = 30.0
) -> TimePlan:
    """Offset ranges of ``topics`` for ``window`` (full ranges when the broker cannot help)."""
    consumer = range_consumer(conf, **PROBE_TUNING)
    try:
        tps = list_partitions(consumer, topics, timeout_s)
        extents = probe_extents(consumer, tps, timeout_s)
        if window.is_open:
            return plan_window(window, extents, None)
        try:
            answers = {
                side: offsets_for_times(consumer, dict.fromkeys(tps, ts), timeout_s)
                for side, ts in targets(window).items()
            }
        except KafkaReadError as exc:
            return plan_window(window, extents, None, broker_error=str(exc))
        requests: dict[tuple[TP, str, str], tuple[TP, int]] = {}
        for side, per_tp in answers.items():
            for tp, answer in per_tp.items():
                low, high = extents[tp]
                for name, offset in probe_offsets(answer, low, high).items():
                    requests[(tp, side, name)] = (tp, offset)
        samples: dict[tuple[TP, str, str], Sample | None] = read_samples(
            consumer, requests, timeout_s
        )
        checks = {
            (tp, side): Check(
                answer,
                at=samples.get((tp, side, "at")),
                before=samples.get((tp, side, "before")),
                last=samples.get((tp, side, "last")),
            )
            for side, per_tp in answers.items()
            for tp, answer in per_tp.items()
        }
        plan = plan_window(window, extents, checks)
    finally:
        consumer.close()
    log.info("time window %s: %s", window.describe(), plan.note)
    return plan


def window_filter(df: DataFrame, window: TimeWindow) -> DataFrame:
    """Keep the records whose Kafka timestamp is inside ``window`` (``[since, until)``)."""
    from pyspark.sql import functions as F

    if window.since_ms is not None:
        df = df.where(F.col("timestamp") >= F.timestamp_millis(F.lit(window.since_ms)))
    if window.until_ms is not None:
        df = df.where(F.col("timestamp") < F.timestamp_millis(F.lit(window.until_ms)))
    return df


def read_window(
    spark: SparkSession,
    conf: Mapping[str, str],
    topics: Sequence[str],
    window: TimeWindow,
    source: Source | str = Source.PYTHON,
    max_records_per_partition: int | None = None,
) -> tuple[DataFrame, TimePlan]:
    """The records of ``topics`` inside ``window``, and how their ranges were found."""
    plan = plan_time_window(conf, topics, window)
    ranges = [OffsetRange(t, p, start, end) for (t, p), (start, end) in plan.ranges.items()]
    opts = kafka_options(
        conf,
        list(topics),
        startingOffsets=ranges_to_json(ranges, "starting") if ranges else None,
        endingOffsets=ranges_to_json(ranges, "ending") if ranges else None,
        maxRecordsPerPartition=max_records_per_partition,
    )
    return window_filter(read_kafka(spark, opts, source), window), plan
