"""``retryd topics create`` and ``retryd topics check``: provision and verify retryd's topics."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.console import Console
from rich.table import Table

from retryd.cli.app import BootstrapOption, ConfigOption, app, settings_or_exit
from retryd.config import Settings
from retryd.errors import KafkaSetupError
from retryd.policy.sequence import format_delay

if TYPE_CHECKING:
    from retryd.kafka.topics import TopicState

topics_app = typer.Typer(
    help=(
        "Create or check the retry tiers (of retry_sequence and every error route), "
        "failed_topic, the routes' dead-letter topics, the replay ledger and (key_order = strict) "
        "the key-state topic."
    ),
    no_args_is_help=True,
)
app.add_typer(topics_app, name="topics")

_STYLE = {
    "created": "green",
    "exists": "green",
    "ok": "green",
    "missing": "red",
    "mis-sized": "yellow",
}

MainTopicsOption = typer.Option(None, "--main-topics", "-m", help="Comma list of main topics")
SequenceOption = typer.Option(
    None, "--retry-sequence", help="Retry delays, e.g. '5m,30m,1h' or 'exp(1s, x2, max=1h, n=8)'"
)
RoutesOption = typer.Option(
    None,
    "--error-routes",
    help="Error routes, e.g. 'TimeoutError=exp(1s, n=5); http_5xx=1m,5m; Declined=dlt:orders.dlt'",
)
PartitionsOption = typer.Option(
    None, "--tier-partitions", help="Partitions of the retry topics (default: main topics')"
)
ReplicationOption = typer.Option(
    None, "--replication-factor", help="Replication factor (-1 = broker default)"
)
MinInsyncOption = typer.Option(
    None,
    "--min-insync-replicas",
    help="min.insync.replicas of retryd's topics (default: the broker's)",
)
TimeoutOption = typer.Option(30.0, "--timeout", help="Seconds to wait for the cluster")
KeyOrderOption = typer.Option(
    None,
    "--key-order",
    help="'strict': also the compacted key-state topic (key_state_topic) of strict key order",
)


def _settings(
    config: Path | None,
    bootstrap_servers: str | None,
    main_topics: str | None,
    retry_sequence: str | None,
    tier_partitions: int | None,
    replication_factor: int | None,
    min_insync_replicas: int | None,
    error_routes: str | None = None,
    key_order: str | None = None,
) -> Settings:
    return settings_or_exit(
        config,
        bootstrap_servers=bootstrap_servers,
        main_topics=main_topics,
        retry_sequence=retry_sequence,
        error_routes=error_routes,
        tier_partitions=tier_partitions,
        replication_factor=replication_factor,
        min_insync_replicas=min_insync_replicas,
        key_order=key_order,
    )


def _ms(value: int | None) -> str:
    if value is None:
        return "-"
    return "forever" if value < 0 else format_delay(value) if value else "0ms"


def _table(title: str, states: list[TopicState]) -> Table:
    table = Table(title=title)
    columns = ("topic", "kind", "delay", "partitions", "retention", "cleanup", "min ISR")
    for column in (*columns, "status"):
        table.add_column(column)
    for st in states:
        actual = "-" if st.partitions is None else str(st.partitions)
        table.add_row(
            st.spec.name,
            st.spec.kind,
            _ms(st.spec.delay_ms) if st.spec.delay_ms is not None else "",
            f"{actual} (plan {st.spec.partitions})",
            f"{_ms(st.retention_ms)} (plan {_ms(st.spec.retention_ms)})",
            st.cleanup_policy or "-",
            f"{st.min_insync_replicas or '-'} (plan {st.spec.min_insync_replicas or 'broker'})",
            f"[{_STYLE[st.status]}]{st.status}[/]",
        )
    return table


def _report_problems(problems: list[str]) -> None:
    typer.echo(f"{len(problems)} problem(s):")
    for line in problems:
        typer.echo(f"  - {line}")


def _setup_failed(exc: KafkaSetupError) -> typer.Exit:
    typer.echo(f"retryd: {exc}", err=True)
    return typer.Exit(1)


@topics_app.command("create")
def create(
    config: Path | None = ConfigOption,
    bootstrap_servers: str | None = BootstrapOption,
    main_topics: str | None = MainTopicsOption,
    retry_sequence: str | None = SequenceOption,
    tier_partitions: int | None = PartitionsOption,
    replication_factor: int | None = ReplicationOption,
    min_insync_replicas: int | None = MinInsyncOption,
    timeout: float = TimeoutOption,
    error_routes: str | None = RoutesOption,
    key_order: str | None = KeyOrderOption,
) -> None:
    """Create missing topics (idempotent). Exits 1 if an existing topic is mis-sized."""
    from retryd.kafka.topics import create_topics, make_admin

    settings = _settings(
        config,
        bootstrap_servers,
        main_topics,
        retry_sequence,
        tier_partitions,
        replication_factor,
        min_insync_replicas,
        error_routes,
        key_order,
    )
    try:
        states = create_topics(settings, make_admin(settings), timeout_s=timeout)
    except KafkaSetupError as exc:
        raise _setup_failed(exc) from None
    Console(width=160).print(_table("retryd topics", states))
    problems = [p for s in states for p in s.problems]
    if problems:
        _report_problems(problems)
        raise typer.Exit(1)
    created = sum(1 for s in states if s.status == "created")
    typer.echo(f"ok: {created} created, {len(states) - created} already existed")


@topics_app.command("check")
def check(
    config: Path | None = ConfigOption,
    bootstrap_servers: str | None = BootstrapOption,
    main_topics: str | None = MainTopicsOption,
    retry_sequence: str | None = SequenceOption,
    tier_partitions: int | None = PartitionsOption,
    replication_factor: int | None = ReplicationOption,
    min_insync_replicas: int | None = MinInsyncOption,
    timeout: float = TimeoutOption,
    error_routes: str | None = RoutesOption,
    key_order: str | None = KeyOrderOption,
) -> None:
    """Verify every topic exists with the planned shape. Exits 1 naming each problem."""
    from retryd.kafka.topics import inspect_topics, make_admin

    settings = _settings(
        config,
        bootstrap_servers,
        main_topics,
        retry_sequence,
        tier_partitions,
        replication_factor,
        min_insync_replicas,
        error_routes,
        key_order,
    )
    try:
        main_problems, states = inspect_topics(settings, make_admin(settings), timeout_s=timeout)
    except KafkaSetupError as exc:
        raise _setup_failed(exc) from None
    Console(width=160).print(_table("retryd topics", states))
    problems = main_problems + [p for s in states for p in s.problems]
    if problems:
        _report_problems(problems)
        raise typer.Exit(1)
    typer.echo(f"ok: all {len(states)} topics in place")
