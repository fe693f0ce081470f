"""``retryd dev``: embedded broker, demo topics and traffic, live progress, a checked summary.

The operator's view comes with it: the sidecar runs next to the workers (a free port, a random
API token for the run) and its ``/metrics``, ``/readyz`` and ``/v1`` URLs are printed.
``--handler http`` runs the demo through a local business service over HTTP (the sidecar mode of
the product) instead of an in-process callable; the outcomes, and so the summary, are the same.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table

from retryd.cli.app import app, settings_or_exit
from retryd.config import Settings
from retryd.dev.services import Services
from retryd.dev.traffic import Expected, demo_orders, encode, expected_outcome
from retryd.errors import RetrydError
from retryd.runtime.paths import metrics_dir, prepare_metrics_env

if TYPE_CHECKING:
    from retryd.dev.progress import Snapshot

console = Console(stderr=True)


@app.command()
def dev(
    messages: int = typer.Option(2000, min=1, help="demo orders to produce"),
    fail_rate: float = typer.Option(
        0.3, min=0, max=1, help="share of orders that fail transiently"
    ),
    poison_rate: float = typer.Option(0.02, min=0, max=1, help="share that is non-retryable"),
    sequence: str = typer.Option("1s,2s,3s", help="retry sequence for the demo"),
    processes: int = typer.Option(2, min=1, max=8, help="worker processes"),
    partitions: int = typer.Option(4, min=1, max=64),
    bootstrap_servers: str | None = typer.Option(
        None,
        "--bootstrap-servers",
        "-b",
        help="use this cluster instead of starting the embedded broker",
    ),
    handler: str = typer.Option(
        "python", help="python: an in-process callable; http: a local business service"
    ),
    broker_kind: str = typer.Option(
        "tansu",
        "--broker",
        help="tansu: the embedded broker (pip only, starts in a second); kafka: Apache Kafka "
        "from Maven Central (needs Java 17+ and Maven; first run downloads ~45 MB)",
    ),
    sidecar: bool = typer.Option(True, help="run the sidecar and print its URLs"),
    hold: bool = typer.Option(
        False, "--hold", help="after the summary, keep broker and sidecar up until Ctrl-C"
    ),
    seed: int = typer.Option(7, help="seed of the demo traffic"),
    timeout_s: float = typer.Option(300, help="give up after this many seconds"),
) -> None:
    """Run retryd locally on an embedded broker with demo traffic, then print a summary."""
    from retryd.kafka.apache import ApacheKafkaBroker
    from retryd.kafka.embedded import EmbeddedBroker

    if handler not in ("python", "http"):
        typer.echo("retryd: --handler must be python or http", err=True)
        raise typer.Exit(2)
    if broker_kind not in ("tansu", "kafka"):
        typer.echo("retryd: --broker must be tansu or kafka", err=True)
        raise typer.Exit(2)
    # SIGTERM (a terminal closing, `timeout`, a supervisor) stops like Ctrl-C: the workers,
    # the sidecar and the broker are stopped, never left running after this process is gone.
    signal.signal(signal.SIGTERM, _interrupted)
    state = Path(tempfile.mkdtemp(prefix="retryd-dev-"))
    broker: EmbeddedBroker | ApacheKafkaBroker | None = None
    if not bootstrap_servers:
        if broker_kind == "kafka":
            broker = ApacheKafkaBroker(log_file=state / "broker.log")
        else:
            broker = EmbeddedBroker(log_file=state / "broker.log")
    services = Services(state)
    try:
        if broker is not None:
            name = "Apache Kafka" if broker_kind == "kafka" else "embedded broker"
            with console.status(f"starting the {name} (first run provisions it)"):
                broker.start()
            console.print(f"{name} pid={broker.pid} at [bold]{broker.bootstrap}[/]")
        bootstrap = bootstrap_servers or (broker.bootstrap if broker else "")
        suffix = "" if broker else f"-{int(time.time())}"
        spec = "python:retryd.dev.demo_handler:handle"
        if handler == "http":
            url = services.start_business()
            console.print(f"business service (HTTP handler contract) at [bold]{url}[/]")
            spec = url + "/handle"
        settings = settings_or_exit(
            None,
            bootstrap_servers=bootstrap,
            main_topics=f"demo.orders{suffix}",
            retry_sequence=sequence,
            tier_template="demo.retry_{delay}" + suffix,
            failed_topic=f"demo.failed{suffix}",
            ledger_topic=f"demo.replay_ledger{suffix}",
            group_id=f"retryd-demo{suffix}",
            handler=spec,
            handler_timeout_s=5,
            session_timeout_ms=6000,
            state_dir=state,
            metrics_interval_s=1,
        )
        code = _run(
            settings,
            services if sidecar else None,
            messages,
            fail_rate,
            poison_rate,
            processes,
            partitions,
            seed,
            timeout_s,
        )
        if hold and code == 0:
            console.print("holding the broker and the sidecar up: Ctrl-C to stop")
            with contextlib.suppress(KeyboardInterrupt):
                while services.alive():
                    time.sleep(0.5)
    except RetrydError as exc:
        console.print(f"[red]retryd dev failed:[/] {exc}")
        code = 1
    finally:
        services.stop()
        if broker is not None:
            broker.stop()
        shutil.rmtree(state, ignore_errors=True)
    raise typer.Exit(code)


def _run(
    settings: Settings,
    services: Services | None,
    messages: int,
    fail_rate: float,
    poison_rate: float,
    processes: int,
    partitions: int,
    seed: int,
    timeout_s: float,
) -> int:
    from confluent_kafka.admin import NewTopic

    from retryd.kafka.clients import (
        admin_config,
        common_config,
        new_admin,
        new_producer,
        producer_config,
    )
    from retryd.kafka.topics import create_topics

    plan = settings.plan
    admin = new_admin(admin_config(common_config(settings), "dev"))
    main = settings.main_topics[0]
    admin.create_topics([NewTopic(main, partitions, 1)])[main].result(30)
    with console.status("creating tier and failed topics"):
        create_topics(settings, admin)
    console.print(f"topics: {main} → {', '.join(plan.tier_topics)} → {plan.failed_topic}")

    orders = demo_orders(messages, fail_rate, poison_rate, plan.max_retries + 1, seed)
    expected = expected_outcome(orders, plan)
    producer = new_producer(producer_config(common_config(settings), "dev", **{"linger.ms": 20}))
    for order in orders:
        key, value = encode(order)
        producer.produce(main, key=key, value=value)
        producer.poll(0)
    producer.flush(30)
    console.print(f"produced {messages} demo orders (sequence {settings.retry_sequence})")

    env = {
        **os.environ,
        "RETRYD_BOOTSTRAP_SERVERS": settings.bootstrap_servers,
        "RETRYD_MAIN_TOPICS": main,
        "RETRYD_RETRY_SEQUENCE": settings.retry_sequence,
        "RETRYD_TIER_TEMPLATE": settings.tier_template,
        "RETRYD_FAILED_TOPIC": settings.failed_topic,
        "RETRYD_GROUP_ID": settings.group_id,
        "RETRYD_HANDLER": settings.handler,
        "RETRYD_HANDLER_TIMEOUT_S": str(settings.handler_timeout_s),
        "RETRYD_SESSION_TIMEOUT_MS": str(settings.session_timeout_ms),
        "RETRYD_STATE_DIR": str(settings.state_dir),
        "RETRYD_LEDGER_TOPIC": settings.ledger_topic,
        "RETRYD_METRICS_INTERVAL_S": str(settings.metrics_interval_s),
        "RETRYD_LOG_LEVEL": "WARNING",
    }
    prepare_metrics_env(settings.state_dir, fresh=True)
    if services is not None:
        url = services.start_sidecar(env)
        # soft_wrap: URLs and the token stay on one line each, whatever the terminal's width
        console.print(f"sidecar metrics  [bold]{url}/metrics[/]", soft_wrap=True)
        console.print(f"sidecar ready    [bold]{url}/readyz[/]", soft_wrap=True)
        console.print(
            f"sidecar API      [bold]{url}/v1/failed[/]  (schema: {url}/docs)", soft_wrap=True
        )
        console.print(f"API token        {services.token}  (this run only)", soft_wrap=True)
    log_path = settings.state_dir / "workers.log"
    with open(log_path, "wb") as log_file:
        workers = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "retryd",
                "worker",
                "--processes",
                str(processes),
                "--until-drained",
            ],
            env=env,
            stdout=log_file,
            stderr=subprocess.STDOUT,
        )
    from retryd.dev.progress import snapshot

    started = time.monotonic()
    topics = [main, *plan.tier_topics]
    try:
        with Live(console=console, refresh_per_second=4) as live:
            while workers.poll() is None:
                live.update(_progress(snapshot(metrics_dir(settings.state_dir)), topics, started))
                if time.monotonic() - started > timeout_s:
                    console.print(f"[red]not drained after {timeout_s:g}s: stopping workers[/]")
                    workers.terminate()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    workers.wait(0.25)
            live.update(_progress(snapshot(metrics_dir(settings.state_dir)), topics, started))
    except KeyboardInterrupt:
        workers.terminate()
        workers.wait(30)
        console.print("[yellow]interrupted[/]")
        return 130
    finally:
        if workers.poll() is None:
            workers.kill()
            workers.wait(10)
    if workers.returncode != 0:
        console.print(f"[red]workers exited with {workers.returncode}; log:[/]")
        console.print(log_path.read_text(errors="replace")[-3000:])
        return 1
    return _summary(snapshot(metrics_dir(settings.state_dir)), expected, topics, main, started)


def _interrupted(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _progress(snap: Snapshot, topics: list[str], started: float) -> Table:
    table = Table(title=f"retryd dev: {time.monotonic() - started:5.1f}s")
    for col in ("topic", "success", "retried", "dead", "paused partitions"):
        table.add_column(col, justify="right" if col != "topic" else "left")
    for topic in topics:
        table.add_row(
            topic,
            str(snap.outcomes[(topic, "success")]),
            str(snap.outcomes[(topic, "retried")]),
            str(snap.outcomes[(topic, "dead")]),
            str(snap.paused[topic]),
        )
    return table


def _summary(
    snap: Snapshot, expected: Expected, topics: list[str], main: str, started: float
) -> int:
    table = Table(title="summary", show_lines=False)
    table.add_column("what")
    table.add_column("expected", justify="right")
    table.add_column("measured", justify="right")
    rows = [("handled", expected.handled, snap.total("success"))]
    for tier in topics[1:]:
        rows.append((f"retried via {tier}", expected.entered[tier], snap.processed(tier)))
    for reason in ("exhausted", "non_retryable", "malformed"):
        rows.append((f"dead-lettered: {reason}", expected.dead[reason], snap.dead[reason]))
    ok = True
    for what, exp, got in rows:
        # at-least-once: a crash may redo work, so more is a warning, less is a failure
        mark = (
            "" if got == exp else (" [yellow](duplicates)[/]" if got > exp else " [red]MISSING[/]")
        )
        ok = ok and got >= exp
        table.add_row(what, str(exp), f"{got}{mark}")
    console.print()
    console.print(Group(table))
    console.print(f"drained in {time.monotonic() - started:.1f}s")
    return 0 if ok else 1
