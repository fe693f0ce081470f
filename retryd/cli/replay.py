"""``retryd replay``: bulk replay of failed records from the command line.

Runs the same job code as ``POST /v1/replays`` (ledger, allow-list and reserved topics, rate
limit, audit lines with actor ``cli``), in this process, with a progress bar; ``--dry-run``
prints what would be replayed as tables. Ctrl-C cancels and waits until every copy in flight
has its ledger entry (bounded by the delivery timeout) before the ledger is closed.

A replay that no filter narrows (every record of failed_topic) asks for confirmation on a
terminal and is refused without one, unless ``--yes``; ``--dry-run`` never asks. ``--topic``
replays from an error route's dead-letter topic (``dlt:<topic>``) or another system's
(``foreign_dead_letters``, read through its header mapping) instead of failed_topic.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from retryd.cli.app import BootstrapOption, ConfigOption, app, settings_or_exit
from retryd.errors import RetrydError, TimeSpecError
from retryd.policy.timespec import FORMS, parse_instant
from retryd.replay.records import DEAD_REASONS

DELIVERY_TIMEOUT_S = 30.0  # a copy's (and a ledger record's) delivery report comes within this


@app.command()
def replay(
    config: Path | None = ConfigOption,
    topic: str | None = typer.Option(
        None,
        "--topic",
        help="the dead-letter topic to replay from: failed_topic (default), a dlt: topic of "
        "error_routes or a topic of foreign_dead_letters",
    ),
    original_topic: str | None = typer.Option(None, help="only records first seen on this topic"),
    error_class: str | None = typer.Option(None, help="only this retryd_error_class"),
    dead_reason: str | None = typer.Option(None, help=" | ".join(DEAD_REASONS)),
    since: str | None = typer.Option(
        None, "--since", help=f"dead-lettered at or after this time: {FORMS}"
    ),
    until: str | None = typer.Option(
        None, "--until", help=f"dead-lettered before this time: {FORMS}"
    ),
    since_ms: int | None = typer.Option(None, min=0, hidden=True, help="epoch ms (--since)"),
    until_ms: int | None = typer.Option(None, min=0, hidden=True, help="epoch ms (--until)"),
    key: str | None = typer.Option(None, help="only records with exactly this key (UTF-8)"),
    partition: int | None = typer.Option(None, min=0, help="only this partition of the topic"),
    target: str | None = typer.Option(None, help="target topic (default: each original topic)"),
    rate: float = typer.Option(100.0, min=0.001, help="at most this many replays per second"),
    max_messages: int | None = typer.Option(None, min=1, help="stop after this many replays"),
    dry_run: bool = typer.Option(False, "--dry-run", help="count only; produce nothing"),
    force: bool = typer.Option(False, "--force", help="replay records the ledger already has"),
    as_json: bool = typer.Option(False, "--json", help="print the final progress as JSON"),
    yes: bool = typer.Option(
        False, "--yes", "-y", help="replay without asking even when no filter narrows the job"
    ),
    bootstrap_servers: str | None = BootstrapOption,
    failed_topic: str | None = typer.Option(None),
    main_topics: str | None = typer.Option(None, help="comma list (the default allow-list)"),
) -> None:
    """Replay failed records matching the filters (each at most once unless --force)."""
    from retryd.api.state import allowed_targets
    from retryd.replay.errors import InvalidTarget
    from retryd.replay.jobs import JobSpec, ReplayJob
    from retryd.replay.ledger import ReplayLedger
    from retryd.replay.records import RecordFilter
    from retryd.replay.replayer import TargetPolicy
    from retryd.replay.sources import foreign_formats, source_topic
    from retryd.replay.targets import reserved_topics
    from retryd.tracing import tracing_from_env

    settings = settings_or_exit(
        config,
        bootstrap_servers=bootstrap_servers,
        failed_topic=failed_topic,
        main_topics=main_topics,
    )
    if dead_reason is not None and dead_reason not in DEAD_REASONS:
        typer.echo(f"retryd: --dead-reason must be one of {', '.join(DEAD_REASONS)}", err=True)
        raise typer.Exit(2)
    try:
        source = source_topic(settings, topic)
    except RetrydError as exc:
        typer.echo(f"retryd: --topic: {exc}", err=True)
        raise typer.Exit(2) from None
    since_ms, until_ms = _window(since, until, since_ms, until_ms)
    unfiltered = all(
        f is None
        for f in (original_topic, error_class, dead_reason, since_ms, until_ms, key, partition)
    )
    if unfiltered and not dry_run and not yes:
        _confirm_everything(source, max_messages)
    console = Console(stderr=True)
    common = dict(settings.kafka_common())
    ledger = ReplayLedger(
        common,
        settings.ledger_topic,
        replication_factor=settings.replication_factor,
        delivery_timeout_s=DELIVERY_TIMEOUT_S,
    )
    policy = TargetPolicy(common, allowed_targets(settings), reserved=reserved_topics(settings))
    tracing = tracing_from_env()  # replayed copies' traces (OTEL_* variables)
    try:
        if target is not None:
            policy.require_allowed(target)
            if policy.partitions(target) is None:
                raise InvalidTarget(f"target topic {target} does not exist")
        ledger.ensure_topic()
        spec = JobSpec(
            topic=source,
            filter=RecordFilter(
                original_topic=original_topic,
                error_class=error_class,
                dead_reason=dead_reason,
                since_ms=since_ms,
                until_ms=until_ms,
                key=key.encode() if key is not None else None,
                partition=partition,
            ),
            target=target,
            max_per_second=rate,
            max_messages=max_messages,
            dry_run=dry_run,
            force=force,
        )
        job = ReplayJob(
            spec,
            common=common,
            failed_topic=settings.failed_topic,
            ledger=ledger,
            policy=policy,
            by="cli",
            delivery_timeout_s=DELIVERY_TIMEOUT_S,
            formats=foreign_formats(settings),
            tracing=tracing,
        )
        snap = _run_with_progress(job, console, quiet=as_json)
    except RetrydError as exc:
        typer.echo(f"retryd: {exc}", err=True)
        raise typer.Exit(1) from None
    finally:
        policy.close()
        ledger.close()
        tracing.shutdown()
    if as_json:
        typer.echo(json.dumps(snap, sort_keys=True))
    else:
        _print_summary(snap, Console())
    if snap["state"] == "failed" or snap["failed"]:
        raise typer.Exit(1)
    if snap["state"] == "cancelled":
        raise typer.Exit(130)


def _window(
    since: str | None, until: str | None, since_ms: int | None, until_ms: int | None
) -> tuple[int | None, int | None]:
    """``--since``/``--until`` resolved against one 'now' (the older epoch-ms options still
    work); exit 2 with one line when a value is unusable."""
    now_ms = int(time.time() * 1000)
    try:
        if since is not None:
            since_ms = parse_instant(since, now_ms)
        if until is not None:
            until_ms = parse_instant(until, now_ms)
    except TimeSpecError as exc:
        typer.echo(f"retryd: {exc}", err=True)
        raise typer.Exit(2) from None
    if since_ms is not None and until_ms is not None and since_ms >= until_ms:
        typer.echo("retryd: --since must be before --until", err=True)
        raise typer.Exit(2)
    return since_ms, until_ms


def _confirm_everything(topic: str, max_messages: int | None) -> None:
    """No filter narrows the job: every record of the dead-letter topic would be replayed.
    Ask on a terminal; refuse (exit 2) without one, since nobody can answer."""
    what = f"up to {max_messages}" if max_messages else "every"
    question = f"No filter given: replay {what} record of {topic} not replayed yet?"
    if not sys.stdin.isatty():
        typer.echo(
            f"retryd: {question.removesuffix('?')}: refused without a terminal to confirm; "
            "narrow it with a filter (--original-topic, --error-class, --since, …), try "
            "--dry-run, or pass --yes",
            err=True,
        )
        raise typer.Exit(2)
    if not typer.confirm(question, default=False, err=True):
        typer.echo("retryd: nothing replayed", err=True)
        raise typer.Exit(1)


def _run_with_progress(job: Any, console: Console, *, quiet: bool) -> dict[str, Any]:
    job.start()
    progress = Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[detail]}"),
        TimeRemainingColumn(),
        console=console,
        disable=quiet,
        transient=False,
    )
    try:
        with progress:
            task = progress.add_task("counting", total=None, detail="")
            while not job.wait(0.2):
                snap = job.snapshot()
                total = snap["to_replay"] if snap["state"] == "running" else None
                done = snap["replayed"] + snap["failed"]
                progress.update(
                    task,
                    description=snap["state"],
                    total=total,
                    completed=done if total is not None else snap["matched"],
                    detail=(
                        f"skipped {snap['skipped']} failed {snap['failed']} "
                        f"{snap['rate_per_second']:.0f}/s"
                    ),
                )
            snap = job.snapshot()
            progress.update(
                task,
                description=snap["state"],
                total=max(snap["to_replay"], 1),
                completed=snap["replayed"] + snap["failed"],
            )
    except KeyboardInterrupt:
        console.print("cancelling: waiting for replays in flight to be acknowledged…")
        job.cancel()
        deadline = time.monotonic() + job.shutdown_bound_s()
        while not job.wait(0.2) and time.monotonic() < deadline:
            pass
    return dict(job.snapshot())


def _counts_table(title: str, counts: dict[str, int]) -> Table:
    table = Table(title=title)
    table.add_column("value")
    table.add_column("records", justify="right")
    for name, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])):
        table.add_row(name, str(n))
    return table


def _print_summary(snap: dict[str, Any], console: Console) -> None:
    head = Table(title="dry run: nothing was produced" if snap["dry_run"] else "replay")
    for col in ("state", "matched", "to replay", "replayed", "skipped", "failed", "rate/s"):
        head.add_column(col, justify="right")
    head.add_row(
        snap["state"],
        str(snap["matched"]),
        str(snap["to_replay"]),
        str(snap["replayed"]),
        str(snap["skipped"]),
        str(snap["failed"]),
        f"{snap['rate_per_second']:.1f}",
    )
    console.print(head)
    if snap["dry_run"]:
        console.print(_counts_table("would replay, by target topic", snap["by_target"]))
        console.print(_counts_table("matched, by dead reason", snap["by_dead_reason"]))
        console.print(_counts_table("matched, by error class", snap["by_error_class"]))
    if snap["skipped_reasons"]:
        console.print(_counts_table("skipped, by reason", snap["skipped_reasons"]))
    if snap["state"] != "completed" or not snap["dry_run"]:
        console.print(f"stopped: {snap['stop_reason']}; position {snap['position']}")
    for line in snap["errors"]:
        console.print(f"[red]error:[/red] {line}")
