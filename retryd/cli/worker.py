"""``retryd worker``: consume main and tier topics, call the handler, route failures."""

from __future__ import annotations

from pathlib import Path

import typer

from retryd.cli.app import BootstrapOption, ConfigOption, app, settings_or_exit
from retryd.config import ConsumerMode, Role
from retryd.runtime.heartbeat import prune_stale
from retryd.runtime.paths import prepare_metrics_env


@app.command()
def worker(
    config: Path | None = ConfigOption,
    role: Role | None = typer.Option(None, help="all | main | tiers (default from settings)"),
    processes: int | None = typer.Option(None, min=1, help="worker processes on this host"),
    until_drained: bool = typer.Option(
        False, "--until-drained", help="exit 0 once every assigned partition is drained"
    ),
    handler: str | None = typer.Option(None, help="python:pkg.mod:func or http(s)://…"),
    handler_batch: int | None = typer.Option(
        None, min=0, help="0: one record per handler call; n: up to n ready records per call"
    ),
    main_topics: str | None = typer.Option(None, help="comma list of source topics"),
    group_id: str | None = typer.Option(None),
    bootstrap_servers: str | None = BootstrapOption,
    retry_sequence: str | None = typer.Option(
        None, help="e.g. 5m,5m,30m,30m,30m,1h or exp(1s, x2, max=1h, n=8, jitter=20%)"
    ),
    failed_topic: str | None = typer.Option(None),
    state_dir: Path | None = typer.Option(None, help="heartbeats and metric files"),
) -> None:
    """Run retry workers until SIGTERM/SIGINT (or until drained)."""
    settings = settings_or_exit(
        config,
        role=role,
        processes=processes,
        handler=handler,
        handler_batch=handler_batch,
        main_topics=main_topics,
        group_id=group_id,
        bootstrap_servers=bootstrap_servers,
        retry_sequence=retry_sequence,
        failed_topic=failed_topic,
        state_dir=state_dir,
    )
    if not settings.handler:
        typer.echo(
            "retryd: invalid configuration:\n  - handler: required (RETRYD_HANDLER)", err=True
        )
        raise typer.Exit(2)
    if not settings.main_topics and settings.role is not Role.TIERS:
        typer.echo(
            "retryd: invalid configuration:\n  - main_topics: required (RETRYD_MAIN_TOPICS)",
            err=True,
        )
        raise typer.Exit(2)
    if (
        until_drained
        and settings.consumer_mode is ConsumerMode.SHARE
        and settings.role is not Role.TIERS
    ):
        typer.echo(
            "retryd: --until-drained does not work with consumer_mode=share: a share group hands "
            "records to its members one by one, with no partition a member owns and reads to "
            "its end, so no worker can tell it is done (records locked by another member, or "
            "released, come back later). Run the share workers until stopped, and watch the "
            "group's lag with kafka-share-groups.sh --describe",
            err=True,
        )
        raise typer.Exit(2)
    prepare_metrics_env(settings.state_dir)
    # Files of workers that were killed (a container restart keeps the state dir): without
    # this they would keep readiness and `retryd health` failing for the new workers.
    prune_stale(settings.state_dir, settings.heartbeat_stale_s)
    if settings.processes == 1:
        from retryd.hosting.process import run_worker

        raise typer.Exit(run_worker(settings, settings.role, until_drained=until_drained))
    from retryd.hosting.supervisor import supervise

    raise typer.Exit(
        supervise(settings, settings.role, settings.processes, until_drained=until_drained)
    )
