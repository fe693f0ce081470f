"""Shared fixtures. Integration tests use a real broker: ``RETRYD_TEST_BOOTSTRAP`` if set,
otherwise one embedded Tansu process for the whole session, stopped by PID at the end."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from retryd.kafka.embedded import EmbeddedBroker


@pytest.fixture(scope="session")
def bootstrap(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    external = os.environ.get("RETRYD_TEST_BOOTSTRAP")
    if external:
        yield external
        return
    log_file = tmp_path_factory.mktemp("broker") / "tansu.log"
    broker = EmbeddedBroker(log_file=log_file).start()
    try:
        yield broker.bootstrap
    finally:
        broker.stop()
