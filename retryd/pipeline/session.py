"""Starting Spark for the jobs: runtime checks (PySpark, Java 17+) and the SparkSession.

The checks run before any JVM starts so a missing piece gives one clear sentence instead of
a py4j stack trace.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from retryd.errors import RetrydError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

MIN_JAVA = 17
INSTALL_HINT = "install it with: pip install 'retryd[spark]'"
_VERSION_RE = re.compile(r'version "(\d+)(?:\.(\d+))?[^"]*"')


class SparkUnavailableError(RetrydError):
    """PySpark or a suitable Java runtime is missing; the message says what to install."""


def java_major(version_output: str) -> int | None:
    """Major version from ``java -version`` output (``"1.8.0_392"`` -> 8, ``"17.0.2"`` -> 17)."""
    match = _VERSION_RE.search(version_output)
    if match is None:
        return None
    major = int(match.group(1))
    if major == 1 and match.group(2):
        return int(match.group(2))
    return major


def find_java(env: Mapping[str, str]) -> Path | None:
    """The java Spark will launch: ``$JAVA_HOME/bin/java``, else ``java`` on PATH."""
    home = env.get("JAVA_HOME")
    if home:
        candidate = Path(home) / "bin" / "java"
        return candidate if candidate.exists() else None
    found = shutil.which("java", path=env.get("PATH"))
    return Path(found) if found else None


def check_java(env: Mapping[str, str]) -> int:
    """Return the Java major version, or raise SparkUnavailableError saying what is wrong."""
    java = find_java(env)
    if java is None:
        where = (
            f"JAVA_HOME={env['JAVA_HOME']} has no bin/java"
            if env.get("JAVA_HOME")
            else ("no 'java' on PATH and JAVA_HOME is not set")
        )
        raise SparkUnavailableError(
            f"Java {MIN_JAVA} or newer is required by Spark 4, but {where}: "
            "install a JDK 17 (e.g. apt-get install openjdk-17-jre-headless) or set JAVA_HOME"
        )
    try:
        proc = subprocess.run(
            [str(java), "-version"], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SparkUnavailableError(f"cannot run {java} -version: {exc}") from exc
    major = java_major(proc.stderr + proc.stdout)
    if major is None:
        raise SparkUnavailableError(f"cannot tell the version of {java}: {proc.stderr.strip()}")
    if major < MIN_JAVA:
        raise SparkUnavailableError(
            f"Spark 4 needs Java {MIN_JAVA} or newer, but {java} is Java {major}: "
            "install a JDK 17 or point JAVA_HOME at one"
        )
    return major


def check_pyspark() -> str:
    """Return the PySpark version, or raise SparkUnavailableError when it is missing/too old."""
    try:
        import pyspark
    except ImportError as exc:
        raise SparkUnavailableError(f"PySpark is not installed: {INSTALL_HINT}") from exc
    version = str(pyspark.__version__)
    if int(version.split(".")[0]) < 4:
        raise SparkUnavailableError(f"PySpark {version} is too old, 4.x is needed: {INSTALL_HINT}")
    try:
        import pyarrow  # noqa: F401
    except ImportError as exc:
        raise SparkUnavailableError(f"pyarrow is not installed: {INSTALL_HINT}") from exc
    return version


def check_runtime(env: Mapping[str, str] | None = None) -> None:
    check_pyspark()
    check_java(os.environ if env is None else env)


def build_session(
    master: str | None = "local[*]",
    app_name: str = "retryd",
    conf: Mapping[str, Any] | None = None,
) -> SparkSession:
    """A SparkSession with the retryd_kafka source registered and UTC as session time zone.

    ``master=None`` keeps the master chosen by ``spark-submit`` (the job runs inside it).
    """
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName(app_name)
    if master is not None:
        builder = builder.master(master)
    settings: dict[str, Any] = {
        "spark.sql.session.timeZone": "UTC",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.execution.arrow.pyspark.enabled": "true",
    }
    if master is not None and master.startswith("local"):
        # Python workers run on this machine: use this interpreter (with retryd installed).
        # The JVM hands PYSPARK_PYTHON to the data source planner, so set it before launch.
        settings["spark.pyspark.python"] = sys.executable
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    settings.update(conf or {})
    for key, value in settings.items():
        builder = builder.config(key, str(value))
    # py4j logs every connection it opens and closes at INFO, and a benign read error while a
    # streaming query's callback server shuts down: noise in the jobs' output.
    logging.getLogger("py4j").setLevel(logging.WARNING)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    register(spark)
    log.info("spark %s session on %s", spark.version, spark.sparkContext.master)
    return spark


def register(spark: SparkSession) -> None:
    """Make ``spark.read.format("retryd_kafka")`` available in this session."""
    from retryd.pipeline.datasource import RetrydKafkaDataSource

    spark.dataSource.register(RetrydKafkaDataSource)


def stop_session(spark: SparkSession, timeout_s: float = 20.0) -> None:
    """Stop Spark and the JVM it started (by PID: terminate, then kill)."""
    from pyspark import SparkContext

    spark.stop()
    gateway = SparkContext._gateway
    proc = getattr(gateway, "proc", None) if gateway is not None else None
    if gateway is not None:
        try:
            gateway.shutdown()
        except Exception as exc:  # the JVM may already be gone
            log.debug("gateway shutdown: %s", exc)
    SparkContext._gateway = None
    SparkContext._jvm = None
    if proc is not None and proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout_s)
