"""``retryd sidecar``: health, metrics and the replay API over HTTP (uvicorn)."""

from __future__ import annotations

import logging
from pathlib import Path

import typer

from retryd.cli.app import ConfigOption, app, settings_or_exit
from retryd.runtime.paths import prepare_metrics_env

log = logging.getLogger(__name__)


@app.command()
def sidecar(
    config: Path | None = ConfigOption,
    host: str | None = typer.Option(None, help="listen address (default from settings)"),
    port: int | None = typer.Option(None, min=0, max=65535, help="listen port"),
    bootstrap_servers: str | None = typer.Option(None),
    main_topics: str | None = typer.Option(None, help="comma list of source topics"),
    group_id: str | None = typer.Option(None, help="worker group whose lag is measured"),
    failed_topic: str | None = typer.Option(None),
    state_dir: Path | None = typer.Option(None, help="where the workers' heartbeats/metrics are"),
) -> None:
    """Serve /healthz, /readyz, /metrics and the /v1 replay API until SIGTERM/SIGINT."""
    settings = settings_or_exit(
        config,
        sidecar_host=host,
        sidecar_port=port,
        bootstrap_servers=bootstrap_servers,
        main_topics=main_topics,
        group_id=group_id,
        failed_topic=failed_topic,
        state_dir=state_dir,
    )
    # Before anything imports prometheus_client metrics: the sidecar's own counters go to the
    # same multiprocess directory as the workers', so one collector serves everything.
    prepare_metrics_env(settings.state_dir)
    import uvicorn

    from retryd.api.app import create_app

    if settings.api_token is None:
        log.warning("no api_token configured: the /v1 replay API is disabled")
    log.info(
        "sidecar listening on %s:%d (failed_topic=%s, group=%s)",
        settings.sidecar_host,
        settings.sidecar_port,
        settings.failed_topic,
        settings.group_id,
    )
    uvicorn.run(
        create_app(settings),
        host=settings.sidecar_host,
        port=settings.sidecar_port,
        log_level=logging.getLevelName(logging.getLogger().getEffectiveLevel()).lower(),
        access_log=False,
        timeout_graceful_shutdown=10,
    )
