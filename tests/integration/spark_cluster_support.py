"""A Spark standalone cluster for tests: one master and two workers started from the installed
PySpark's own classes (``spark-class org.apache.spark.deploy.master.Master`` / ``...Worker``),
on loopback, each in a process group of its own, stopped by PID; logs in the test's tmp_path.

What a cluster node would hold is built too: ``node_python`` is a Python with retryd's
dependencies but without retryd (a virtual environment that sees this environment's
site-packages without running its ``.pth`` files, so the editable retryd install is not on its
path), and ``retryd_zip`` is the retryd package as ``--py-files`` ships it. A job that forgets
to ship retryd fails on the executors, as it would on a real cluster.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import sysconfig
import urllib.request
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

import retryd
from tests.support import wait_for

pytest.importorskip("pyspark", reason="PySpark is not installed (pip install 'retryd[spark]')")


import pyspark

SPARK_HOME = Path(pyspark.__file__).parent
SPARK_CLASS = SPARK_HOME / "bin" / "spark-class"
WORKER_CORES = 1
WORKER_MEMORY = "1g"
EXECUTOR_MEMORY = "512m"
DAEMON_MEMORY = "256m"  # master and worker JVMs (Spark's default is 1g each)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def daemon_env() -> dict[str, str]:
    """The environment of the master and workers: loopback, small JVMs, and no PYTHONPATH (the
    executors' Python must get retryd from what the job ships, as on a real node)."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("RETRYD_", "PYSPARK_", "SPARK_")) and k != "PYTHONPATH"
    }
    env.update(
        SPARK_HOME=str(SPARK_HOME),
        SPARK_LOCAL_IP="127.0.0.1",
        SPARK_DAEMON_MEMORY=DAEMON_MEMORY,
        SPARK_NO_DAEMONIZE="1",
        # the master's REST submission server listens on a fixed port (6066) by default
        SPARK_MASTER_OPTS="-Dspark.master.rest.enabled=false",
    )
    return env


@dataclass
class Daemon:
    name: str
    proc: subprocess.Popen[bytes]
    log: Path
    work_dir: Path | None = None
    killed: bool = False

    def kill(self) -> None:
        """SIGKILL the daemon's whole process group (for a worker: its executors and their
        Python workers too, as when a node is lost)."""
        self.killed = True
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(60)

    def stop(self, timeout: float = 20.0) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout)
        with contextlib.suppress(ProcessLookupError):  # whatever is left in its group
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(60)

    def tail(self, chars: int = 3000) -> str:
        return self.log.read_text(errors="replace")[-chars:] if self.log.exists() else ""


@dataclass
class StandaloneCluster:
    root: Path
    port: int = field(default_factory=free_port)
    ui_port: int = field(default_factory=free_port)
    master: Daemon | None = None
    workers: list[Daemon] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    def _start(self, name: str, args: list[str], work_dir: Path | None = None) -> Daemon:
        log = self.root / f"{name}.log"
        with log.open("ab") as out:
            proc = subprocess.Popen(
                [str(SPARK_CLASS), *args],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=daemon_env(),
                cwd=self.root,
                start_new_session=True,
            )
        return Daemon(name, proc, log, work_dir)

    def start(self, workers: int = 2, timeout: float = 120.0) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self.master = self._start(
            "master",
            [
                "org.apache.spark.deploy.master.Master",
                *("--host", "127.0.0.1", "--port", str(self.port)),
                *("--webui-port", str(self.ui_port)),
            ],
        )
        for i in range(workers):
            self.add_worker(f"worker-{i}")
        self.wait_alive(workers, timeout)

    def add_worker(self, name: str) -> Daemon:
        work = self.root / name
        work.mkdir(exist_ok=True)
        worker = self._start(
            name,
            [
                "org.apache.spark.deploy.worker.Worker",
                *("--host", "127.0.0.1", "--port", str(free_port())),
                *("--webui-port", str(free_port())),
                *("--cores", str(WORKER_CORES), "--memory", WORKER_MEMORY),
                *("--work-dir", str(work)),
                self.url,
            ],
            work,
        )
        self.workers.append(worker)
        return worker

    def ensure_workers(self, count: int) -> None:
        """Start workers until ``count`` are alive (a test before may have killed one)."""
        alive = [w for w in self.workers if not w.killed]
        for _i in range(count - len(alive)):
            self.add_worker(f"worker-{len(self.workers)}")
        self.wait_alive(count)

    def state(self) -> dict[str, Any]:
        """The master's own JSON view (workers, applications), {} while it is not up. A
        master starting under load serves its HTML page at ``/json/`` for a moment (its web
        server is up before the JSON handler is attached): that is "not up" too."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.ui_port}/json/", timeout=5) as r:
                return dict(json.loads(r.read()))
        except (OSError, ValueError):
            return {}

    def alive_workers(self) -> int:
        return sum(1 for w in self.state().get("workers", []) if w.get("state") == "ALIVE")

    def wait_alive(self, count: int, timeout: float = 120.0) -> None:
        def ready() -> bool:
            assert self.master is not None
            for daemon in (self.master, *self.workers):
                if not daemon.killed:
                    assert daemon.proc.poll() is None, f"{daemon.name} exited:\n{daemon.tail()}"
            return self.alive_workers() == count

        wait_for(ready, timeout, 0.2, f"{count} Spark workers registered")

    def executor_dirs(self, worker: Daemon) -> list[Path]:
        """``<work-dir>/<app-id>/<executor-id>``: one per executor this worker ran."""
        assert worker.work_dir is not None
        return sorted(p for p in worker.work_dir.glob("app-*/*") if p.is_dir())

    def stop(self) -> None:
        for daemon in [*self.workers, self.master]:
            if daemon is not None:
                daemon.stop()

    def logs(self) -> str:
        daemons = [d for d in (self.master, *self.workers) if d is not None]
        return "\n".join(f"--- {d.name}\n{d.tail(1500)}" for d in daemons)


def retryd_zip(dest: Path) -> Path:
    """The retryd package being tested as a zip for ``--py-files``, as a user makes it from a
    checkout with ``python -m zipfile -c retryd.zip retryd/``."""
    package = Path(retryd.__file__).parent
    with zipfile.ZipFile(dest, "w", zipfile.ZIP_DEFLATED) as zf:
        for path in sorted(package.rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts:
                zf.write(path, path.relative_to(package.parent).as_posix())
    return dest


def node_python(root: Path) -> Path:
    """A Python with retryd's dependencies (PySpark, pyarrow, confluent-kafka, ...) but not
    retryd: a virtual environment whose one ``.pth`` line puts this environment's
    site-packages on its path (lines of a ``.pth`` are added as they are; the ``.pth`` files in
    that directory, which install the editable retryd, are not run)."""
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(root)], check=True, timeout=120
    )
    python = root / "bin" / "python"
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout.strip()
    Path(purelib, "retryd-deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    check = subprocess.run(
        [str(python), "-c", "import pyspark, pyarrow, confluent_kafka, pydantic; import retryd"],
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
        cwd=root,  # not a checkout: its retryd/ would be importable from there
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "No module named 'retryd'" in check.stderr, check.stderr
    return python


@pytest.fixture(scope="module")
def spark_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandaloneCluster]:
    cluster = StandaloneCluster(tmp_path_factory.mktemp("spark-cluster"))
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


@dataclass(frozen=True)
class Node:
    """What the job needs on every node: the executors' Python and the retryd it ships."""

    python: Path
    py_files: Path


@pytest.fixture(scope="module")
def cluster_node(tmp_path_factory: pytest.TempPathFactory) -> Node:
    root = tmp_path_factory.mktemp("spark-node")
    return Node(node_python(root / "venv"), retryd_zip(root / "retryd.zip"))
