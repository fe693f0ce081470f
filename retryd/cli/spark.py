"""``retryd spark report|archive|replay``: the Spark pipeline jobs.

PySpark is optional (``pip install 'retryd[spark]'``): nothing here imports it until a job
runs, and a missing PySpark or Java 17 is reported in one sentence before Spark starts.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.console import Console

from retryd.cli.app import BootstrapOption, ConfigOption, app, settings_or_exit
from retryd.errors import RetrydError, TimeSpecError
from retryd.policy.timespec import TimeWindow, parse_window

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from retryd.config import Settings
    from retryd.pipeline.archive import ArchiveSpec

spark_app = typer.Typer(
    name="spark",
    help="Spark jobs over the retry and dead-letter topics (needs the spark extra, Java 17).",
    no_args_is_help=True,
)
app.add_typer(spark_app, name="spark")

EXIT_RUNTIME = 3
MasterOption = typer.Option(
    None, "--master", help="Spark master URL [default: local[*], or spark-submit's --master]"
)
SourceOption = typer.Option(
    "python", "--source", help="python: retryd_kafka data source; native: Spark's Kafka connector"
)
ChunkOption = typer.Option(
    None, "--max-records-per-partition", min=1, help="split offset ranges into tasks of this size"
)
ConfOption = typer.Option(None, "--spark-conf", help="extra Spark setting KEY=VALUE (repeatable)")
_TIME_FORMS = "ISO-8601 (2024-05-01T10:00Z, UTC if no offset) or relative (30m, 2h, 7d)"
SinceOption = typer.Option(
    None, "--since", help=f"only dead letters stamped at/after this time: {_TIME_FORMS}"
)
UntilOption = typer.Option(
    None, "--until", help=f"only dead letters stamped before this time: {_TIME_FORMS}"
)


def _parse_conf(items: list[str] | None) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            typer.echo(f"retryd: --spark-conf {item!r} must look like KEY=VALUE", err=True)
            raise typer.Exit(2)
        out[key.strip()] = value
    return out


def _window(
    since: str | None,
    until: str | None,
    since_ms: int | None = None,
    until_ms: int | None = None,
) -> TimeWindow:
    """The time window of --since/--until (both resolved against one 'now'); exit 2 when a
    value cannot be parsed. The older --since-ms/--until-ms (epoch ms) still work."""
    try:
        if since_ms is not None or until_ms is not None:
            if since is not None or until is not None:
                raise TimeSpecError("give --since/--until or --since-ms/--until-ms, not both")
            if since_ms is not None and until_ms is not None and since_ms >= until_ms:
                raise TimeSpecError(f"--since-ms {since_ms} is not before --until-ms {until_ms}")
            return TimeWindow(since_ms, until_ms)
        return parse_window(since, until, int(time.time() * 1000))
    except TimeSpecError as exc:
        typer.echo(f"retryd: {exc}", err=True)
        raise typer.Exit(2) from None


def _source(name: str) -> str:
    """Checked here without importing the pipeline (it needs PySpark)."""
    if name not in ("python", "native"):
        typer.echo("retryd: --source must be 'python' or 'native'", err=True)
        raise typer.Exit(2)
    return name


@contextmanager
def spark_session(
    master: str | None, conf: dict[str, str], console: Console
) -> Iterator[SparkSession]:
    """Check the runtime, start Spark (or reuse a running session), stop what we started."""
    from retryd.pipeline.session import SparkUnavailableError, check_runtime

    try:
        check_runtime(os.environ)
    except SparkUnavailableError as exc:
        typer.echo(f"retryd: {exc}", err=True)
        raise typer.Exit(EXIT_RUNTIME) from None
    from pyspark.sql import SparkSession

    from retryd.pipeline.session import build_session, register, stop_session

    existing = SparkSession.getActiveSession()
    if existing is not None:
        register(existing)
        yield existing
        return
    if master is None and "PYSPARK_GATEWAY_PORT" not in os.environ:
        master = "local[*]"  # not launched by spark-submit
    with console.status(f"starting Spark ({master or 'spark-submit'})"):
        session = build_session(master, "retryd", conf)
    try:
        yield session
    finally:
        stop_session(session)


@contextmanager
def _job_errors() -> Iterator[None]:
    try:
        yield
    except RetrydError as exc:
        typer.echo(f"retryd: {exc}", err=True)
        raise typer.Exit(1) from None


@spark_app.command()
def report(
    out: Path = typer.Option(..., "--out", help="output directory (Parquet, CSV, report.png)"),
    config: Path | None = ConfigOption,
    master: str | None = MasterOption,
    source: str = SourceOption,
    top: int = typer.Option(20, "--top", min=1, help="how many failure modes to list"),
    since: str | None = SinceOption,
    until: str | None = UntilOption,
    since_ms: int | None = typer.Option(None, min=0, hidden=True, help="epoch ms (--since)"),
    until_ms: int | None = typer.Option(None, min=0, hidden=True, help="epoch ms (--until)"),
    max_records_per_partition: int | None = ChunkOption,
    spark_conf: list[str] | None = ConfOption,
    bootstrap_servers: str | None = BootstrapOption,
) -> None:
    """Dead letters by topic/class/reason/hour, the retry funnel and top error messages."""
    settings = settings_or_exit(config, bootstrap_servers=bootstrap_servers)
    conf, src = _parse_conf(spark_conf), _source(source)
    window = _window(since, until, since_ms, until_ms)
    console = Console(stderr=False)
    with _job_errors(), spark_session(master, conf, console) as spark:
        from retryd.pipeline.progress import JobProgress
        from retryd.pipeline.report import ReportSpec, clear_output, run_report

        spec = ReportSpec(
            kafka_conf=settings.kafka_common(),
            failed_topic=settings.failed_topic,
            tier_topics=tuple(settings.plan.tier_topics),
            dlt_topics=tuple(settings.plan.dlt_topics),
            foreign=dict(settings.foreign_dead_letters),
            out_dir=out,
            top_n=top,
            source=src,
            max_records_per_partition=max_records_per_partition,
            window=window,
        )
        clear_output(out)
        with JobProgress(spark, Console(stderr=True)) as progress:
            result = run_report(spark, spec, progress, console)
        for name, path in sorted(result.files.items()):
            console.print(f"  {name}: {path}")


@spark_app.command()
def archive(
    out: str = typer.Option(
        ...,
        "--out",
        help="archive directory, a path or a URI (file://, hdfs://, s3a://): date=YYYY-MM-DD/...",
    ),
    config: Path | None = ConfigOption,
    topic: str | None = typer.Option(None, "--topic", help="topic to archive (default: failed)"),
    continuous: bool = typer.Option(
        False, "--continuous", help="keep archiving new records (a streaming query) until stopped"
    ),
    checkpoint: str | None = typer.Option(
        None, "--checkpoint", help="--continuous: the query's checkpoint directory (path or URI)"
    ),
    trigger: str = typer.Option(
        "10s", "--trigger", help="--continuous: how often to look for new records (e.g. 10s, 1m)"
    ),
    max_offsets_per_trigger: int | None = typer.Option(
        None, "--max-offsets-per-trigger", min=1, help="--continuous: cap each micro-batch"
    ),
    master: str | None = MasterOption,
    source: str = SourceOption,
    max_records_per_partition: int | None = ChunkOption,
    spark_conf: list[str] | None = ConfOption,
    bootstrap_servers: str | None = BootstrapOption,
) -> None:
    """Append what is new in failed_topic to a Parquet archive (exactly once per record)."""
    settings = settings_or_exit(config, bootstrap_servers=bootstrap_servers)
    conf, src = _parse_conf(spark_conf), _source(source)
    trigger_s = _continuous_options(continuous, checkpoint, trigger)
    console = Console()
    with _job_errors(), spark_session(master, conf, console) as spark:
        from retryd.pipeline.archive import ArchiveSpec, run_archive
        from retryd.pipeline.progress import JobProgress

        spec = ArchiveSpec(
            kafka_conf=settings.kafka_common(),
            topic=topic or settings.failed_topic,
            out=out,
            source=src,
            max_records_per_partition=max_records_per_partition,
        )
        if continuous and checkpoint is not None:
            _archive_continuously(spark, spec, checkpoint, trigger_s, max_offsets_per_trigger)
            return
        with JobProgress(spark, Console(stderr=True)) as progress:
            result = run_archive(spark, spec, progress)
        summary = {
            "batch": result.batch,
            "records": result.records,
            "resumed": result.resumed,
            "files": len(result.files),
        }
        console.print_json(json.dumps(summary))


def _continuous_options(continuous: bool, checkpoint: str | None, trigger: str) -> float:
    """Check the --continuous options before Spark starts; the trigger interval in seconds."""
    from retryd.policy.timespec import parse_duration

    problem = None
    if continuous and not checkpoint:
        problem = "--continuous needs --checkpoint DIR (where the query keeps its progress)"
    elif checkpoint and not continuous:
        problem = "--checkpoint is for --continuous runs"
    if problem is None:
        try:
            trigger_ms = parse_duration(trigger)
        except TimeSpecError as exc:
            problem = f"--trigger: {exc}"
        else:
            if trigger_ms < 100:
                problem = f"--trigger {trigger!r} is too short (at least 100ms)"
    if problem is not None:
        typer.echo(f"retryd: {problem}", err=True)
        raise typer.Exit(2)
    return trigger_ms / 1000


def _archive_continuously(
    spark: SparkSession,
    spec: ArchiveSpec,
    checkpoint: str,
    trigger_s: float,
    max_offsets_per_trigger: int | None,
) -> None:
    """Run the streaming archive until SIGTERM/SIGINT, one line per archived batch."""
    import signal
    import threading

    from retryd.pipeline.continuous import BatchReport, ContinuousSpec, run_continuous

    console = Console()
    stop = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        console.print(f"{signal.Signals(signum).name}: stopping after the running micro-batch")
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)

    def on_batch(report: BatchReport) -> None:
        console.print(
            f"batch {report.batch}: {report.records} records in {report.files} files "
            f"(micro-batch {report.micro_batch}, {report.seconds:.1f}s)",
            soft_wrap=True,
        )

    console.print(
        f"archiving {spec.topic} to {spec.out} every {trigger_s:g}s "
        f"(checkpoint {checkpoint}); SIGTERM or Ctrl-C stops",
        soft_wrap=True,
    )
    cspec = ContinuousSpec(spec, checkpoint, trigger_s, max_offsets_per_trigger)
    result = run_continuous(spark, cspec, stop, on_batch)
    console.print_json(json.dumps({"batches": len(result.batches), "records": result.records}))


def _dead_letter_topic(settings: Settings, topic: str | None) -> str:
    """``--topic``: failed_topic, a route's dlt: topic or a foreign one; exit 2 otherwise."""
    from retryd.replay.sources import source_topic

    try:
        return source_topic(settings, topic)
    except RetrydError as exc:
        typer.echo(f"retryd: --topic: {exc}", err=True)
        raise typer.Exit(2) from None


@spark_app.command()
def replay(
    config: Path | None = ConfigOption,
    topic: str | None = typer.Option(
        None,
        "--topic",
        help="the dead-letter topic to replay from: failed_topic (default), a dlt: topic of "
        "error_routes or a topic of foreign_dead_letters",
    ),
    where: str | None = typer.Option(None, "--where", help="Spark SQL filter on the columns"),
    target: str | None = typer.Option(None, help="target topic (default: each original topic)"),
    rate: float = typer.Option(100.0, "--rate", min=0.001, help="replays per second, in total"),
    max_messages: int | None = typer.Option(None, min=1, help="replay at most this many"),
    since: str | None = SinceOption,
    until: str | None = UntilOption,
    dry_run: bool = typer.Option(False, "--dry-run", help="count only; produce nothing"),
    force: bool = typer.Option(False, "--force", help="replay records the ledger already has"),
    master: str | None = MasterOption,
    source: str = SourceOption,
    max_records_per_partition: int | None = ChunkOption,
    spark_conf: list[str] | None = ConfOption,
    bootstrap_servers: str | None = BootstrapOption,
    main_topics: str | None = typer.Option(None, help="comma list (the default allow-list)"),
) -> None:
    """Replay failed records selected by --where, rate-limited, through the replay ledger."""
    settings = settings_or_exit(
        config, bootstrap_servers=bootstrap_servers, main_topics=main_topics
    )
    conf, src = _parse_conf(spark_conf), _source(source)
    window = _window(since, until)
    dead_topic = _dead_letter_topic(settings, topic)  # checked before Spark starts
    console = Console()
    with _job_errors(), spark_session(master, conf, console) as spark:
        from retryd.pipeline.progress import JobProgress
        from retryd.pipeline.replay import ReplaySpec, print_summary, run_replay
        from retryd.replay.sources import topic_format
        from retryd.replay.targets import reserved_topics

        spec = ReplaySpec(
            kafka_conf=settings.kafka_common(),
            failed_topic=settings.failed_topic,
            topic=dead_topic,
            foreign=str(topic_format(settings, dead_topic)),
            ledger_topic=settings.ledger_topic,
            allowlist=tuple(settings.replay_allowlist or settings.main_topics),
            reserved=tuple(reserved_topics(settings).items()),
            where=where,
            target=target,
            max_per_second=rate,
            max_messages=max_messages,
            dry_run=dry_run,
            force=force,
            source=src,
            max_records_per_partition=max_records_per_partition,
            replication_factor=settings.replication_factor,
            window=window,
        )
        with JobProgress(spark, Console(stderr=True)) as progress:
            result = run_replay(spark, spec, progress)
        print_summary(result, console)
