"""``retryd demo business`` and ``retryd demo traffic``: the demo services of the compose stack
and of the Kubernetes example pod (a business service answering the HTTP handler contract, and
a traffic producer), run from the retryd image itself."""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
from pathlib import Path
from types import FrameType

import typer

from retryd.cli.app import BootstrapOption, ConfigOption, app, settings_or_exit

log = logging.getLogger(__name__)

demo_app = typer.Typer(
    help="Demo services: a business service for HTTP mode and a traffic producer.",
    no_args_is_help=True,
)
app.add_typer(demo_app, name="demo")


@demo_app.command("business")
def business(
    host: str = typer.Option("0.0.0.0", help="listen address"),
    port: int = typer.Option(8000, min=0, max=65535, envvar="BUSINESS_PORT", help="listen port"),
    fail_share: float = typer.Option(
        0.2, min=0, max=1, envvar="FAIL_SHARE", help="share of requests answered 503 (retried)"
    ),
    not_found_share: float = typer.Option(
        0.02, min=0, max=1, envvar="NOT_FOUND_SHARE", help="share answered 404 (dead-lettered)"
    ),
    latency_ms: float = typer.Option(5.0, min=0, envvar="LATENCY_MS", help="time per request"),
    seed: int | None = typer.Option(None, help="seed of the failure draws (repeatable runs)"),
) -> None:
    """Serve POST /handle (the HTTP handler contract) and GET /healthz until SIGTERM."""
    from retryd.dev.business import Behaviour, serve

    if fail_share + not_found_share > 1:
        typer.echo("retryd: --fail-share plus --not-found-share must not exceed 1", err=True)
        raise typer.Exit(2)

    def stop(signum: int, frame: FrameType | None) -> None:
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, stop)
    with contextlib.suppress(KeyboardInterrupt):
        serve(host, port, Behaviour(fail_share, not_found_share, latency_ms), seed)


@demo_app.command("traffic")
def traffic(
    config: Path | None = ConfigOption,
    bootstrap_servers: str | None = BootstrapOption,
    topic: str | None = typer.Option(None, help="target topic (default: the first main topic)"),
    rate: float = typer.Option(10.0, min=0.01, envvar="TRAFFIC_RATE", help="orders per second"),
    count: int | None = typer.Option(None, min=1, help="stop after this many (default: never)"),
    seed: int | None = typer.Option(None, help="seed of the generated orders"),
) -> None:
    """Produce demo orders to a main topic at a steady rate until SIGTERM (or --count)."""
    from retryd.dev.producer import produce_orders

    settings = settings_or_exit(config, bootstrap_servers=bootstrap_servers)
    target = topic or (settings.main_topics[0] if settings.main_topics else None)
    if target is None:
        typer.echo("retryd: --topic or main_topics (RETRYD_MAIN_TOPICS) is required", err=True)
        raise typer.Exit(2)
    stop_event = threading.Event()

    def stop(signum: int, frame: FrameType | None) -> None:
        stop_event.set()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    log.info("producing demo orders to %s at %g/s", target, rate)
    ok, failed = produce_orders(settings.kafka_common(), target, rate, count, stop_event, seed)
    log.info("produced %d orders (%d failed)", ok, failed)
    raise typer.Exit(1 if failed else 0)
