"""``retryd health``: liveness for containers (Docker HEALTHCHECK, Kubernetes exec probes)."""

from __future__ import annotations

from pathlib import Path

import typer

from retryd.cli.app import ConfigOption, app, settings_or_exit


@app.command()
def health(
    config: Path | None = ConfigOption,
    worker: bool = typer.Option(False, "--worker", help="check the worker heartbeats"),
    sidecar: bool = typer.Option(False, "--sidecar", help="check the local sidecar's /healthz"),
    state_dir: Path | None = typer.Option(None, help="where the workers write heartbeats"),
    http: list[str] | None = typer.Option(
        None, "--http", help="also check that this URL answers 200 (e.g. a business service)"
    ),
) -> None:
    """Exit 0 when what runs here is alive, 1 otherwise (one line per check).

    With neither flag it checks what it finds: the workers if there are heartbeats in the
    state dir, the sidecar if its port is open; finding nothing is a failure.
    """
    from retryd.runtime.health import http_check, port_open, sidecar_check, worker_check
    from retryd.runtime.paths import heartbeat_dir

    settings = settings_or_exit(config, state_dir=state_dir)
    tls = bool(getattr(settings, "sidecar_tls_cert_file", None))
    checks = []
    if not worker and not sidecar and not http:
        worker = any(heartbeat_dir(settings.state_dir).glob("*.json"))
        sidecar = port_open(settings.sidecar_port)
        if not worker and not sidecar:
            typer.echo(
                f"FAIL nothing to check: no worker heartbeat in {settings.state_dir} and no "
                f"sidecar on port {settings.sidecar_port}",
                err=True,
            )
            raise typer.Exit(1)
    if worker:
        checks.append(worker_check(settings.state_dir, settings.heartbeat_stale_s))
    if sidecar:
        checks.append(sidecar_check(settings.sidecar_port, tls=tls))
    checks.extend(http_check(url) for url in http or [])
    for check in checks:
        typer.echo(check.line(), err=not check.ok)
    raise typer.Exit(0 if all(c.ok for c in checks) else 1)
