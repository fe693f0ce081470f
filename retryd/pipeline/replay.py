"""``retryd spark replay``: bulk replay of failed records selected with Spark SQL.

Same rules as the sidecar (``retryd.replay``): targets must be in the allow-list, a replayed
copy gets ``replay_headers`` (fresh retry sequence), and the shared ledger topic decides what
was replayed already, in both directions:

- the driver drops records the ledger has (anti-join with the ledger topic's latest entry per
  key, tombstones forget) before choosing what to replay, so ``--max-messages`` and the
  dry-run counts are exact;
- each task re-reads the ledger through ``ReplayLedger`` (and every second while it runs), so
  a record the sidecar replayed after the driver looked is skipped too;
- a copy counts only once its ledger record is acknowledged, written with ``ReplayLedger``.

The global rate limit is split evenly across the tasks (one token bucket each), and the rows
are spread round-robin so every task gets its share. ``topic`` reads another dead-letter topic
than ``failed_topic`` (an error route's, or another system's: ``foreign`` names how its
headers are read, ``retryd.pipeline.foreign``).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.table import Table

from retryd.errors import RetrydError, SequenceError
from retryd.pipeline.foreign import map_foreign
from retryd.pipeline.progress import JobProgress
from retryd.pipeline.replay_task import TaskSpec, replay_partition
from retryd.pipeline.source import Source, kafka_options, read_kafka
from retryd.pipeline.timefilter import read_window
from retryd.policy.sequence import validate_topic_name
from retryd.policy.timespec import TimeWindow
from retryd.replay.errors import InvalidTarget
from retryd.replay.ledger import ReplayLedger
from retryd.replay.replayer import TargetPolicy

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

log = logging.getLogger(__name__)


class ReplayInputError(RetrydError):
    """The filter or the target of a Spark replay is unusable."""


@dataclass(frozen=True)
class ReplaySpec:
    kafka_conf: dict[str, str]
    failed_topic: str
    ledger_topic: str
    allowlist: tuple[str, ...]
    # retryd's own topics (tiers, failed_topic, ledger): never targets whatever the allow-list
    reserved: tuple[tuple[str, str], ...] = ()
    where: str | None = None
    target: str | None = None
    max_per_second: float = 100.0
    max_messages: int | None = None
    dry_run: bool = False
    force: bool = False
    source: Source | str = Source.PYTHON
    max_records_per_partition: int | None = None
    replication_factor: int = -1
    replay_id: str | None = None
    timeout_s: float = 10.0
    window: TimeWindow = field(default_factory=TimeWindow)  # failed records' Kafka timestamps
    topic: str | None = None  # the dead-letter topic to read (default: failed_topic)
    foreign: str = "retryd"  # how its records are read: a format of foreign_dead_letters

    @property
    def source_topic(self) -> str:
        return self.topic or self.failed_topic


@dataclass
class ReplayResult:
    replay_id: str
    dry_run: bool
    matched: int = 0
    to_replay: int = 0
    replayed: int = 0
    failed: int = 0
    skipped: Counter[str] = field(default_factory=Counter)
    by_target: Counter[str] = field(default_factory=Counter)
    errors: list[str] = field(default_factory=list)
    seconds: float = 0.0
    time_filter: str | None = None  # how --since/--until selected the records

    @property
    def rate(self) -> float:
        return self.replayed / self.seconds if self.seconds > 0 else 0.0


def _filtered(spark: SparkSession, spec: ReplaySpec, result: ReplayResult) -> DataFrame:
    from pyspark.errors import AnalysisException, ParseException

    if spec.window.is_open:
        opts = kafka_options(
            spec.kafka_conf,
            [spec.source_topic],
            maxRecordsPerPartition=spec.max_records_per_partition,
        )
        failed = read_kafka(spark, opts, spec.source)
    else:
        failed, plan = read_window(
            spark, spec.kafka_conf, [spec.source_topic], spec.window, spec.source,
            spec.max_records_per_partition,
        )  # fmt: skip
        result.time_filter = f"{spec.window.describe()}: {plan.note}"
    if spec.foreign != "retryd":
        failed = map_foreign(failed, {spec.source_topic: spec.foreign})
    if not spec.where:
        return failed
    try:
        selected = failed.where(spec.where)
        selected.schema  # noqa: B018 - analysis happens here: a bad filter fails now
    except (AnalysisException, ParseException) as exc:
        first = str(exc).strip().splitlines()[0]
        raise ReplayInputError(f"--where {spec.where!r} is not a valid filter: {first}") from exc
    return selected


def replayed_keys(spark: SparkSession, spec: ReplaySpec) -> DataFrame:
    """Ledger keys whose latest record is not a tombstone (what ``ReplayLedger`` holds)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    ledger = read_kafka(spark, kafka_options(spec.kafka_conf, [spec.ledger_topic]), spec.source)
    latest = Window.partitionBy("ledger_key").orderBy(F.desc("partition"), F.desc("offset"))
    return (
        ledger.select(
            F.col("key").cast("string").alias("ledger_key"), "partition", "offset", "value"
        )
        .withColumn("n", F.row_number().over(latest))
        .where("n = 1 AND value IS NOT NULL")
        .select("ledger_key")
    )


def _check_targets(spec: ReplaySpec, topics: Iterable[str | None]) -> dict[str | None, Any]:
    """Per target topic: its partition count, or the reason records to it are skipped."""
    policy = TargetPolicy(spec.kafka_conf, list(spec.allowlist), reserved=dict(spec.reserved))
    out: dict[str | None, Any] = {}
    try:
        for topic in topics:
            if not topic:
                out[topic] = "no_valid_target"
                continue
            try:
                validate_topic_name(topic)
            except SequenceError:
                out[topic] = "no_valid_target"
                continue
            if policy.refusal(topic) is not None:
                out[topic] = "target_reserved"
                continue
            if topic not in policy.allowed:
                out[topic] = "target_not_allowed"
                continue
            count = policy.partitions(topic, spec.timeout_s)
            out[topic] = "target_missing" if count is None else count
    finally:
        policy.close()
    return out


def run_replay(spark: SparkSession, spec: ReplaySpec, progress: JobProgress) -> ReplayResult:
    from pyspark.sql import functions as F

    replay_id = spec.replay_id or f"spark-{uuid.uuid4().hex[:16]}"
    result = ReplayResult(replay_id=replay_id, dry_run=spec.dry_run)
    if spec.target is not None:
        reason = _check_targets(spec, [spec.target])[spec.target]
        if isinstance(reason, str):
            allowed = ", ".join(spec.allowlist) or "(empty: set replay_allowlist)"
            raise InvalidTarget(
                f"target topic {spec.target} refused: {reason} (allowed: {allowed})"
            )
    ledger = ReplayLedger(
        spec.kafka_conf, spec.ledger_topic, replication_factor=spec.replication_factor
    )
    try:
        ledger.ensure_topic()
    finally:
        ledger.close()
    coord = F.concat_ws("/", "topic", "partition", "offset")
    target = F.lit(spec.target) if spec.target else F.col("original_topic")
    columns: list[Column | str] = [
        "topic", "partition", "offset", F.unix_millis("timestamp").alias("ts_ms"),
        "key", "value", "headers", "original_topic", target.alias("target"), coord.alias("coord"),
    ]  # fmt: skip
    with progress.step(f"selecting from {spec.source_topic}"):
        matched = _filtered(spark, spec, result).select(*columns).cache()
        result.matched = matched.count()
        candidates = matched
        if not spec.force:
            ledger_keys = replayed_keys(spark, spec)
            candidates = matched.join(
                ledger_keys, matched.coord == ledger_keys.ledger_key, "left_anti"
            )
        counted = candidates.groupBy("target").agg(F.count(F.lit(1)).alias("n")).collect()
        per_target = {r["target"]: r["n"] for r in counted}
    result.skipped["already_replayed"] = result.matched - sum(per_target.values())
    checked = _check_targets(spec, per_target)
    usable = {t: n for t, n in checked.items() if isinstance(n, int)}
    for topic, reason in checked.items():
        if isinstance(reason, str):
            result.skipped[reason] += per_target[topic]
    selected = candidates.where(F.col("target").isin(list(usable))) if usable else None
    eligible = sum(per_target[t] for t in usable)
    result.to_replay = min(eligible, spec.max_messages or eligible)
    if selected is not None and spec.max_messages is not None and eligible > spec.max_messages:
        selected = selected.orderBy("partition", "offset").limit(spec.max_messages)
        result.skipped["max_messages"] = eligible - spec.max_messages
    if spec.dry_run or selected is None or result.to_replay == 0:
        if selected is not None:
            counts = selected.groupBy("target").count().collect()
            result.by_target.update({r["target"]: r["count"] for r in counts})
        matched.unpersist()
        result.skipped = +result.skipped
        return result
    tasks = max(1, min(spark.sparkContext.defaultParallelism, result.to_replay))
    task = TaskSpec(
        kafka_conf=dict(spec.kafka_conf),
        ledger_topic=spec.ledger_topic,
        replay_id=replay_id,
        partitions=usable,
        rate_per_task=spec.max_per_second / tasks,
        force=spec.force,
        timeout_s=spec.timeout_s,
        foreign=spec.foreign,
    )
    rows = selected.repartition(tasks).sortWithinPartitions("partition", "offset")
    label = f"replaying {result.to_replay} records at <= {spec.max_per_second:g}/s ({tasks} tasks)"
    started = time.monotonic()
    with progress.step(label):
        summaries = rows.rdd.mapPartitions(lambda it: replay_partition(task, iter(it))).collect()
    result.seconds = time.monotonic() - started
    matched.unpersist()
    _merge(result, summaries)
    return result


def _merge(result: ReplayResult, summaries: list[dict[str, Any]]) -> None:
    for summary in summaries:
        result.replayed += summary["replayed"]
        result.failed += summary["failed"]
        result.skipped.update(summary["skipped"])
        result.by_target.update(summary["by_target"])
        result.errors.extend(summary["errors"][: max(0, 20 - len(result.errors))])
    result.skipped = +result.skipped


def print_summary(result: ReplayResult, console: Console) -> None:
    title = "Spark replay (dry run: nothing produced)" if result.dry_run else "Spark replay"
    table = Table(title=title, title_justify="left")
    table.add_column("item")
    table.add_column("value", justify="right")
    table.add_row("replay id", result.replay_id)
    table.add_row("matched", str(result.matched))
    table.add_row("to replay", str(result.to_replay))
    if not result.dry_run:
        table.add_row("replayed", str(result.replayed))
        table.add_row("failed", str(result.failed))
        table.add_row("seconds", f"{result.seconds:.1f}")
        table.add_row("rate (/s)", f"{result.rate:.1f}")
    for reason, count in sorted(result.skipped.items()):
        table.add_row(f"skipped: {reason}", str(count))
    for target, count in sorted(result.by_target.items()):
        table.add_row(f"to {target}", str(count))
    console.print(table)
    if result.time_filter is not None:
        console.print(f"time filter {result.time_filter}", soft_wrap=True)
    for line in result.errors:
        console.print(f"[red]error[/red] {line}")
