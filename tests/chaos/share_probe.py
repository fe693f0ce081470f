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

One request per connection, on a plain socket with a deadline: a probe is rare, and a node
that was just killed must cost a refused connection, not a client's reconnect loop.
"""

from __future__ import annotations

import base64
import socket
import struct
from dataclasses import dataclass

from confluent_kafka import Consumer, TopicCollection, TopicPartition
from confluent_kafka.admin import AdminClient

KEY_GROUP = 0
KEY_SHARE = 2
FIND_COORDINATOR = (10, 6)  # (API key, version)
DESCRIBE_SHARE_OFFSETS = (90, 1)
TIMEOUT_S = 5.0


class ProbeError(Exception):
    """The cluster did not answer a probe (a node down, no coordinator yet): ask again."""


# -- the flexible ("compact") encodings of the Kafka protocol ------------------------------
def _uvarint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _cstr(s: str) -> bytes:
    raw = s.encode()
    return _uvarint(len(raw) + 1) + raw


def _carray(items: list[bytes]) -> bytes:
    return _uvarint(len(items) + 1) + b"".join(items)


NO_TAGS = b"\x00"


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data = data
        self.at = 0

    def take(self, fmt: str) -> int:
        (value,) = struct.unpack_from(fmt, self.data, self.at)
        self.at += struct.calcsize(fmt)
        return int(value)

    def uvarint(self) -> int:
        shift = value = 0
        while True:
            byte = self.data[self.at]
            self.at += 1
            value |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return value
            shift += 7

    def cstr(self) -> str | None:
        n = self.uvarint()
        if n == 0:
            return None
        raw = self.data[self.at : self.at + n - 1]
        self.at += n - 1
        return raw.decode()

    def count(self) -> int:
        return self.uvarint() - 1

    def tags(self) -> None:
        for _ in range(self.uvarint()):
            self.uvarint()
            self.at += self.uvarint()


def _request(address: str, api: tuple[int, int], body: bytes) -> _Reader:
    """One request (header v2) to ``host:port``; the response after its header (v1)."""
    host, _, port = address.rpartition(":")
    client = b"retryd-chaos"
    header = struct.pack(">hhih", api[0], api[1], 1, len(client)) + client + NO_TAGS
    frame = header + body
    try:
        with socket.create_connection((host, int(port)), TIMEOUT_S) as sock:
            sock.settimeout(TIMEOUT_S)
            sock.sendall(struct.pack(">i", len(frame)) + frame)
            size = struct.unpack(">i", _recv(sock, 4))[0]
            reader = _Reader(_recv(sock, size))
    except OSError as exc:
        raise ProbeError(f"{address}: {exc}") from exc
    reader.take(">i")  # correlation id
    reader.tags()
    return reader


def _recv(sock: socket.socket, n: int) -> bytes:
    out = bytearray()
    while len(out) < n:
        chunk = sock.recv(n - len(out))
        if not chunk:
            raise ProbeError("connection closed mid-response")
        out += chunk
    return bytes(out)


def _first_answer(addresses: list[str], api: tuple[int, int], body: bytes) -> _Reader:
    errors = []
    for address in addresses:
        try:
            return _request(address, api, body)
        except ProbeError as exc:
            errors.append(str(exc))
    raise ProbeError("no node answered: " + "; ".join(errors))


# -- the two probes --------------------------------------------------------------------------
def find_coordinators(
    addresses: list[str], key_type: int, keys: list[str]
) -> dict[str, tuple[int, str]]:
    """The node coordinating each key (its id and ``host:port``), asked of the first of
    ``addresses`` that answers; raises ``ProbeError`` when a key has none now (the leader of
    its partition is being elected)."""
    body = struct.pack(">b", key_type) + _carray([_cstr(k) for k in keys]) + NO_TAGS
    r = _first_answer(addresses, FIND_COORDINATOR, body)
    r.take(">i")  # throttle
    out: dict[str, tuple[int, str]] = {}
    problems = []
    for _ in range(r.count()):
        key = r.cstr() or ""
        node = r.take(">i")
        host = r.cstr()
        port = r.take(">i")
        error = r.take(">h")
        message = r.cstr()
        r.tags()
        if error:
            problems.append(f"{key}: error {error} {message or ''}")
        else:
            out[key] = (node, f"{host}:{port}")
    if problems:
        raise ProbeError("; ".join(problems))
    return out


@dataclass(frozen=True)
class ShareOffsets:
    partition: int
    start_offset: int  # -1: the group has no state for it yet
    lag: int  # -1: the broker did not compute it


def describe_share_offsets(
    address: str, group: str, topic: str, partitions: list[int]
) -> dict[int, ShareOffsets]:
    """``DescribeShareGroupOffsets`` for ``partitions`` of ``topic``, sent to ``address`` (the
    group coordinator's). Kafka 4.4 answers an empty partition list with an unknown server
    error ("partitions cannot be null or empty"): they are named."""
    wanted = _carray([struct.pack(">i", p) for p in partitions])
    topics = _carray([_cstr(topic) + wanted + NO_TAGS])
    body = _carray([_cstr(group) + topics + NO_TAGS]) + NO_TAGS
    r = _request(address, DESCRIBE_SHARE_OFFSETS, body)
    r.take(">i")  # throttle
    out: dict[int, ShareOffsets] = {}
    for _ in range(r.count()):
        r.cstr()  # group id
        for _ in range(r.count()):
            r.cstr()  # topic name
            r.at += 16  # topic id
            for _ in range(r.count()):
                partition = r.take(">i")
                start = r.take(">q")
                r.take(">i")  # leader epoch
                lag = r.take(">q")
                error = r.take(">h")
                message = r.cstr()
                r.tags()
                if error:
                    raise ProbeError(f"{topic}[{partition}]: error {error} {message or ''}")
                out[partition] = ShareOffsets(partition, start, lag)
            r.tags()
        error = r.take(">h")
        message = r.cstr()
        r.tags()
        if error:
            raise ProbeError(f"share group {group}: error {error} {message or ''}")
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
        _, address = self.group_coordinator()
        offsets = describe_share_offsets(address, self.group, self.topic, self.partitions)
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
