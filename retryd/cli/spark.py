"""``retryd spark report|archive|replay``: the Spark pipeline jobs.

PySpark is optional (``pip install 'retryd[spark]'``): nothing here imports it until a job
runs, and a missing PySpark or Java 17 is reported in one sentence before Spark starts.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.console import Console

from retryd.cli.app import BootstrapOption, ConfigOption, app, settings_or_exit
from retryd.errors import RetrydError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

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


def _parse_conf(items: list[str] | None) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            typer.echo(f"retryd: --spark-conf {item!r} must look like KEY=VALUE", err=True)
            raise typer.Exit(2)
        out[key.strip()] = value
    return out


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
    top: int = typer.Option(20, "--top", min=1, help="how many error messages to list"),
    since_ms: int | None = typer.Option(None, min=0, help="dead-lettered at/after (epoch ms)"),
    until_ms: int | None = typer.Option(None, min=0, help="dead-lettered before (epoch ms)"),
    max_records_per_partition: int | None = ChunkOption,
    spark_conf: list[str] | None = ConfOption,
    bootstrap_servers: str | None = BootstrapOption,
) -> None:
    """Dead letters by topic/class/reason/hour, the retry funnel and top error messages."""
    settings = settings_or_exit(config, bootstrap_servers=bootstrap_servers)
    conf, src = _parse_conf(spark_conf), _source(source)
    console = Console(stderr=False)
    with _job_errors(), spark_session(master, conf, console) as spark:
        from retryd.pipeline.progress import JobProgress
        from retryd.pipeline.report import ReportSpec, clear_output, run_report

        spec = ReportSpec(
            kafka_conf=settings.kafka_common(),
            failed_topic=settings.failed_topic,
            tier_topics=tuple(settings.plan.tier_topics),
            out_dir=out,
            top_n=top,
            source=src,
            max_records_per_partition=max_records_per_partition,
            since_ms=since_ms,
            until_ms=until_ms,
        )
        clear_output(out)
        with JobProgress(spark, Console(stderr=True)) as progress:
            result = run_report(spark, spec, progress, console)
        for name, path in sorted(result.files.items()):
            console.print(f"  {name}: {path}")


@spark_app.command()
def archive(
    out: Path = typer.Option(..., "--out", help="archive directory (date=YYYY-MM-DD/...)"),
    config: Path | None = ConfigOption,
    topic: str | None = typer.Option(None, "--topic", help="topic to archive (default: failed)"),
    master: str | None = MasterOption,
    source: str = SourceOption,
    max_records_per_partition: int | None = ChunkOption,
    spark_conf: list[str] | None = ConfOption,
    bootstrap_servers: str | None = BootstrapOption,
) -> None:
    """Append what is new in failed_topic to a Parquet archive (exactly once per record)."""
    settings = settings_or_exit(config, bootstrap_servers=bootstrap_servers)
    conf, src = _parse_conf(spark_conf), _source(source)
    console = Console()
    with _job_errors(), spark_session(master, conf, console) as spark:
        from retryd.pipeline.archive import ArchiveSpec, run_archive
        from retryd.pipeline.progress import JobProgress

        spec = ArchiveSpec(
            kafka_conf=settings.kafka_common(),
            topic=topic or settings.failed_topic,
            out_dir=out,
            source=src,
            max_records_per_partition=max_records_per_partition,
        )
        with JobProgress(spark, Console(stderr=True)) as progress:
            result = run_archive(spark, spec, progress)
        summary = {
            "batch": result.batch,
            "records": result.records,
            "resumed": result.resumed,
            "files": len(result.files),
        }
        console.print_json(json.dumps(summary))


@spark_app.command()
def replay(
    config: Path | None = ConfigOption,
    where: str | None = typer.Option(None, "--where", help="Spark SQL filter on the columns"),
    target: str | None = typer.Option(None, help="target topic (default: each original topic)"),
    rate: float = typer.Option(100.0, "--rate", min=0.001, help="replays per second, in total"),
    max_messages: int | None = typer.Option(None, min=1, help="replay at most this many"),
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
    console = Console()
    with _job_errors(), spark_session(master, conf, console) as spark:
        from retryd.pipeline.progress import JobProgress
        from retryd.pipeline.replay import ReplaySpec, print_summary, run_replay

        spec = ReplaySpec(
            kafka_conf=settings.kafka_common(),
            failed_topic=settings.failed_topic,
            ledger_topic=settings.ledger_topic,
            allowlist=tuple(settings.replay_allowlist or settings.main_topics),
            where=where,
            target=target,
            max_per_second=rate,
            max_messages=max_messages,
            dry_run=dry_run,
            force=force,
            source=src,
            max_records_per_partition=max_records_per_partition,
            replication_factor=settings.replication_factor,
        )
        with JobProgress(spark, Console(stderr=True)) as progress:
            result = run_replay(spark, spec, progress)
        print_summary(result, console)
