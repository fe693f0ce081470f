"""Chaos suite fixtures: the session's report, sizes and seed (see ``scale`` and ``report``),
and the three-node Apache Kafka cluster of the replicated scenarios (``cluster``)."""

from __future__ import annotations

import random
from collections.abc import Iterator

import pytest

from retryd.kafka.apache import DEFAULT_VERSION, ApacheKafkaCluster, provision
from tests.chaos.cluster import Nodes, why_no_cluster
from tests.chaos.report import ChaosReport, report_path
from tests.chaos.scale import Sizes, scale, seed, sizes
from tests.support import TEST_KAFKA_OVERRIDES


@pytest.fixture(scope="session")
def chaos_seed() -> int:
    value = seed()
    print(f"\nchaos seed: {value} (RETRYD_CHAOS_SEED={value} repeats this run's choices)")
    return value


@pytest.fixture(scope="session")
def chaos_report(tmp_path_factory: pytest.TempPathFactory, chaos_seed: int) -> ChaosReport:
    path = report_path(tmp_path_factory.getbasetemp())
    print(f"\nchaos report: {path}")
    return ChaosReport(path, scale(), chaos_seed)


@pytest.fixture(scope="session")
def chaos_sizes() -> Sizes:
    return sizes()


@pytest.fixture
def chaos_rng(request: pytest.FixtureRequest, chaos_seed: int) -> random.Random:
    """A random source per scenario, independent of which scenarios run and in what order."""
    return random.Random(f"{chaos_seed}:{request.node.name}")


@pytest.fixture(scope="module")
def kafka_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Nodes]:
    """Three Apache Kafka nodes for one test module (a start costs ~5 s; module scope frees
    three JVMs as soon as the module is done). Every node is stopped by PID in the finalizer,
    however the module ended; the nodes' logs stay in pytest's temporary directory."""
    reason = why_no_cluster(DEFAULT_VERSION)
    if reason:
        pytest.skip(reason)
    provision(DEFAULT_VERSION)
    nodes = ApacheKafkaCluster(
        3,
        version=DEFAULT_VERSION,
        base_dir=tmp_path_factory.mktemp("cluster"),
        overrides=TEST_KAFKA_OVERRIDES,
    )
    try:
        nodes.start(timeout_s=180)
        print(f"\ncluster: Apache Kafka {nodes.version} at {nodes.bootstrap} ({nodes.base_dir})")
        yield Nodes(nodes)
    finally:
        nodes.stop()


@pytest.fixture
def cluster(kafka_cluster: Nodes) -> Nodes:
    """The module's cluster, whole again: a scenario that failed half-way may have left a node
    down or paused."""
    kafka_cluster.heal()
    return kafka_cluster
