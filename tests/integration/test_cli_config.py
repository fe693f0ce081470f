"""A broken configuration stops the CLI with exit status 2 and one readable line per problem.

Runs the real ``retryd`` entry point in a subprocess; no broker is needed because settings are
validated before anything connects.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from retryd import __version__

RETRYD = [sys.executable, "-c", "from retryd.cli import main; main()"]
HEADER = "retryd: invalid configuration:"


def run(
    *args: str, env: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("RETRYD_")}
    return subprocess.run(
        [*RETRYD, *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**base, **(env or {})},
        cwd=cwd,
        check=False,
    )


def problem_lines(stderr: str) -> list[str]:
    return [line.removeprefix("  - ") for line in stderr.splitlines() if line.startswith("  - ")]


def assert_config_failure(out: subprocess.CompletedProcess[str], expected: list[str]) -> None:
    """Exit 2, the header, exactly the expected problem lines (by prefix), no traceback."""
    assert out.returncode == 2, (out.returncode, out.stdout, out.stderr)
    assert HEADER in out.stderr
    assert "Traceback" not in out.stderr + out.stdout
    lines = problem_lines(out.stderr)
    assert len(lines) == len(expected), lines
    for line, prefix in zip(sorted(lines), sorted(expected), strict=True):
        assert line.startswith(prefix), (line, prefix)


def toml(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "bad.toml"
    path.write_text(text, encoding="utf-8")
    return path


COMMANDS = [["topics", "check"], ["topics", "create"], ["worker"]]


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_bad_sequence(tmp_path: Path, command: list[str]) -> None:
    cfg = toml(tmp_path, 'retry_sequence = "5m,oops,1h"\n')
    out = run(*command, "-c", str(cfg))
    assert_config_failure(out, ["retry_sequence='5m,oops,1h': invalid delay 'oops'"])


def test_bad_handler_spec(tmp_path: Path) -> None:
    cfg = toml(tmp_path, 'handler = "ftp://example.com/hook"\n')
    out = run("topics", "check", "-c", str(cfg))
    assert_config_failure(out, ["handler='ftp://example.com/hook': must be 'python:"])


def test_unknown_toml_key(tmp_path: Path) -> None:
    cfg = toml(tmp_path, 'bootstrap_server = "typo:9092"\n')
    out = run("topics", "check", "-c", str(cfg))
    assert_config_failure(out, ["bootstrap_server='typo:9092': Extra inputs are not permitted"])


def test_missing_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope.toml"
    out = run("topics", "check", "-c", str(missing))
    assert_config_failure(out, [f"config file {missing}: not found"])


def test_toml_syntax_error(tmp_path: Path) -> None:
    cfg = toml(tmp_path, "retry_sequence = \n")
    out = run("topics", "create", "-c", str(cfg))
    assert_config_failure(out, [f"config file {cfg}: "])


def test_every_problem_on_its_own_line(tmp_path: Path) -> None:
    cfg = toml(
        tmp_path,
        'retry_sequence = "5m,0s"\nhandler = "python:nomodule"\nbogus = true\nprocesses = 0\n',
    )
    out = run("topics", "check", "-c", str(cfg))
    assert_config_failure(
        out,
        [
            "retry_sequence='5m,0s': invalid delay '0s': must be greater than zero",
            "handler='python:nomodule': python handler must look like",
            "bogus=True: Extra inputs are not permitted",
            "processes=0: Input should be greater than or equal to 1",
        ],
    )


def test_bad_environment_and_flags(tmp_path: Path) -> None:
    out = run("topics", "check", env={"RETRYD_KAFKA": "{oops", "RETRYD_BATCH_SIZE": "many"})
    assert_config_failure(
        out, ["kafka: must be a JSON object", "batch_size='many': Input should be a valid integer"]
    )
    out = run("topics", "check", "--retry-sequence", "5m,,1h")
    assert_config_failure(out, ["retry_sequence='5m,,1h': invalid retry sequence"])


def test_secrets_stay_out_of_error_output(tmp_path: Path) -> None:
    cfg = toml(tmp_path, 'api_token = 12345\n[kafka]\n"sasl.password" = ["hunter2"]\n')
    out = run("topics", "check", "-c", str(cfg))
    assert out.returncode == 2
    assert "hunter2" not in out.stderr and "12345" not in out.stderr


def test_version_needs_no_configuration(tmp_path: Path) -> None:
    """`retryd version` reads no settings: a broken environment must not break it."""
    out = run("version", env={"RETRYD_RETRY_SEQUENCE": "nonsense", "RETRYD_KAFKA": "{"})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == __version__
