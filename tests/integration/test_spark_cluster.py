"""The pipeline on a Spark standalone cluster (a master and two workers, each in JVMs of its
own): ``retryd spark report``, ``archive`` and ``replay`` with ``--master spark://...`` give
what the same commands give on the suite's local session, and a worker killed during
``archive --continuous`` loses and duplicates no record.

The jobs run as a user runs them on a cluster: the executors' Python has retryd's dependencies
but not retryd (``PYSPARK_PYTHON``, the same path on every node), retryd is shipped with
``spark.submit.pyFiles`` (a zip of the package), and ``--source native`` gets Spark's Kafka
connector from ``spark.jars.packages``, which the driver resolves and serves to the executors.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from retryd.config import Settings
from tests.integration.spark_cluster_support import (  # noqa: F401 - fixtures
    Node,
    StandaloneCluster,
    cluster_node,
    spark_cluster,
)
from tests.integration.spark_connector import connector
from tests.integration.spark_support import (  # noqa: F401 - fixture
    assert_exactly_once,
    dead_letter,
    spark,
    tier_copy,
)
from tests.support import create_topics, produce, read_topic, unique, wait_for

# Measured on the shared 2-core machine: both tests 6.5 minutes at a load average of 7-9
# (3.8 + 2.0), 9.5 at 11-15; Spark's per-task latency grows with the load, hence a timeout
# above pytest's default.
pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.timeout(1200)]
ROOT = Path(__file__).resolve().parents[2]
APP_CONF = {
    "spark.ui.enabled": "false",
    "spark.executor.memory": "512m",
    "spark.executor.cores": "1",
    "spark.sql.shuffle.partitions": "2",
    "spark.default.parallelism": "2",
}


def cluster_command(cluster: StandaloneCluster, node: Node, args: list[str]) -> list[str]:
    conf = {**APP_CONF, "spark.submit.pyFiles": str(node.py_files)}
    flags = [x for key, value in conf.items() for x in ("--spark-conf", f"{key}={value}")]
    return [sys.executable, "-m", "retryd", *args, "--master", cluster.url, *flags]


def cluster_env(node: Node, env: dict[str, str]) -> dict[str, str]:
    """The driver's environment: its own retryd (this checkout), the executors' Python."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("RETRYD_", "PYSPARK_"))}
    return {
        **base,
        **env,
        "PYTHONPATH": str(ROOT),
        "PYSPARK_PYTHON": str(node.python),
        "SPARK_LOCAL_IP": "127.0.0.1",
    }


@contextlib.contextmanager
def jobs_on_cluster(
    cluster: StandaloneCluster,
    node: Node,
    jobs: dict[str, list[str]],
    env: dict[str, str],
    workdir: Path,
) -> Iterator[dict[str, str]]:
    """Run ``retryd spark`` commands on the cluster as one application (one session, started as
    ``--master`` and ``--spark-conf`` start it; see spark_cluster_jobs) while the block runs;
    the dict yielded holds their outputs when the block ends."""
    conf = {
        **APP_CONF,
        "spark.submit.pyFiles": str(node.py_files),
        "spark.jars.packages": connector().package,  # for --source native
    }
    results, log = workdir / "cluster-jobs.json", workdir / "cluster-jobs.log"
    args = [cluster.url, json.dumps(conf), json.dumps(jobs), str(results)]
    with log.open("wb") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.integration.spark_cluster_jobs", *args],
            env=cluster_env(node, env),
            stdout=sink,
            stderr=subprocess.STDOUT,
            cwd=workdir,
            start_new_session=True,
        )
    outputs: dict[str, str] = {}
    try:
        yield outputs
        returncode = proc.wait(900)
    finally:
        with contextlib.suppress(ProcessLookupError):  # its JVM and Python workers, if left
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(60)
    ran = json.loads(results.read_text()) if results.exists() else {}
    print("cluster: " + ", ".join(f"{name} {r['seconds']:.1f}s" for name, r in ran.items()))
    failed = [f"{name}: {r['output'][-3000:]}" for name, r in ran.items() if r["exit"] != 0]
    assert returncode == 0 and set(ran) == {"session", *jobs}, (
        "\n".join(failed) + log.read_text(errors="replace")[-5000:] + cluster.logs()
    )
    outputs.update((name, r["output"]) for name, r in ran.items())


def run_local(args: list[str], env: dict[str, str]) -> str:
    """The same command on the suite's local session (``local[2]`` on the 2-core machine)."""
    from typer.testing import CliRunner

    from retryd.cli import app

    done = CliRunner().invoke(app, args, env=env)
    assert done.exit_code == 0, done.output
    return done.output


def archive_rows(spark, out: Path) -> list[dict]:  # type: ignore[no-untyped-def]  # noqa: F811
    rows = spark.read.parquet(str(out)).orderBy("partition", "offset").collect()
    return [r.asDict(recursive=True) for r in rows]


def replayed(bootstrap: str, topic: str, count: int) -> list[tuple]:
    """(key, value, user headers) of the copies a replay produced, in a stable order."""
    records = read_topic(bootstrap, topic, expect=count)
    return sorted(
        (r.key, r.value, sorted((k, v) for k, v in r.headers if not k.startswith("retryd_")))
        for r in records
    )


def test_report_archive_and_replay_match_the_local_run(
    spark,  # noqa: F811
    spark_cluster: StandaloneCluster,  # noqa: F811
    cluster_node: Node,  # noqa: F811
    bootstrap: str,
    tmp_path: Path,
) -> None:
    prefix = unique("cluster")
    orders = f"{prefix}.orders"
    targets = {where: f"{prefix}.replayed-{where}" for where in ("cluster", "local")}
    env = {
        "RETRYD_BOOTSTRAP_SERVERS": bootstrap,
        "RETRYD_MAIN_TOPICS": ",".join([orders, *targets.values()]),
        "RETRYD_FAILED_TOPIC": f"{prefix}.failed",
        "RETRYD_TIER_TEMPLATE": prefix + ".retry_{delay}",
    }
    settings = Settings(
        bootstrap_servers=bootstrap,
        failed_topic=env["RETRYD_FAILED_TOPIC"],
        tier_template=env["RETRYD_TIER_TEMPLATE"],
    )
    tiers = list(dict.fromkeys(settings.plan.tier_topics))
    create_topics(bootstrap, [settings.failed_topic, *tiers, orders, *targets.values()], 2)
    dead = []
    for i in range(60):
        cls, reason = [("TimeoutError", "exhausted"), ("ValueError", "non_retryable")][i % 2]
        headers = dead_letter(
            orders, i, partition=i % 2, error_class=cls, dead_reason=reason,
            error_message=f"order {i} failed", user_headers=[("trace", b"t-%d" % i)],
        )  # fmt: skip
        dead.append((b"k%d" % i, b"value-%d" % i, headers))
    produce(bootstrap, settings.failed_topic, dead)
    produce(bootstrap, tiers[0], [(b"k", b"v", tier_copy(orders, i, 1)) for i in range(60)])
    produce(bootstrap, tiers[1], [(b"k", b"v", tier_copy(orders, i, 2)) for i in range(30)])

    where = "error_class = 'TimeoutError' AND original_offset < 40"
    out = {name: tmp_path / name for name in ("cluster", "local")}
    ledgers = {side: f"{prefix}.ledger-{side}" for side in out}

    def jobs(side: str) -> dict[str, list[str]]:
        return {
            "report": ["spark", "report", "--out", str(out[side] / "report")],
            "archive": ["spark", "archive", "--out", str(out[side] / "archive")]
            + (["--source", "native"] if side == "cluster" else []),
            "replay": [
                *("spark", "replay", "--where", where, "--rate", "1000"),
                *("--target", targets[side]),
            ],
        }

    executors_before = [len(spark_cluster.executor_dirs(w)) for w in spark_cluster.workers]
    on_cluster = {**env, "RETRYD_LEDGER_TOPIC": ledgers["cluster"]}
    local_env = {**env, "RETRYD_LEDGER_TOPIC": ledgers["local"]}
    outputs: dict[str, dict[str, str]] = {}
    # the local run meanwhile: most of a job's time on 2 cores is Spark's latency, not CPU
    with jobs_on_cluster(
        spark_cluster, cluster_node, jobs("cluster"), on_cluster, tmp_path
    ) as outputs["cluster"]:
        outputs["local"] = {
            name: run_local(args, local_env) for name, args in jobs("local").items()
        }
    for side in out:
        assert re.search(r"replayed\s*│\s*20\s*│", outputs[side]["replay"]), outputs[side]

    # the executors ran in the workers' JVMs: one on each worker
    executors = [len(spark_cluster.executor_dirs(w)) for w in spark_cluster.workers]
    assert all(n > before for n, before in zip(executors, executors_before, strict=True))
    # the report: the same tables (the archive came through the native connector on the
    # cluster, the python source locally: the same columns and values)
    reports = {side: out[side] / "report" for side in out}
    for table in sorted(p.name for p in reports["local"].glob("*.csv")):
        assert (reports["cluster"] / table).read_text() == (reports["local"] / table).read_text()
    cluster_rows = archive_rows(spark, out["cluster"] / "archive")
    assert len(cluster_rows) == len(dead)
    assert cluster_rows == archive_rows(spark, out["local"] / "archive")
    copies = {side: replayed(bootstrap, targets[side], 20) for side in targets}
    assert copies["cluster"] == copies["local"]
    assert [c[1] for c in copies["cluster"]] == sorted(b"value-%d" % i for i in range(0, 40, 2))


def produce_dead(bootstrap: str, topic: str, start: int, count: int) -> None:
    produce(
        bootstrap,
        topic,
        [
            (b"k%d" % i, b"value-%d" % i, dead_letter("orders", i))
            for i in range(start, start + count)
        ],
    )


def archived(out: Path) -> int:
    """Records committed to the archive so far (its write-once commit log)."""
    total = 0
    for path in (out / "_retryd_archive" / "commits").glob("*.json"):
        try:
            total += json.loads(path.read_text())["records"]
        except ValueError:
            continue  # renamed into place whole; only be safe while polling
    return total


def test_worker_killed_during_continuous_archive(
    spark,  # noqa: F811
    spark_cluster: StandaloneCluster,  # noqa: F811
    cluster_node: Node,  # noqa: F811
    bootstrap: str,
    tmp_path: Path,
) -> None:
    spark_cluster.ensure_workers(2)
    topic = unique("cluster-cont")
    create_topics(bootstrap, [topic], partitions=2)
    out, checkpoint = tmp_path / "archive", tmp_path / "checkpoint"
    log = tmp_path / "cli.log"
    args = [
        "spark", "archive", "--continuous", "--out", out.as_uri(),
        "--checkpoint", checkpoint.as_uri(), "--trigger", "2s", "--topic", topic,
        "--bootstrap-servers", bootstrap, "--max-offsets-per-trigger", "300",
    ]  # fmt: skip
    produce_dead(bootstrap, topic, 0, 200)
    with log.open("ab") as sink:
        proc = subprocess.Popen(
            cluster_command(spark_cluster, cluster_node, args),
            env=cluster_env(cluster_node, {}),
            stdout=sink,
            stderr=subprocess.STDOUT,
            cwd=tmp_path,
            start_new_session=True,
        )

    def tail() -> str:
        return log.read_text(errors="replace")[-4000:] + spark_cluster.logs()

    try:
        wait_for(lambda: archived(out) == 200 or proc.poll() is not None, 300, 0.1, "200")
        assert proc.poll() is None, tail()
        # a micro-batch is being written on the executors when one worker (its JVM, its
        # executor and their Python workers: the node) is killed
        produce_dead(bootstrap, topic, 200, 600)
        staged = wait_for(
            lambda: sorted((out / "_staging").glob("batch-*/**/*")) or proc.poll() is not None,
            120,
            0.01,
            "a micro-batch writing",
        )
        assert proc.poll() is None, tail()
        batch = staged[0].relative_to(out / "_staging").parts[0].removeprefix("batch-")
        victim = spark_cluster.workers[-1]
        assert spark_cluster.executor_dirs(victim), "the worker ran no executor"
        victim.kill()
        commit = out / "_retryd_archive" / "commits" / f"{batch}.json"
        assert not commit.exists(), "the micro-batch was committed before the kill: " + tail()
        produce_dead(bootstrap, topic, 800, 100)
        wait_for(lambda: archived(out) >= 900 or proc.poll() is not None, 300, 0.2, "all 900")
        assert proc.poll() is None, tail()
        os.kill(proc.pid, signal.SIGTERM)
        assert proc.wait(120) == 0, tail()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(60)
        with contextlib.suppress(ProcessLookupError):  # whatever it left behind in its group
            os.killpg(proc.pid, signal.SIGKILL)
    assert spark_cluster.alive_workers() == 1
    assert "Lost executor" in log.read_text(errors="replace")  # the driver saw it go
    assert archived(out) == 900
    assert_exactly_once(spark, out, 900)
    assert not list((out / "_staging").glob("*")), "a micro-batch left staged files behind"
