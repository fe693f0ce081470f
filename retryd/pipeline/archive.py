"""``retryd spark archive``: an incremental Parquet archive of a topic, partitioned by date.

Exactly once across re-runs and crashes, with state in ``<out>/_retryd_archive/``:

1. ``pending.json`` fixes batch N's offset ranges (from the checkpoint to the current end)
   *before* anything is written, so a re-run after a crash redoes exactly the same ranges;
2. Spark writes batch N to ``<out>/_staging/batch-N/date=.../*.parquet``;
3. the driver moves each file to ``<out>/date=.../batch-N-<name>`` (renames on one file system);
4. ``checkpoint.json`` (next offset per partition) is replaced atomically: batch N is done.

A re-run first deletes every ``batch-N-*`` file and the staging directory of an unfinished
batch, then repeats steps 2-4. Spark ignores ``_``-prefixed directories when reading
``<out>``. One archive run per directory at a time (an exclusive file lock).
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import shutil
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from retryd.errors import RetrydError
from retryd.pipeline.kafka_io import resolve_ranges
from retryd.pipeline.offsets import Bound, BoundSpec, OffsetRange, ranges_to_json
from retryd.pipeline.options import SourceOptions
from retryd.pipeline.progress import JobProgress
from retryd.pipeline.source import Source, kafka_options, read_kafka

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)
STATE_DIR = "_retryd_archive"
STAGING_DIR = "_staging"


class ArchiveError(RetrydError):
    """The archive directory is unusable (another topic's archive, locked, corrupt state)."""


@dataclass(frozen=True)
class ArchiveSpec:
    kafka_conf: Mapping[str, str]
    topic: str
    out_dir: Path
    source: Source | str = Source.PYTHON
    max_records_per_partition: int | None = None


@dataclass
class ArchiveResult:
    batch: int | None  # None: nothing new to archive
    records: int = 0
    resumed: bool = False
    ranges: list[OffsetRange] = field(default_factory=list)
    files: list[Path] = field(default_factory=list)


def _write_json(path: Path, data: Any) -> None:
    """Atomic replace: a reader sees the old or the new file, never half of one."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(data, fh, indent=1, sort_keys=True)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise ArchiveError(f"archive state {path} is unreadable: {exc}") from exc


class ArchiveState:
    """The checkpoint and the pending batch of one archive directory."""

    def __init__(self, out_dir: Path, topic: str) -> None:
        self.out_dir = out_dir
        self.topic = topic
        self.dir = out_dir / STATE_DIR
        self.checkpoint_path = self.dir / "checkpoint.json"
        self.pending_path = self.dir / "pending.json"

    def checkpoint(self) -> tuple[int, dict[int, int]]:
        """(last committed batch, next offset per partition)."""
        data = _read_json(self.checkpoint_path)
        if data is None:
            return 0, {}
        if data.get("topic") != self.topic:
            raise ArchiveError(
                f"{self.out_dir} archives topic {data.get('topic')!r}, not {self.topic!r}"
            )
        return int(data["batch"]), {int(p): int(o) for p, o in data["offsets"].items()}

    def pending(self) -> tuple[int, list[OffsetRange]] | None:
        data = _read_json(self.pending_path)
        if data is None:
            return None
        ranges = [
            OffsetRange(self.topic, int(r["partition"]), int(r["start"]), int(r["end"]))
            for r in data["ranges"]
        ]
        return int(data["batch"]), ranges

    def write_pending(self, batch: int, ranges: list[OffsetRange]) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        rows = [{"partition": r.partition, "start": r.start, "end": r.end} for r in ranges]
        _write_json(self.pending_path, {"topic": self.topic, "batch": batch, "ranges": rows})

    def commit(self, batch: int, offsets: dict[int, int], manifest: dict[str, Any]) -> None:
        (self.dir / "batches").mkdir(parents=True, exist_ok=True)
        _write_json(self.dir / "batches" / f"{batch}.json", manifest)
        data = {
            "topic": self.topic,
            "batch": batch,
            "offsets": {str(p): o for p, o in offsets.items()},
        }
        _write_json(self.checkpoint_path, data)
        self.pending_path.unlink(missing_ok=True)

    @contextmanager
    def locked(self) -> Iterator[None]:
        self.dir.mkdir(parents=True, exist_ok=True)
        with open(self.dir / "lock", "w") as fh:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError as exc:
                raise ArchiveError(f"another archive run is using {self.out_dir}") from exc
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)


def staging_dir(out_dir: Path, batch: int) -> Path:
    return out_dir / STAGING_DIR / f"batch-{batch}"


def batch_files(out_dir: Path, batch: int) -> list[Path]:
    """Files of ``batch`` already moved into the archive (all of them, or some after a crash)."""
    return sorted(out_dir.glob(f"date=*/batch-{batch}-*"))


def discard_attempt(out_dir: Path, batch: int) -> int:
    """Remove what an unfinished attempt of ``batch`` left; returns how many files went."""
    leftovers = batch_files(out_dir, batch)
    for path in leftovers:
        path.unlink()
    shutil.rmtree(staging_dir(out_dir, batch), ignore_errors=True)
    return len(leftovers)


def next_ranges(spec: ArchiveSpec, offsets: dict[int, int]) -> list[OffsetRange]:
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


def write_batch(
    spark: SparkSession, spec: ArchiveSpec, batch: int, ranges: list[OffsetRange]
) -> int:
    """Spark writes the ranges to the batch's staging directory; returns the record count."""
    from pyspark.sql import functions as F

    opts = kafka_options(
        spec.kafka_conf,
        [spec.topic],
        startingOffsets=ranges_to_json(ranges, "starting"),
        endingOffsets=ranges_to_json(ranges, "ending"),
        maxRecordsPerPartition=spec.max_records_per_partition,
    )
    df = read_kafka(spark, opts, spec.source).withColumn("date", F.to_date("timestamp"))
    stage = staging_dir(spec.out_dir, batch)
    df.write.mode("overwrite").partitionBy("date").parquet(str(stage))
    return staged_rows(stage)


def staged_rows(stage: Path) -> int:
    """Rows written to a staging directory, from the Parquet footers (no Spark job)."""
    import pyarrow.parquet as pq

    return sum(pq.ParquetFile(path).metadata.num_rows for path in stage.glob("date=*/*.parquet"))


def publish_batch(out_dir: Path, batch: int) -> list[Path]:
    """Move the staged files into ``date=...`` directories with the batch in their name."""
    stage = staging_dir(out_dir, batch)
    moved: list[Path] = []
    for src in sorted(stage.glob("date=*/*.parquet")):
        dest_dir = out_dir / src.parent.name
        dest_dir.mkdir(parents=True, exist_ok=True)
        dest = dest_dir / f"batch-{batch}-{src.name}"
        os.replace(src, dest)
        moved.append(dest)
    return moved


def run_archive(spark: SparkSession, spec: ArchiveSpec, progress: JobProgress) -> ArchiveResult:
    """Archive everything new since the checkpoint (or finish an interrupted batch)."""
    state = ArchiveState(spec.out_dir, spec.topic)
    with state.locked():
        last, offsets = state.checkpoint()
        pending = state.pending()
        resumed = pending is not None and pending[0] == last + 1
        if pending is not None and not resumed:
            if pending[0] > last + 1:
                raise ArchiveError(
                    f"{state.pending_path} names batch {pending[0]} but the checkpoint is at "
                    f"batch {last}: the archive state is inconsistent"
                )
            state.pending_path.unlink()  # left over after its batch was committed: harmless
        batch = last + 1
        if resumed and pending is not None:
            ranges = pending[1]
            removed = discard_attempt(spec.out_dir, batch)
            progress.note(f"resuming unfinished batch {batch} (removed {removed} partial files)")
        else:
            with progress.step(f"planning offsets of {spec.topic}"):
                ranges = [r for r in next_ranges(spec, offsets) if r.span > 0]
            if not ranges:
                progress.note(f"nothing new in {spec.topic} since batch {last}")
                return ArchiveResult(batch=None)
            discard_attempt(spec.out_dir, batch)
            state.write_pending(batch, ranges)
        with progress.step(f"writing batch {batch} ({sum(r.span for r in ranges)} offsets)"):
            records = write_batch(spark, spec, batch, ranges)
        files = publish_batch(spec.out_dir, batch)
        new_offsets = {**offsets, **{r.partition: r.end for r in ranges}}
        manifest = {
            "batch": batch,
            "topic": spec.topic,
            "records": records,
            "ranges": [{"partition": r.partition, "start": r.start, "end": r.end} for r in ranges],
            "files": [str(p.relative_to(spec.out_dir)) for p in files],
        }
        state.commit(batch, new_offsets, manifest)
        shutil.rmtree(staging_dir(spec.out_dir, batch), ignore_errors=True)
        progress.note(f"batch {batch}: {records} records archived in {len(files)} files")
        return ArchiveResult(batch, records, resumed, ranges, files)
