"""``retryd spark archive --continuous``: the archive as a streaming query, exactly once
across a SIGKILL in the middle of a micro-batch and a restart from the checkpoint, and when
batch and continuous runs take turns on one archive."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from rich.console import Console

from retryd.pipeline.archive import ArchiveSpec, run_archive
from retryd.pipeline.continuous import BatchReport, ContinuousSpec, run_continuous
from retryd.pipeline.progress import JobProgress
from tests.integration.spark_support import assert_exactly_once, dead_letter, spark  # noqa: F401
from tests.support import create_topics, produce, unique, wait_for

pytestmark = pytest.mark.spark
TRIGGER_S = 2


def produce_dead(bootstrap: str, topic: str, start: int, count: int) -> float:
    """Produce dead letters value-<i>; returns when the last one was acknowledged."""
    records = [
        (b"k%d" % i, b"value-%d" % i, dead_letter("orders", i)) for i in range(start, start + count)
    ]
    produce(bootstrap, topic, records)
    return time.time()


def commits(out: Path) -> list[dict]:
    folder = out / "_retryd_archive" / "commits"
    found = []
    for path in folder.glob("*.json") if folder.exists() else []:
        try:
            found.append(json.loads(path.read_text()))
        except ValueError:
            continue  # never half-written (renamed into place), but be safe while polling
    return sorted(found, key=lambda c: c["batch"])


def archived(out: Path) -> int:
    return sum(c["records"] for c in commits(out))


def start(cmd: list[str], log_path: Path) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RETRYD_")}
    with log_path.open("ab") as log:
        return subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )


def kill(proc: subprocess.Popen[bytes]) -> int:
    """SIGKILL the CLI, its JVM and Python workers (one process group)."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    return proc.wait(90)


def terminate(proc: subprocess.Popen[bytes]) -> int:
    """SIGTERM the CLI process alone, as a supervisor stopping it does; wait for its exit."""
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGTERM)
    try:
        return proc.wait(120)
    finally:
        kill(proc)  # whatever it left behind in its group


def test_killed_mid_batch_and_restarted(spark, bootstrap: str, tmp_path: Path) -> None:  # noqa: F811
    topic = unique("cont")
    create_topics(bootstrap, [topic], partitions=2)
    out, checkpoint, log = tmp_path / "archive", tmp_path / "checkpoint", tmp_path / "cli.log"
    cmd = [
        str(Path(sys.executable).parent / "retryd"), "spark", "archive", "--continuous",
        "--out", out.as_uri(), "--checkpoint", str(checkpoint), "--trigger", f"{TRIGGER_S}s",
        "--topic", topic, "--bootstrap-servers", bootstrap, "--master", "local[2]",
        "--max-records-per-partition", "100", "--spark-conf", "spark.ui.enabled=false",
    ]  # fmt: skip

    def tail() -> str:
        return log.read_text(errors="replace")[-4000:]

    produce_dead(bootstrap, topic, 0, 40)  # before the query starts
    first = start(cmd, log)
    try:
        wait_for(lambda: archived(out) == 40 or first.poll() is not None, 180, 0.1, "40 archived")
        assert first.poll() is None, tail()

        # a new dead letter is picked up by the next trigger
        acked_ms = produce_dead(bootstrap, topic, 40, 1) * 1000
        wait_for(lambda: archived(out) == 41, 60, 0.05, "the new dead letter archived")
        newest = commits(out)[-1]
        picked_up_s = (newest["started_ms"] - acked_ms) / 1000
        latency_s = (newest["committed_ms"] - acked_ms) / 1000
        print(f"continuous archive: picked up after {picked_up_s:.2f}s, in the archive after "
              f"{latency_s:.2f}s (trigger {TRIGGER_S}s)")  # fmt: skip
        # the next trigger took it (slack: planning on a loaded 2-core machine)
        assert picked_up_s < TRIGGER_S + 3, (picked_up_s, newest)

        # SIGKILL while a micro-batch is being written
        produce_dead(bootstrap, topic, 41, 400)
        batch = newest["batch"] + 1
        staging = out / "_staging" / f"batch-{batch}"
        wait_for(lambda: staging.exists() or first.poll() is not None, 60, 0.01, "writing")
        kill(first)
        assert not (out / "_retryd_archive" / "commits" / f"{batch}.json").exists(), (
            "the micro-batch finished before the kill: " + tail()
        )
    finally:
        kill(first)

    produce_dead(bootstrap, topic, 441, 30)  # arrives while nothing runs
    second = start(cmd, log)
    try:
        wait_for(lambda: archived(out) >= 471 or second.poll() is not None, 180, 0.1, "all")
        assert second.poll() is None, tail()
        assert terminate(second) == 0, tail()
    finally:
        kill(second)
    assert archived(out) == 471
    assert_exactly_once(spark, out, 471)
    assert not list((out / "_staging").glob("*")), "a micro-batch left staged files behind"
    text = tail()
    assert "SIGTERM: stopping after the running micro-batch" in text
    assert '"records":' in text.replace(" ", "")

    # a batch run on the same archive continues from the continuous run's commits
    produce_dead(bootstrap, topic, 471, 20)
    spec = ArchiveSpec({"bootstrap.servers": bootstrap}, topic, str(out))
    with JobProgress(spark, Console(file=io.StringIO())) as progress:
        assert run_archive(spark, spec, progress).records == 20
    assert_exactly_once(spark, out, 491)

    # the query's checkpoint is now behind the archive: it re-reads those 20 and drops them
    produce_dead(bootstrap, topic, 491, 5)
    stop = threading.Event()
    watchdog = threading.Timer(120, stop.set)
    watchdog.start()

    def on_batch(report: BatchReport) -> None:
        stop.set()

    try:
        cspec = ContinuousSpec(spec, str(checkpoint), trigger_s=1)
        result = run_continuous(spark, cspec, stop, on_batch)
    finally:
        watchdog.cancel()
    assert [b.records for b in result.batches] == [5]
    assert_exactly_once(spark, out, 496)
