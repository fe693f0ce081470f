"""``retryd spark ...`` from the command line: clear runtime errors, and the jobs end to end."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import create_topics, produce, unique

ROOT = Path(__file__).resolve().parents[2]
BLOCK_PYSPARK = (
    "import sys; sys.modules['pyspark'] = None; sys.argv = ['retryd', *sys.argv[1:]]; "
    "from retryd.cli import main; main()"
)


def run_cli(args: list[str], env: dict[str, str], *, block_pyspark: bool = False):  # type: ignore[no-untyped-def]
    cmd = [sys.executable, "-c", BLOCK_PYSPARK, *args] if block_pyspark else [
        sys.executable, "-c", "from retryd.cli import main; main()", *args,
    ]  # fmt: skip
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120, cwd=ROOT)


def base_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(("RETRYD_", "JAVA_HOME"))}


def test_without_pyspark_the_cli_works_and_jobs_say_what_is_missing(tmp_path: Path) -> None:
    env = base_env()
    assert run_cli(["--help"], env, block_pyspark=True).returncode == 0
    helped = run_cli(["spark", "--help"], env, block_pyspark=True)
    assert helped.returncode == 0 and "report" in helped.stdout and "replay" in helped.stdout
    done = run_cli(["spark", "report", "--out", str(tmp_path)], env, block_pyspark=True)
    assert done.returncode == 3, done.stderr
    assert "PySpark is not installed: install it with: pip install 'retryd[spark]'" in done.stderr
    assert "Traceback" not in done.stderr


def test_bad_time_filters_exit_2_before_spark_starts(tmp_path: Path) -> None:
    env = base_env()
    for args, message in (
        (["--since", "yesterday"], "invalid time 'yesterday': expected ISO-8601"),
        (["--since", "1h", "--until", "2h"], "is not before --until"),
        (["--since", "1h", "--since-ms", "5"], "not both"),
    ):
        done = run_cli(["spark", "report", "--out", str(tmp_path), *args], env, block_pyspark=True)
        assert done.returncode == 2 and message in done.stderr, done.stderr
        assert "Traceback" not in done.stderr
    done = run_cli(["spark", "replay", "--until", "2024-02-30"], env, block_pyspark=True)
    assert done.returncode == 2 and "invalid time '2024-02-30'" in done.stderr


def test_without_java_the_jobs_say_so(tmp_path: Path) -> None:
    pytest.importorskip("pyspark")
    empty = tmp_path / "bin"
    empty.mkdir()
    env = {**base_env(), "PATH": str(empty)}
    done = run_cli(["spark", "archive", "--out", str(tmp_path / "a")], env)
    assert done.returncode == 3, done.stderr
    assert "Java 17 or newer is required" in done.stderr and "no 'java' on PATH" in done.stderr
    env["JAVA_HOME"] = str(tmp_path / "nojdk")
    done = run_cli(["spark", "replay", "--dry-run"], env)
    assert done.returncode == 3 and f"JAVA_HOME={tmp_path / 'nojdk'} has no bin/java" in done.stderr


@pytest.fixture(scope="session")
def running_spark() -> Iterator[object]:
    """The shared test session: the commands reuse it instead of starting their own."""
    support = pytest.importorskip("tests.integration.spark_support")
    try:
        yield support.shared_spark()
    finally:
        support.stop_shared()


@pytest.mark.spark
def test_report_and_replay_commands(running_spark, bootstrap: str, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from retryd.cli import app
    from tests.integration.spark_support import dead_letter

    prefix = unique("cli")
    failed, orders = f"{prefix}.failed", f"{prefix}.orders"
    create_topics(bootstrap, [failed, orders])
    produce(bootstrap, failed, [(b"k%d" % i, b"v", dead_letter(orders, i)) for i in range(5)])
    env = {
        "RETRYD_BOOTSTRAP_SERVERS": bootstrap,
        "RETRYD_FAILED_TOPIC": failed,
        "RETRYD_TIER_TEMPLATE": prefix + ".retry_{delay}",
        "RETRYD_LEDGER_TOPIC": f"{prefix}.ledger",
        "RETRYD_MAIN_TOPICS": orders,
    }
    runner = CliRunner()
    out = tmp_path / "report"
    args = ["spark", "report", "--out", str(out), "--top", "5", "--since", "1h", "--until", "now"]
    done = runner.invoke(app, args, env=env)
    assert done.exit_code == 0, done.output
    assert "5 dead letters" in done.output
    narrowed = r"offsets-for-times: reading"
    fallback = r"offsets-for-times not supported by this broker .*filtering after the read"
    assert re.search(rf"time filter \[\S+Z, \S+Z\): ({narrowed}|{fallback})", done.output)
    assert (out / "dead_letters.csv").read_text().count("\n") == 2  # header + one group
    assert (out / "report.png").exists() and (out / "funnel" / "_SUCCESS").exists()
    dry = runner.invoke(
        app,
        ["spark", "replay", "--where", "original_offset < 3", "--since", "1d", "--dry-run"],
        env=env,
    )
    assert dry.exit_code == 0, dry.output
    assert re.search(rf"time filter \[\S+Z, now\): ({narrowed}|{fallback})", dry.output)
    assert "dry run" in dry.output and "to replay" in dry.output
    assert re.search(r"matched\s*│\s*3\s*│", dry.output)
    assert re.search(r"to replay\s*│\s*3\s*│", dry.output)
    assert re.search(rf"to {re.escape(orders)}\s*│\s*3\s*│", dry.output)
    bad = runner.invoke(app, ["spark", "replay", "--where", "nope ==="], env=env)
    assert bad.exit_code == 1 and "is not a valid filter" in bad.output
    native = runner.invoke(
        app, ["spark", "report", "--out", str(out), "--source", "native"], env=env
    )
    assert native.exit_code == 1 and "spark-sql-kafka-0-10_2.13" in native.output
