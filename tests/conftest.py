"""Shared fixtures. Integration tests use a real broker for the whole session, stopped by PID
at the end:

- ``RETRYD_TEST_BOOTSTRAP=host:port``: an existing cluster (nothing is started);
- otherwise Apache Kafka (``RETRYD_TEST_BROKER=kafka``, the default), provisioned from Maven
  Central into a cache outside the repository and started in KRaft mode on loopback, version
  ``RETRYD_KAFKA_VERSION`` (default: ``retryd.kafka.apache.DEFAULT_VERSION``);
- ``RETRYD_TEST_BROKER=tansu``: the embedded Tansu broker of ``retryd dev``.

The broker in use is printed once at the start of the session (``pytest_report_header``).

In parallel (``pytest -n 2``, as ``scripts/test`` runs it) the controlling process starts the
one suite broker before its workers exist and stops it after they ended; the workers find it
in ``RETRYD_SUITE_BOOTSTRAP`` (every test makes its own topics and groups, so they share it as
they share it in one process). Tests go to workers in groups (``--dist loadgroup``, scheduled
by ``SuiteGroups``): a file's tests stay on one worker, so a module's fixtures start once; the
fault-injection, benchmark and outage tests form one group, so that they never run beside each
other on the two cores they measure or time on; the Spark tests form another (one Spark
session, one JVM); both start first, as they set the run's length.
"""

from __future__ import annotations

import logging
import os
import signal
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support import TEST_BROKER, TEST_KAFKA_OVERRIDES

SUITE_BOOTSTRAP = "RETRYD_SUITE_BOOTSTRAP"
# Tests that inject faults or time themselves against a clock: one group, never two at once.
SERIAL_GROUP = "serial"
SERIAL_PATHS = (
    "tests/chaos/",
    "tests/integration/test_bench_",
    "tests/integration/test_circuit_outage.py",
)
# Tests on the Spark session (a JVM that loads both cores): one group, one session.
SPARK_GROUP = "spark"
SPARK_PATHS = (
    "tests/integration/test_spark_",
    "tests/integration/test_foreign_dead_letters.py",  # shares the Spark session
    "tests/integration/test_bench_datasource_quick.py",  # so does this benchmark's quick mode
)
# Long tests that start servers of their own and time nothing against a clock: each a group of
# its own, so that they run beside the serial group instead of lengthening it (the Spark
# standalone cluster's tests alone are about 6 minutes).
OWN_GROUP_PATHS = ("tests/integration/test_spark_cluster.py",)
ROOT = Path(__file__).resolve().parents[1]
_BROKER = pytest.StashKey[Any]()  # the broker a parallel run's controlling process started


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


def _start_broker(directory: Path) -> Any:
    """The suite's broker, started (``stop()`` stops it by PID)."""
    if TEST_BROKER == "tansu":
        from retryd.kafka.embedded import EmbeddedBroker

        return EmbeddedBroker(log_file=directory / "tansu.log").start()
    from retryd.kafka.apache import ApacheKafkaBroker

    return ApacheKafkaBroker(
        log_file=directory / "kafka.log", overrides=TEST_KAFKA_OVERRIDES
    ).start(timeout_s=180)


def _parallel_controller(config: pytest.Config) -> bool:
    """This process distributes tests to xdist workers (and runs none itself)."""
    workers = getattr(config.option, "numprocesses", None)
    return bool(workers) and not hasattr(config, "workerinput")


def _interrupted(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def pytest_configure(config: pytest.Config) -> None:
    # A run stopped with SIGTERM unwinds as Ctrl-C does: tests' finally blocks and fixtures'
    # teardowns stop the brokers and workers they started, by PID. (Python's default ends the
    # process on the spot and leaves them running, orphaned.)
    signal.signal(signal.SIGTERM, _interrupted)
    if not _parallel_controller(config) or os.environ.get("RETRYD_TEST_BOOTSTRAP"):
        return
    # Set before the workers start, so they inherit it.
    directory = Path(tempfile.mkdtemp(prefix="retryd-suite-broker-"))
    broker = _start_broker(directory)
    config.stash[_BROKER] = broker
    os.environ[SUITE_BOOTSTRAP] = broker.bootstrap


def pytest_unconfigure(config: pytest.Config) -> None:
    broker = config.stash.get(_BROKER, None)
    if broker is not None:
        broker.stop()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not hasattr(config, "workerinput"):
        return
    # the long groups first (they set the run's length); the scheduler keeps this order
    first = (SERIAL_GROUP, SPARK_GROUP, *OWN_GROUP_PATHS)
    rank = {group: i for i, group in enumerate(first)}
    items.sort(
        key=lambda item: rank.get(
            group_of(item.path.resolve().relative_to(ROOT).as_posix()), len(first)
        )
    )  # stable: each group keeps its collection order


def group_of(path: str) -> str:
    """The worker group of a test file (a path relative to the repository): the serial or
    the Spark group (but for ``OWN_GROUP_PATHS``), the browser package (one chromium and its
    sidecars), else the file itself."""
    if path in OWN_GROUP_PATHS:
        return path
    if path.startswith(SPARK_PATHS):
        return SPARK_GROUP
    if path.startswith(SERIAL_PATHS):
        return SERIAL_GROUP
    if path.startswith("tests/browser/"):
        return "tests/browser"
    return path


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadgroup`` with the suite's groups, decided from each test's path.

    xdist's own loadgroup reads ``xdist_group`` marks through a suffix it writes into each
    test's node id; pytest 9.2 builds node ids another way and the suffix no longer takes
    (pytest-xdist issue 1386), so every test became a group of its own: a file's module
    fixtures started on both workers and the fault-injection tests ran beside each other.
    Grouping by path needs no marks. Groups go out in collection order (long ones first)."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class SuiteGroups(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return scope_of(nodeid)

    config.option.loadscopereorder = False  # keep the order above, not "most tests first"
    return SuiteGroups(config, log)


def scope_of(nodeid: str) -> str:
    """The group of a test's node id (``path::name``, maybe with xdist's ``@group``)."""
    return group_of(nodeid.split("::", 1)[0])


@pytest.fixture(scope="session")
def bootstrap(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    shared = os.environ.get("RETRYD_TEST_BOOTSTRAP") or os.environ.get(SUITE_BOOTSTRAP)
    if shared:
        yield shared
        return
    broker = _start_broker(tmp_path_factory.mktemp("broker"))
    try:
        yield broker.bootstrap
    finally:
        broker.stop()


@pytest.fixture(autouse=True)
def _root_logging_restored() -> Iterator[None]:
    """The CLI, run in-process by a test, replaces the root logger's handlers with one on the
    test's captured stderr: put back after the test, so that a thread logging later (a handler
    call abandoned by an earlier test) never writes to a closed capture file."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
