"""``--source native`` end to end on the suite's broker (Apache Kafka unless the suite runs
elsewhere): ``retryd spark archive`` and ``retryd spark report`` read through Spark's own Kafka
connector and give the same archive, column for column, and the same report as the default
``--source python`` on the same topics.

The connector must be on the JVM's classpath when Spark starts, so the native runs are the CLI
in a process of its own (``--spark-conf spark.jars.packages=...``, resolved from Maven Central,
cached by Spark in ``~/.ivy2*`` after the first run); the python runs reuse the suite's session.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from confluent_kafka import Producer

from retryd.config import Settings
from tests.integration.spark_connector import connector
from tests.integration.spark_support import dead_letter, spark, tier_copy  # noqa: F401
from tests.support import create_topics, unique

pytestmark = pytest.mark.spark
ROOT = Path(__file__).resolve().parents[2]
# Record timestamps of now: older ones would be deleted by the broker's 7-day retention while
# the test runs (Apache Kafka checks retention 30 s after start, then every 5 minutes).
TS = int(time.time() * 1000) - 3_600_000


def produce_records(bootstrap: str, topic: str, records: list[tuple], partitions: int = 2) -> None:
    """(key, value, headers) records, round-robin over the partitions, timestamps TS + i."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for i, (key, value, headers) in enumerate(records):
        producer.produce(
            topic, key=key, value=value, headers=headers, timestamp=TS + i, partition=i % partitions
        )
    assert producer.flush(30) == 0


def hostile_dead_letters(orders: str) -> list[tuple]:
    """Dead letters a real failed_topic holds, and headers that the two sources must decode
    alike (last occurrence wins; not UTF-8, not a number, out of range: NULL)."""
    out: list[tuple] = []
    for i in range(24):
        cls, reason = [("TimeoutError", "exhausted"), ("ValueError", "non_retryable")][i % 2]
        user = [("trace", b"t-%d" % i), ("empty", None)] if i % 3 == 0 else None
        out.append(
            (
                b"k%d" % i,
                b"value-%d" % i,
                dead_letter(
                    orders, i, error_class=cls, dead_reason=reason, user_headers=user, ts_ms=TS + i
                ),
            )
        )
    base = dead_letter(orders, 100)
    out += [
        (b"dup", b"v", [*base, ("retryd_error_class", b"SecondWins")]),
        (b"nan", b"v", [*base, ("retry_number", b"abc")]),
        (b"big", b"v", [*base, ("retryd_original_offset", b"99999999999999999999")]),
        (b"neg", b"v", [*base, ("retryd_original_partition", b"-1")]),
        (b"bin", b"v", [*base, ("retryd_error_message", b"\xff\xfe not utf-8")]),
        (b"far", b"v", [*base, ("retryd_original_timestamp", b"9" * 19)]),
        (None, None, None),  # no key, no value, no headers
    ]
    return out


def run_native(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    package = connector().package
    cmd = [
        *(sys.executable, "-m", "retryd", *args),
        *("--source", "native", "--master", "local[2]"),
        *("--spark-conf", f"spark.jars.packages={package}"),
        *("--spark-conf", "spark.ui.enabled=false"),
    ]
    child_env = {**os.environ, **env, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        cmd, env=child_env, capture_output=True, text=True, timeout=420, cwd=ROOT, check=False
    )


def archive_rows(spark, out: Path) -> list[dict]:  # type: ignore[no-untyped-def]  # noqa: F811
    rows = spark.read.parquet(str(out)).orderBy("partition", "offset").collect()
    return [r.asDict(recursive=True) for r in rows]


@pytest.mark.slow
def test_native_source_archive_and_report_match_the_python_source(
    spark,  # noqa: F811 - the python runs reuse it
    bootstrap: str,
    tmp_path: Path,
) -> None:
    from typer.testing import CliRunner

    from retryd.cli import app

    prefix = unique("native")
    orders = f"{prefix}.orders"
    env = {
        "RETRYD_BOOTSTRAP_SERVERS": bootstrap,
        "RETRYD_MAIN_TOPICS": orders,
        "RETRYD_FAILED_TOPIC": f"{prefix}.failed",
        "RETRYD_TIER_TEMPLATE": prefix + ".retry_{delay}",
        "RETRYD_LEDGER_TOPIC": f"{prefix}.ledger",
    }
    settings = Settings(
        bootstrap_servers=bootstrap,
        main_topics=[orders],
        failed_topic=env["RETRYD_FAILED_TOPIC"],
        tier_template=env["RETRYD_TIER_TEMPLATE"],
        ledger_topic=env["RETRYD_LEDGER_TOPIC"],
    )
    tiers = list(dict.fromkeys(settings.plan.tier_topics))
    create_topics(bootstrap, [settings.failed_topic, *tiers], 2)
    dead = hostile_dead_letters(orders)
    produce_records(bootstrap, settings.failed_topic, dead)
    # tier copies: every dead letter's message went through the first tier, half the second
    produce_records(bootstrap, tiers[0], [(b"k", b"v", tier_copy(orders, i, 1)) for i in range(24)])
    produce_records(bootstrap, tiers[1], [(b"k", b"v", tier_copy(orders, i, 2)) for i in range(12)])

    native_archive, python_archive = tmp_path / "native-archive", tmp_path / "python-archive"
    done = run_native(["spark", "archive", "--out", str(native_archive)], env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    assert json.loads(done.stdout[done.stdout.index("{") :])["records"] == len(dead)
    native_report, python_report = tmp_path / "native-report", tmp_path / "python-report"
    done = run_native(["spark", "report", "--out", str(native_report)], env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    assert f"{len(dead)} dead letters" in done.stdout

    runner = CliRunner()
    for args in (
        ["spark", "archive", "--out", str(python_archive)],
        ["spark", "report", "--out", str(python_report)],
    ):
        ran = runner.invoke(app, args, env=env)
        assert ran.exit_code == 0, ran.output

    native_rows = archive_rows(spark, native_archive)
    python_rows = archive_rows(spark, python_archive)
    assert len(native_rows) == len(dead)
    assert native_rows == python_rows
    by_key = {r["key"]: r for r in native_rows}
    assert by_key[b"dup"]["error_class"] == "SecondWins"
    assert by_key[b"nan"]["retry_number"] is None
    assert by_key[b"big"]["original_offset"] is None
    assert by_key[b"bin"]["error_message"] is None
    assert by_key[None]["value"] is None and by_key[None]["headers"] == []
    for name in ("dead_letters.csv", "funnel.csv"):
        assert (native_report / name).read_text() == (python_report / name).read_text(), name
