"""``retryd --version``, the conventional flag, answers what ``retryd version`` answers.

Run as a user runs them: ``python -m retryd`` in a child process (the console script is the
same entry point), so the flag is checked through the real argument parsing, including the
root's ``no_args_is_help`` (a flag alone, with no sub-command, must still answer)."""

from __future__ import annotations

import os
import subprocess
import sys

from retryd import __version__


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "retryd", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **(env or {})},
        check=False,
    )


def test_version_flag_prints_what_the_version_command_prints() -> None:
    flag = run("--version")
    command = run("version")
    assert flag.returncode == 0, flag.stderr
    assert command.returncode == 0, command.stderr
    assert flag.stdout == command.stdout == f"{__version__}\n"
    assert "No such option" not in flag.stderr


def test_version_flag_is_listed_in_the_help() -> None:
    out = run("--help")
    assert out.returncode == 0, out.stderr
    assert "--version" in out.stdout


def test_version_flag_reads_no_settings() -> None:
    """Eager: it answers before any setting is read, as ``retryd version`` does."""
    out = run("--version", env={"RETRYD_RETRY_SEQUENCE": "nonsense", "RETRYD_KAFKA": "{"})
    assert out.returncode == 0, out.stderr
    assert out.stdout == f"{__version__}\n"
