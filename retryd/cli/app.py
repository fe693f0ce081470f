"""The typer application object and helpers shared by every sub-command."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import typer

from retryd.config import Settings, load_settings
from retryd.errors import ConfigError
from retryd.hosting import early
from retryd.runtime import logs

app = typer.Typer(
    name="retryd",
    help="Retry-topic orchestration for Apache Kafka.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)

ConfigOption = typer.Option(None, "--config", "-c", help="TOML settings file", exists=False)
# Every command that talks to Kafka takes -b/--bootstrap-servers (a test checks it).
BootstrapOption = typer.Option(
    None, "--bootstrap-servers", "-b", help="Kafka bootstrap servers, host:port[,host:port]"
)

# --log-level / --log-format given on the command line: they win over the settings.
_LOG_FLAGS: dict[str, str] = {}

# The commands that take over the stop signals held since the process's first line
# (``retryd.hosting.early``): a signal that came while they started stops them cleanly (exit 0).
# Every other command gets Python's dispositions back before it runs.
STOPS_CLEANLY = frozenset({"worker", "sidecar"})


def settings_or_exit(config: Path | None, **overrides: Any) -> Settings:
    """Load settings; on a bad setting print one line per problem and exit with status 2.

    Logging is configured again from the loaded settings (a ``log_format`` in the TOML file
    applies from here on), the command-line flags still winning."""
    try:
        settings = load_settings(config, **{**overrides, **_LOG_FLAGS})
    except ConfigError as exc:
        typer.echo("retryd: invalid configuration:", err=True)
        for line in exc.problems:
            typer.echo(f"  - {line}", err=True)
        raise typer.Exit(2) from None
    logs.configure(settings.log_level.value, settings.log_format.value)
    return settings


def _version_flag(value: bool) -> None:
    """``retryd --version``, the conventional flag: the text of ``retryd version``, printed by
    the same function, so that the two cannot differ. Eager: it answers before a sub-command
    is required and before any setting is read."""
    if value:
        from retryd.cli.version import version  # imported late: that module imports this one

        version()
        raise typer.Exit()


@app.callback()
def _root(
    ctx: typer.Context,
    log_level: str | None = typer.Option(
        None, "--log-level", help="DEBUG|INFO|WARNING|ERROR (default: settings, RETRYD_LOG_LEVEL)"
    ),
    log_format: str | None = typer.Option(
        None, "--log-format", help="text|json (default: settings, RETRYD_LOG_FORMAT)"
    ),
    _version: bool = typer.Option(
        False,
        "--version",
        callback=_version_flag,
        is_eager=True,
        help="Print the retryd version and exit (as `retryd version`).",
    ),
) -> None:
    """retryd: retry-topic orchestration for Apache Kafka."""
    if ctx.invoked_subcommand not in STOPS_CLEANLY:
        early.release()
    _LOG_FLAGS.clear()
    if log_level is not None:
        _LOG_FLAGS["log_level"] = log_level
    if log_format is not None:
        _LOG_FLAGS["log_format"] = log_format
    # Until the settings are read (they may fail to load): flags, then the environment.
    logs.configure(
        log_level or os.environ.get("RETRYD_LOG_LEVEL", "INFO"),
        (log_format or os.environ.get("RETRYD_LOG_FORMAT", "text")).lower(),
    )
