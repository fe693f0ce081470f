"""Shared Spark test support: one SparkSession per test process, and seeding retryd topics.

Import the ``spark`` fixture into a test module (``from tests.integration.spark_support import
spark``); every module gets the same session, stopped (JVM by PID) when the test run ends.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from retryd.policy.headers import Envelope, routed_headers

pytest.importorskip("pyspark", reason="PySpark is not installed (pip install 'retryd[spark]')")

from pyspark.sql import SparkSession

from retryd.pipeline.session import build_session, stop_session

SPARK_CONF = {
    "spark.ui.enabled": "false",
    "spark.sql.shuffle.partitions": "2",
    "spark.default.parallelism": "2",
    "spark.driver.memory": "1g",
    "spark.python.worker.reuse": "true",
}
_session: list[SparkSession] = []


def shared_spark() -> SparkSession:
    if not _session:
        _session.append(build_session("local[2]", "retryd-tests", SPARK_CONF))
    return _session[0]


def stop_shared() -> None:
    """Stop the shared session and its JVM (idempotent: every module's fixture calls it)."""
    if _session:
        stop_session(_session.pop())


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    session = shared_spark()
    try:
        yield session
    finally:
        stop_shared()


def dead_letter(
    original_topic: str,
    offset: int,
    *,
    error_class: str = "ValueError",
    error_message: str = "boom",
    dead_reason: str = "exhausted",
    retry_number: int = 6,
    partition: int = 0,
    user_headers: list[tuple[str, bytes | None]] | None = None,
    ts_ms: int = 1_700_000_000_000,
) -> list[tuple[str, bytes | None]]:
    """Headers of a failed_topic record, encoded with the product's header codec."""
    env = Envelope(
        original_topic=original_topic,
        original_partition=partition,
        original_offset=offset,
        original_timestamp=ts_ms,
        retry_number=retry_number,
        retry_timestamp=None,
        first_failure_timestamp=ts_ms + 1,
        error_class=error_class,
        error_message=error_message,
        dead_reason=dead_reason,
    )
    return routed_headers(user_headers or [], env)


def tier_copy(
    original_topic: str, offset: int, retry_number: int, *, partition: int = 0, due_ms: int = 0
) -> list[tuple[str, bytes | None]]:
    """Headers of a tier-topic record (scheduled retry ``retry_number``)."""
    env = Envelope(
        original_topic=original_topic,
        original_partition=partition,
        original_offset=offset,
        original_timestamp=1_700_000_000_000,
        retry_number=retry_number,
        retry_timestamp=due_ms or 1_700_000_000_000 + retry_number,
        first_failure_timestamp=1_700_000_000_001,
        error_class="TimeoutError",
        error_message="slow",
    )
    return routed_headers([], env)


def rows_by_offset(df: Any) -> dict[tuple[int, int], Any]:
    return {(r["partition"], r["offset"]): r for r in df.collect()}


def archived_rows(spark: SparkSession, out: Path) -> list[tuple[int, int, bytes]]:
    """(partition, offset, value) of every record in a Parquet archive, as Spark reads it."""
    rows = spark.read.parquet(str(out)).select("partition", "offset", "value").collect()
    return sorted((r["partition"], r["offset"], bytes(r["value"])) for r in rows)


def assert_exactly_once(spark: SparkSession, out: Path, produced: int) -> None:
    """Every record value-0 .. value-<produced - 1> is in the archive, none twice."""
    rows = archived_rows(spark, out)
    keys = [(p, o) for p, o, _ in rows]
    assert len(keys) == len(set(keys)), "a record was archived twice"
    assert sorted(v for _, _, v in rows) == sorted(b"value-%d" % i for i in range(produced))
