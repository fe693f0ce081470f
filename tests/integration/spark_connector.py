"""Spark's Kafka connector (``--source native``) for tests and benchmarks: the Maven coordinate
to put in ``spark.jars.packages``, resolved by Spark (Ivy) from Maven Central when a session
starts.

The connector should match the installed PySpark. A PySpark release can reach PyPI before its
Spark artifacts reach Maven Central (PySpark 4.3.0 did: no ``spark-sql-kafka-0-10_2.13`` 4.3.0,
nor ``spark-core_2.13`` 4.3.0, on Maven Central; the newest was 4.2.0, which reads fine under
PySpark 4.3.0). Then the newest published release of the same major line not newer than PySpark
is used, and ``note`` says so. ``RETRYD_SPARK_KAFKA_CONNECTOR`` (a version) overrides both.
"""

from __future__ import annotations

import os
import re
import urllib.error
import urllib.request
from dataclasses import dataclass
from functools import cache

from retryd.pipeline.native import CONNECTOR

MAVEN_CENTRAL = "https://repo1.maven.org/maven2"
OVERRIDE_ENV = "RETRYD_SPARK_KAFKA_CONNECTOR"
_RELEASE = re.compile(r"^\d+\.\d+\.\d+$")


@dataclass(frozen=True)
class Connector:
    version: str
    pyspark: str
    note: str | None = None  # why the version differs from PySpark's

    @property
    def package(self) -> str:
        return f"{CONNECTOR}:{self.version}"


def _artifact_url() -> str:
    group, artifact = CONNECTOR.split(":")
    return f"{MAVEN_CENTRAL}/{group.replace('.', '/')}/{artifact}"


def _published(version: str, timeout: float) -> bool:
    artifact = CONNECTOR.split(":")[1]
    url = f"{_artifact_url()}/{version}/{artifact}-{version}.pom"
    try:
        with urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=timeout):
            return True
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return False
        raise


def _releases(timeout: float) -> list[str]:
    with urllib.request.urlopen(f"{_artifact_url()}/maven-metadata.xml", timeout=timeout) as r:
        text = r.read().decode()
    return [v for v in re.findall(r"<version>([^<]+)</version>", text) if _RELEASE.match(v)]


def _key(version: str) -> tuple[int, ...]:
    return tuple(int(x) for x in version.split("."))


@cache
def connector(timeout: float = 20.0) -> Connector:
    """The connector for the installed PySpark (see the module's docstring)."""
    import pyspark

    wanted = str(pyspark.__version__)
    override = os.environ.get(OVERRIDE_ENV)
    if override:
        return Connector(override, wanted, f"{OVERRIDE_ENV}={override}")
    if _published(wanted, timeout):
        return Connector(wanted, wanted)
    major = wanted.split(".")[0]
    older = [
        v
        for v in _releases(timeout)
        if v.split(".")[0] == major and _key(v) <= _key(wanted.split("+")[0])
    ]
    if not older:
        raise RuntimeError(f"no {CONNECTOR} release of the {major}.x line on Maven Central")
    chosen = max(older, key=_key)
    return Connector(
        chosen,
        wanted,
        f"{CONNECTOR}:{wanted} is not published on Maven Central; using {chosen}, the newest "
        f"{major}.x release there",
    )
