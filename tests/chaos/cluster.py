"""The three-node Apache Kafka cluster of the replicated scenarios, and what they ask of it.

``Nodes`` wraps ``retryd.kafka.apache.ApacheKafkaCluster`` (three KRaft nodes on loopback,
each a broker and a controller voter) with the faults the scenarios inject (SIGKILL, SIGSTOP
and SIGCONT, a clean stop, a restart: each node by its PID) and the facts they wait on, read
from the cluster itself: who leads which partition, who is in sync, who coordinates a group.
It remembers which nodes it took down or paused, so ``heal`` can bring a shared cluster back
whole before the next scenario, whatever the last one left behind.
"""

from __future__ import annotations

import os
import shutil
import time
from collections import Counter
from collections.abc import Iterable

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from retryd.errors import BrokerStartError
from retryd.kafka.apache import ApacheKafkaBroker, ApacheKafkaCluster, cache_root, java_binary
from tests.support import TEST_BROKER, wait_for

REPLICATION = 3
MIN_INSYNC = 2
OFFSETS_TOPIC = "__consumer_offsets"
NODE_START_S = 120.0

Where = tuple[str, int]  # (topic, partition)


def why_no_cluster(version: str) -> str | None:
    """Why the replicated scenarios cannot run here (skipped, not failed), or None."""
    if os.environ.get("RETRYD_TEST_BOOTSTRAP") or TEST_BROKER != "kafka":
        return "the replicated scenarios start Apache Kafka of their own (RETRYD_TEST_BROKER=kafka)"
    try:
        java_binary()
    except BrokerStartError as exc:
        return str(exc)
    if not shutil.which("mvn") and not (cache_root() / version / "provisioned").exists():
        return "Maven (mvn) is not installed and Kafka is not provisioned"
    return None


class Nodes:
    """A running ``ApacheKafkaCluster`` and the faults and look-ups of the scenarios."""

    def __init__(self, cluster: ApacheKafkaCluster) -> None:
        self.cluster = cluster
        self.paused: set[int] = set()

    @property
    def bootstrap(self) -> str:
        return self.cluster.bootstrap

    @property
    def version(self) -> str:
        return self.cluster.version

    def node(self, node_id: int) -> ApacheKafkaBroker:
        return self.cluster.node(node_id)

    @property
    def ids(self) -> list[int]:
        return [n.node_id for n in self.cluster.nodes]

    # -- faults, each by the node's PID ------------------------------------------------
    def kill(self, node_id: int) -> int:
        """SIGKILL: a crash; returns the PID that was killed."""
        node = self.node(node_id)
        pid = node.pid
        assert pid is not None, f"node {node_id} is not running"
        node.kill()
        self.paused.discard(node_id)
        return pid

    def stop(self, node_id: int) -> int:
        """SIGTERM: a controlled shutdown (leadership handed over first); returns the PID."""
        node = self.node(node_id)
        pid = node.pid
        assert pid is not None, f"node {node_id} is not running"
        node.stop(timeout_s=60)
        return pid

    def pause(self, node_id: int) -> int:
        node = self.node(node_id)
        assert node.pid is not None, f"node {node_id} is not running"
        node.pause()
        self.paused.add(node_id)
        return node.pid

    def resume(self, node_id: int) -> None:
        self.node(node_id).resume()
        self.paused.discard(node_id)

    def start(self, node_id: int) -> float:
        """Start a node that is down again (same id, ports and data); returns the seconds
        until it served metadata naming itself."""
        began = time.monotonic()
        self.node(node_id).start(timeout_s=NODE_START_S)
        return round(time.monotonic() - began, 1)

    def heal(self, timeout_s: float = 180.0) -> None:
        """Every node running and unpaused, and every existing partition fully in sync: what
        a scenario may assume when it starts."""
        for node_id in list(self.paused):
            self.resume(node_id)
        for node in self.cluster.nodes:
            if node.process is None:
                node.start(timeout_s=NODE_START_S)
        self.wait_in_sync(self.topics(), timeout_s)

    # -- facts -------------------------------------------------------------------------
    def _admin(self) -> AdminClient:
        """A client of the nodes that can answer: a fresh one per look-up, bootstrapped from
        the running, unpaused nodes. A long-lived client keeps sending its requests to a
        node it is connected to, and a SIGSTOPped node holds each one until it times out
        (seen: metadata from a paused node's connection, 5 s per attempt, for a minute)."""
        up = [
            n.bootstrap
            for n in self.cluster.nodes
            if n.process is not None and n.node_id not in self.paused
        ]
        return AdminClient({"bootstrap.servers": ",".join(up), "log_level": 0})

    def topics(self) -> list[str]:
        md = self._admin().list_topics(timeout=10)
        return sorted(t for t, m in md.topics.items() if m.error is None)

    def describe(
        self, topics: Iterable[str], timeout_s: float = 5.0
    ) -> dict[Where, tuple[int, frozenset[int], int]] | None:
        """(leader or -1, in-sync replicas, replica count) per partition, as the cluster says
        now; None when it does not answer in time or does not know a topic yet.

        A metadata request, which any live node answers: librdkafka sends DescribeTopics to
        the node metadata named as controller (in KRaft a live broker picked at random) and,
        when that node is killed, keeps waiting for it ("Timed out waiting for controller")
        for as long as the client lives."""
        names = set(topics)
        if not names:
            return {}
        try:
            md = self._admin().list_topics(timeout=timeout_s)
        except KafkaException:
            return None
        out: dict[Where, tuple[int, frozenset[int], int]] = {}
        for name in names:
            topic = md.topics.get(name)
            if topic is None or topic.error is not None:
                return None
            for p in topic.partitions.values():
                out[(name, p.id)] = (p.leader, frozenset(p.isrs), len(p.replicas))
        return out

    def _described(
        self, topics: Iterable[str], timeout_s: float = 60.0
    ) -> dict[Where, tuple[int, frozenset[int], int]]:
        return wait_for(
            lambda: self.describe(topics), timeout_s, 0.5, what=f"a description of {topics}"
        )

    def partitions(self, topics: Iterable[str]) -> int:
        return len(self._described(topics))

    def led_by(self, node_id: int, topics: Iterable[str]) -> list[Where]:
        return sorted(
            w for w, (leader, _, _) in self._described(topics).items() if leader == node_id
        )

    def busiest_leader(self, topics: Iterable[str]) -> int:
        """The node leading the most partitions of ``topics`` (the lowest id on a tie)."""
        counts = Counter(leader for leader, _, _ in self._described(topics).values())
        counts.pop(-1, None)
        assert counts, f"no partition of {topics} has a leader"
        return min(counts, key=lambda n: (-counts[n], n))

    def coordinator(self, group: str) -> int:
        return wait_for(
            lambda: self.coordinator_now(group), 60, 0.5, what=f"the coordinator of {group}"
        )

    def coordinator_now(self, group: str) -> int | None:
        """The group's coordinator as the cluster reports it now; None without an answer."""
        try:
            return self.cluster.coordinator_of(group, timeout_s=5)
        except (KafkaException, KeyError, TimeoutError):
            return None

    # -- waiting on the cluster ----------------------------------------------------------
    def wait_led_elsewhere(
        self, where: list[Where], old: int | set[int], began: float, timeout_s: float = 120.0
    ) -> float:
        """Until every partition of ``where`` has a leader that is neither ``old`` nor none;
        returns the seconds since ``began`` (the fault)."""
        gone = {old} if isinstance(old, int) else old
        topics = sorted({t for t, _ in where})

        def moved() -> bool:
            desc = self.describe(topics)
            return desc is not None and all(desc[w][0] not in (-1, *gone) for w in where)

        wait_for(moved, timeout_s, 0.25, what=f"new leaders for {where} (not {gone})")
        return round(time.monotonic() - began, 1)

    def wait_out_of_sync(
        self, node_id: int, topics: Iterable[str], timeout_s: float = 120.0
    ) -> None:
        """Until ``node_id`` is in no in-sync replica set of ``topics`` (fenced or shut down)."""
        names = list(topics)

        def out() -> bool:
            desc = self.describe(names)
            return desc is not None and all(node_id not in isr for _, isr, _ in desc.values())

        wait_for(out, timeout_s, 0.25, what=f"node {node_id} out of the ISRs of {names}")

    def wait_in_sync(self, topics: Iterable[str], timeout_s: float = 180.0) -> float:
        """Until every partition of ``topics`` has all its replicas in sync; returns seconds."""
        names = list(topics)
        began = time.monotonic()

        def whole() -> bool:
            desc = self.describe(names)
            return desc is not None and all(len(isr) == n for _, isr, n in desc.values())

        wait_for(whole, timeout_s, 0.25, what=f"every replica of {len(names)} topics in sync")
        return round(time.monotonic() - began, 1)

    def under_min_insync(self, topics: Iterable[str]) -> int:
        """Partitions of ``topics`` with fewer in-sync replicas than min.insync.replicas."""
        desc = self._described(topics)
        return sum(1 for _, isr, _ in desc.values() if len(isr) < MIN_INSYNC)
