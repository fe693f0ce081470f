"""``retryd sidecar``: health, metrics and the replay API over HTTP(S) (uvicorn)."""

from __future__ import annotations

import logging
import ssl
from pathlib import Path

import typer

from retryd.cli.app import BootstrapOption, ConfigOption, app, settings_or_exit
from retryd.config import Settings
from retryd.errors import ConfigError
from retryd.runtime.paths import prepare_metrics_env

log = logging.getLogger(__name__)


def tls_problems(settings: Settings) -> list[str]:
    """Load the certificate and key once now, so a bad pair is a config error, not a crash."""
    cert, key = settings.sidecar_tls_cert_file, settings.sidecar_tls_key_file
    if cert is None or key is None:
        return []
    for name, path in (("sidecar_tls_cert_file", cert), ("sidecar_tls_key_file", key)):
        if not path.is_file():
            return [f"{name}: {path} does not exist or is not a file"]
    try:
        ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(cert, key)
    except (ssl.SSLError, OSError) as exc:
        reason = getattr(exc, "reason", None) or exc.__class__.__name__
        return [f"sidecar_tls_cert_file/sidecar_tls_key_file: cannot load them ({reason})"]
    return []


def check_ledger(settings: Settings) -> str | None:
    """Create or verify the replay ledger now; a problem that must stop the sidecar, or None.

    A ledger that is not compacted is refused (its entries would expire and records be
    replayed twice). A broker that does not answer is not fatal: the check runs again before
    the first replay.
    """
    from retryd.replay.errors import BrokerUnavailable, LedgerMisconfigured
    from retryd.replay.ledger import LedgerError, ReplayLedger

    ledger = ReplayLedger(
        settings.kafka_common(),
        settings.ledger_topic,
        replication_factor=settings.replication_factor,
        timeout_s=settings.readiness_timeout_s,
    )
    try:
        ledger.ensure_topic()
    except LedgerMisconfigured as exc:
        return f"{exc} (run 'retryd topics check'; recreate it with cleanup.policy=compact)"
    except (BrokerUnavailable, LedgerError) as exc:
        log.warning("cannot check the replay ledger now (%s); checked before the first replay", exc)
    finally:
        ledger.close()
    return None


@app.command()
def sidecar(
    config: Path | None = ConfigOption,
    host: str | None = typer.Option(None, help="listen address (default from settings)"),
    port: int | None = typer.Option(None, min=0, max=65535, help="listen port"),
    bootstrap_servers: str | None = BootstrapOption,
    main_topics: str | None = typer.Option(None, help="comma list of source topics"),
    group_id: str | None = typer.Option(None, help="worker group whose lag is measured"),
    failed_topic: str | None = typer.Option(None),
    state_dir: Path | None = typer.Option(None, help="where the workers' heartbeats/metrics are"),
) -> None:
    """Serve /healthz, /readyz, /metrics and the /v1 replay API until SIGTERM/SIGINT."""
    from retryd.hosting.process import StopSignals

    # From here on a stop signal ends the sidecar with status 0 whenever it comes: one that
    # came earlier (held since the process's first line) or comes before the server runs
    # stops it before it serves anything.
    signals = StopSignals("refusing new replays, finishing those in flight, then exit")
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
    from retryd.api.credentials import load_credentials

    try:
        credentials = load_credentials(settings)
        problems = tls_problems(settings)
        if problems:
            raise ConfigError(problems)
    except ConfigError as exc:
        typer.echo("retryd: invalid configuration:", err=True)
        for line in exc.problems:
            typer.echo(f"  - {line}", err=True)
        raise typer.Exit(2) from None
    ledger_problem = check_ledger(settings)
    if ledger_problem is not None:
        typer.echo(f"retryd: {ledger_problem}", err=True)
        raise typer.Exit(1)
    # Before anything imports prometheus_client metrics: the sidecar's own counters go to the
    # same multiprocess directory as the workers', so one collector serves everything.
    prepare_metrics_env(settings.state_dir)
    import uvicorn

    from retryd.api.app import create_app
    from retryd.replay.targets import reserved_topics

    if not credentials.enabled:
        log.warning("no API token configured: the /v1 replay API is disabled")
    for token in credentials.tokens:
        log.info("API token %s accepted with scope %s", token.id, token.scope)
    refused = sorted(set(settings.replay_allowlist) & set(reserved_topics(settings)))
    refused += sorted(t for t in settings.replay_allowlist if t.startswith("__"))
    if refused:
        log.warning("replay_allowlist names topics that are never replay targets: %s", refused)
    tls = settings.sidecar_tls_cert_file is not None
    log.info(
        "sidecar listening on %s://%s:%d (failed_topic=%s, group=%s)",
        "https" if tls else "http",
        settings.sidecar_host,
        settings.sidecar_port,
        settings.failed_topic,
        settings.group_id,
    )
    if signals.requested:
        return
    server = uvicorn.Server(
        uvicorn.Config(
            create_app(settings, credentials=credentials),
            host=settings.sidecar_host,
            port=settings.sidecar_port,
            log_level=logging.getLevelName(logging.getLogger().getEffectiveLevel()).lower(),
            log_config=None,  # uvicorn's loggers go through retryd's handler (text or JSON)
            access_log=False,
            timeout_graceful_shutdown=10,
            ssl_certfile=str(settings.sidecar_tls_cert_file) if tls else None,
            ssl_keyfile=str(settings.sidecar_tls_key_file) if tls else None,
        )
    )
    # While it serves, uvicorn's own handlers take the signals (a graceful shutdown) and give
    # them back to ours afterwards, re-raising them: ours only marks the server stopped, so
    # the process ends with status 0 rather than uvicorn's re-raised -15 (or, for SIGINT, a
    # KeyboardInterrupt). A signal between here and uvicorn's handlers stops it the same way.
    signals.attach(lambda: setattr(server, "should_exit", True))
    server.run()
    if not server.started and not signals.requested:
        raise typer.Exit(3)  # uvicorn's STARTUP_FAILURE: the server never started
