"""``retryd spark archive --continuous``: the archive as a Structured Streaming query.

The ``retryd_kafka`` stream reads the topic; every micro-batch goes through the archive's own
steps (stage, publish, commit: ``archive``) in ``foreachBatch``, so a continuous archive and a
batch archive are the same directory format and can take turns on one directory.

Exactly once, across kills and restarts:

- Spark writes a micro-batch's offset range to the query's checkpoint (``--checkpoint``)
  before running it and re-runs that same range after a crash;
- every micro-batch first drops the records the archive already holds (offset below the
  archive's committed next offset for their partition): the re-run of a micro-batch that was
  committed just before a crash adds nothing, and neither do records a batch run archived in
  between;
- the rest becomes archive batch N exactly like a batch run: files of an unfinished batch N
  are deleted before it is written again.

The archive's committed offsets also start a new query: ``--checkpoint`` in a fresh directory
continues where the archive is. A new dead letter is picked up by the first trigger after it
arrived (``--trigger``, default 10 s) and is in the archive when that micro-batch commits.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import reduce
from typing import TYPE_CHECKING, Any

from retryd.errors import RetrydError
from retryd.pipeline.archive import (
    ArchiveSpec,
    discard_attempt,
    finish_batch,
    staged_summary,
    staging_dir,
    write_staged,
)
from retryd.pipeline.archive_state import ArchiveState
from retryd.pipeline.hadoopfs import HadoopFS
from retryd.pipeline.offsets import offsets_to_json_dict
from retryd.pipeline.source import SOURCE_NAME, Source, kafka_options

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession
    from pyspark.sql.streaming import StreamingQuery

log = logging.getLogger(__name__)
DEFAULT_TRIGGER_S = 10.0
STOP_GRACE_S = 60.0  # on stop, how long a running micro-batch may take to finish


class ContinuousError(RetrydError):
    """The continuous archive cannot start or its query failed."""


@dataclass(frozen=True)
class ContinuousSpec:
    archive: ArchiveSpec
    checkpoint: str  # Structured Streaming checkpoint: a path or a URI
    trigger_s: float = DEFAULT_TRIGGER_S
    max_offsets_per_trigger: int | None = None


@dataclass
class BatchReport:
    batch: int  # archive batch (None-free: only committed batches are reported)
    micro_batch: int  # Spark's batch id
    records: int
    files: int
    seconds: float


@dataclass
class ContinuousResult:
    batches: list[BatchReport] = field(default_factory=list)

    @property
    def records(self) -> int:
        return sum(b.records for b in self.batches)


def not_archived(offsets: Mapping[int, int]) -> Column:
    """Records the archive does not hold yet: offset >= committed next offset of the partition."""
    from pyspark.sql import functions as F

    if not offsets:
        return F.lit(True)
    known = F.col("partition").isin(list(offsets))
    held = [
        (F.col("partition") == F.lit(p)) & (F.col("offset") < F.lit(o)) for p, o in offsets.items()
    ]
    return ~known | ~reduce(lambda a, b: a | b, held)


class MicroBatchArchiver:
    """The ``foreachBatch`` function: one micro-batch in, at most one archive batch out."""

    def __init__(
        self,
        spark: SparkSession,
        store: HadoopFS,
        state: ArchiveState,
        on_batch: Callable[[BatchReport], None],
    ) -> None:
        self.spark = spark
        self.store = store
        self.state = state
        self.on_batch = on_batch

    def __call__(self, df: DataFrame, micro_batch: int) -> None:
        started = time.monotonic()
        started_ms = int(time.time() * 1000)
        last, offsets = self.state.latest()
        batch = last + 1
        for stale in self.state.pending_batches():  # plans of batch runs, now superseded
            self.state.drop_pending(stale)
        discard_attempt(self.store, batch)
        write_staged(self.spark, self.store, batch, df.where(not_archived(offsets)))
        records, last_offsets = staged_summary(self.spark, self.store, batch)
        if records == 0:
            self.store.delete(staging_dir(batch), recursive=True)
            return
        new_offsets = {**offsets, **{p: o + 1 for p, o in last_offsets.items()}}
        extra: dict[str, Any] = {"micro_batch": micro_batch, "started_ms": started_ms}
        files = finish_batch(self.store, self.state, batch, records, new_offsets, extra)
        report = BatchReport(batch, micro_batch, records, len(files), time.monotonic() - started)
        log.info("archive batch %d (micro-batch %d): %d records", batch, micro_batch, records)
        self.on_batch(report)


def start_query(
    spark: SparkSession,
    spec: ContinuousSpec,
    archiver: MicroBatchArchiver,
    start_offsets: Mapping[int, int],
) -> StreamingQuery:
    a = spec.archive
    if str(a.source) != Source.PYTHON.value:
        raise ContinuousError("--continuous reads with the retryd_kafka source (--source python)")
    starting = offsets_to_json_dict({(a.topic, p): o for p, o in start_offsets.items()})
    opts = kafka_options(
        a.kafka_conf,
        [a.topic],
        startingOffsets=json.dumps(starting) if starting else "earliest",
        maxRecordsPerPartition=a.max_records_per_partition,
        maxOffsetsPerTrigger=spec.max_offsets_per_trigger,
    )
    stream = spark.readStream.format(SOURCE_NAME).options(**opts).load()
    return (
        stream.writeStream.foreachBatch(archiver)
        .option("checkpointLocation", spec.checkpoint)
        .trigger(processingTime=f"{int(spec.trigger_s * 1000)} milliseconds")
        .queryName(f"retryd-archive-{a.topic}")
        .start()
    )


def stop_gracefully(query: StreamingQuery, grace_s: float = STOP_GRACE_S) -> None:
    """Let a running micro-batch finish (bounded), then stop the query. Stopping in the middle
    of one is safe too (the next run discards its files), only slower to recover."""
    deadline = time.monotonic() + grace_s
    while query.isActive and time.monotonic() < deadline:
        try:
            busy = bool(query.status.get("isTriggerActive"))
        except Exception:  # the query may be ending on its own
            busy = False
        if not busy:
            break
        time.sleep(0.1)
    if query.isActive:
        query.stop()


def run_continuous(
    spark: SparkSession,
    spec: ContinuousSpec,
    stop: threading.Event,
    on_batch: Callable[[BatchReport], None],
    poll_s: int = 1,
) -> ContinuousResult:
    """Run until ``stop`` is set (SIGTERM/SIGINT in the CLI) or the query fails."""
    store = HadoopFS(spark, spec.archive.out)
    state = ArchiveState(store, spec.archive.topic)
    result = ContinuousResult()

    def record(report: BatchReport) -> None:
        result.batches.append(report)
        on_batch(report)

    with state.locked():
        _, offsets = state.latest()
        archiver = MicroBatchArchiver(spark, store, state, record)
        query = start_query(spark, spec, archiver, offsets)
        try:
            while query.isActive and not stop.is_set():
                query.awaitTermination(poll_s)
        finally:
            stop_gracefully(query)
        failure = query.exception()
        if failure is not None and not stop.is_set():
            first = str(failure).strip().splitlines()[0] if str(failure).strip() else "unknown"
            raise ContinuousError(f"the continuous archive query failed: {first}") from failure
    return result
