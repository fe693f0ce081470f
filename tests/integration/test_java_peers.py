"""The Java peers of the peer benchmark (bench/peers/java.py): both jars build with Maven and,
on the real broker, handle exactly the records asked for and report what the benchmark
tables need (wall clock, process CPU, the retry shape's lateness)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from bench.peers import java
from tests.support import create_topics, produce, unique

pytestmark = pytest.mark.skipif(
    java.tools_missing() is not None,
    reason=f"the Java peers need Maven and a JDK: {java.tools_missing()}",
)

RECORDS = 300
KEYS = 50
# Spring's retry topic handles each first-attempt failure with a seek of the records fetched
# after it, and the re-fetch waits up to fetch.max.wait.ms (500 ms by default): about half a
# second per failed record, so the retry shape runs on fewer records.
RETRY_RECORDS = 60


@pytest.fixture(scope="module")
def jars() -> Iterator[dict[str, Any]]:
    """Both jars, built (or found up to date) once for the module."""
    built = {}
    for name in java.JARS:
        started = time.monotonic()
        built[name] = java.build(name)
        print(f"{name}: jar ready in {time.monotonic() - started:.1f} s")
    yield built


def keyed_topic(bootstrap: str, count: int) -> str:
    topic = unique("peer-java")
    create_topics(bootstrap, [topic], partitions=3)
    produce(bootstrap, topic, [(f"k{i % KEYS}".encode(), bytes(200)) for i in range(count)])
    return topic


def assert_measured(result: dict[str, Any], system: str, count: int) -> None:
    assert result["system"] == system
    assert result["version"]
    assert result["handled"] == count
    assert result["wall_s"] > 0
    assert result["cpu_s"] > 0
    assert result["config"]["consumer"]["auto.offset.reset"] == "earliest"


def test_build_is_cached(jars: dict[str, Any]) -> None:
    for name, jar in jars.items():
        built = jar.stat().st_mtime
        assert java.build(name) == jar and jar.stat().st_mtime == built


def test_success_shape_both_peers(bootstrap: str, jars: dict[str, Any]) -> None:
    topic = keyed_topic(bootstrap, RECORDS)
    spring = java.run("spring", bootstrap, topic, unique("g"), RECORDS, "success", timeout_s=120)
    assert_measured(spring, "spring-kafka", RECORDS)
    assert spring["version"] == "4.1.2"
    pc = java.run(
        "parallel-consumer",
        bootstrap,
        topic,
        unique("g"),
        RECORDS,
        "success",
        warm_from=RECORDS // 2,
        timeout_s=120,
    )
    assert_measured(pc, "parallel-consumer", RECORDS)
    assert pc["config"]["ordering"] == "KEY" and pc["config"]["maxConcurrency"] == 16
    assert 0 < pc["warm_wall_s"] <= pc["wall_s"] and 0 <= pc["warm_cpu_s"] <= pc["cpu_s"]


def test_keyed_shape_parallel_consumer(bootstrap: str, jars: dict[str, Any]) -> None:
    topic = keyed_topic(bootstrap, RECORDS)
    result = java.run(
        "parallel-consumer",
        bootstrap,
        topic,
        unique("g"),
        RECORDS,
        "keyed",
        concurrency=8,
        handler_ms_max=5,
        timeout_s=120,
    )
    assert_measured(result, "parallel-consumer", RECORDS)
    assert result["config"]["maxConcurrency"] == 8
    # 300 pauses of 2.5 ms on average, 8 at a time: well above 0.09 s unless pauses are skipped
    assert result["wall_s"] > 300 * 0.0025 / 8


def test_keyed_shape_spring(bootstrap: str, jars: dict[str, Any]) -> None:
    """Spring runs the keyed shape too: one container thread per partition at most."""
    topic = keyed_topic(bootstrap, RECORDS)
    result = java.run(
        "spring", bootstrap, topic, unique("g"), RECORDS, "keyed", concurrency=3, timeout_s=120
    )
    assert_measured(result, "spring-kafka", RECORDS)
    assert result["config"]["container.concurrency"] == 3
    assert result["wall_s"] > 300 * 0.0025 / 3


def test_retry_shape_spring(bootstrap: str, jars: dict[str, Any]) -> None:
    """Every record fails once and succeeds on its retry; a second group on the same topic
    (whose retry topic still holds the first run's retries) counts only its own."""
    topic = keyed_topic(bootstrap, RETRY_RECORDS)
    for _run in range(2):
        result = java.run(
            "spring",
            bootstrap,
            topic,
            unique("g"),
            RETRY_RECORDS,
            "retry",
            retry_delay_ms=1000,
            timeout_s=240,
            # Spring re-fetches behind each failure, waiting fetch.max.wait.ms (500 ms by
            # default) every time: the benchmark publishes that, this test checks behaviour
            jvm_props={"peer.consumer.fetch.max.wait.ms": "20"},
        )
        assert_measured(result, "spring-kafka", RETRY_RECORDS)
        assert result["config"]["RetryableTopic.attempts"] == 2
        lateness = result["lateness_ms"]
        assert lateness["count"] == RETRY_RECORDS
        assert lateness["min"] <= lateness["p50"] <= lateness["p99"] <= lateness["max"]
        assert lateness["min"] >= -5, f"a retry came early: {lateness}"


def test_refusals(bootstrap: str, jars: dict[str, Any]) -> None:
    """Parallel Consumer has no delayed retry: exit 2 with the reason, raised as PeerRefused;
    a bad command line is refused the same way."""
    topic = keyed_topic(bootstrap, 1)
    with pytest.raises(java.PeerRefused, match="no delayed retry"):
        java.run("parallel-consumer", bootstrap, topic, unique("g"), 1, "retry", timeout_s=30)
    with pytest.raises(java.PeerRefused, match="warm-from"):
        java.run("spring", bootstrap, topic, unique("g"), 1, "success", warm_from=5)


def test_maven_failure_names_the_step() -> None:
    output = (
        "\x1b[1;31m[ERROR]\x1b[m Failed to execute goal org.apache.maven.plugins:"
        "maven-compiler-plugin:3.13.0:compile (default-compile) on project spring-peer: "
        "Compilation failure\n[ERROR] /x/SpringPeer.java:[3,1] ';' expected\n[ERROR] \n"
    )
    message = java.maven_failure(output)
    assert message.startswith("Maven step org.apache.maven.plugins:maven-compiler-plugin")
    assert "';' expected" in message
    assert java.maven_failure("").endswith("no output")
