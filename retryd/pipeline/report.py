"""``retryd spark report``: what ended up in ``failed_topic`` and how far messages got.

Three tables, each written as Parquet and CSV, printed to the terminal and drawn in one PNG:

- ``dead_letters``: count by original topic x error class x dead reason x hour (UTC hour of
  the dead letter's Kafka timestamp);
- ``funnel``: per tier topic (in sequence order), how many distinct messages reached it and how
  many of those reached ``failed_topic``; a last row for ``failed_topic`` itself. A message is
  identified by its ``retryd_original_topic/partition/offset``;
- ``top_errors``: the most frequent error class + message pairs among dead letters.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.table import Table

from retryd.pipeline.chart import render_chart
from retryd.pipeline.kafka_io import list_partitions, range_consumer
from retryd.pipeline.progress import JobProgress
from retryd.pipeline.source import Source, kafka_options, read_kafka

if TYPE_CHECKING:
    import pandas as pd
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)
TABLES = ("dead_letters", "funnel", "top_errors")


@dataclass(frozen=True)
class ReportSpec:
    kafka_conf: Mapping[str, str]
    failed_topic: str
    tier_topics: tuple[str, ...]  # in retry-sequence order
    out_dir: Path
    top_n: int = 20
    source: Source | str = Source.PYTHON
    max_records_per_partition: int | None = None
    since_ms: int | None = None  # dead letters with a Kafka timestamp >= since (epoch ms)
    until_ms: int | None = None  # ... and < until


@dataclass
class ReportResult:
    tables: dict[str, pd.DataFrame]
    files: dict[str, Path] = field(default_factory=dict)
    chart_data: dict[str, Any] = field(default_factory=dict)
    dead_letter_total: int = 0


def _existing_topics(conf: Mapping[str, str], topics: tuple[str, ...]) -> list[str]:
    consumer = range_consumer(conf)
    try:
        out = []
        for topic in topics:
            try:
                list_partitions(consumer, [topic], 30)
                out.append(topic)
            except Exception as exc:
                log.warning("tier topic %s skipped in the funnel: %s", topic, exc)
        return out
    finally:
        consumer.close()


def _read(spark: SparkSession, spec: ReportSpec, topics: list[str]) -> DataFrame:
    opts = kafka_options(
        spec.kafka_conf, topics, maxRecordsPerPartition=spec.max_records_per_partition
    )
    return read_kafka(spark, opts, spec.source)


def build_tables(spark: SparkSession, spec: ReportSpec, progress: JobProgress) -> dict[str, Any]:
    """The three report tables as Spark DataFrames (the failed topic is read once, cached)."""
    from pyspark.sql import functions as F

    ident = F.concat_ws(
        "/", "original_topic", "original_partition", "original_offset"
    )  # NULL parts are skipped by concat_ws, so require all three below
    has_ident = (
        F.col("original_topic").isNotNull()
        & F.col("original_partition").isNotNull()
        & F.col("original_offset").isNotNull()
    )
    with progress.step(f"reading {spec.failed_topic}"):
        failed = _read(spark, spec, [spec.failed_topic]).select(
            "timestamp", "original_topic", "original_partition", "original_offset",
            "error_class", "error_message", "dead_reason",
        )  # fmt: skip
        if spec.since_ms is not None:
            failed = failed.where(F.col("timestamp") >= F.timestamp_millis(F.lit(spec.since_ms)))
        if spec.until_ms is not None:
            failed = failed.where(F.col("timestamp") < F.timestamp_millis(F.lit(spec.until_ms)))
        failed = failed.cache()
        failed.count()
    dead_letters = (
        failed.groupBy(
            "original_topic",
            "error_class",
            "dead_reason",
            F.date_trunc("hour", "timestamp").alias("hour"),
        )
        .agg(F.count(F.lit(1)).alias("count"))
        .orderBy(F.desc("count"), "original_topic", "error_class", "dead_reason", "hour")
    )
    top_errors = (
        failed.groupBy("error_class", "error_message")
        .agg(F.count(F.lit(1)).alias("count"))
        .orderBy(F.desc("count"), "error_class", "error_message")
        .limit(spec.top_n)
    )
    failed_ids = failed.where(has_ident).select(ident.alias("message")).distinct()
    tiers = _existing_topics(spec.kafka_conf, spec.tier_topics)
    if tiers:
        with progress.step("reading tier topics"):
            seen = (
                _read(spark, spec, tiers)
                .where(has_ident)
                .select(F.col("topic").alias("tier"), ident.alias("message"))
                .distinct()
                .cache()
            )
            seen.count()
        reached = seen.join(failed_ids.withColumn("dead", F.lit(1)), "message", "left")
        per_tier = reached.groupBy("tier").agg(
            F.count(F.lit(1)).alias("messages"),
            F.count("dead").alias("reached_failed"),
        )
    else:
        per_tier = spark.createDataFrame([], "tier string, messages bigint, reached_failed bigint")
    failed_row = failed_ids.agg(
        F.lit(len(spec.tier_topics) + 1).alias("stage"),
        F.lit(spec.failed_topic).alias("tier"),
        F.count(F.lit(1)).alias("messages"),
        F.count(F.lit(1)).alias("reached_failed"),
    )
    stages = [(i + 1, topic) for i, topic in enumerate(spec.tier_topics)]
    funnel = (
        spark.createDataFrame(stages, "stage int, tier string")
        .join(per_tier, "tier", "left")
        .select("stage", "tier", "messages", "reached_failed")
        .unionByName(failed_row)
        .fillna(0, ["messages", "reached_failed"])
        .orderBy("stage")
    )
    return {"dead_letters": dead_letters, "funnel": funnel, "top_errors": top_errors}


def write_outputs(tables: dict[str, Any], out_dir: Path, progress: JobProgress) -> dict[str, Any]:
    """Parquet (by Spark) and CSV (one file each, from the small aggregates) per table."""
    out_dir.mkdir(parents=True, exist_ok=True)
    frames: dict[str, pd.DataFrame] = {}
    files: dict[str, Path] = {}
    for name in TABLES:
        with progress.step(f"computing {name}"):
            df = tables[name].cache()
            parquet = out_dir / name
            df.coalesce(1).write.mode("overwrite").parquet(str(parquet))
            frame = df.toPandas()
            df.unpersist()
        csv = out_dir / f"{name}.csv"
        frame.to_csv(csv, index=False, date_format="%Y-%m-%dT%H:%M:%SZ")
        frames[name], files[f"{name}.parquet"], files[f"{name}.csv"] = frame, parquet, csv
    return {"frames": frames, "files": files}


def print_tables(frames: Mapping[str, pd.DataFrame], console: Console, limit: int = 30) -> None:
    titles = {
        "dead_letters": "Dead letters by original topic, error class, dead reason and hour",
        "funnel": "Retry funnel (distinct messages)",
        "top_errors": "Top error messages of dead letters",
    }
    for name in TABLES:
        frame = frames[name]
        table = Table(title=titles[name], title_justify="left")
        for column in frame.columns:
            table.add_column(
                column, justify="right" if frame[column].dtype.kind in "iu" else "left"
            )
        for row in frame.head(limit).itertuples(index=False):
            table.add_row(*[_cell(v) for v in row])
        if len(frame) > limit:
            table.caption = f"{len(frame) - limit} more rows in {name}.csv"
        console.print(table)


def _cell(value: Any) -> str:
    if value is None or (isinstance(value, float) and value != value):
        return "-"
    if hasattr(value, "strftime"):
        return str(value.strftime("%Y-%m-%d %H:00Z"))
    text = str(value)
    return text if len(text) <= 80 else text[:77] + "..."


def run_report(
    spark: SparkSession, spec: ReportSpec, progress: JobProgress, console: Console
) -> ReportResult:
    """Build, write, print and chart the report; returns the tables as pandas frames."""
    tables = build_tables(spark, spec, progress)
    written = write_outputs(tables, spec.out_dir, progress)
    frames: dict[str, pd.DataFrame] = written["frames"]
    files: dict[str, Path] = written["files"]
    png = spec.out_dir / "report.png"
    chart_data = render_chart(frames["dead_letters"], frames["funnel"], png)
    files["report.png"] = png
    spark.catalog.clearCache()
    print_tables(frames, console)
    total = int(frames["dead_letters"]["count"].sum()) if len(frames["dead_letters"]) else 0
    console.print(f"{total} dead letters; report written to {spec.out_dir}")
    return ReportResult(frames, files, chart_data, total)


def clear_output(out_dir: Path) -> None:
    """Remove a previous report's files (only the ones a report writes)."""
    for name in TABLES:
        shutil.rmtree(out_dir / name, ignore_errors=True)
        (out_dir / f"{name}.csv").unlink(missing_ok=True)
    (out_dir / "report.png").unlink(missing_ok=True)
