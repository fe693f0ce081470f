"""The typer application object and helpers shared by every sub-command."""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any

import typer

from retryd.config import Settings, load_settings
from retryd.errors import ConfigError

app = typer.Typer(
    name="retryd",
    help="Retry-topic orchestration for Apache Kafka.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)

ConfigOption = typer.Option(None, "--config", "-c", help="TOML settings file", exists=False)


def settings_or_exit(config: Path | None, **overrides: Any) -> Settings:
    """Load settings; on a bad setting print one line per problem and exit with status 2."""
    try:
        return load_settings(config, **overrides)
    except ConfigError as exc:
        typer.echo("retryd: invalid configuration:", err=True)
        for line in exc.problems:
            typer.echo(f"  - {line}", err=True)
        raise typer.Exit(2) from None


def setup_logging(level: str = "INFO") -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(process)d %(name)s: %(message)s",
        stream=sys.stderr,
    )


@app.callback()
def _root(
    log_level: str = typer.Option(
        "INFO", "--log-level", envvar="RETRYD_LOG_LEVEL", help="DEBUG|INFO|WARNING"
    ),
) -> None:
    """retryd: retry-topic orchestration for Apache Kafka."""
    setup_logging(log_level)
