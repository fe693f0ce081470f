"""``retryd spark archive``: incremental, and exactly once across re-runs and crashes, with
the archive given as a plain path and as a ``file://`` URI (both go through Hadoop's
FileSystem; ``hdfs://`` and ``s3a://`` take the same code path on a cluster)."""

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
    next_ranges,
    run_archive,
    staging_dir,
    write_batch,
)
from retryd.pipeline.archive_state import ArchiveState
from retryd.pipeline.hadoopfs import HadoopFS
from retryd.pipeline.progress import JobProgress
from tests.integration.spark_support import assert_exactly_once, dead_letter, spark  # noqa: F401
from tests.support import create_topics, unique, wait_for

pytestmark = pytest.mark.spark

DAY1 = 1_700_000_000_000  # 2023-11-14
DAY2 = DAY1 + 86_400_000  # 2023-11-15
PATH_STYLES = pytest.mark.parametrize("style", ["path", "file-uri"])


def location(tmp_path: Path, style: str) -> tuple[str, Path]:
    """The archive location as given to retryd, and the local directory it names."""
    local = tmp_path / "archive"
    return (str(local) if style == "path" else local.as_uri()), local


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


@PATH_STYLES
def test_incremental_and_crash_safe(spark, bootstrap: str, tmp_path: Path, style: str) -> None:  # noqa: F811
    topic = unique("arch")
    create_topics(bootstrap, [topic], partitions=2)
    where, out = location(tmp_path, style)
    spec = ArchiveSpec({"bootstrap.servers": bootstrap}, topic, where, max_records_per_partition=10)
    store = HadoopFS(spark, where)
    assert store.uri == f"file:{out}"
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
    state = ArchiveState(store, topic)
    _, offsets = state.latest()
    ranges = [r for r in next_ranges(spec, offsets) if r.span]
    state.write_pending(2, ranges)
    assert write_batch(spark, store, spec, 2, ranges) == 18
    produce_dead(bootstrap, topic, 48, 5, DAY2)  # arrives after the crash
    resumed = archive(spark, spec)
    assert (resumed.batch, resumed.records, resumed.resumed) == (2, 18, True)
    assert not (out / staging_dir(2)).exists()
    assert_exactly_once(spark, out, 48)

    # crash 2: batch 3 died while moving files into the archive (one file already moved)
    produce_dead(bootstrap, topic, 53, 7, DAY2)
    _, offsets = state.latest()
    ranges = [r for r in next_ranges(spec, offsets) if r.span]
    state.write_pending(3, ranges)
    write_batch(spark, store, spec, 3, ranges)
    staged = sorted((out / staging_dir(3)).glob("date=*/*.parquet"))
    assert staged
    os.replace(staged[0], out / staged[0].parent.name / f"batch-3-{staged[0].name}")
    finished = archive(spark, spec)  # the 5 that came after crash 1 and these 7
    assert (finished.batch, finished.records, finished.resumed) == (3, 12, True)
    assert_exactly_once(spark, out, 60)
    assert state.latest() == (3, {0: 30, 1: 30})
    manifest = state.manifest(3)
    assert manifest is not None and manifest["records"] == 12
    assert sorted(manifest["files"]) == sorted(finished.files)
    assert all((out / rel).is_file() for rel in manifest["files"])


@PATH_STYLES
def test_killed_cli_run_then_rerun(spark, bootstrap: str, tmp_path: Path, style: str) -> None:  # noqa: F811
    """SIGKILL a real ``retryd spark archive`` process mid-run, then run again."""
    topic = unique("arch-kill")
    create_topics(bootstrap, [topic], partitions=2)
    where, out = location(tmp_path, style)
    total = 3000
    produce_dead(bootstrap, topic, 0, total, DAY1)
    cmd = [
        str(Path(sys.executable).parent / "retryd"), "spark", "archive",
        "--out", where, "--topic", topic, "--bootstrap-servers", bootstrap,
        "--master", "local[1]", "--max-records-per-partition", "100",
        "--spark-conf", "spark.ui.enabled=false",
    ]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith("RETRYD_")}
    log = (tmp_path / "cli.log").open("wb")
    proc = subprocess.Popen(
        cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
    )
    try:
        pending = out / "_retryd_archive" / "pending" / "1.json"
        wait_for(lambda: pending.exists() or proc.poll() is not None, 180, 0.05, "batch planned")
        wait_for(
            lambda: any((out / staging_dir(1)).rglob("*")) or proc.poll() is not None,
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
    spec = ArchiveSpec({"bootstrap.servers": bootstrap}, topic, where)
    result = archive(spark, spec)
    assert result.resumed and result.batch == 1 and result.records == total
    assert_exactly_once(spark, out, total)
    assert archive(spark, spec).batch is None


def test_state_written_by_the_posix_version_is_carried_on(spark, tmp_path: Path) -> None:  # noqa: F811
    """``checkpoint.json``/``pending.json`` (replaced in place by earlier versions) still work,
    and the first commit of the write-once log supersedes them."""
    import json

    from retryd.pipeline.archive_state import ArchiveError

    out = tmp_path / "old-archive"
    (out / "_retryd_archive").mkdir(parents=True)
    old = {"topic": "failed", "batch": 4, "offsets": {"0": 120, "1": 95}}
    (out / "_retryd_archive" / "checkpoint.json").write_text(json.dumps(old))
    plan = {"topic": "failed", "batch": 5, "ranges": [{"partition": 0, "start": 120, "end": 130}]}
    (out / "_retryd_archive" / "pending.json").write_text(json.dumps(plan))
    state = ArchiveState(HadoopFS(spark, out.as_uri()), "failed")
    assert state.latest() == (4, {0: 120, 1: 95})
    assert state.pending_batches() == [5]
    assert [(r.partition, r.start, r.end) for r in state.pending(5) or []] == [(0, 120, 130)]
    state.commit(5, {0: 130, 1: 95}, {"records": 10})
    assert state.latest() == (5, {0: 130, 1: 95}) and state.pending_batches() == []
    assert not (out / "_retryd_archive" / "checkpoint.json").exists()
    with pytest.raises(ArchiveError, match="archives topic 'failed', not 'orders'"):
        ArchiveState(HadoopFS(spark, str(out)), "orders").latest()
    second = ArchiveState(HadoopFS(spark, str(out)), "failed")
    with (
        state.locked(),
        pytest.raises(ArchiveError, match="another archive run is using"),
        second.locked(),
    ):
        pass
