"""A real Kafka Connect worker (standalone mode) for tests that need Connect's own dead letters.

Hand-made ``__connect.errors.*`` headers only test retryd against what its authors read in
Connect's source; this runs ``org.apache.kafka.connect.cli.ConnectStandalone`` of the same
release as the test broker, so the dead letters are the ones Connect really writes.

``provision_connect()`` resolves connect-runtime and the JSON converter with Maven
(``connect-pom.xml`` next to this file) into ``<cache>/kafka-connect/<version>/libs`` beside
the broker's jars (``retryd.kafka.apache.cache_root``), once: a stamp holding the digest of
the pom and the connector's source marks a complete copy, and parallel callers serialise on a
lock file, exactly as the broker's ``provision()`` does. The sink connector is
``LineFileSinkConnector.java`` (FileStreamSinkConnector's behaviour; the pom says why Kafka's
own cannot be used with 4.4.0), compiled with the JDK's ``javac`` into a jar in the same
directory. ``ConnectStandalone`` runs one worker with one connector from that class path (no
``plugin.path``) in its own process group, stopped by PID.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import signal
import subprocess
import tempfile
import zipfile
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType

import httpx

from retryd.errors import BrokerStartError
from retryd.kafka.apache import (
    JVM_FLAGS,
    cache_root,
    classpath,
    fetch_with_maven,
    java_binary,
    resolve_version,
)
from retryd.kafka.embedded import _die_with_parent, free_port
from tests.support import wait_for

POM = Path(__file__).with_name("connect-pom.xml")
SINK_SOURCE = Path(__file__).with_name("LineFileSinkConnector.java")
SINK_CONNECTOR = "io.retryd.testing.LineFileSinkConnector"
_SINK_JAR = "retryd-test-line-file-sink.jar"
MAIN_CLASS = "org.apache.kafka.connect.cli.ConnectStandalone"
_MVN_TIMEOUT_S = 600.0

# Connect logs a lot at INFO (every config it parses); WARN keeps a failure's cause findable.
_LOG4J2 = """\
status = warn
shutdownHook = disable
appender.console.type = Console
appender.console.name = STDOUT
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = WARN
rootLogger.appenderRef.console.ref = STDOUT
logger.worker.name = org.apache.kafka.connect.runtime.Worker
logger.worker.level = INFO
"""


def connect_root(version: str) -> Path:
    """``<cache>/kafka-connect/<version>``: next to the broker's cache, outside any checkout."""
    return cache_root().parent / "kafka-connect" / version


def provision_connect(version: str | None = None) -> Path:
    """The directory of Kafka Connect's jars for ``version`` (the broker's by default),
    resolving them with Maven on first use (the broker's ``fetch_with_maven``), the test sink
    connector built into them; later calls read one stamp file."""
    version = resolve_version(version)
    return fetch_with_maven(
        POM,
        connect_root(version),
        hashlib.sha256(POM.read_bytes() + SINK_SOURCE.read_bytes()).hexdigest(),
        {"kafka.version": version},
        name=f"Kafka Connect {version}",
        artifact=f"Kafka Connect {version}",
        expect="connect-runtime-*.jar",
        finish=_build_sink_jar,
        timeout_s=_MVN_TIMEOUT_S,
    )


def has_javac() -> bool:
    """Whether a JDK is at hand to build the test sink connector."""
    try:
        _javac()
    except BrokerStartError:
        return False
    return True


def _javac() -> str:
    """The ``javac`` beside the ``java`` that runs Kafka (same JDK), else the one on PATH."""
    beside = java_binary().resolve().parent / "javac"
    if os.access(beside, os.X_OK):
        return str(beside)
    found = shutil.which("javac")
    if not found:
        raise BrokerStartError(
            "javac (a JDK, 17 or newer) is needed to build the test sink connector: install "
            "one (apt-get install openjdk-17-jdk-headless) or set RETRYD_KAFKA_JAVA to a JDK's java"
        )
    return found


def _build_sink_jar(libs: Path) -> None:
    """Compile ``SINK_SOURCE`` against the jars in ``libs`` and add it there as a jar with the
    ServiceLoader manifest that ``plugin.discovery=service_load`` finds it by."""
    with tempfile.TemporaryDirectory(prefix="connect-sink-") as build:
        result = subprocess.run(
            [_javac(), "-nowarn", "--release", "17", "-cp", classpath(libs), "-d", build,
             str(SINK_SOURCE)],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        if result.returncode != 0:
            raise BrokerStartError(f"javac failed on {SINK_SOURCE.name}:\n{result.stderr[-3000:]}")
        with zipfile.ZipFile(libs / _SINK_JAR, "w", zipfile.ZIP_DEFLATED) as jar:
            jar.writestr("META-INF/MANIFEST.MF", "Manifest-Version: 1.0\r\n\r\n")
            jar.writestr(
                "META-INF/services/org.apache.kafka.connect.sink.SinkConnector",
                SINK_CONNECTOR + "\n",
            )
            for cls in sorted(Path(build).rglob("*.class")):
                jar.write(cls, cls.relative_to(build).as_posix())


def _properties(values: Mapping[str, str]) -> str:
    return "".join(f"{k}={v}\n" for k, v in values.items())


class ConnectStandalone:
    """One standalone Connect worker running one connector; a context manager.

    ``connector`` is the connector's configuration (``name`` and ``connector.class``
    included); ``worker`` adds to or overrides the worker's. The worker's REST listener is on
    a free loopback port; ``start()`` returns once the REST API reports the connector and its
    tasks RUNNING (the sink task has joined its group), or fails with the log's tail."""

    def __init__(
        self,
        bootstrap: str,
        work_dir: Path,
        connector: Mapping[str, str],
        *,
        worker: Mapping[str, str] | None = None,
        version: str | None = None,
    ) -> None:
        self.bootstrap = bootstrap
        self.work_dir = work_dir
        self.connector = dict(connector)
        self.name = self.connector["name"]
        self.version = resolve_version(version)
        self.port = free_port()
        self.worker = {
            "bootstrap.servers": bootstrap,
            "listeners": f"http://127.0.0.1:{self.port}",
            "key.converter": "org.apache.kafka.connect.storage.StringConverter",
            "value.converter": "org.apache.kafka.connect.json.JsonConverter",
            "value.converter.schemas.enable": "false",
            "offset.storage.file.filename": str(work_dir / "offsets"),
            "offset.flush.interval.ms": "1000",
            # the plugins are on the class path with ServiceLoader manifests: no reflective
            # scan of every jar at start-up
            "plugin.discovery": "service_load",
            **(worker or {}),
        }
        self.log_file = work_dir / "connect.log"
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    def start(self, timeout_s: float = 60.0) -> ConnectStandalone:
        libs = provision_connect(self.version)
        java = java_binary()
        self.work_dir.mkdir(parents=True, exist_ok=True)
        worker = self.work_dir / "worker.properties"
        worker.write_text(_properties(self.worker))
        connector = self.work_dir / "connector.properties"
        connector.write_text(_properties(self.connector))
        log_config = self.work_dir / "log4j2.properties"
        log_config.write_text(_LOG4J2)
        cmd = [
            str(java),
            *JVM_FLAGS,
            f"-Dlog4j2.configurationFile={log_config}",
            "-cp",
            classpath(libs),
            MAIN_CLASS,
            str(worker),
            str(connector),
        ]
        with open(self.log_file, "ab") as out:
            try:
                self.process = subprocess.Popen(
                    cmd,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,  # its own process group: signals reach only it
                    preexec_fn=_die_with_parent,
                )
            except OSError as exc:
                raise BrokerStartError(f"cannot start Kafka Connect with {java}: {exc}") from exc
        try:
            wait_for(self._running, timeout_s, 0.2, f"Kafka Connect ({self.log_tail()})")
        except BaseException:
            self.stop()
            raise
        return self

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log_file.read_text(errors="replace")
        except OSError:
            return f"no log at {self.log_file}"
        return f"log {self.log_file}:\n" + "\n".join(text.splitlines()[-lines:])

    def _running(self) -> bool:
        if self.process is not None and self.process.poll() is not None:
            raise AssertionError(
                f"Kafka Connect exited with {self.process.returncode}; {self.log_tail()}"
            )
        try:
            resp = httpx.get(f"{self.url}/connectors/{self.name}/status", timeout=2)
        except httpx.HTTPError:
            return False
        if resp.status_code != 200:
            return False
        status = resp.json()
        tasks = status.get("tasks") or []
        states = [status["connector"]["state"], *(t["state"] for t in tasks)]
        if "FAILED" in states:
            raise AssertionError(f"connector {self.name} failed: {status}")
        return bool(tasks) and all(s == "RUNNING" for s in states)

    def stop(self, timeout_s: float = 20.0) -> None:
        """SIGTERM the worker's process group (Connect stops its tasks and commits their
        offsets), SIGKILL it if it is still there after ``timeout_s``."""
        proc, self.process = self.process, None
        if proc is None:
            return
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()

    def __enter__(self) -> ConnectStandalone:
        return self.start() if self.process is None else self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
