"""``retryd spark archive``: an incremental Parquet archive of a topic, partitioned by date, on
any path Spark can write (a local path, ``file://``, ``hdfs://``, ``s3a://`` ...).

Exactly once across re-runs and crashes. Batch N goes through four steps, with the state in
``<out>/_retryd_archive/`` (``archive_state``) and every file operation done through the
Hadoop FileSystem of the driver's JVM (``hadoopfs``):

1. ``pending/N.json`` fixes batch N's offset ranges (checkpoint to current end) *before*
   anything is written, so a re-run after a crash redoes exactly the same ranges;
2. Spark writes batch N to ``<out>/_staging/batch-N/date=.../*.parquet``;
3. the driver moves each file to ``<out>/date=.../batch-N-<name>``;
4. ``commits/N.json`` (next offset per partition) is created: batch N is done.

A re-run first deletes every ``batch-N-*`` file and the staging directory of an unfinished
batch, then repeats steps 2-4, so every record is in the archive once, in one file, whatever
step a crash hit. Spark ignores ``_``-prefixed directories when reading ``<out>``, and so does
every Parquet reader that follows the Hive layout; readers that list files see only whole
batches. ``--continuous`` (``continuous``) runs the same steps once per micro-batch.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from retryd.pipeline.archive_state import ArchiveError, ArchiveState
from retryd.pipeline.hadoopfs import HadoopFS
from retryd.pipeline.kafka_io import resolve_ranges
from retryd.pipeline.offsets import Bound, BoundSpec, OffsetRange, ranges_to_json
from retryd.pipeline.options import SourceOptions
from retryd.pipeline.progress import JobProgress
from retryd.pipeline.source import Source, kafka_options, read_kafka

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["ArchiveError", "ArchiveResult", "ArchiveSpec", "run_archive"]
log = logging.getLogger(__name__)
STAGING_DIR = "_staging"


@dataclass(frozen=True)
class ArchiveSpec:
    kafka_conf: Mapping[str, str]
    topic: str
    out: str  # a path or a URI, resolved like Spark resolves it
    source: Source | str = Source.PYTHON
    max_records_per_partition: int | None = None


@dataclass
class ArchiveResult:
    batch: int | None  # None: nothing new to archive
    records: int = 0
    resumed: bool = False
    ranges: list[OffsetRange] = field(default_factory=list)
    files: list[str] = field(default_factory=list)  # relative to the archive root


def staging_dir(batch: int) -> str:
    return f"{STAGING_DIR}/batch-{batch}"


def batch_files(store: HadoopFS, batch: int) -> list[str]:
    """Files of ``batch`` already moved into the archive (all of them, or some after a crash)."""
    return store.glob(f"date=*/batch-{batch}-*")


def discard_attempt(store: HadoopFS, batch: int) -> int:
    """Remove what an unfinished attempt of ``batch`` left; returns how many files went."""
    leftovers = batch_files(store, batch)
    for rel in leftovers:
        store.delete(rel)
    store.delete(staging_dir(batch), recursive=True)
    return len(leftovers)


def next_ranges(spec: ArchiveSpec, offsets: Mapping[int, int]) -> list[OffsetRange]:
    """From the checkpoint (earliest for partitions it does not know) to the current end."""
    starting = BoundSpec(
        Bound("earliest"), {(spec.topic, p): Bound("offset", o) for p, o in offsets.items()}
    )
    opts = SourceOptions(
        kafka_conf=spec.kafka_conf,
        topics=(spec.topic,),
        starting=starting,
        ending=BoundSpec(Bound("latest")),
    )
    return resolve_ranges(opts)


def write_staged(spark: SparkSession, store: HadoopFS, batch: int, df: DataFrame) -> None:
    """Spark writes the records to the batch's staging directory, one directory per date."""
    from pyspark.sql import functions as F

    stage = store.child_uri(staging_dir(batch))
    df.withColumn("date", F.to_date("timestamp")).write.mode("overwrite").partitionBy(
        "date"
    ).parquet(stage)


def staged_summary(spark: SparkSession, store: HadoopFS, batch: int) -> tuple[int, dict[int, int]]:
    """(records, highest offset per partition) of a staged batch, read back from its files."""
    from pyspark.sql import functions as F

    if not store.glob(f"{staging_dir(batch)}/date=*/*.parquet"):
        return 0, {}  # nothing staged: the ranges held only gaps (or no new records)
    rows = (
        spark.read.parquet(store.child_uri(staging_dir(batch)))
        .groupBy("partition")
        .agg(F.count(F.lit(1)).alias("n"), F.max("offset").alias("last"))
        .collect()
    )
    return sum(int(r["n"]) for r in rows), {int(r["partition"]): int(r["last"]) for r in rows}


def publish_batch(store: HadoopFS, batch: int) -> list[str]:
    """Move the staged files into ``date=...`` directories with the batch in their name."""
    moved: list[str] = []
    for src in store.glob(f"{staging_dir(batch)}/date=*/*.parquet"):
        date_dir, name = src.split("/")[-2:]
        dest = f"{date_dir}/batch-{batch}-{name}"
        store.rename(src, dest)
        moved.append(dest)
    return moved


def read_ranges(spark: SparkSession, spec: ArchiveSpec, ranges: list[OffsetRange]) -> DataFrame:
    opts = kafka_options(
        spec.kafka_conf,
        [spec.topic],
        startingOffsets=ranges_to_json(ranges, "starting"),
        endingOffsets=ranges_to_json(ranges, "ending"),
        maxRecordsPerPartition=spec.max_records_per_partition,
    )
    return read_kafka(spark, opts, spec.source)


def write_batch(
    spark: SparkSession, store: HadoopFS, spec: ArchiveSpec, batch: int, ranges: list[OffsetRange]
) -> int:
    """Steps 2: the ranges staged; returns the record count."""
    write_staged(spark, store, batch, read_ranges(spark, spec, ranges))
    return staged_summary(spark, store, batch)[0]


def finish_batch(
    store: HadoopFS,
    state: ArchiveState,
    batch: int,
    records: int,
    offsets: Mapping[int, int],
    extra: Mapping[str, Any],
) -> list[str]:
    """Steps 3 and 4: publish the staged files, commit the batch, drop the staging directory."""
    files = publish_batch(store, batch)
    state.commit(batch, offsets, {**extra, "records": records, "files": files})
    store.delete(staging_dir(batch), recursive=True)
    return files


def run_archive(spark: SparkSession, spec: ArchiveSpec, progress: JobProgress) -> ArchiveResult:
    """Archive everything new since the checkpoint (or finish an interrupted batch)."""
    store = HadoopFS(spark, spec.out)
    state = ArchiveState(store, spec.topic)
    with state.locked():
        last, offsets = state.latest()
        batch = last + 1
        for stale in state.pending_batches():
            if stale > batch:
                raise ArchiveError(
                    f"{store.uri}: pending batch {stale} but the checkpoint is at batch {last}: "
                    "the archive state is inconsistent"
                )
            if stale < batch:
                state.drop_pending(stale)  # left over after its batch was committed: harmless
        pending = state.pending(batch)
        resumed = pending is not None
        if pending is not None:
            ranges = pending
            removed = discard_attempt(store, batch)
            progress.note(f"resuming unfinished batch {batch} (removed {removed} partial files)")
        else:
            with progress.step(f"planning offsets of {spec.topic}"):
                ranges = [r for r in next_ranges(spec, offsets) if r.span > 0]
            if not ranges:
                progress.note(f"nothing new in {spec.topic} since batch {last}")
                return ArchiveResult(batch=None)
            discard_attempt(store, batch)
            state.write_pending(batch, ranges)
        with progress.step(f"writing batch {batch} ({sum(r.span for r in ranges)} offsets)"):
            records = write_batch(spark, store, spec, batch, ranges)
        new_offsets = {**offsets, **{r.partition: r.end for r in ranges}}
        rows = [{"partition": r.partition, "start": r.start, "end": r.end} for r in ranges]
        files = finish_batch(store, state, batch, records, new_offsets, {"ranges": rows})
        progress.note(f"batch {batch}: {records} records archived in {len(files)} files")
        return ArchiveResult(batch, records, resumed, ranges, files)
