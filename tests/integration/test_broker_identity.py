"""The suite runs on the broker it says it runs on: Apache Kafka unless RETRYD_TEST_BROKER=tansu,
so a missing JVM or a failed provisioning can never fall back silently to the stand-in."""

from __future__ import annotations

import os

import pytest
from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType

from tests.support import TEST_BROKER


def test_the_session_broker_is_apache_kafka_in_kraft_mode(bootstrap: str) -> None:
    if TEST_BROKER == "tansu" and not os.environ.get("RETRYD_TEST_BOOTSTRAP"):
        pytest.skip("RETRYD_TEST_BROKER=tansu: the suite runs on the embedded stand-in")
    admin = AdminClient({"bootstrap.servers": bootstrap})
    cluster = admin.describe_cluster().result(15)
    assert cluster.nodes, "DescribeCluster names the nodes"
    node = str(cluster.nodes[0].id)
    resource = ConfigResource(ResourceType.BROKER, node)
    configs = admin.describe_configs([resource])[resource].result(15)
    # KRaft brokers report their roles; the stand-in has no broker configs of this kind.
    roles = configs["process.roles"].value
    assert roles and "broker" in roles
    if not os.environ.get("RETRYD_TEST_BOOTSTRAP"):
        from retryd.kafka.apache import resolve_version

        assert roles == "broker,controller"
        version = resolve_version(None)
        print(f"suite broker: Apache Kafka {version} at {bootstrap} (node {node}, {roles})")
