"""Consistent command-line flags: ``-b/--bootstrap-servers`` on every command that talks to
Kafka, ``--since/--until`` where a command filters by time, ``--log-format`` at the root."""

from __future__ import annotations

from typing import Any

import typer.main

from retryd.cli import app

KAFKA_COMMANDS = {
    "worker",
    "sidecar",
    "replay",
    "dev",
    "topics create",
    "topics check",
    "spark report",
    "spark archive",
    "spark replay",
    "demo traffic",
    "share-lag",
}


def commands(group: Any, prefix: str = "") -> dict[str, Any]:
    out = {}
    for name, cmd in group.commands.items():
        full = f"{prefix}{name}"
        if hasattr(cmd, "commands"):
            out.update(commands(cmd, full + " "))
        else:
            out[full] = cmd
    return out


def options(cmd: Any) -> set[str]:
    return {opt for p in cmd.params for opt in getattr(p, "opts", [])}


def test_bootstrap_flag_everywhere_kafka_is_used() -> None:
    every = commands(typer.main.get_command(app))
    assert set(KAFKA_COMMANDS) <= set(every)
    for name, cmd in every.items():
        opts = options(cmd)
        if name in KAFKA_COMMANDS or "--bootstrap-servers" in opts:
            assert {"-b", "--bootstrap-servers"} <= opts, name


def test_time_filters_and_root_flags() -> None:
    every = commands(typer.main.get_command(app))
    assert {"--since", "--until", "--yes"} <= options(every["replay"])
    root = options(typer.main.get_command(app))
    assert {"--log-level", "--log-format"} <= root
