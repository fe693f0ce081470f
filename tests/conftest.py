"""Shared fixtures. Integration tests use a real broker for the whole session, stopped by PID
at the end:

- ``RETRYD_TEST_BOOTSTRAP=host:port``: an existing cluster (nothing is started);
- otherwise Apache Kafka (``RETRYD_TEST_BROKER=kafka``, the default), provisioned from Maven
  Central into a cache outside the repository and started in KRaft mode on loopback, version
  ``RETRYD_KAFKA_VERSION`` (default: ``retryd.kafka.apache.DEFAULT_VERSION``);
- ``RETRYD_TEST_BROKER=tansu``: the embedded Tansu broker of ``retryd dev``.

The broker in use is printed once at the start of the session (``pytest_report_header``).
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.support import TEST_BROKER, TEST_KAFKA_OVERRIDES


def pytest_report_header(config: pytest.Config) -> str:
    return f"broker: {broker_name()}"


def broker_name() -> str:
    """The broker the integration tests run on, as the test log names it."""
    if os.environ.get("RETRYD_TEST_BOOTSTRAP"):
        return f"external cluster at {os.environ['RETRYD_TEST_BOOTSTRAP']}"
    if TEST_BROKER == "tansu":
        return "embedded Tansu (RETRYD_TEST_BROKER=tansu)"
    from retryd.kafka.apache import resolve_version

    return f"Apache Kafka {resolve_version(None)} (KRaft, single node, from Maven Central)"


@pytest.fixture(scope="session")
def bootstrap(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    external = os.environ.get("RETRYD_TEST_BOOTSTRAP")
    if external:
        yield external
        return
    if TEST_BROKER == "tansu":
        from retryd.kafka.embedded import EmbeddedBroker

        log_file = tmp_path_factory.mktemp("broker") / "tansu.log"
        tansu = EmbeddedBroker(log_file=log_file).start()
        try:
            yield tansu.bootstrap
        finally:
            tansu.stop()
        return
    from retryd.kafka.apache import ApacheKafkaBroker

    log_file = tmp_path_factory.mktemp("broker") / "kafka.log"
    broker = ApacheKafkaBroker(log_file=log_file, overrides=TEST_KAFKA_OVERRIDES).start(
        timeout_s=180
    )
    try:
        yield broker.bootstrap
    finally:
        broker.stop()
