"""What the chaos scenarios of share mode ask the cluster about a share group, in the Kafka
protocol itself: confluent-kafka 2.16's ``AdminClient`` has no call for either.

- ``FindCoordinator`` (v6) with key type ``share`` (2): the *share coordinator* of each
  share-partition (KIP-932). Its key is ``<group>:<topic id>:<partition>``, and the node it
  names leads the ``__share_group_state`` partition that keeps that share-partition's state
  (start offset, acquired and acknowledged ranges); key type ``group`` (0) names the group
  coordinator (members, assignment), the leader of the group's ``__consumer_offsets``
  partition, as for a consumer group.
- ``DescribeShareGroupOffsets`` (v1), sent to the group coordinator: each share-partition's
  start offset (SPSO: every record below it is acknowledged or archived) and lag, what
  ``kafka-share-groups.sh --describe --offsets`` prints. A share-partition is settled when its
  lag is 0: nothing acquired, released or left to hand out.

One request per connection, with a deadline (``retryd.kafka.wire``, the encoding retryd's own
share-lag reader speaks; the offsets come from that reader's ``ShareOffsetsClient``): a probe
is rare, and a node that was just killed must cost a refused connection, not a client's
reconnect loop.
"""

from __future__ import annotations

import base64
import struct

from confluent_kafka import Consumer, TopicCollection, TopicPartition
from confluent_kafka.admin import AdminClient

from retryd.errors import KafkaRuntimeError
from retryd.kafka.share_offsets import FIND_COORDINATOR, ShareOffsetsClient
from retryd.kafka.wire import Connection, Writer

KEY_GROUP = 0
KEY_SHARE = 2
FIND_COORDINATOR_VERSION = 6  # key type share needs v6
TIMEOUT_S = 5.0


class ProbeError(Exception):
    """The cluster did not answer a probe (a node down, no coordinator yet): ask again."""


def find_coordinators(
    addresses: list[str], key_type: int, keys: list[str]
) -> dict[str, tuple[int, str]]:
    """The node coordinating each key (its id and ``host:port``), asked of the first of
    ``addresses`` that answers; raises ``ProbeError`` when a key has none now (the leader of
    its partition is being elected)."""
    w = Writer().int8(key_type).compact_array_length(len(keys))
    for key in keys:
        w.compact_string(key)
    body = w.no_tags().bytes()
    errors = []
    for address in addresses:
        host, _, port = address.rpartition(":")
        try:
            with Connection(host, int(port), None, TIMEOUT_S, client_id="retryd-chaos") as conn:
                r = conn.request(
                    FIND_COORDINATOR,
                    FIND_COORDINATOR_VERSION,
                    body,
                    flexible=True,
                    what="FindCoordinator",
                )
                break
        except KafkaRuntimeError as exc:
            errors.append(str(exc))
    else:
        raise ProbeError("no node answered: " + "; ".join(errors))
    r.int32()  # throttle
    out: dict[str, tuple[int, str]] = {}
    problems = []
    for _ in range(r.compact_array_length(15)):
        key, node = r.compact_string() or "", r.int32()
        where = f"{r.compact_string()}:{r.int32()}"
        error, message = r.int16(), r.compact_string()
        r.skip_tags()
        if error:
            problems.append(f"{key}: error {error} {message or ''}")
        else:
            out[key] = (node, where)
    if problems:
        raise ProbeError("; ".join(problems))
    return out


class ShareProbe:
    """The facts of one share group reading one topic, on the cluster at ``bootstrap``."""

    def __init__(self, bootstrap: str, group: str, topic: str) -> None:
        self.addresses = bootstrap.split(",")
        self.group = group
        self.topic = topic
        admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
        description = admin.describe_topics(TopicCollection([topic]))[topic].result(15)
        uuid = description.topic_id
        bits = (uuid.get_most_significant_bits(), uuid.get_least_significant_bits())
        raw = struct.pack(">qq", *bits)
        # Kafka's Uuid.toString(): URL-safe base64, unpadded (the client's str() is plain
        # base64: a "/" or "+" in it makes the key invalid, error 42)
        self.topic_id = base64.urlsafe_b64encode(raw).decode().rstrip("=")
        self.partitions = sorted(p.id for p in description.partitions)
        self.bootstrap = bootstrap

    def share_keys(self) -> dict[int, str]:
        return {p: f"{self.group}:{self.topic_id}:{p}" for p in self.partitions}

    def share_coordinators(self) -> dict[int, int]:
        """Partition -> node id of its share coordinator."""
        keys = self.share_keys()
        found = find_coordinators(self.addresses, KEY_SHARE, list(keys.values()))
        return {p: found[k][0] for p, k in keys.items()}

    def group_coordinator(self) -> tuple[int, str]:
        """The node id and address of the group coordinator of the share group."""
        return find_coordinators(self.addresses, KEY_GROUP, [self.group])[self.group]

    def behind(self) -> list[str]:
        """Share-partitions with records not yet acknowledged (acquired, released, or not
        handed out yet), each as ``p<n>: start/end lag <n>``; [] when the group is settled.

        The broker's lag is the measure (records between the start offset and the end not
        yet delivery-complete): the start offset it reports stays behind the end although
        everything was acknowledged (seen on 4.4: start 1 of 4, lag 0, all 4 accepted), so
        "start offset == end" would wait for ever."""
        try:
            client = ShareOffsetsClient({"bootstrap.servers": self.bootstrap}, self.group)
            offsets = {p.partition: p for p in client.describe([self.topic])}
        except KafkaRuntimeError as exc:  # a node down, no coordinator yet: ask again
            raise ProbeError(str(exc)) from exc
        for got in offsets.values():
            if got.error_code:
                raise ProbeError(f"{self.topic}[{got.partition}]: error {got.error_code}")
        ends = _high_watermarks(self.bootstrap, self.topic, self.partitions)
        out = []
        for p in self.partitions:
            got = offsets.get(p)
            start, lag = (got.start_offset, got.lag) if got else (-1, -1)
            if ends[p] == 0 or lag == 0 or (lag < 0 and start >= ends[p]):
                continue
            out.append(f"p{p}: {start}/{ends[p]} lag {lag}")
        return out


def _high_watermarks(bootstrap: str, topic: str, partitions: list[int]) -> dict[int, int]:
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "retryd-chaos-probe", "log_level": 0}
    )
    try:
        out = {}
        for p in partitions:
            _, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
            out[p] = high
        return out
    finally:
        consumer.close()
