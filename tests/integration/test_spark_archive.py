"""``retryd spark archive``: incremental, and exactly once across re-runs and crashes."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from confluent_kafka import Producer
from rich.console import Console

from retryd.pipeline.archive import (
    ArchiveSpec,
    ArchiveState,
    next_ranges,
    run_archive,
    staging_dir,
    write_batch,
)
from retryd.pipeline.progress import JobProgress
from tests.integration.spark_support import dead_letter, spark  # noqa: F401
from tests.support import create_topics, unique, wait_for

pytestmark = pytest.mark.spark

DAY1 = 1_700_000_000_000  # 2023-11-14
DAY2 = DAY1 + 86_400_000  # 2023-11-15


def produce_dead(bootstrap: str, topic: str, start: int, count: int, ts: int) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for i in range(start, start + count):
        producer.produce(
            topic,
            key=b"k%d" % i,
            value=b"value-%d" % i,
            headers=dead_letter("orders", i),
            timestamp=ts + i,
            partition=i % 2,
        )
    assert producer.flush(30) == 0


def archive(spark, spec: ArchiveSpec):  # type: ignore[no-untyped-def]  # noqa: F811
    with JobProgress(spark, Console(file=io.StringIO())) as progress:
        return run_archive(spark, spec, progress)


def archived(spark, out: Path) -> list[tuple[int, int, bytes]]:  # noqa: F811
    rows = spark.read.parquet(str(out)).select("partition", "offset", "value").collect()
    return sorted((r["partition"], r["offset"], bytes(r["value"])) for r in rows)


def assert_exactly_once(spark, out: Path, produced: int) -> None:  # noqa: F811
    rows = archived(spark, out)
    keys = [(p, o) for p, o, _ in rows]
    assert len(keys) == len(set(keys)), "a record was archived twice"
    assert sorted(v for _, _, v in rows) == sorted(b"value-%d" % i for i in range(produced))


def test_incremental_and_crash_safe(spark, bootstrap: str, tmp_path: Path) -> None:  # noqa: F811
    topic = unique("arch")
    create_topics(bootstrap, [topic], partitions=2)
    out = tmp_path / "archive"
    spec = ArchiveSpec({"bootstrap.servers": bootstrap}, topic, out, max_records_per_partition=10)
    produce_dead(bootstrap, topic, 0, 20, DAY1)
    produce_dead(bootstrap, topic, 20, 10, DAY2)

    first = archive(spark, spec)
    assert (first.batch, first.records, first.resumed) == (1, 30, False)
    assert_exactly_once(spark, out, 30)
    dates = sorted(p.name for p in out.glob("date=*"))
    assert dates == ["date=2023-11-14", "date=2023-11-15"]
    df = spark.read.parquet(str(out))
    assert df.where("date = '2023-11-15'").count() == 10
    assert df.where("original_topic = 'orders' AND dead_reason = 'exhausted'").count() == 30

    again = archive(spark, spec)  # nothing new: adds nothing
    assert again.batch is None and again.records == 0
    assert_exactly_once(spark, out, 30)

    # crash 1: batch 2 planned and written to staging, then the process died
    produce_dead(bootstrap, topic, 30, 18, DAY2)
    state = ArchiveState(out, topic)
    _, offsets = state.checkpoint()
    ranges = [r for r in next_ranges(spec, offsets) if r.span]
    state.write_pending(2, ranges)
    assert write_batch(spark, spec, 2, ranges) == 18
    produce_dead(bootstrap, topic, 48, 5, DAY2)  # arrives after the crash
    resumed = archive(spark, spec)
    assert (resumed.batch, resumed.records, resumed.resumed) == (2, 18, True)
    assert not staging_dir(out, 2).exists()
    assert_exactly_once(spark, out, 48)

    # crash 2: batch 3 died while moving files into the archive (one file already moved)
    produce_dead(bootstrap, topic, 53, 7, DAY2)
    _, offsets = state.checkpoint()
    ranges = [r for r in next_ranges(spec, offsets) if r.span]
    state.write_pending(3, ranges)
    write_batch(spark, spec, 3, ranges)
    staged = sorted(staging_dir(out, 3).glob("date=*/*.parquet"))
    assert staged
    os.replace(staged[0], out / staged[0].parent.name / f"batch-3-{staged[0].name}")
    finished = archive(spark, spec)  # the 5 that came after crash 1 and these 7
    assert (finished.batch, finished.records, finished.resumed) == (3, 12, True)
    assert_exactly_once(spark, out, 60)
    assert state.checkpoint() == (3, {0: 30, 1: 30})


def test_killed_cli_run_then_rerun(spark, bootstrap: str, tmp_path: Path) -> None:  # noqa: F811
    """SIGKILL a real ``retryd spark archive`` process mid-run, then run again."""
    topic = unique("arch-kill")
    create_topics(bootstrap, [topic], partitions=2)
    out = tmp_path / "archive"
    total = 3000
    produce_dead(bootstrap, topic, 0, total, DAY1)
    cmd = [
        str(Path(sys.executable).parent / "retryd"), "spark", "archive",
        "--out", str(out), "--topic", topic, "--bootstrap-servers", bootstrap,
        "--master", "local[1]", "--max-records-per-partition", "100",
        "--spark-conf", "spark.ui.enabled=false",
    ]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith("RETRYD_")}
    log = (tmp_path / "cli.log").open("wb")
    proc = subprocess.Popen(
        cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
    )
    try:
        pending = out / "_retryd_archive" / "pending.json"
        wait_for(lambda: pending.exists() or proc.poll() is not None, 180, 0.05, "batch planned")
        wait_for(
            lambda: any(staging_dir(out, 1).rglob("*")) or proc.poll() is not None,
            120,
            0.02,
            "Spark writing",
        )
        killed = proc.poll() is None
        assert killed, (
            "the archive run ended before it could be killed: "
            + (tmp_path / "cli.log").read_text()[-3000:]
        )
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)
        log.close()
    spec = ArchiveSpec({"bootstrap.servers": bootstrap}, topic, out)
    result = archive(spark, spec)
    assert result.resumed and result.batch == 1 and result.records == total
    assert_exactly_once(spark, out, total)
    assert archive(spark, spec).batch is None
