"""A share group's offsets, read the way ``kafka-share-groups.sh --describe`` reads them.

Kafka exposes a share group's progress per partition as its *share-partition start offset*
(every record before it is acknowledged or archived) and, from Kafka 4.2 (KIP-1226,
DescribeShareGroupOffsets v1), the broker's own *lag* (records from the start offset to the
high watermark not yet acknowledged). A consumer group's committed offsets say nothing about
it, and librdkafka 2.16 has no share-group admin API: this module speaks the three requests
needed itself (``retryd.kafka.wire``), over one short-lived connection per step:

1. ApiVersions (v0, which every broker answers) on a bootstrap server: which versions of the
   next two requests the broker speaks;
2. FindCoordinator for the group: a share group is managed by the *group* coordinator (key
   type 0), as a consumer group is (key type 2, "share", finds the share-*state* coordinator
   of one partition, ``group:topicId:partition``, which a client never asks);
3. DescribeShareGroupOffsets (key 90) on that coordinator, for every topic (null topics).

Security: PLAINTEXT and SSL, from the same librdkafka properties every retryd client uses
(``security.protocol``, ``ssl.ca.location``/``ssl.ca.pem``, ``ssl.certificate.location``,
``ssl.key.location``, ``ssl.key.password``, ``enable.ssl.certificate.verification``,
``ssl.endpoint.identification.algorithm``). Anything else (SASL, PKCS#12 keystores, inline
certificates) raises ``ShareOffsetsUnsupported`` naming the fallback, the Kafka script.
Bounded: every socket operation has the deadline of its request, and a response larger than
``max_response_bytes`` is refused before it is read.

Errors: a broker's error code raises ``ShareOffsetsError``; everything else that fails on the
way (a connection, a timeout, a response that does not decode, a coordinator address that is
no address) raises ``WireError``. Each decoder is wrapped by ``wire.decoder``, so a check
missed here still surfaces as ``WireError`` and never as ``IndexError`` or ``UnicodeError``.
"""

from __future__ import annotations

import logging
import ssl
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from retryd.errors import KafkaRuntimeError
from retryd.kafka.wire import (
    API_VERSIONS,
    MAX_RESPONSE_BYTES,
    Connection,
    Reader,
    WireError,
    Writer,
    check_address,
    decoder,
)

log = logging.getLogger(__name__)

FIND_COORDINATOR, DESCRIBE_SHARE_GROUP_OFFSETS = 10, 90
FIND_COORDINATOR_VERSIONS = (3, 6)  # flexible ones; 4+ batches keys
DESCRIBE_VERSIONS = (0, 1)  # 1 adds the broker's lag (KIP-1226)
KEY_TYPE_GROUP = 0
# error codes met here (org.apache.kafka.common.protocol.Errors)
ERRORS = {
    -1: "UNKNOWN_SERVER_ERROR",
    3: "UNKNOWN_TOPIC_OR_PARTITION",
    14: "COORDINATOR_LOAD_IN_PROGRESS",
    15: "COORDINATOR_NOT_AVAILABLE",
    16: "NOT_COORDINATOR",
    29: "TOPIC_AUTHORIZATION_FAILED",
    30: "GROUP_AUTHORIZATION_FAILED",
    35: "UNSUPPORTED_VERSION",
    42: "INVALID_REQUEST",
    69: "GROUP_ID_NOT_FOUND",
}
GROUP_ID_NOT_FOUND = 69


def fallback(group: str, bootstrap: str = "<bootstrap>") -> str:
    return f"kafka-share-groups.sh --describe --group {group} --bootstrap-server {bootstrap}"


class ShareOffsetsError(KafkaRuntimeError):
    """The share group's offsets could not be read this time (network, coordinator moving,
    a broker error): the next read may work."""


class ShareOffsetsUnsupported(ShareOffsetsError):
    """The offsets cannot be read by retryd with this configuration or broker: the message
    names the Kafka script that can (it ships with the broker's distribution)."""


@dataclass(frozen=True, slots=True)
class SharePartitionOffset:
    topic: str
    partition: int
    start_offset: int  # -1: the broker holds no state for it
    leader_epoch: int
    lag: int  # the broker's figure; -1 when it returned none (v0, or unknown)
    error_code: int = 0
    error_message: str | None = None


@dataclass(frozen=True, slots=True)
class ShareGroupOffsets:
    group: str
    partitions: list[SharePartitionOffset]
    error_code: int = 0
    error_message: str | None = None


# ---------------------------------------------------------------------- encoding / decoding
def encode_find_coordinator(version: int, group: str) -> bytes:
    """FindCoordinator v3 (one key) or v4+ (a batch of keys: here one), key type group."""
    w = Writer()
    if version >= 4:
        w.int8(KEY_TYPE_GROUP).compact_array_length(1).compact_string(group)
    else:
        w.compact_string(group).int8(KEY_TYPE_GROUP)
    return w.no_tags().bytes()


@decoder("FindCoordinator response")
def decode_find_coordinator(r: Reader, version: int, group: str) -> tuple[str, int]:
    """The coordinator's (host, port), checked (``wire.check_address``) before anything
    connects to it; a broker error raises ``ShareOffsetsError``."""
    r.int32()  # throttle time
    if version >= 4:
        found: tuple[str | None, int, int, str | None] | None = None
        for _ in range(r.compact_array_length(15)):
            key, _node, host, port = r.compact_string(), r.int32(), r.compact_string(), r.int32()
            code, message = r.int16(), r.compact_string()
            r.skip_tags()
            if key == group:
                found = (host, port, code, message)
        r.skip_tags()
        r.end()
        if found is None:
            raise WireError(f"FindCoordinator response has no coordinator for {group!r}")
        host, port, code, message = found
    else:
        code, message = r.int16(), r.compact_string()
        r.int32()  # node id
        host, port = r.compact_string(), r.int32()
        r.skip_tags()
        r.end()
    if code:
        raise ShareOffsetsError(f"no coordinator for group {group}: {_error(code, message)}")
    return check_address(host, port, "FindCoordinator response")


def encode_describe(version: int, group: str) -> bytes:
    """DescribeShareGroupOffsets v0/v1 (same request): one group, every topic (null)."""
    w = Writer().compact_array_length(1).compact_string(group).compact_array_length(None)
    return w.no_tags().no_tags().bytes()


@decoder("DescribeShareGroupOffsets response")
def decode_describe(r: Reader, version: int) -> list[ShareGroupOffsets]:
    r.int32()  # throttle time
    groups: list[ShareGroupOffsets] = []
    for _ in range(r.compact_array_length(5)):
        group = r.compact_string() or ""
        partitions: list[SharePartitionOffset] = []
        for _ in range(r.compact_array_length(19)):
            topic = r.compact_string() or ""
            r.uuid()
            for _ in range(r.compact_array_length(20)):
                index, start, epoch = r.int32(), r.int64(), r.int32()
                lag = r.int64() if version >= 1 else -1
                code, message = r.int16(), r.compact_string()
                r.skip_tags()
                partitions.append(
                    SharePartitionOffset(topic, index, start, epoch, lag, code, message)
                )
            r.skip_tags()
        code, message = r.int16(), r.compact_string()
        r.skip_tags()
        groups.append(ShareGroupOffsets(group, partitions, code, message))
    r.skip_tags()
    r.end()
    return groups


@decoder("ApiVersions response")
def decode_api_versions(r: Reader) -> dict[int, tuple[int, int]]:
    """ApiVersions v0: api key -> (min, max) version."""
    code = r.int16()
    out: dict[int, tuple[int, int]] = {}
    for _ in range(r.array_length(6)):
        key, low, high = r.int16(), r.int16(), r.int16()
        out[key] = (low, high)
    r.end()
    if code:
        raise ShareOffsetsError(f"ApiVersions refused: {_error(code, None)}")
    return out


def pick_version(
    supported: Mapping[int, tuple[int, int]], api_key: int, mine: tuple[int, int], what: str
) -> int:
    """The highest version both sides speak, or ``ShareOffsetsUnsupported``."""
    low, high = supported.get(api_key, (-1, -2))
    best = min(high, mine[1])
    if best < max(low, mine[0]):
        raise ShareOffsetsUnsupported(
            f"the broker does not speak {what} v{mine[0]}-{mine[1]} (it offers "
            f"{'none' if high < 0 else f'v{low}-{high}'}): share groups need Apache Kafka 4.2+"
        )
    return best


def _error(code: int, message: str | None) -> str:
    name = ERRORS.get(code, f"error {code}")
    if not message:
        return name
    return f"{name} ({message if len(message) <= 200 else message[:200] + '...'})"  # a peer's


# ---------------------------------------------------------------------- TLS
def _flag(common: Mapping[str, Any], key: str, default: bool) -> bool:
    value = str(common.get(key, default)).strip().lower()
    return value in ("true", "1", "yes", "on")


def ssl_context(common: Mapping[str, Any], group: str) -> ssl.SSLContext | None:
    """The TLS context of ``security.protocol=ssl`` from librdkafka's properties (None for
    plaintext); configurations this reader cannot honour raise ``ShareOffsetsUnsupported``."""
    script = fallback(group, str(common.get("bootstrap.servers") or "<bootstrap>"))
    protocol = str(common.get("security.protocol", "plaintext")).strip().lower()
    if protocol == "plaintext":
        return None
    if protocol != "ssl":
        raise ShareOffsetsUnsupported(
            f"security.protocol={protocol} is not supported by retryd's share-group offsets "
            f"reader (PLAINTEXT and SSL only); read the lag with {script}"
        )
    for key in ("ssl.keystore.location", "ssl.certificate.pem", "ssl.key.pem"):
        if common.get(key):
            raise ShareOffsetsUnsupported(
                f"{key} is not supported by retryd's share-group offsets reader (use "
                f"ssl.certificate.location and ssl.key.location); read the lag with "
                f"{script}"
            )
    ca = common.get("ssl.ca.location")
    ca_file = ca if ca and str(ca) != "probe" else None
    try:
        ctx = ssl.create_default_context(cafile=ca_file, cadata=common.get("ssl.ca.pem") or None)
        cert = common.get("ssl.certificate.location")
        if cert:
            ctx.load_cert_chain(
                cert, common.get("ssl.key.location") or None, common.get("ssl.key.password")
            )
    except (OSError, ssl.SSLError, ValueError) as exc:
        raise ShareOffsetsUnsupported(
            f"cannot set up TLS from the kafka ssl.* options: {exc}; read the lag with {script}"
        ) from exc
    algorithm = str(common.get("ssl.endpoint.identification.algorithm", "https")).lower()
    ctx.check_hostname = algorithm == "https"
    if not _flag(common, "enable.ssl.certificate.verification", True):
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    return ctx


# ---------------------------------------------------------------------- the client
def _servers(bootstrap: str) -> list[tuple[str, int]]:
    out = []
    for item in bootstrap.split(","):
        item = item.strip().split("://")[-1]
        if not item:
            continue
        host, _, port = item.rpartition(":")
        number = int(port or 9092)
        if not 0 < number <= 0xFFFF:
            raise ValueError(f"port {number} is out of range")
        out.append((host.strip("[]") or "localhost", number))
    return out


class ShareOffsetsClient:
    """Reads one share group's offsets; cheap to keep (it holds no connection between
    reads: each ``describe`` opens and closes its own, so a broker restart needs nothing)."""

    def __init__(
        self,
        common: Mapping[str, Any],
        group: str,
        *,
        timeout_s: float = 5.0,
        max_response_bytes: int = MAX_RESPONSE_BYTES,
    ) -> None:
        self.group = group
        self.timeout_s = timeout_s
        self.max_response_bytes = max_response_bytes
        bootstrap = str(common.get("bootstrap.servers", ""))
        try:
            self.servers = _servers(bootstrap)
        except ValueError as exc:
            raise ShareOffsetsUnsupported(f"bootstrap.servers={bootstrap!r}: {exc}") from exc
        if not self.servers:
            raise ShareOffsetsUnsupported("no bootstrap.servers to read share-group offsets from")
        self.tls = ssl_context(common, group)

    def _connect(self, host: str, port: int) -> Connection:
        return Connection(
            host, port, self.tls, self.timeout_s, max_response_bytes=self.max_response_bytes
        )

    def _bootstrap(self) -> Connection:
        errors = []
        for host, port in self.servers:
            try:
                return self._connect(host, port)
            except WireError as exc:
                errors.append(str(exc))
        raise WireError("; ".join(errors))

    def describe(self, topics: Iterable[str] | None = None) -> list[SharePartitionOffset]:
        """Every partition of ``topics`` (all when None) the group holds state for. A group
        that does not exist (yet) has none. A broker's error raises ``ShareOffsetsError``, a
        failed connection or a response that does not decode ``WireError``."""
        with self._bootstrap() as conn:
            r = conn.request(API_VERSIONS, 0, b"", flexible=False, what="ApiVersions")
            supported = decode_api_versions(r)
            find_v = pick_version(
                supported, FIND_COORDINATOR, FIND_COORDINATOR_VERSIONS, "FindCoordinator"
            )
            desc_v = pick_version(
                supported,
                DESCRIBE_SHARE_GROUP_OFFSETS,
                DESCRIBE_VERSIONS,
                "DescribeShareGroupOffsets",
            )
            r = conn.request(
                FIND_COORDINATOR,
                find_v,
                encode_find_coordinator(find_v, self.group),
                flexible=True,
                what="FindCoordinator",
            )
            host, port = decode_find_coordinator(r, find_v, self.group)
            if (host, port) == (conn.host, conn.port):
                groups = self._describe(conn, desc_v)
            else:
                with self._connect(host, port) as coordinator:
                    groups = self._describe(coordinator, desc_v)
        wanted = None if topics is None else set(topics)
        out: list[SharePartitionOffset] = []
        for g in groups:
            if g.group != self.group:
                continue
            if g.error_code == GROUP_ID_NOT_FOUND:
                return []
            if g.error_code:
                raise ShareOffsetsError(
                    f"share group {self.group}: {_error(g.error_code, g.error_message)}"
                )
            out.extend(p for p in g.partitions if wanted is None or p.topic in wanted)
        return sorted(out, key=lambda p: (p.topic, p.partition))

    def _describe(self, conn: Connection, version: int) -> list[ShareGroupOffsets]:
        r = conn.request(
            DESCRIBE_SHARE_GROUP_OFFSETS,
            version,
            encode_describe(version, self.group),
            flexible=True,
            what="DescribeShareGroupOffsets",
        )
        return decode_describe(r, version)
