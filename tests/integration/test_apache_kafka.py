"""The real Apache Kafka broker provisioned from Maven Central (retryd.kafka.apache).

Slow (a JVM per node; the first run downloads ~45 MB of jars per version): marked ``slow``,
run with ``pytest -m slow tests/integration/test_apache_kafka.py``. Skipped, not failed, on a
machine without Java or without Maven and no provisioned copy.

Every process is stopped by PID through a finalizer registered *before* it starts, so a
failing start or assertion never leaves a JVM behind.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, TopicCollection, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic, ResourceType

from retryd.errors import BrokerStartError
from retryd.kafka.apache import (
    DEFAULT_VERSION,
    OLDEST_VERSION,
    ApacheKafkaBroker,
    ApacheKafkaCluster,
    cache_root,
    java_binary,
    provision,
)
from tests.support import produce, read_topic, unique, wait_for

pytestmark = pytest.mark.slow

_COORDINATOR_MOVING = {
    KafkaError.NOT_COORDINATOR,
    KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
    KafkaError.COORDINATOR_NOT_AVAILABLE,
}


def _provisioned(version: str) -> None:
    """Provision ``version`` or skip when the tools to run it are absent."""
    try:
        java_binary()
    except BrokerStartError as exc:
        pytest.skip(str(exc))
    if not shutil.which("mvn") and not (cache_root() / version / "provisioned").exists():
        pytest.skip("Maven (mvn) is not installed and Kafka is not provisioned")
    provision(version)


def _pid_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def _create(bootstrap: str, topic: str, partitions: int, replication: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([NewTopic(topic, partitions, replication)], operation_timeout=30)
    futures[topic].result(40)


def _offsets_partition(group: str, partitions: int = 50) -> int:
    """The ``__consumer_offsets`` partition of ``group``, whose leader is its coordinator:
    Kafka's ``Utils.abs(group.hashCode()) % partitions``, where ``hashCode`` is Java's signed
    32-bit ``String.hashCode`` (ASCII ids here) and ``Utils.abs(Integer.MIN_VALUE)`` is 0."""
    h = 0
    for ch in group:
        h = (31 * h + ord(ch)) & 0xFFFFFFFF
    signed = h - (1 << 32) if h >= 1 << 31 else h
    return (0 if signed == -(1 << 31) else abs(signed)) % partitions


def _isr(bootstrap: str, topic: str, partition: int) -> set[int]:
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
    desc = admin.describe_topics(TopicCollection([topic]))[topic].result(10)
    return {n.id for n in desc.partitions[partition].isr}


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[ApacheKafkaCluster]:
    _provisioned(DEFAULT_VERSION)
    # under tmp_path, the nodes' logs outlive a failure (pytest keeps the last 3 runs)
    nodes = ApacheKafkaCluster(3, version=DEFAULT_VERSION, base_dir=tmp_path / "cluster")
    try:
        nodes.start()
        yield nodes
    finally:
        nodes.stop()  # every node by PID: SIGTERM, SIGKILL at the deadline


@pytest.mark.parametrize("version", [DEFAULT_VERSION, OLDEST_VERSION])
def test_single_node_is_apache_kafka(
    version: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    _provisioned(version)
    broker = ApacheKafkaBroker(version=version, work_dir=tmp_path / "broker")
    request.addfinalizer(broker.stop)
    broker.start()
    pid = broker.pid
    assert pid is not None

    topic = unique("apache")
    _create(broker.bootstrap, topic, 1, 1)
    produce(broker.bootstrap, topic, [(b"k", b"hello kafka")])
    [record] = read_topic(broker.bootstrap, topic, expect=1)
    assert (record.key, record.value) == (b"k", b"hello kafka")

    # Proof that this is Apache Kafka in KRaft mode and not Tansu (which also answers
    # Metadata/Produce/Fetch): the broker's own `process.roles` config, which only a KRaft
    # node has, and the cluster id the storage was formatted with, echoed by DescribeCluster.
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    resource = ConfigResource(ResourceType.BROKER, str(broker.node_id))
    configs = admin.describe_configs([resource])[resource].result(10)
    assert configs["process.roles"].value == "broker,controller"
    assert configs["auto.create.topics.enable"].value == "false"
    assert admin.describe_cluster().result(10).cluster_id == broker.cluster_id

    broker.stop()
    assert broker.pid is None
    assert wait_for(lambda: _pid_gone(pid), 10, what=f"pid {pid} to be gone")


def test_three_node_cluster_survives_losing_a_leader(cluster: ApacheKafkaCluster) -> None:
    assert len(cluster.bootstrap.split(",")) == 3
    assert all(n.pid is not None for n in cluster)

    topic = unique("replicated")
    _create(cluster.bootstrap, topic, 3, 3)
    produce(cluster.bootstrap, topic, [(b"before", b"1")], partition=0)
    assert _isr(cluster.bootstrap, topic, 0) == {1, 2, 3}

    old = cluster.leader_of(topic, 0)
    victim = cluster.node(old)
    victim_pid = victim.pid
    assert victim_pid is not None
    victim.kill()
    assert _pid_gone(victim_pid)

    def new_leader() -> int:
        try:
            leader = cluster.leader_of(topic, 0, timeout_s=5)
        except Exception:  # the request may hit the dead node first
            return 0
        return leader if leader not in (old, -1) else 0

    # the controller fences the dead node after broker.session.timeout.ms (9 s)
    started = time.monotonic()
    leader = wait_for(new_leader, 60, interval=0.5, what=f"a leader other than {old}")
    assert leader in {1, 2, 3} - {old}
    print(f"new leader of {topic}-0: node {leader} after {time.monotonic() - started:.1f}s")

    # acks=all with 2 of 3 replicas in sync (min.insync.replicas=2) still succeeds
    produce(cluster.bootstrap, topic, [(b"after", b"2")], partition=0)
    values = [r.value for r in read_topic(cluster.bootstrap, topic, expect=2) if r.partition == 0]
    assert values == [b"1", b"2"]

    victim.restart()
    assert victim.pid is not None and victim.pid != victim_pid
    wait_for(
        lambda: old in _isr(cluster.bootstrap, topic, 0),
        60,
        interval=0.5,
        what=f"node {old} back in the ISR",
    )


def test_coordinator_of_names_the_offsets_partition_leader(cluster: ApacheKafkaCluster) -> None:
    topic, group = unique("coord"), unique("group")
    _create(cluster.bootstrap, topic, 1, 3)
    produce(cluster.bootstrap, topic, [(None, b"x")])
    consumer = Consumer(
        {"bootstrap.servers": cluster.bootstrap, "group.id": group, "enable.auto.commit": False}
    )

    def committed() -> bool:
        # The first commit creates __consumer_offsets (50 partitions, RF 3); until their
        # leaders have loaded them, a commit fails with the retriable NOT_COORDINATOR.
        try:
            consumer.commit(offsets=[TopicPartition(topic, 0, 1)], asynchronous=False)
        except KafkaException as exc:
            if exc.args[0].code() not in _COORDINATOR_MOVING and not exc.args[0].retriable():
                raise
            return False
        return True

    try:  # a committed offset makes the group exist
        wait_for(committed, 30, interval=0.5, what=f"a commit by {group}")
    finally:
        consumer.close()

    coordinator = cluster.coordinator_of(group)
    assert coordinator in {1, 2, 3}
    assert coordinator == cluster.leader_of("__consumer_offsets", _offsets_partition(group))
