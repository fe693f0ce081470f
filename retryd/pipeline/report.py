"""``retryd spark report``: what ended up in the dead-letter topics and how far messages got.

The dead letters are those of ``failed_topic`` and of the error routes' named dead-letter
topics (``dlt:<topic>``, dead reason ``routed``): a record an error route sent to its DLT is as
dead as an exhausted one. A DLT that does not exist yet (nothing was routed there, the topics
were not created) is skipped, like a missing tier. So are other systems' dead-letter topics
(``foreign_dead_letters``): their headers are mapped onto the same columns
(``retryd.pipeline.foreign``), and each gets its funnel row.

Three tables, each written as Parquet and CSV, printed to the terminal and drawn in one PNG:

- ``dead_letters``: count by original topic x error class x dead reason x hour (UTC hour of
  the dead letter's Kafka timestamp);
- ``funnel``: per tier topic (retry_sequence's in order, then the tiers only error routes
  use), how many distinct messages reached it and how many of those reached a dead-letter
  topic (``reached_failed``: ``failed_topic`` or a route's DLT); then one row per dead-letter
  topic (``failed_topic``, then each DLT) with the distinct messages in it. A message is
  identified by its ``retryd_original_topic/partition/offset``;
- ``top_errors``: the most frequent failure modes among dead letters: error class x message
  *fingerprint* (``retryd.policy.fingerprint``: numbers, ids, hex, quoted values replaced), with
  how many dead letters and how many distinct messages each has, and one example message. A
  failure mode with a million distinct messages (one per order id) is one row.

``--since/--until`` select dead letters by their Kafka timestamp; the read is narrowed to the
matching offsets where the broker's offsets-for-times can be trusted (``timefilter``), and the
report says which way it went.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd  # at module level: pandas_udf resolves the hints in module globals
from rich.console import Console
from rich.table import Table

from retryd.pipeline.chart import render_chart
from retryd.pipeline.foreign import map_foreign
from retryd.pipeline.kafka_io import list_partitions, range_consumer
from retryd.pipeline.progress import JobProgress
from retryd.pipeline.source import Source, kafka_options, read_kafka
from retryd.pipeline.timefilter import read_window
from retryd.policy.fingerprint import fingerprint
from retryd.policy.timespec import TimeWindow

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)
TABLES = ("dead_letters", "funnel", "top_errors")


@dataclass(frozen=True)
class ReportSpec:
    kafka_conf: Mapping[str, str]
    failed_topic: str
    tier_topics: tuple[str, ...]  # in retry-sequence order
    out_dir: Path
    dlt_topics: tuple[str, ...] = ()  # the error routes' dead-letter topics (RetryPlan)
    top_n: int = 20
    source: Source | str = Source.PYTHON
    max_records_per_partition: int | None = None
    window: TimeWindow = field(default_factory=TimeWindow)  # dead letters' Kafka timestamps
    foreign: Mapping[str, str] = field(default_factory=dict)  # foreign_dead_letters


@dataclass
class ReportResult:
    tables: dict[str, pd.DataFrame]
    files: dict[str, Path] = field(default_factory=dict)
    chart_data: dict[str, Any] = field(default_factory=dict)
    dead_letter_total: int = 0
    time_filter: str = "no time filter"  # how --since/--until selected the records


def _existing_topics(
    conf: Mapping[str, str], topics: tuple[str, ...], what: str = "tier topic"
) -> list[str]:
    if not topics:
        return []
    consumer = range_consumer(conf)
    try:
        out = []
        for topic in topics:
            try:
                list_partitions(consumer, [topic], 30)
                out.append(topic)
            except Exception as exc:
                log.warning("%s %s skipped in the report: %s", what, topic, exc)
        return out
    finally:
        consumer.close()


def _read(spark: SparkSession, spec: ReportSpec, topics: list[str]) -> DataFrame:
    opts = kafka_options(
        spec.kafka_conf, topics, maxRecordsPerPartition=spec.max_records_per_partition
    )
    return read_kafka(spark, opts, spec.source)


def _fingerprints(messages: DataFrame) -> DataFrame:
    """Add ``fingerprint`` to (error_class, error_message, n) rows: one Python call per
    distinct message (vectorised through Arrow), then the id in SQL, equal to
    ``fingerprint_id`` (SHA-256 of class NUL template)."""
    from pyspark.sql import functions as F

    @F.pandas_udf("string")  # type: ignore[call-overload]
    def template(texts: pd.Series) -> pd.Series:
        return texts.map(lambda t: None if t is None else fingerprint(t))

    with_template = messages.withColumn("fingerprint", template("error_message"))
    key = F.concat_ws("\x00", F.coalesce("error_class", F.lit("")), F.col("fingerprint"))
    return with_template.withColumn(
        "fingerprint_id",
        F.when(F.col("fingerprint").isNotNull(), F.substring(F.sha2(key, 256), 1, 12)),
    )


def _also_dead(spec: ReportSpec) -> tuple[str, ...]:
    """The dead-letter topics besides failed_topic: the routes' DLTs, then the foreign ones."""
    return tuple(dict.fromkeys((*spec.dlt_topics, *spec.foreign)))


def top_errors(failed: DataFrame, top_n: int) -> DataFrame:
    """Failure modes by count: error class x fingerprint, distinct messages, one example."""
    from pyspark.sql import functions as F

    messages = failed.groupBy("error_class", "error_message").agg(F.count(F.lit(1)).alias("n"))
    return (
        _fingerprints(messages)
        .groupBy("error_class", "fingerprint", "fingerprint_id")
        .agg(
            F.sum("n").alias("count"),
            F.count("error_message").alias("messages"),
            F.min("error_message").alias("example"),
        )
        .select("error_class", "fingerprint", "count", "messages", "example", "fingerprint_id")
        .orderBy(F.desc("count"), "error_class", "fingerprint")
        .limit(top_n)
    )


def build_tables(
    spark: SparkSession, spec: ReportSpec, progress: JobProgress
) -> tuple[dict[str, Any], str]:
    """The three report tables as Spark DataFrames (the dead-letter topics are read once,
    cached), and how the time window selected the records."""
    from pyspark.sql import functions as F

    ident = F.concat_ws(
        "/", "original_topic", "original_partition", "original_offset"
    )  # NULL parts are skipped by concat_ws, so require all three below
    has_ident = (
        F.col("original_topic").isNotNull()
        & F.col("original_partition").isNotNull()
        & F.col("original_offset").isNotNull()
    )
    dead_topics = [
        spec.failed_topic,
        *_existing_topics(spec.kafka_conf, _also_dead(spec), "dead-letter topic"),
    ]
    with progress.step(f"reading {', '.join(dead_topics)}"):
        time_filter = "no time filter"
        if spec.window.is_open:
            raw = _read(spark, spec, dead_topics)
        else:
            raw, plan = read_window(
                spark, spec.kafka_conf, dead_topics, spec.window, spec.source,
                spec.max_records_per_partition,
            )  # fmt: skip
            time_filter = f"{spec.window.describe()}: {plan.note}"
        failed = map_foreign(raw, spec.foreign).select(
            "topic", "timestamp", "original_topic", "original_partition", "original_offset",
            "error_class", "error_message", "dead_reason",
        ).cache()  # fmt: skip
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
    top = top_errors(failed, spec.top_n)
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
    # one row per dead-letter topic (a missing DLT included, as 0): its distinct messages
    per_dead = (
        failed.where(has_ident)
        .groupBy(F.col("topic").alias("tier"))
        .agg(F.countDistinct(ident).alias("messages"))
        .withColumn("reached_failed", F.col("messages"))
    )
    stages = [(i + 1, topic) for i, topic in enumerate(spec.tier_topics)]
    dead_stages = [
        (len(stages) + i + 1, topic)
        for i, topic in enumerate(dict.fromkeys((spec.failed_topic, *_also_dead(spec))))
    ]
    funnel = (
        spark.createDataFrame(stages, "stage int, tier string")
        .join(per_tier, "tier", "left")
        .unionByName(
            spark.createDataFrame(dead_stages, "stage int, tier string").join(
                per_dead, "tier", "left"
            )
        )
        .select("stage", "tier", "messages", "reached_failed")
        .fillna(0, ["messages", "reached_failed"])
        .orderBy("stage")
    )
    return {"dead_letters": dead_letters, "funnel": funnel, "top_errors": top}, time_filter


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
        "top_errors": "Top failure modes of dead letters (error class x message fingerprint)",
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
    tables, time_filter = build_tables(spark, spec, progress)
    written = write_outputs(tables, spec.out_dir, progress)
    frames: dict[str, pd.DataFrame] = written["frames"]
    files: dict[str, Path] = written["files"]
    png = spec.out_dir / "report.png"
    chart_data = render_chart(frames["dead_letters"], frames["funnel"], png)
    files["report.png"] = png
    spark.catalog.clearCache()
    print_tables(frames, console)
    total = int(frames["dead_letters"]["count"].sum()) if len(frames["dead_letters"]) else 0
    if not spec.window.is_open:
        console.print(f"time filter {time_filter}", soft_wrap=True)
    console.print(f"{total} dead letters; report written to {spec.out_dir}")
    return ReportResult(frames, files, chart_data, total, time_filter)


def clear_output(out_dir: Path) -> None:
    """Remove a previous report's files (only the ones a report writes)."""
    for name in TABLES:
        shutil.rmtree(out_dir / name, ignore_errors=True)
        (out_dir / f"{name}.csv").unlink(missing_ok=True)
    (out_dir / "report.png").unlink(missing_ok=True)
